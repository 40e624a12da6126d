//! Following the Lease by watch: the followers' silence clock, the
//! leader's sight of writes by others (which end its term at once), a 410
//! answered by a fresh read, and polling when RBAC denies `watch`.

use std::ops::ControlFlow;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::WatchEvent;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::view::WatchView;
use super::*;

impl KubeLeaseBackend {
    /// Where a watch of `seen`'s term resumes, or `None` when what we know
    /// already differs from `seen` (the watch's answer is "changed").
    pub(super) fn watch_view(&self, seen: &Holder) -> Option<WatchView> {
        self.view(|v| v.watch_from(seen.term_id.as_str()))
    }

    /// Whether someone else changed what our term `seen` promises, as the
    /// Lease last read shows it (the term then ends at once).
    pub(super) fn overwritten(&self, seen: &Holder) -> bool {
        match self.view(|v| v.classify(Some(seen.term_id.as_str()), Instant::now())) {
            Standing::Overwritten { edit } => {
                warn!(lease = %self.name, %edit, "our Lease was edited by someone else; ending the term at once");
                true
            }
            _ => false,
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
                    match self.watched(&l, seen, view.leading) {
                        ControlFlow::Break(()) => return Ok(Some(())),
                        ControlFlow::Continue(next) => deadline = next,
                    }
                }
                Some(Ok(WatchEvent::Deleted(l))) => {
                    // Its version is the deletion's: a replay point.
                    self.observe_deleted(Some(rv_of(&l)));
                    return Ok(Some(()));
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    self.view(|v| v.resume_from(b.metadata.resource_version));
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

    /// A version of the Lease delivered by the watch of `seen`'s term:
    /// `Break` when the term changed (another holder, or, for the leader, a
    /// write of someone else's to what it promises); else the follower's
    /// new silence deadline (the leader has none).
    fn watched(
        &self,
        lease: &Lease,
        seen: &Holder,
        leading: bool,
    ) -> ControlFlow<(), Option<Instant>> {
        let now = Instant::now();
        self.roster_saw(lease);
        if seen.term_id != holder_of(lease) {
            self.view(|v| v.observed(lease, now));
            return ControlFlow::Break(());
        }
        if !leading {
            return ControlFlow::Continue(self.view(|v| {
                v.watched(lease, now);
                v.silent_until()
            }));
        }
        // Our own renewals only move the resume point (the update answers
        // are the CAS versions).
        match self.view(|v| v.observed_while_leading(lease, now)) {
            Some(edit) => {
                warn!(lease = %self.name, %edit, "our Lease was edited by someone else; ending the term at once");
                ControlFlow::Break(())
            }
            None => ControlFlow::Continue(None),
        }
    }

    /// The configured TTL, or client-go's default 15 s before any campaign.
    pub(super) fn fallback_ttl(&self) -> Duration {
        self.view(|v| v.fallback_ttl())
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
        if seen.term_id != holder_of(&lease) {
            return Ok(true);
        }
        Ok(leading && self.overwritten(seen))
    }

    /// RBAC refused a watch that the permission check did not foresee: say
    /// so once and poll from now on.
    pub(super) fn watch_forbidden(&self, conn: &Conn, message: &str) {
        if self.view(|v| v.watch_denied()) {
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
                self.view(|v| v.silent_until())
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
                Some(l) if seen.term_id == holder_of(&l) => {
                    if leading && self.overwritten(seen) {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        }
    }
}
