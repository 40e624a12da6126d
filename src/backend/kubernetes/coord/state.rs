//! What a coordination Lease stores: the holders (lock holder, semaphore
//! permits, job claim, read-write lock readers or writer), the completion of
//! a job, the tokens released lately, a lock's fair waiters, a read-write
//! lock's waiting writer's intent, as JSON in the annotation [`STATE_ANNOTATION`]; the fencing counter in
//! the election's [`TOKEN_ANNOTATION`]. Readable parts (holder, duration,
//! renew time) are mirrored in the Lease's spec for `kubectl`, never read.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::names::{NAME_ANNOTATION, kind_label, label_value};
use crate::backend::coordination::Kind;
use crate::backend::kubernetes::{TOKEN_ANNOTATION, lease_duration_secs, now_micro, token_of};

/// Annotation holding a coordination object's `Stored` state (JSON).
pub const STATE_ANNOTATION: &str = "leader-elector.io/coordination";
/// Label saying what the object is: `lock`, `semaphore`, `job` or `rwlock`.
pub const KIND_LABEL: &str = "leader-elector.io/kind";
/// Label naming the election of the sidecar that created the object.
pub const ELECTION_LABEL: &str = "leader-elector.io/election";

/// Tokens of released holders kept in [`Stored::released`]: a holder that
/// vanishes from the state without being listed there was removed by
/// someone else, and stays live in every sidecar's eyes until its TTL ends.
const RELEASED_KEPT: usize = 32;

/// One holder (or a job's completion): who, since when, for how long.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The grant's token.
    pub token: String,
    /// The owner label.
    pub owner: String,
    /// TTL in milliseconds (a completion: the retention).
    pub ttl_ms: u64,
    /// Wall clock of the writer at the write, Unix milliseconds; with the
    /// token, the stamp whose first sight starts the TTL in each sidecar.
    pub at_ms: u64,
}

impl Entry {
    /// The stamp of this write: token and write time.
    pub fn stamp(&self) -> (String, u64) {
        (self.token.clone(), self.at_ms)
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// A coordination object's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// A semaphore's size (the size its live permits were taken with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// Holders in the order they were granted.
    #[serde(default)]
    pub holders: Vec<Entry>,
    /// A lock's fair waiters in arrival order (each kept alive by its
    /// sidecar while it waits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<Entry>,
    /// A read-write lock's waiting writer's intent: `token` is the intent's
    /// id, `owner` the writer's, `ttl_ms` the intent's TTL; it keeps new
    /// readers out while live by sight, like a holder. Boxed: rarely there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<Box<Entry>>,
    /// A job's completion, remembered for its `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<Entry>,
    /// Tokens released lately, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<String>,
}

impl Stored {
    /// Whether `token` is named anywhere (holder, completion, released).
    pub fn names(&self, token: &str) -> bool {
        self.holders.iter().any(|e| e.token == token)
            || self.queue.iter().any(|e| e.token == token)
            || self.done.as_ref().is_some_and(|d| d.token == token)
            || self.released.iter().any(|t| t == token)
    }

    /// Remove `token`'s holder and list it as released.
    pub fn release(&mut self, token: &str) {
        self.holders.retain(|e| e.token != token);
        self.released.push(token.to_owned());
        let extra = self.released.len().saturating_sub(RELEASED_KEPT);
        self.released.drain(..extra);
    }
}

/// Why a Lease's coordination state cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub enum Unusable {
    /// The object stands for another name (a hash collision, or a hand edit).
    OtherName(String),
    /// The state annotation is not ours.
    BadState(String),
}

