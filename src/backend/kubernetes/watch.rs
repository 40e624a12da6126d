//! Following the Lease by watch: the followers' silence clock, the
//! leader's sight of writes by others (which end its term at once), a 410
//! answered by a fresh read, and polling when RBAC denies `watch`.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::WatchEvent;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::*;

/// What a watch of the Lease starts from.
pub(super) struct WatchView {
    /// The version to resume from.
    pub(super) rv: String,
    /// When the followed holder's term ends by silence (followers only).
    pub(super) deadline: Option<Instant>,
    /// We hold the term being watched.
    pub(super) leading: bool,
    /// RBAC denies `watch`: poll instead.
    pub(super) poll: bool,
}

/// How a foreign write changed our term's Lease, if it did: the holder's
/// duration or the fencing token (what followers and fencing rely on).
pub(super) fn foreign_edit(lease: &Lease, term: &Term) -> Option<String> {
    let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
    let ours = lease_duration_secs(term.ttl);
    if duration != Some(ours) {
        return Some(format!(
            "leaseDurationSeconds {ours} -> {}",
            duration.map_or("(none)".to_owned(), |d| d.to_string())
        ));
    }
    let token = token_of(lease);
    (token != term.holder.fencing_token)
        .then(|| format!("fencing token {} -> {token}", term.holder.fencing_token))
}

impl KubeLeaseBackend {
    /// Where a watch of `seen`'s term resumes, or `None` when what we know
    /// already differs from `seen` (the watch's answer is "changed").
    pub(super) fn watch_view(&self, seen: &Holder) -> Option<WatchView> {
        let inner = self.inner.lock().expect("lease state poisoned");
        let fallback = inner.ttl.unwrap_or(Duration::from_secs(15));
        let s = inner.seen.as_ref()?;
        if s.deleted || holder_of(&s.lease) != seen.term_id {
            return None;
        }
        Some(WatchView {
            rv: inner
                .resume_rv
                .clone()
                .unwrap_or_else(|| rv_of(&s.lease).to_owned()),
            deadline: Self::silence_deadline(s, fallback),
            leading: inner.own.as_deref() == Some(seen.term_id.as_str()),
            poll: inner.no_watch,
        })
    }

    /// The term we hold, as the leader's watch compares it with what others
    /// write: our holder, the duration and token of our last own view.
    pub(super) fn own_term(&self, seen: &Holder) -> Option<Term> {
        let inner = self.inner.lock().expect("lease state poisoned");
        let ttl = inner.own_ttl?;
        Some(Term {
            holder: Holder {
                fencing_token: inner.own_token,
                ..seen.clone()
            },
            ttl,
            granted: ttl,
            servers: None,
        })
    }

    /// A Lease of our holder that the leader's watch or read saw: `true`
    /// when someone else changed what our term promises (the term ends).
    pub(super) fn edited_by_others(&self, lease: &Lease, seen: &Holder) -> bool {
        let Some(term) = self.own_term(seen) else {
            return false;
        };
        match foreign_edit(lease, &term) {
            Some(edit) => {
                self.observe(lease);
                warn!(lease = %self.name, %edit, "our Lease was edited by someone else; ending the term at once");
                true
            }
            None => false,
        }
    }

