//! The election verbs on a Lease: campaign, renew, resign, read and watch,
//! each a read or a compare-and-swap on the Lease's `resourceVersion`.

use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{PostParams, WatchEvent, WatchParams};
use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::*;

#[async_trait]
impl LeaseBackend for KubeLeaseBackend {
    fn about(&self) -> &'static crate::backend::About {
        ABOUT
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        _previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let conn = self.conn().await?;
        self.inner.lock().expect("lease state poisoned").ttl = Some(ttl);
        // Two rounds: a lost race (409) is answered by one fresh read.
        for round in 0..2 {
            let current = self.get(conn).await?;
            let mine = format!("{identity}_{}", term_id());
            let step = match current {
                None => self.take_absent(conn, round, mine, ttl).await?,
                Some(lease) => self.take_over(conn, round, lease, mine, ttl).await?,
            };
            match step {
                Round::Done(c) => return Ok(c),
                Round::Again => continue,
                Round::Lost => break,
            }
        }
        Ok(self.after_lost_race())
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let conn = self.conn().await?;
        let ours = &term.holder.term_id;
        for _ in 0..CAS_TRIES {
            let base = {
                let inner = self.inner.lock().expect("lease state poisoned");
                match &inner.seen {
                    Some(s) if s.deleted => return Ok(Renewal::Lost(LostReason::KeyDeleted)),
                    Some(s) if holder_of(&s.lease) != ours => {
                        return Ok(Renewal::Lost(LostReason::KeyOverwritten));
                    }
                    Some(s) => s.lease.clone(),
                    None => return Ok(Renewal::Lost(LostReason::KeyDeleted)),
                }
            };
            if let Some(edit) = foreign_edit(&base, term) {
                // Someone changed what our term promises: followers count
                // from their sight of it, so the term ends here.
                warn!(lease = %self.name, %edit, "our Lease was edited by someone else; ending the term");
                return Ok(Renewal::Lost(LostReason::KeyOverwritten));
            }
            let mut next = base;
            let spec = next.spec.get_or_insert_with(Default::default);
            spec.renew_time = Some(now_micro());
            let ttl = Self::duration_of(&next, term.ttl);
            match conn.api.replace(&self.name, &post_params(), &next).await {
                Ok(updated) => {
                    self.observe(&updated);
                    return Ok(Renewal::Renewed { ttl, servers: None });
                }
                Err(e) if Self::is_conflict(&e) => {
                    // Someone else wrote: re-read and decide; never overwrite.
                    if self.get(conn).await?.is_none() {
                        return Ok(Renewal::Lost(LostReason::KeyDeleted));
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.observe_deleted(None);
                    return Ok(Renewal::Lost(LostReason::KeyDeleted));
                }
                Err(e) => return Err(self.classify(conn, "update", e)),
            }
        }
        Err(self.contended(conn))
    }

