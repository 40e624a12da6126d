//! The old `leader-elector` image's lock, as a [`LeaseBackend`]: a v1
//! Endpoints object named after the election, in the election namespace,
//! whose annotation holds client-go's `LeaderElectionRecord` (the archived
//! image is client-go's pre-Lease `EndpointsLock`). Used only beside the
//! Lease, by [`super::super::both`], so that a rolling update from the old
//! image never elects two leaders.
//!
//! Rules kept here (client-go `tools/leaderelection/leaderelection.go` and
//! `resourcelock/endpointslock.go`; the record rules are in
//! `endpoints_record`):
//! - Every write is an update carrying the `resourceVersion` read or last
//!   written (a create when the object is absent); a 409 means someone else
//!   wrote: re-read, never overwrite.
//! - `holderIdentity` is our identity alone, as the old image shows it;
//!   ownership is that identity plus our term id in a second annotation.
//! - The holder's claim: old-image candidates take the record once they have
//!   seen it unchanged for its `leaseDurationSeconds` (whole seconds, at
//!   least our TTL), from the instant they saw it change, which is after we
//!   sent the write. So a renewal extends our claim to its send instant +
//!   TTL (less the Elector's drift margin) only if it changed the record; a
//!   renewal within the same second as the last one writes an identical
//!   record, and its answer reports the TTL left since the send of the last
//!   write that changed it.
//! - A record changed by anyone else while ours (a hand edit, a shorter
//!   duration, another holder) ends our term; a deletion ends it too.
//! - A follower that finds the object deleted waits out the last record it
//!   saw before it creates one. A term it never saw (taken and deleted
//!   between two of its polls) is not waited for, as client-go does not
//!   either: the old image's safety ends at a deletion by hand. Two of ours
//!   still never lead at once, since each also needs the Lease.
//! - Release writes an empty holder with `leaseDurationSeconds: 1`, as
//!   client-go's `release()` does, so old-image candidates take it at once.
//! - Followers poll (a GET per renew interval), as the old image does: the
//!   bridge needs no `watch` on Endpoints. The holder does not poll: its
//!   renewals see any change (409).

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio::sync::OnceCell;
use tokio::time::{Instant, sleep};

use super::endpoints_record::{
    LockView, Record, Standing, TERM_PREFIX, duration_secs, holder_key, holder_of, now_seconds,
    raw_of, record_of, term_of, with_record,
};
use super::{FIELD_MANAGER, KubeOptions, connect, term_id};
use crate::backend::{
    About, BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term, TermId,
    WaitReason,
};

/// The Endpoints lock's name and advice (errors name the `kubernetes`
/// backend; the advice is about Endpoints).
pub const ABOUT: &About = &About {
    name: super::NAME,
    tls_hint: super::ABOUT.tls_hint,
    auth_hint: "--migrate-from-endpoints needs get, create, update on endpoints (core API group) in the election namespace: the chart's Role has them with migrateFromEndpoints: true",
    rejected: &[],
    expiry: super::ABOUT.expiry,
    open_cause: None,
};

struct Conn {
    api: Api<Endpoints>,
    server: String,
}

/// Our term on the lock.
#[derive(Clone, Debug)]
struct Ours {
    /// `Holder::term_id` of the term.
    key: String,
    /// The object as our last write left it (its `resourceVersion` is the
    /// next write's condition).
    object: Endpoints,
    /// The send instant of the last write that changed the record.
    changed_sent: Instant,
}

#[derive(Debug, Default)]
struct State {
    view: LockView,
    ours: Option<Ours>,
    /// The TTL of the last campaign: the least a record is waited for.
    ttl: Duration,
    /// The holder key whose new record a poll last found, and when.
    heard: Option<(String, Instant)>,
}