/// The state of `lease`, which must stand for `name`. A Lease without the
/// state annotation holds nothing.
///
/// # Errors
/// [`Unusable`] when it stands for another name or its state is not ours.
pub fn stored_of(lease: &Lease, name: &str) -> Result<Stored, Unusable> {
    let ann = lease.metadata.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k));
    if let Some(n) = get(NAME_ANNOTATION)
        && n != name
    {
        return Err(Unusable::OtherName(n.clone()));
    }
    match get(STATE_ANNOTATION) {
        None => Ok(Stored::default()),
        Some(s) => serde_json::from_str(s).map_err(|e| Unusable::BadState(format!("{s:?} ({e})"))),
    }
}

/// Where an object is and what it is, for writes.
pub struct Target<'a> {
    /// Its kind.
    pub kind: Kind,
    /// The client's name (`queue/job` for jobs).
    pub name: &'a str,
    /// The object name.
    pub object: &'a str,
    /// The election of this sidecar, for the label.
    pub election: &'a str,
}

/// The Lease to write for `state` with fencing counter `fencing`: over
/// `base` (its version for the compare-and-swap, and labels and
/// annotations of others kept), or a new object.
pub fn lease_for(base: Option<&Lease>, t: &Target<'_>, state: &Stored, fencing: u64) -> Lease {
    let mut meta = base
        .map(|l| l.metadata.clone())
        .unwrap_or_else(|| ObjectMeta {
            name: Some(t.object.to_owned()),
            ..ObjectMeta::default()
        });
    meta.managed_fields = None;
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(KIND_LABEL.into(), kind_label(t.kind).into());
    labels
        .entry(ELECTION_LABEL.into())
        .or_insert_with(|| label_value(t.election));
    let ann = meta.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(NAME_ANNOTATION.into(), t.name.into());
    ann.insert(
        STATE_ANNOTATION.into(),
        serde_json::to_string(state).unwrap_or_default(),
    );
    ann.insert(TOKEN_ANNOTATION.into(), fencing.to_string());
    let owners: Vec<&str> = state.holders.iter().map(|e| e.owner.as_str()).collect();
    let longest = state.holders.iter().map(|e| e.ttl_ms).max().unwrap_or(1000);
    let spec = LeaseSpec {
        holder_identity: (!owners.is_empty()).then(|| owners.join(",")),
        lease_duration_seconds: Some(lease_duration_secs(Duration::from_millis(longest))),
        renew_time: Some(now_micro()),
        ..base.and_then(|l| l.spec.clone()).unwrap_or_default()
    };
    Lease {
        metadata: meta,
        spec: Some(spec),
    }
}

/// The fencing counter of `lease` (0 when it has none).
pub fn fencing_of(lease: &Lease) -> u64 {
    token_of(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(t: &str) -> Entry {
        Entry {
            token: t.into(),
            owner: "o".into(),
            ttl_ms: 1000,
            at_ms: 5,
        }
    }

    #[test]
    fn a_written_state_reads_back_and_names_its_object() {
        let mut st = Stored {
            permits: Some(3),
            holders: vec![entry("a"), entry("b")],
            ..Stored::default()
        };
        st.release("a");
        let t = Target {
            kind: Kind::Semaphore,
            name: "Pool",
            object: "le-sem-pool-0",
            election: "e",
        };
        let l = lease_for(None, &t, &st, 42);
        assert_eq!(stored_of(&l, "Pool"), Ok(st.clone()));
        assert_eq!(fencing_of(&l), 42);
        assert!(st.names("a") && st.names("b") && !st.names("c"));
        assert!(matches!(stored_of(&l, "pool"), Err(Unusable::OtherName(_))));
        let labels = l.metadata.labels.unwrap();
        assert_eq!(labels[KIND_LABEL], "semaphore");
        assert_eq!(labels[ELECTION_LABEL], "e");
    }

    #[test]
    fn released_tokens_are_bounded() {
        let mut st = Stored::default();
        for i in 0..100 {
            st.holders.push(entry(&i.to_string()));
            st.release(&i.to_string());
        }
        assert_eq!(st.released.len(), RELEASED_KEPT);
        assert!(st.holders.is_empty());
        assert!(st.names("99") && !st.names("0"));
    }
}
