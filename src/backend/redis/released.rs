//! The election's release channel: one subscription per server, on which
//! a resigning leader publishes its released value, so followers campaign
//! at once instead of at the key's expiry. The registry's and the
//! controls' channels are followed the same way ([`Released::any`]).

use futures_util::StreamExt;
use redis::aio::PubSub;
use tokio::sync::Mutex;
use tokio::time::timeout;
use tracing::debug;

use super::group::Group;
use crate::backend::BackendError;

/// Per server: the subscription to the release channel (`None` until made,
/// and again after it broke).
pub struct Released {
    subs: Vec<Mutex<Option<PubSub>>>,
}

impl Released {
    /// No subscriptions yet, for `n` servers.
    pub fn new(n: usize) -> Released {
        Released {
            subs: (0..n).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Subscribe every server's pub/sub connection to `channel`, once.
    pub async fn subscribe(&self, group: &Group, channel: &str) {
        for (server, slot) in group.servers().iter().zip(&self.subs) {
            let mut guard = slot.lock().await;
            if guard.is_some() {
                continue;
            }
            let sub = async {
                let mut ps = server.pubsub().await?;
                ps.subscribe(channel)
                    .await
                    .map_err(|e| server.classify(e))?;
                Ok::<_, BackendError>(ps)
            };
            match timeout(server.timeout(), sub).await {
                Ok(Ok(ps)) => *guard = Some(ps),
                Ok(Err(e)) => {
                    debug!(server = %server.label(), error = %e, "cannot subscribe to the release channel yet")
                }
                Err(_) => {
                    debug!(server = %server.label(), "subscribing to the release channel timed out")
                }
            }
        }
    }

    /// Wait on server `i`'s subscription for a message starting with
    /// `prefix`. Returns `false` when the subscription broke.
    async fn wait_on(&self, i: usize, prefix: &str) -> bool {
        let mut guard = self.subs[i].lock().await;
        let Some(ps) = guard.as_mut() else {
            return false;
        };
        let mut stream = ps.on_message();
        while let Some(msg) = stream.next().await {
            if msg.get_payload_bytes().starts_with(prefix.as_bytes()) {
                return true;
            }
        }
        drop(stream);
        *guard = None;
        false
    }

    /// Wait on every server's subscription for the release of `token`.
    /// Returns `false` when every subscription broke (the caller reports it
    /// and campaigns again, which re-subscribes).
    pub async fn wait(&self, token: &str) -> bool {
        self.wait_for(&format!("{token}|")).await
    }

    /// Wait on every server's subscription for any message (messages that
    /// came since the last wait count). Returns `false` when every
    /// subscription broke.
    pub async fn any(&self) -> bool {
        self.wait_for("").await
    }

    async fn wait_for(&self, prefix: &str) -> bool {
        let mut pending: Vec<_> = (0..self.subs.len())
            .map(|i| Box::pin(self.wait_on(i, prefix)))
            .collect();
        while !pending.is_empty() {
            let (released, _, rest) = futures_util::future::select_all(pending).await;
            if released {
                return true;
            }
            pending = rest;
        }
        false
    }
}