/// The Endpoints lock of one election. Cheap to share behind an `Arc`.
pub struct EndpointsLock {
    name: String,
    options: KubeOptions,
    conn: OnceCell<Conn>,
    state: Mutex<State>,
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// What a conditional write came to.
enum Put {
    Written(Box<Endpoints>),
    Conflict,
    Gone,
}

impl EndpointsLock {
    /// The lock of election `name`, connecting on first use like the Lease
    /// backend (in-cluster config or `KUBECONFIG`, namespace from `options`).
    pub fn new(name: impl Into<String>, options: KubeOptions) -> std::sync::Arc<Self> {
        std::sync::Arc::new(EndpointsLock {
            name: name.into(),
            options,
            conn: OnceCell::new(),
            state: Mutex::new(State::default()),
        })
    }

    /// The lock of election `name` in `namespace` over your own client, used
    /// as is (see [`super::KubeLeaseBackend::with_client`] for what the
    /// client should be).
    pub fn with_client(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> std::sync::Arc<Self> {
        let namespace = namespace.into();
        let conn = Conn {
            api: Api::namespaced(client, &namespace),
            server: "(client)".into(),
        };
        std::sync::Arc::new(EndpointsLock {
            name: name.into(),
            options: KubeOptions {
                namespace: Some(namespace),
                ..KubeOptions::default()
            },
            conn: OnceCell::new_with(Some(conn)),
            state: Mutex::new(State::default()),
        })
    }

    async fn conn(&self) -> Result<&Conn> {
        self.conn
            .get_or_try_init(|| async {
                let c = connect(self.options.namespace.clone()).await.map_err(|e| {
                    BackendError::Rejected {
                        backend: ABOUT,
                        code: "no_kubeconfig",
                        source: Box::new(e),
                    }
                })?;
                Ok(Conn {
                    api: Api::namespaced(c.client, &c.namespace),
                    server: c.server,
                })
            })
            .await
    }

    fn state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().expect("endpoints lock state poisoned"))
    }

    fn error(conn: &Conn, e: kube::Error) -> BackendError {
        match e {
            kube::Error::Api(s) => match s.code {
                401 | 403 => BackendError::Auth {
                    backend: ABOUT,
                    source: Box::new(kube::Error::Api(s)),
                },
                429 => BackendError::Throttled {
                    backend: ABOUT,
                    retry_after: Duration::from_secs(1),
                    source: Box::new(kube::Error::Api(s)),
                },
                _ => BackendError::Server {
                    backend: ABOUT,
                    source: Box::new(kube::Error::Api(s)),
                },
            },
            other => BackendError::Unreachable {
                backend: ABOUT,
                endpoints: conn.server.clone(),
                source: Box::new(other),
            },
        }
    }

