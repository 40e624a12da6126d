//! Following the candidate registry: one LIST, then one watch of the
//! records' label selector whose events keep a copy of the records
//! (`Marks::records`), so a leader at rest sends nothing but that watch —
//! no LIST per lease duration (issue 37 item 6).
//!
//! The copy is trusted only while a watch is attached: either a
//! [`follow_candidates`](KubeLeaseBackend::follow_candidates) call is
//! polling it right now, or the last call returned on a change and left
//! the open stream behind for the next call (events that arrived since are
//! applied before the copy is read). A follow call that is dropped (the
//! leader lost its term) or ends in an error closes the watch, and the
//! next read of the registry is a LIST again. A 410 (the version was
//! compacted) forgets the copy: the next read lists afresh.
//!
//! Staleness: a watch the server keeps open but silent delays what the
//! copy shows until the server's timeout (`WATCH_TIMEOUT_SECS`); the
//! registry is a hint for choosing a successor and for preemption, never
//! a guard of the term, so that is a liveness cost only.

use std::collections::BTreeMap;

use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, WatchEvent, WatchParams};

use super::candidates::{candidate_selector, listed};
use super::*;
use crate::backend::candidates::Listed;

/// An open watch of the records, left between follow calls.
pub(super) type Events = BoxStream<'static, kube::Result<WatchEvent<Lease>>>;

/// What one watch event did to the copy.
enum Applied {
    /// A record was written or deleted: the caller judges again.
    Changed,
    /// A bookmark: only the resume version moved.
    Moved,
    /// 410: the copy is forgotten; the next read lists.
    Forgotten,
}

impl KubeLeaseBackend {
    /// The election's records: the watched copy when a watch is attached,
    /// else one LIST by label (which also starts the copy).
    pub(super) async fn list_candidates(&self) -> Result<Vec<Listed>> {
        let conn = self.conn().await?;
        if let Ok(mut held) = self.registry_watch.try_lock() {
            // Not being polled: apply what already arrived, if a watch was
            // left open; without one, nothing keeps the copy current.
            let mut open = held.is_some();
            while let Some(events) = held.as_mut() {
                let Some(Some(ev)) = events.next().now_or_never() else {
                    break;
                };
                if !matches!(
                    self.apply_registry(conn, ev),
                    Ok(Applied::Changed | Applied::Moved)
                ) {
                    *held = None;
                    open = false;
                }
            }
            if !open {
                drop(held);
                return self.list_registry().await;
            }
        }
        let copy = self.marks(|m| {
            m.records
                .as_ref()
                .map(|r| r.values().filter_map(listed).collect())
        });
        match copy {
            Some(records) => Ok(records),
            None => self.list_registry().await,
        }
    }

    /// Resolve at the first record written, renewed or deleted after the
    /// previous call (the first call: after the LIST that started the
    /// copy). A 410 resolves too (the next read lists afresh). On a change
    /// the open watch is kept for the next call.
    ///
    /// # Errors
    /// A transport error or an API status other than 410; the watch is
    /// closed.
    pub(super) async fn follow_candidates(&self) -> Result<()> {
        let conn = self.conn().await?;
        let mut held = self.registry_watch.lock().await;
        // Taken out: dropped with this future if it is cancelled.
        let mut events = match held.take() {
            Some(events) => events,
            None => match self.open_registry_watch().await? {
                Some(events) => events,
                None => return Ok(()),
            },
        };
        loop {
            match events.next().await {
                Some(ev) => match self.apply_registry(conn, ev)? {
                    Applied::Changed => {
                        *held = Some(events);
                        return Ok(());
                    }
                    Applied::Moved => {}
                    Applied::Forgotten => return Ok(()),
                },
                // The server's timeout ended the watch: reopen where it was.
                None => match self.open_registry_watch().await? {
                    Some(next) => events = next,
                    None => return Ok(()),
                },
            }
        }
    }

    /// A watch from the copy's version (a LIST first when there is no
    /// copy); `None` on a 410, with the copy forgotten.
    async fn open_registry_watch(&self) -> Result<Option<Events>> {
        let conn = self.conn().await?;
        let rv = match self.marks(|m| m.candidates.clone()) {
            Some(rv) => rv,
            None => {
                self.list_registry().await?;
                self.marks(|m| m.candidates.clone()).unwrap_or_default()
            }
        };
        let params = WatchParams::default()
            .labels(&candidate_selector(&self.name))
            .timeout(WATCH_TIMEOUT_SECS);
        match conn.api.watch(&params, &rv).await {
            Ok(stream) => Ok(Some(stream.boxed())),
            Err(kube::Error::Api(s)) if s.code == 410 => {
                self.forget_registry();
                Ok(None)
            }
            Err(e) => Err(self.classify(conn, "watch", e)),
        }
    }

    /// One LIST of the records by label: the copy and its version.
    async fn list_registry(&self) -> Result<Vec<Listed>> {
        let conn = self.conn().await?;
        let params = ListParams::default().labels(&candidate_selector(&self.name));
        let list = match conn.api.list(&params).await {
            Ok(list) => list,
            Err(e) => return Err(self.classify(conn, "list", e)),
        };
        let records: BTreeMap<String, Lease> = list
            .items
            .into_iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, l)))
            .collect();
        let out = records.values().filter_map(listed).collect();
        let rv = list.metadata.resource_version.unwrap_or_default();
        self.marks(|m| {
            m.candidates = Some(rv);
            m.records = Some(records);
        });
        Ok(out)
    }

    /// One LIST of the records by label, the copy untouched (a watch
    /// attached to it may still deliver events older than this list).
    pub(super) async fn list_registry_now(&self) -> Result<Vec<Listed>> {
        let conn = self.conn().await?;
        let params = ListParams::default().labels(&candidate_selector(&self.name));
        match conn.api.list(&params).await {
            Ok(list) => Ok(list.items.iter().filter_map(listed).collect()),
            Err(e) => Err(self.classify(conn, "list", e)),
        }
    }

    fn forget_registry(&self) {
        self.marks(|m| {
            m.candidates = None;
            m.records = None;
        });
    }

    /// Apply one event of the registry watch to the copy.
    fn apply_registry(&self, conn: &Conn, ev: kube::Result<WatchEvent<Lease>>) -> Result<Applied> {
        let (lease, gone) = match ev {
            Ok(WatchEvent::Added(l) | WatchEvent::Modified(l)) => (l, false),
            Ok(WatchEvent::Deleted(l)) => (l, true),
            Ok(WatchEvent::Bookmark(b)) => {
                let rv = b.metadata.resource_version;
                self.marks(|m| m.candidates = Some(rv));
                return Ok(Applied::Moved);
            }
            Ok(WatchEvent::Error(s)) if s.code == 410 => {
                self.forget_registry();
                return Ok(Applied::Forgotten);
            }
            Ok(WatchEvent::Error(s)) => {
                return Err(self.classify(conn, "watch", kube::Error::Api(s)));
            }
            Err(e) => return Err(self.classify(conn, "watch", e)),
        };
        let rv = rv_of(&lease).to_owned();
        let name = lease.metadata.name.clone().unwrap_or_default();
        self.marks(|m| {
            m.candidates = Some(rv);
            if let Some(records) = m.records.as_mut() {
                if gone {
                    records.remove(&name);
                } else {
                    records.insert(name, lease);
                }
            }
        });
        Ok(Applied::Changed)
    }
}
