//! This sidecar's sight of the coordination Leases: every version it read
//! or was sent by its watch, and when it first saw each holder's stamp.
//!
//! The API server never expires anything, and wall clocks may differ, so a
//! holder (a stamp: token + write time) is live until this sidecar has seen
//! it unchanged for its TTL, measured on the monotonic clock from its first
//! sight (client-go's `observedTime`, per holder). Its first sight comes
//! after its write, and the holder counts its TTL from before its write, so
//! no sidecar judges a holder expired before the holder's promise ends.
//!
//! A holder that vanishes from a newer version without being listed as
//! released (a hand edit of the annotation, or the deletion of the object)
//! is a **ghost**: it stays live here until its TTL ends by this sidecar's
//! sight, so an edit or a deletion by a third party never lets a second
//! holder in while the first may still act. Versions are applied in
//! `resourceVersion` order; an older one (a read answered after a newer
//! watch event) is ignored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::names::NAME_ANNOTATION;
use super::state::{Entry, Stored, fencing_of, stored_of};

/// What is known of one object.
#[derive(Default)]
struct Obj {
    /// The newest version seen; `None` when absent (or never seen).
    lease: Option<Lease>,
    /// Its state (empty when absent or not ours).
    stored: Stored,
    /// First sight of each stamp still live or recent.
    first: HashMap<(String, u64), Instant>,
    /// Holders that vanished without a release (see the module docs).
    ghosts: Vec<Entry>,
    /// The highest fencing counter seen, kept across a deletion.
    top: u64,
}

/// A snapshot of one object, for a decision at `now`.
#[derive(Clone, Debug, Default)]
pub struct Sight {
    /// The newest version seen; `None`: absent or never seen.
    pub lease: Option<Lease>,
    /// Live holders by this sidecar's sight, ghosts included.
    pub live: Vec<Entry>,
    /// Holders whose TTL ended by this sidecar's sight.
    pub expired: Vec<String>,
    /// A lock's fair waiters live by this sidecar's sight, in arrival order.
    pub queue: Vec<Entry>,
    /// A read-write lock's writer intent, when live by this sidecar's sight.
    pub intent: Option<Entry>,
    /// Whether a job's completion is still remembered.
    pub done_live: bool,
    /// The highest fencing counter seen for the object.
    pub top: u64,
    /// When the next live holder (or ghost, or waiter, or writer intent)
    /// expires by this sidecar's sight.
    pub next_expiry: Option<Instant>,
}

/// The sight of every coordination object, and the waiters on each.
#[derive(Default)]
pub struct Book {
    objs: Mutex<HashMap<String, Obj>>,
    notices: Mutex<HashMap<String, Arc<Notify>>>,
}

fn newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => a != b,
    }
}

fn rv(l: &Lease) -> &str {
    l.metadata.resource_version.as_deref().unwrap_or("")
}

/// The state of `lease` whatever name it stands for (empty when unusable).
fn raw_state(lease: &Lease) -> Stored {
    let name = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NAME_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    stored_of(lease, &name).unwrap_or_default()
}

impl Obj {
    fn live_at(&self, e: &Entry, now: Instant) -> bool {
        self.first
            .get(&e.stamp())
            .is_none_or(|seen| now < *seen + e.ttl())
    }

    /// Holders and ghosts live at `now`.
    fn live(&self, now: Instant) -> Vec<Entry> {
        let ghosts = self.ghosts.iter();
        self.stored
            .holders
            .iter()
            .chain(ghosts)
            .filter(|e| self.live_at(e, now))
            .cloned()
            .collect()
    }

    /// Move to `lease` (`None`: gone), seen at `now`.
    fn apply(&mut self, lease: Option<Lease>, now: Instant) {
        let next = lease.as_ref().map(raw_state).unwrap_or_default();
        let mut ghosts: Vec<Entry> = self
            .live(now)
            .into_iter()
            .filter(|e| !next.names(&e.token))
            .collect();
        ghosts.dedup_by(|a, b| a.token == b.token);
        self.top = self.top.max(lease.as_ref().map_or(0, fencing_of));
        let mut first = HashMap::new();
        let entries = (next.holders.iter().chain(&next.queue))
            .chain(next.intent.as_deref())
            .chain(&next.done);
        for e in entries.chain(&ghosts) {
            let seen = self.first.get(&e.stamp()).copied().unwrap_or(now);
            first.insert(e.stamp(), seen);
        }
        self.first = first;
        self.ghosts = ghosts;
        self.stored = next;
        self.lease = lease;
    }
}