    /// GET the object and record what was seen.
    async fn get(&self, conn: &Conn) -> Result<Option<Endpoints>> {
        let found = conn
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| Self::error(conn, e))?;
        self.state(|s| s.view.observe(found.as_ref(), Instant::now()));
        Ok(found)
    }

    /// Replace the object by `next` if it is still at `next`'s version.
    async fn put(&self, conn: &Conn, next: &Endpoints) -> Result<Put> {
        match conn.api.replace(&self.name, &params(), next).await {
            Ok(written) => {
                self.state(|s| s.view.observe(Some(&written), Instant::now()));
                Ok(Put::Written(Box::new(written)))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Put::Conflict),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Put::Gone),
            Err(e) => Err(Self::error(conn, e)),
        }
    }

    /// Our term's object, if `term` is our current term.
    fn ours(&self, term: &Term) -> Option<Ours> {
        self.state(|s| s.ours.clone())
            .filter(|o| o.key == term.holder.term_id.as_str())
    }

    /// Take the lock as `identity` from `base` (the object read, `None`:
    /// absent), one write.
    async fn take(
        &self,
        conn: &Conn,
        base: Option<Endpoints>,
        identity: &str,
        ttl: Duration,
    ) -> Result<Campaign> {
        let old = base.as_ref().map(record_of).unwrap_or_default();
        let now = now_seconds();
        let record = Record {
            holder_identity: identity.to_owned(),
            lease_duration_seconds: duration_secs(ttl),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            leader_transitions: old.leader_transitions
                + i64::from(!old.holder_identity.is_empty() && old.holder_identity != identity),
        };
        let term = term_id();
        let sent = Instant::now();
        let written = self.write_taken(conn, base, &record, &term).await?;
        let Some(written) = written else {
            return Ok(Campaign::Waiting {
                previous: None,
                retry_after: Duration::from_millis(100),
                why: WaitReason::LostRace,
            });
        };
        let holder = holder_of(&written);
        self.state(|s| {
            s.view.observe(Some(&written), Instant::now());
            s.ours = Some(Ours {
                key: holder.term_id.to_string(),
                object: written,
                changed_sent: sent,
            });
        });
        Ok(Campaign::Elected(Term {
            holder,
            ttl,
            granted: ttl,
            servers: None,
        }))
    }

    /// The write of [`Self::take`]: a create when the object is absent, else
    /// an update on the version read; `None` when a race was lost.
    async fn write_taken(
        &self,
        conn: &Conn,
        base: Option<Endpoints>,
        record: &Record,
        term: &str,
    ) -> Result<Option<Endpoints>> {
        Ok(match base {
            None => {
                let fresh = Endpoints {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Endpoints::default()
                };
                match conn
                    .api
                    .create(&params(), &with_record(fresh, record, Some(term)))
                    .await
                {
                    Ok(e) => Some(e),
                    Err(kube::Error::Api(s)) if s.code == 409 => None,
                    Err(e) => return Err(Self::error(conn, e)),
                }
            }
            Some(base) => match self
                .put(conn, &with_record(base, record, Some(term)))
                .await?
            {
                Put::Written(e) => Some(*e),
                Put::Conflict | Put::Gone => None,
            },
        })
    }

    /// Our write met a 409: the object re-read if it is still ours with the
    /// record we last wrote (retry on it), else why the term is over.
    async fn after_conflict(
        &self,
        conn: &Conn,
        ours: &Ours,
    ) -> Result<std::result::Result<Endpoints, LostReason>> {
        let Some(now) = self.get(conn).await? else {
            return Ok(Err(LostReason::KeyDeleted));
        };
        let same = raw_of(&now) == raw_of(&ours.object) && term_of(&now) == term_of(&ours.object);
        Ok(if same {
            Ok(now)
        } else {
            Err(LostReason::KeyOverwritten)
        })
    }

    /// Poll every renew interval until `seen`'s term is over: another
    /// term, no object, or its record unchanged for its duration. A new
    /// record of `seen`'s term found here is recorded for `heard_at`.
    async fn poll(&self, conn: &Conn, seen: &Holder, ttl: Duration) -> Result<()> {
        let every = self.options.poll_every.unwrap_or(Duration::from_secs(2));
        loop {
            let (until, before) =
                match self.state(|s| (s.view.standing(ttl, Instant::now()), s.view.changed_at())) {
                    (Standing::Held { until, .. }, before) => (until, before),
                    (Standing::Free, _) => return Ok(()),
                };
            sleep(every.min(until.saturating_duration_since(Instant::now()))).await;
            match self.get(conn).await? {
                Some(e) if holder_key(&e) == seen.term_id.as_str() => self.state(|s| {
                    let after = s.view.changed_at();
                    if let Some(at) = after.filter(|_| after != before) {
                        s.heard = Some((seen.term_id.to_string(), at));
                    }
                }),
                _ => return Ok(()),
            }
        }
    }
}