    /// Deliver the events of one open watch. `Ok(Some(()))`: the followed
    /// term changed (or ended by silence); `Ok(None)`: reopen the watch.
    pub(super) async fn follow_stream<S>(
        &self,
        conn: &Conn,
        seen: &Holder,
        view: WatchView,
        stream: &mut S,
    ) -> Result<Option<()>>
    where
        S: futures_util::Stream<Item = kube::Result<WatchEvent<Lease>>> + Unpin,
    {
        let fallback = self.fallback_ttl();
        let mut deadline = view.deadline;
        loop {
            let wake = if view.leading { None } else { deadline };
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    debug!(holder = %seen.term_id, "no change of the lease for its duration: expired");
                    return Ok(Some(()));
                }
            };
            match ev {
                None => return Ok(None), // server-side timeout: reopen from resume_rv
                Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                    if holder_of(&l) != seen.term_id {
                        self.observe(&l);
                        return Ok(Some(()));
                    }
                    if view.leading {
                        if self.edited_by_others(&l, seen) {
                            return Ok(Some(()));
                        }
                        // Our own renewals: the update answers are the CAS
                        // versions; only the resume point moves.
                        self.inner.lock().expect("lease state poisoned").resume_rv =
                            Some(rv_of(&l).to_owned());
                    } else {
                        let mut inner = self.inner.lock().expect("lease state poisoned");
                        Self::observe_locked(&mut inner, &l);
                        deadline = inner
                            .seen
                            .as_ref()
                            .and_then(|s| Self::silence_deadline(s, fallback));
                    }
                }
                Some(Ok(WatchEvent::Deleted(l))) => {
                    // Its version is the deletion's: a replay point.
                    self.observe_deleted(Some(rv_of(&l)));
                    return Ok(Some(()));
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    self.inner.lock().expect("lease state poisoned").resume_rv =
                        Some(b.metadata.resource_version);
                }
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    return Ok(self.relist(conn, seen, view.leading).await?.then_some(()));
                }
                Some(Ok(WatchEvent::Error(status))) if status.code == 403 => {
                    self.watch_forbidden(conn, &status.message);
                    return Ok(None);
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    return Err(self.classify(conn, "watch", kube::Error::Api(status)));
                }
                Some(Err(e)) => return Err(self.classify(conn, "watch", e)),
            }
        }
    }

    /// The configured TTL, or client-go's default 15 s before any campaign.
    pub(super) fn fallback_ttl(&self) -> Duration {
        self.inner
            .lock()
            .expect("lease state poisoned")
            .ttl
            .unwrap_or(Duration::from_secs(15))
    }

    /// A watch answered 410 (its version was compacted): read the Lease
    /// afresh, as a reflector relists, and resume from the read's version
    /// (a LIST's, which is current; the object's own version may be as old
    /// as the compaction). Not a failure. Returns `true` when the read
    /// shows the followed term changed.
    pub(super) async fn relist(&self, conn: &Conn, seen: &Holder, leading: bool) -> Result<bool> {
        debug!(lease = %self.name, "watch version compacted (410); reading the Lease afresh");
        let current = self.list(conn).await?;
        let Some(lease) = current else {
            return Ok(true);
        };
        if holder_of(&lease) != seen.term_id {
            return Ok(true);
        }
        Ok(leading && self.edited_by_others(&lease, seen))
    }

    /// RBAC refused a watch that the permission check did not foresee: say
    /// so once and poll from now on.
    pub(super) fn watch_forbidden(&self, conn: &Conn, message: &str) {
        let mut inner = self.inner.lock().expect("lease state poisoned");
        if !inner.no_watch {
            inner.no_watch = true;
            warn!(namespace = %conn.namespace, credentials = %conn.credentials, %message,
                "{} may not watch leases.coordination.k8s.io; following the Lease by polling at the renew interval", conn.credentials);
        }
    }

    /// Follow `seen`'s term without a watch (RBAC denies it): read the Lease
    /// every poll interval (the renew interval) until it changes, or, for a
    /// follower, until its silence deadline passes.
    pub(super) async fn poll(&self, conn: &Conn, seen: &Holder, leading: bool) -> Result<()> {
        let every = self
            .options
            .poll_every
            .unwrap_or_else(|| self.fallback_ttl() / 3);
        loop {
            let deadline = if leading {
                None
            } else {
                let inner = self.inner.lock().expect("lease state poisoned");
                let fallback = inner.ttl.unwrap_or(Duration::from_secs(15));
                inner
                    .seen
                    .as_ref()
                    .and_then(|s| Self::silence_deadline(s, fallback))
            };
            let next = Instant::now() + every;
            match deadline {
                Some(end) if end <= next => {
                    sleep_until(end).await;
                    return Ok(());
                }
                _ => sleep_until(next).await,
            }
            match self.get(conn).await? {
                Some(l) if holder_of(&l) == seen.term_id => {
                    if leading && self.edited_by_others(&l, seen) {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        }
    }
}