    async fn resign(&self, term: &Term) -> Result<()> {
        let conn = self.conn().await?;
        let ours = &term.holder.term_id;
        for _ in 0..CAS_TRIES {
            let base = {
                let inner = self.inner.lock().expect("lease state poisoned");
                match &inner.seen {
                    Some(s) if !s.deleted && holder_of(&s.lease) == ours => s.lease.clone(),
                    // Gone or someone else's: nothing of ours to release.
                    _ => {
                        drop(inner);
                        self.inner.lock().expect("poisoned").own = None;
                        return Ok(());
                    }
                }
            };
            let mut next = base;
            let spec = next.spec.get_or_insert_with(Default::default);
            let now = now_micro();
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            // Proof that the holder itself released (a hand edit clearing
            // the holder does not end its promise for our followers).
            next.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(RELEASED_ANNOTATION.to_owned(), ours.clone());
            match conn.api.replace(&self.name, &post_params(), &next).await {
                Ok(updated) => {
                    self.observe(&updated);
                    self.inner.lock().expect("poisoned").own = None;
                    return Ok(());
                }
                Err(e) if Self::is_conflict(&e) => {
                    self.get(conn).await?;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.observe_deleted(None);
                    return Ok(());
                }
                Err(e) => return Err(self.classify(conn, "update", e)),
            }
        }
        Err(self.contended(conn))
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let conn = self.conn().await?;
        Ok(self
            .get(conn)
            .await?
            .filter(|l| !holder_of(l).is_empty())
            .map(|l| holder_view(&l)))
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        let conn = self.conn().await?;
        let mut broken = false;
        loop {
            let Some(view) = self.watch_view(seen) else {
                return Ok(());
            };
            if view.poll {
                return self.poll(conn, seen, view.leading).await;
            }
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", self.name))
                .timeout(WATCH_TIMEOUT_SECS);
            // A hung API must not hold a follower past the silence deadline.
            let wake = if view.leading { None } else { view.deadline };
            let opened = tokio::select! {
                r = conn.api.watch(&params, &view.rv) => r,
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    debug!(holder = %seen.term_id, "no change of the lease for its duration: expired");
                    return Ok(());
                }
            };
            let stream = match opened {
                Ok(stream) => stream,
                Err(kube::Error::Api(s)) if s.code == 410 => {
                    if self.relist(conn, seen, view.leading).await? {
                        return Ok(());
                    }
                    continue;
                }
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    self.watch_forbidden(conn, &s.message);
                    continue;
                }
                Err(e) => return Err(self.classify(conn, "watch", e)),
            };
            futures_util::pin_mut!(stream);
            match self.follow_stream(conn, seen, view, &mut stream).await {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => continue,
                // A stream broken mid-way (a reset connection) is reopened
                // once at once from where it was; a second break is the
                // caller's to report and back off from.
                Err(e) if !broken && matches!(e, BackendError::Unreachable { .. }) => {
                    debug!(error = %e.report(), "watch broke; reopening it");
                    broken = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// What a watch of the Lease starts from.
struct WatchView {
    /// The version to resume from.
    rv: String,
    /// When the followed holder's term ends by silence (followers only).
    deadline: Option<Instant>,
    /// We hold the term being watched.
    leading: bool,
    /// RBAC denies `watch`: poll instead.
    poll: bool,
}

/// How a foreign write changed our term's Lease, if it did: the holder's
/// duration or the fencing token (what followers and fencing rely on).
fn foreign_edit(lease: &Lease, term: &Term) -> Option<String> {
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
    fn watch_view(&self, seen: &Holder) -> Option<WatchView> {
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
    fn own_term(&self, seen: &Holder) -> Option<Term> {
        let inner = self.inner.lock().expect("lease state poisoned");
        let ttl = inner.own_ttl?;
        Some(Term {
            holder: Holder {
                fencing_token: inner.own_token,
                ..seen.clone()
            },
            ttl,
            servers: None,
        })
    }

    /// A Lease of our holder that the leader's watch or read saw: `true`
    /// when someone else changed what our term promises (the term ends).
    fn edited_by_others(&self, lease: &Lease, seen: &Holder) -> bool {
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
    async fn follow_stream<S>(
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
    fn fallback_ttl(&self) -> Duration {
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
    async fn relist(&self, conn: &Conn, seen: &Holder, leading: bool) -> Result<bool> {
        debug!(lease = %self.name, "watch version compacted (410); reading the Lease afresh");
        let current = self.list_or_get(conn).await?;
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
    fn watch_forbidden(&self, conn: &Conn, message: &str) {
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
    async fn poll(&self, conn: &Conn, seen: &Holder, leading: bool) -> Result<()> {
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

/// Write parameters: our field manager on every write.
fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// What one round of a campaign came to.
enum Round {
    /// The campaign's answer.
    Done(Campaign),
    /// The CAS lost a race: read again (once).
    Again,
    /// The second round found the race lost: report what is there now.
    Lost,
}

impl KubeLeaseBackend {
    /// The Lease is absent. If we saw a holder whose term may still run (the
    /// Lease was deleted by hand), wait its duration from when we found the
    /// Lease gone; else create it as `mine` with a seeded fencing token, and
    /// claim it only if no term we never saw ran since the absence point
    /// ([`Self::after_create`]).
    async fn take_absent(
        &self,
        conn: &Conn,
        round: usize,
        mine: String,
        ttl: Duration,
    ) -> Result<Round> {
        let now = Instant::now();
        let (max_token, seen, from) = {
            let inner = self.inner.lock().expect("lease state poisoned");
            (inner.max_token, inner.seen.clone(), inner.absent_rv.clone())
        };
        if let Some(s) = &seen
            && let Some(end) = Self::silence_deadline(s, ttl)
            && now < end
            && !self
                .inner
                .lock()
                .expect("lease state poisoned")
                .is_unclaimed_own(holder_of(&s.lease))
        {
            return Ok(Round::Done(Campaign::Waiting {
                previous: holder_view(&s.lease),
                retry_after: end - now,
            }));
        }
        if round > 0 {
            // Someone created it between our reads and we lost.
            return Ok(Round::Lost);
        }
        let token = (max_token + 1).max(unix_millis());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(conn.namespace.clone()),
                annotations: Some([(TOKEN_ANNOTATION.to_owned(), token.to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(Self::new_spec(&mine, ttl, 0)),
        };
        self.inner
            .lock()
            .expect("lease state poisoned")
            .send_acquisition(&mine);
        let r = conn.api.create(&post_params(), &lease).await;
        match r {
            Ok(created) => {
                let known = seen.as_ref().map(|s| holder_of(&s.lease).to_owned());
                let c = self
                    .after_create(conn, created, mine, ttl, from, known)
                    .await;
                Ok(Round::Done(c))
            }
            Err(e) => {
                self.inner
                    .lock()
                    .expect("lease state poisoned")
                    .answered(&mine);
                if Self::is_conflict(&e) {
                    Ok(Round::Again)
                } else {
                    Err(self.classify(conn, "create", e))
                }
            }
        }
    }

    /// The Lease exists: follow its holder, or, when it is free, silent for
    /// its duration or an acquisition of ours that was never answered, take
    /// it by CAS as `mine` with the next fencing token.
    async fn take_over(
        &self,
        conn: &Conn,
        round: usize,
        lease: Lease,
        mine: String,
        ttl: Duration,
    ) -> Result<Round> {
        let now = Instant::now();
        let (max_token, seen) = {
            let inner = self.inner.lock().expect("lease state poisoned");
            (inner.max_token, inner.seen.clone())
        };
        let holder = holder_of(&lease);
        let s = seen.expect("observed by get");
        if let Some(wait) = self.pending_wait(holder, now) {
            return Ok(Round::Done(wait));
        }
        let unclaimed = self
            .inner
            .lock()
            .expect("lease state poisoned")
            .is_unclaimed_own(holder);
        let end = Self::silence_deadline(&s, ttl);
        let expired = unclaimed || end.is_none_or(|end| now >= end);
        if !expired && holder.is_empty() {
            // Cleared by someone other than its holder: that holder's
            // promise still runs.
            return Ok(Round::Done(Campaign::Waiting {
                previous: holder_view(&lease),
                retry_after: end.map_or(Duration::ZERO, |end| end - now),
            }));
        }
        if !expired {
            return Ok(Round::Done(Campaign::Following(holder_view(&lease))));
        }
        if round > 0 {
            return Ok(Round::Lost);
        }
        debug!(
            previous = holder,
            "lease free or silent for its duration; taking it"
        );
        let old = lease.spec.clone().unwrap_or_default();
        let transitions = old.lease_transitions.unwrap_or(0).saturating_add(1);
        let token = (token_of(&lease).max(max_token)) + 1;
        let mut next = lease.clone();
        next.spec = Some(Self::new_spec(&mine, ttl, transitions));
        next.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TOKEN_ANNOTATION.to_owned(), token.to_string());
        self.inner
            .lock()
            .expect("lease state poisoned")
            .send_acquisition(&mine);
        let r = conn.api.replace(&self.name, &post_params(), &next).await;
        self.inner
            .lock()
            .expect("lease state poisoned")
            .answered(&mine);
        match r {
            Ok(updated) => Ok(Round::Done(self.elected(&updated, mine, ttl))),
            Err(e) if Self::is_conflict(&e) => Ok(Round::Again),
            Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => Ok(Round::Again),
            Err(e) => Err(self.classify(conn, "update", e)),
        }
    }

    /// Lost a race: report what is there now.
    fn after_lost_race(&self) -> Campaign {
        let inner = self.inner.lock().expect("lease state poisoned");
        match &inner.seen {
            Some(s) if !s.deleted && !holder_of(&s.lease).is_empty() => {
                Campaign::Following(holder_view(&s.lease))
            }
            Some(s) => Campaign::Waiting {
                previous: holder_view(&s.lease),
                retry_after: Duration::from_millis(100),
            },
            None => Campaign::Waiting {
                previous: Holder {
                    identity: String::new(),
                    fencing_token: 0,
                    term_id: String::new(),
                    revision: 0,
                    expires_in: None,
                },
                retry_after: Duration::from_millis(100),
            },
        }
    }
}
