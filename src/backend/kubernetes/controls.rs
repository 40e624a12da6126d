//! Operator controls on the election Lease itself, as annotations
//! ([`PAUSED_ANNOTATION`], [`SWITCHOVER_ANNOTATION`]), so one object and
//! one compare-and-swap order a pause against every campaign (the rule is
//! `view::controls`).
//!
//! - Reading them is a GET of the Lease; an absent Lease has none set.
//! - Setting one is a read-modify-write of that annotation alone by CAS on
//!   the version read: the holder, duration, fencing token and every other
//!   annotation and field are written back as read. A 409 re-reads and
//!   tries again ([`CONTROL_TRIES`] times). An absent Lease is created
//!   without a holder, carrying the annotation and a fencing token seeded
//!   as a campaign's create seeds it (so tokens still grow past a Lease
//!   deleted by hand); candidates treat a holder cleared by anyone but its
//!   holder as held for a duration, so such a Lease is taken only after it.
//! - Following them is a watch of the Lease by name, resumed between calls
//!   from the last version delivered; a 410 relists.

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, WatchEvent, WatchParams};

use super::verbs::{Cas, post_params};
use super::view::{controls_of, with_note};
use super::*;
use crate::backend::controls::Controls;

/// How many read-modify-writes of a control may lose their CAS in a row.
const CONTROL_TRIES: usize = 5;

/// Where this backend's watches of other objects than the election term
/// resume between calls.
#[derive(Debug, Default)]
pub(super) struct Marks {
    /// The registry watch: the version of the last event delivered (or of
    /// the LIST that started it).
    pub(super) candidates: Option<String>,
    /// The registry's records by Lease name, as of `candidates`
    /// (`registry_watch`).
    pub(super) records: Option<std::collections::BTreeMap<String, Lease>>,
    /// The controls watch: the version of the Lease (or of a LIST that
    /// found it absent) and the controls it carried.
    controls: Option<(String, Controls)>,
}

impl KubeLeaseBackend {
    pub(super) fn marks<R>(&self, f: impl FnOnce(&mut Marks) -> R) -> R {
        f(&mut self.marks.lock().expect("marks poisoned"))
    }

    /// The controls the election Lease carries now (a GET).
    pub(super) async fn read_controls(&self) -> Result<Controls> {
        let conn = self.conn().await?;
        match conn.api.get_opt(&self.name).await {
            Ok(found) => Ok(controls_of(found.as_ref())),
            Err(e) => Err(self.classify(conn, "get", e)),
        }
    }

    /// Set annotation `key` of the election Lease to `value` (`None`:
    /// remove it) by CAS, touching nothing else (module docs).
    ///
    /// # Errors
    /// Any [`BackendError`]; [`KubeLeaseError::Contended`] after
    /// [`CONTROL_TRIES`] lost races.
    pub(super) async fn set_note(&self, key: &'static str, value: Option<&str>) -> Result<()> {
        let conn = self.conn().await?;
        for _ in 0..CONTROL_TRIES {
            let found = match conn.api.get_opt(&self.name).await {
                Ok(found) => found,
                Err(e) => return Err(self.classify(conn, "get", e)),
            };
            let written = match found {
                None if value.is_none() => return Ok(()),
                None => self.create_noted(conn, key, value).await?,
                Some(mut lease) => {
                    if !with_note(&mut lease, key, value) {
                        return Ok(());
                    }
                    matches!(self.cas(conn, &lease).await?, Cas::Written(_))
                }
            };
            if written {
                return Ok(());
            }
        }
        Err(self.contended(conn))
    }

    /// Create the absent election Lease without a holder, carrying
    /// annotation `key`. `false` when someone created it first (409).
    async fn create_noted(&self, conn: &Conn, key: &str, value: Option<&str>) -> Result<bool> {
        let token = (self.view(|v| v.max_token()) + 1).max(unix_millis());
        let mut notes = std::collections::BTreeMap::new();
        notes.insert(TOKEN_ANNOTATION.to_owned(), token.to_string());
        if let Some(v) = value {
            notes.insert(key.to_owned(), v.to_owned());
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(conn.namespace.clone()),
                annotations: Some(notes),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        };
        match conn.api.create(&post_params(), &lease).await {
            Ok(created) => {
                self.observe(&created);
                Ok(true)
            }
            Err(e) if Self::is_conflict(&e) => Ok(false),
            Err(e) => Err(self.classify(conn, "create", e)),
        }
    }

