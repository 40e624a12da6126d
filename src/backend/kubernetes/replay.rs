//! After a create: may the new term be claimed? The watch replays the
//! Lease's changes from where this process last found it absent up to our
//! create; a term we never saw may still run (see the view's pending create).

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{WatchEvent, WatchParams};
use tokio::time::{Instant, timeout};
use tracing::{debug, info};

use super::view::Created;
use super::*;
use crate::backend::WaitReason;

/// What the replay from the absence point showed.
enum Replay {
    /// Nothing but our own create: nobody else held the Lease since.
    Clean,
    /// Another term held the Lease in between; the longest duration named.
    Unseen(Holder, Duration),
    /// No replay could be had (no absence point, 410, an error, a stall):
    /// a term may have run unseen, for at most a whole duration.
    Unknown(String),
}

impl KubeLeaseBackend {
    /// Our create was answered with `created`: claim it at once, or leave it
    /// pending (unclaimed) until no unseen term can still run. `from` is the
    /// absence point, `known` the holder whose term we already waited out.
    pub(super) async fn after_create(
        &self,
        conn: &Conn,
        created: Lease,
        mine: String,
        ttl: Duration,
        from: Option<String>,
        known: Option<String>,
    ) -> Campaign {
        let answered = Instant::now();
        // Safe defaults first: if this call is dropped (the Elector's
        // deadline) the Lease stays unclaimed for a whole duration.
        let Created { floor, whole } = self.view(|v| v.created(&created, &mine, answered));
        let limit = (ttl / 3).max(Duration::from_secs(1));
        let replay = match timeout(
            limit,
            self.replay(conn, from, &mine, known.as_deref().unwrap_or("")),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Replay::Unknown(format!("no answer in {limit:?}")),
        };
        let (previous, wait) = match replay {
            Replay::Clean => (holder_view(&created), Duration::ZERO),
            Replay::Unseen(h, d) => {
                // Never shorter than our own duration: the duration written
                // may be a hand edit of what its holder was promised.
                let d = d.max(ttl);
                info!(unseen = %h.term_id, duration = ?d, "a term we never saw held the Lease since we found it gone; claiming ours only after its duration");
                (h, d)
            }
            Replay::Unknown(why) => {
                info!(%why, duration = ?whole, "cannot replay the Lease's changes since we found it gone; claiming ours only after a whole duration");
                (holder_view(&created), whole)
            }
        };
        let not_before = floor.unwrap_or(answered).max(answered + wait);
        let now = Instant::now();
        if now >= not_before {
            return self.elected(&created, mine, ttl);
        }
        self.view(|v| v.pending_until(mine, not_before, previous.clone()));
        Campaign::Waiting {
            previous: Some(previous),
            retry_after: not_before - now,
            why: WaitReason::UnseenTerm,
        }
    }

    /// Replay the Lease's changes after `from` up to our own create (the
    /// first event naming `mine`); terms of `known` (already waited out)
    /// and of our own unclaimed acquisitions are not counted.
    async fn replay(&self, conn: &Conn, from: Option<String>, mine: &str, known: &str) -> Replay {
        let Some(from) = from else {
            return Replay::Unknown("no version to replay from".into());
        };
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(WATCH_TIMEOUT_SECS);
        let stream = match conn.api.watch(&params, &from).await {
            Ok(s) => s,
            Err(e) => return Replay::Unknown(format!("watch from {from}: {e}")),
        };
        futures_util::pin_mut!(stream);
        let mut unseen: Option<(Holder, Duration)> = None;
        let fallback = self.fallback_ttl();
        while let Some(ev) = stream.next().await {
            let lease = match ev {
                Ok(WatchEvent::Added(l) | WatchEvent::Modified(l) | WatchEvent::Deleted(l)) => l,
                Ok(WatchEvent::Bookmark(_)) => continue,
                Ok(WatchEvent::Error(s)) => {
                    return Replay::Unknown(format!("watch from {from}: {} {}", s.code, s.reason));
                }
                Err(e) => return Replay::Unknown(format!("watch from {from}: {e}")),
            };
            let holder = holder_of(&lease);
            if holder == mine {
                debug!(%from, unseen = unseen.is_some(), "replayed the Lease's changes up to our create");
                return match unseen {
                    None => Replay::Clean,
                    Some((h, d)) => Replay::Unseen(h, d),
                };
            }
            let ours = self.view(|v| v.is_unanswered(holder));
            if holder.is_empty() || holder == known || ours {
                continue;
            }
            let d = duration_of(&lease, fallback);
            if unseen.as_ref().is_none_or(|(_, longest)| d > *longest) {
                unseen = Some((holder_view(&lease), d));
            }
        }
        Replay::Unknown(format!("watch from {from} ended before our create"))
    }
}