impl Book {
    /// Record `lease` (a read's answer or a watch event) seen now; ignored
    /// when an equal or newer version was seen. Wakes the object's waiters.
    pub fn seen(&self, object: &str, lease: &Lease) {
        let mut objs = self.objs.lock().unwrap_or_else(|e| e.into_inner());
        let obj = objs.entry(object.to_owned()).or_default();
        if obj.lease.as_ref().is_some_and(|l| !newer(rv(lease), rv(l))) {
            return;
        }
        obj.apply(Some(lease.clone()), Instant::now());
        drop(objs);
        self.wake(object);
    }

    /// Record that `object` is gone (deleted at version `at`, when a watch
    /// says so; a read that found nothing gives none).
    pub fn gone(&self, object: &str, at: Option<&str>) {
        let mut objs = self.objs.lock().unwrap_or_else(|e| e.into_inner());
        let obj = objs.entry(object.to_owned()).or_default();
        match (&obj.lease, at) {
            (None, _) => return,
            (Some(l), Some(at)) if !newer(at, rv(l)) => return,
            _ => {}
        }
        obj.apply(None, Instant::now());
        drop(objs);
        self.wake(object);
    }

    /// Forget everything of objects not in `present` (a fresh list): they
    /// were deleted while the watch was away.
    pub fn keep_only(&self, present: &std::collections::HashSet<String>) {
        let names: Vec<String> = {
            let objs = self.objs.lock().unwrap_or_else(|e| e.into_inner());
            objs.iter()
                .filter(|(n, o)| o.lease.is_some() && !present.contains(*n))
                .map(|(n, _)| n.clone())
                .collect()
        };
        for n in names {
            self.gone(&n, None);
        }
    }

    /// What is known of `object` at `now`.
    pub fn sight(&self, object: &str, now: Instant) -> Sight {
        let objs = self.objs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(obj) = objs.get(object) else {
            return Sight::default();
        };
        let live = obj.live(now);
        let expired = obj
            .stored
            .holders
            .iter()
            .filter(|e| !obj.live_at(e, now))
            .map(|e| e.token.clone())
            .collect();
        let until = |e: &Entry| obj.first.get(&e.stamp()).map(|s| *s + e.ttl());
        let queue: Vec<Entry> = (obj.stored.queue.iter())
            .filter(|e| obj.live_at(e, now))
            .cloned()
            .collect();
        let intent = (obj.stored.intent.as_deref())
            .filter(|e| obj.live_at(e, now))
            .cloned();
        Sight {
            lease: obj.lease.clone(),
            next_expiry: (live.iter().chain(&queue).chain(&intent))
                .filter_map(until)
                .min(),
            live,
            queue,
            intent,
            expired,
            done_live: obj
                .stored
                .done
                .as_ref()
                .is_some_and(|d| obj.live_at(d, now)),
            top: obj.top,
        }
    }

    /// Completed jobs whose retention ended by this sidecar's sight, with
    /// their versions (for a delete with a precondition).
    pub fn done_expired(&self, now: Instant) -> Vec<(String, String)> {
        let objs = self.objs.lock().unwrap_or_else(|e| e.into_inner());
        objs.iter()
            .filter_map(|(n, o)| {
                let d = o.stored.done.as_ref()?;
                let l = o.lease.as_ref()?;
                (o.stored.holders.is_empty() && !o.live_at(d, now))
                    .then(|| (n.clone(), rv(l).to_owned()))
            })
            .collect()
    }

    /// The wake-up of `object`'s waiters.
    pub fn notice(&self, object: &str) -> Arc<Notify> {
        let mut n = self.notices.lock().unwrap_or_else(|e| e.into_inner());
        if n.len() > 10_000 {
            n.retain(|_, v| Arc::strong_count(v) > 1);
        }
        n.entry(object.to_owned())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    fn wake(&self, object: &str) {
        let n = self.notices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = n.get(object) {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