#[async_trait]
impl LeaseBackend for EndpointsLock {
    fn about(&self) -> &'static About {
        ABOUT
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        _previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let conn = self.conn().await?;
        self.state(|s| s.ttl = ttl);
        let found = self.get(conn).await?;
        let now = Instant::now();
        match (self.state(|s| s.view.standing(ttl, now)), found) {
            (Standing::Held { holder, until }, None) => Ok(Campaign::Waiting {
                previous: Some(Holder {
                    identity: holder,
                    fencing_token: 0,
                    term_id: TermId::new(format!("{TERM_PREFIX}(deleted)")),
                    revision: None,
                    expires_in: None,
                }),
                retry_after: until - now,
                why: WaitReason::PreviousTerm,
            }),
            (Standing::Held { .. }, Some(e)) => Ok(Campaign::Following(holder_of(&e))),
            (Standing::Free, found) => self.take(conn, found, identity, ttl).await,
        }
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let conn = self.conn().await?;
        let Some(mut ours) = self.ours(term) else {
            return Ok(Renewal::Lost(LostReason::KeyOverwritten));
        };
        let mut base = ours.object.clone();
        for _ in 0..3 {
            let mut record = record_of(&ours.object);
            record.renew_time = Some(now_seconds());
            record.lease_duration_seconds = duration_secs(term.granted);
            let next = with_record(base.clone(), &record, term_of(&ours.object));
            let changed = raw_of(&next) != raw_of(&ours.object);
            let send = Instant::now();
            match self.put(conn, &next).await? {
                Put::Written(written) => {
                    if changed {
                        ours.changed_sent = send;
                    }
                    ours.object = *written;
                    let left = term.ttl.saturating_sub(send - ours.changed_sent);
                    self.state(|s| s.ours = Some(ours));
                    return Ok(Renewal::Renewed {
                        ttl: left,
                        servers: None,
                    });
                }
                Put::Gone => return Ok(Renewal::Lost(LostReason::KeyDeleted)),
                Put::Conflict => match self.after_conflict(conn, &ours).await? {
                    Ok(now) => base = now,
                    Err(lost) => return Ok(Renewal::Lost(lost)),
                },
            }
        }
        Err(BackendError::Server {
            backend: ABOUT,
            source: format!(
                "endpoints {}: 3 updates in a row answered 409 Conflict",
                self.name
            )
            .into(),
        })
    }

    /// The old image's lock has no registry: `successor` is not written.
    async fn release(&self, term: &Term, _successor: Option<&str>) -> Result<()> {
        let conn = self.conn().await?;
        let Some(ours) = self.ours(term) else {
            return Ok(());
        };
        let mut base = ours.object.clone();
        for _ in 0..3 {
            let now = now_seconds();
            let record = Record {
                holder_identity: String::new(),
                lease_duration_seconds: 1,
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                leader_transitions: record_of(&ours.object).leader_transitions,
            };
            match self.put(conn, &with_record(base, &record, None)).await? {
                Put::Conflict => match self.after_conflict(conn, &ours).await? {
                    Ok(now) => base = now,
                    Err(_) => break,
                },
                Put::Written(_) | Put::Gone => break,
            }
        }
        self.state(|s| s.ours = None);
        Ok(())
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let conn = self.conn().await?;
        Ok(self
            .get(conn)
            .await?
            .filter(|e| !record_of(e).holder_identity.is_empty())
            .map(|e| holder_of(&e)))
    }

    /// The arrival of the last new record of `holder`'s term that a poll
    /// (this backend's watch) found; never one found by a campaign or a
    /// read.
    fn heard_at(&self, holder: &Holder) -> Option<Instant> {
        self.state(|s| {
            s.heard
                .as_ref()
                .filter(|(key, _)| key == holder.term_id.as_str())
                .map(|(_, at)| *at)
        })
    }

    /// The holder's own term: pending (its renewals see every change).
    /// Another holder: polled every renew interval until its term changes,
    /// the object goes, or its record stays unchanged for its duration.
    async fn watch(&self, seen: &Holder) -> Result<()> {
        let conn = self.conn().await?;
        let mine = self.state(|s| {
            s.ours
                .as_ref()
                .is_some_and(|o| o.key == seen.term_id.as_str())
        });
        if mine {
            return std::future::pending().await;
        }
        let ttl = self.state(|s| s.ttl);
        self.poll(conn, seen, ttl).await
    }
}