    /// Resolve with the controls once they differ from `seen`: at once
    /// when the last version this backend saw already differs, else at
    /// the first watch event of the election Lease that makes them
    /// differ (a deletion: none set).
    ///
    /// # Errors
    /// A transport error or an API status other than 410; the caller reads
    /// the controls again.
    pub(super) async fn follow_controls(&self, seen: &Controls) -> Result<Controls> {
        if self.view(|v| v.may_not_list() || v.may_not_watch()) {
            // Said once by the election's own follow; no request that
            // RBAC refuses is sent again.
            return Err(BackendError::Auth {
                backend: super::ABOUT,
                source: "this sidecar may not list or watch Leases: the operator controls are read instead of watched".into(),
            });
        }
        let conn = self.conn().await?;
        let mut open = self.election_watches.subscribe();
        loop {
            if *open.borrow_and_update() > 0 {
                if let Some(now) = self.controls_from_view(seen, &mut open).await? {
                    return Ok(now);
                }
                continue;
            }
            let (rv, now) = match self.marks(|m| m.controls.clone()) {
                Some(mark) => mark,
                None => self.list_controls(conn).await?,
            };
            if now != *seen {
                return Ok(now);
            }
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", self.name))
                .timeout(WATCH_TIMEOUT_SECS);
            let stream = match conn.api.watch(&params, &rv).await {
                Ok(stream) => stream,
                Err(kube::Error::Api(s)) if s.code == 410 => {
                    self.marks(|m| m.controls = None);
                    continue;
                }
                Err(e) => return Err(self.classify(conn, "watch", e)),
            };
            futures_util::pin_mut!(stream);
            tokio::select! {
                changed = self.controls_events(conn, seen, &mut stream) => {
                    if let Some(changed) = changed? {
                        return Ok(changed);
                    }
                }
                // The election's watch opened: it serves the controls too,
                // and this one closes (one watch of the Lease at rest).
                _ = open.wait_for(|n| *n > 0) => {}
            }
        }
    }

    /// While a watch of the election Lease is open, it delivers every
    /// version to the view, which wakes this follow: once the view's
    /// controls differ from `seen`, one GET says what they are now (the
    /// view may lag a read that produced `seen`; the answer never goes
    /// back in time). `None` when that watch closed (the caller watches by
    /// itself). The mark of the controls' own watch is dropped (it is
    /// behind the view; a later watch of its own starts from a LIST).
    async fn controls_from_view(
        &self,
        seen: &Controls,
        open: &mut tokio::sync::watch::Receiver<usize>,
    ) -> Result<Option<Controls>> {
        self.marks(|m| m.controls = None);
        let mut sightings = self.sightings.subscribe();
        loop {
            sightings.borrow_and_update();
            if self.view(|v| v.controls_seen()).is_some_and(|c| c != *seen) {
                let now = self.read_controls().await?;
                if now != *seen {
                    return Ok(Some(now));
                }
            }
            tokio::select! {
                _ = sightings.changed() => {}
                _ = open.wait_for(|n| *n == 0) => return Ok(None),
            }
        }
    }

    /// Count one open watch of the election Lease until the guard drops.
    pub(super) fn election_watch_open(&self) -> OpenWatch<'_> {
        self.election_watches.send_modify(|n| *n += 1);
        OpenWatch(&self.election_watches)
    }

    /// LIST the election Lease by name: its controls and the version a
    /// watch starts from (remembered).
    async fn list_controls(&self, conn: &Conn) -> Result<(String, Controls)> {
        let params = ListParams::default().fields(&format!("metadata.name={}", self.name));
        let list = match conn.api.list(&params).await {
            Ok(list) => list,
            Err(e) => return Err(self.classify(conn, "list", e)),
        };
        let rv = list.metadata.resource_version.unwrap_or_default();
        let mark = (rv, controls_of(list.items.first()));
        self.marks(|m| m.controls = Some(mark.clone()));
        Ok(mark)
    }

    /// Deliver one open watch's events into the mark: `Some` with the
    /// controls once they differ from `seen`; `None` when the watch ended
    /// (server timeout, or 410: the mark is dropped for a relist).
    async fn controls_events<S>(
        &self,
        conn: &Conn,
        seen: &Controls,
        stream: &mut S,
    ) -> Result<Option<Controls>>
    where
        S: futures_util::Stream<Item = kube::Result<WatchEvent<Lease>>> + Unpin,
    {
        while let Some(ev) = stream.next().await {
            let (rv, now) = match ev {
                Ok(WatchEvent::Added(l) | WatchEvent::Modified(l)) => {
                    (rv_of(&l).to_owned(), controls_of(Some(&l)))
                }
                Ok(WatchEvent::Deleted(l)) => (rv_of(&l).to_owned(), Controls::default()),
                Ok(WatchEvent::Bookmark(b)) => {
                    let rv = b.metadata.resource_version;
                    self.marks(|m| m.controls.as_mut().map(|c| c.0 = rv));
                    continue;
                }
                Ok(WatchEvent::Error(s)) if s.code == 410 => {
                    self.marks(|m| m.controls = None);
                    return Ok(None);
                }
                Ok(WatchEvent::Error(s)) => {
                    return Err(self.classify(conn, "watch", kube::Error::Api(s)));
                }
                Err(e) => return Err(self.classify(conn, "watch", e)),
            };
            self.marks(|m| m.controls = Some((rv, now.clone())));
            if now != *seen {
                return Ok(Some(now));
            }
        }
        Ok(None)
    }
}

/// One open watch of the election Lease, counted until dropped.
pub(super) struct OpenWatch<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}
