//! The old `leader-elector` image's lock record and what a candidate knows
//! of it: the pure half of [`super::endpoints_lock`], tested without an API
//! server.
//!
//! The record is client-go's `LeaderElectionRecord`
//! (`tools/leaderelection/resourcelock/interface.go`), stored as JSON in the
//! Endpoints annotation [`LEADER_ANNOTATION`]. Its times are RFC 3339 at
//! second precision, as `metav1.Time` serializes them.
//!
//! Rule kept here (client-go `leaderelection.go`, `tryAcquireOrRenew`): a
//! record is expired only when this process has seen it unchanged for its
//! `leaseDurationSeconds` (at least our own lease duration), counted on the
//! monotonic clock from the instant it first saw that exact record (the
//! observed time); the record's own times are never compared with a clock.
//! An empty `holderIdentity` is free at once.

use std::time::Duration;

use k8s_openapi::api::core::v1::Endpoints;
use serde::{Deserialize, Serialize};

use crate::backend::{Holder, TermId};
use tokio::time::Instant;

/// The annotation holding the record (client-go's
/// `LeaderElectionRecordAnnotationKey`).
pub const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Our per-term id beside the record: a Pod restarted under the same name
/// finds a record naming it but not this id, and waits like any follower.
/// The old image keeps other annotations when it writes, so after it takes
/// the lock this names a term that no longer holds it (the holder decides).
pub const TERM_ANNOTATION: &str = "leader-elector/endpoints-term";

/// Prefix of the term ids of Endpoints-lock holders ([`holder_key`]).
pub const TERM_PREFIX: &str = "endpoints/";

/// client-go's `LeaderElectionRecord`, field for field and in its order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The holder's identity (the Pod name); empty: released.
    #[serde(default)]
    pub holder_identity: String,
    /// How long followers wait for a change before taking, in seconds.
    #[serde(default)]
    pub lease_duration_seconds: i64,
    /// When the holder acquired the lock (RFC 3339, seconds), for humans.
    #[serde(default)]
    pub acquire_time: Option<String>,
    /// When the holder last renewed (RFC 3339, seconds), for humans.
    #[serde(default)]
    pub renew_time: Option<String>,
    /// Acquisitions by a new holder so far.
    #[serde(default)]
    pub leader_transitions: i64,
}

impl Record {
    /// The record as the annotation's value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }
}

/// Now as `metav1.Time` writes it: UTC, whole seconds (`…T15:04:05Z`).
pub fn now_seconds() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The annotation's raw value, if any.
pub fn raw_of(e: &Endpoints) -> Option<&str> {
    annotation(e, LEADER_ANNOTATION)
}

/// Our term id on the object, if any.
pub fn term_of(e: &Endpoints) -> Option<&str> {
    annotation(e, TERM_ANNOTATION)
}

fn annotation<'a>(e: &'a Endpoints, key: &str) -> Option<&'a str> {
    e.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The record on the object; a missing or unreadable annotation is an empty
/// record (client-go's reading: nobody holds it).
pub fn record_of(e: &Endpoints) -> Record {
    raw_of(e)
        .and_then(|raw| serde_json::from_str(raw).ok())
        .unwrap_or_default()
}

/// The term id of whoever holds `e` now (`endpoints/<holder>/<transitions>/<our term id or "">`):
/// it changes with every acquisition, ours or the old image's.
pub fn holder_key(e: &Endpoints) -> String {
    let r = record_of(e);
    format!(
        "{TERM_PREFIX}{}/{}/{}",
        r.holder_identity,
        r.leader_transitions,
        term_of(e).unwrap_or("")
    )
}

/// `e` with `record` and our term id (`None`: removed).
pub fn with_record(mut e: Endpoints, record: &Record, term: Option<&str>) -> Endpoints {
    let a = e.metadata.annotations.get_or_insert_with(Default::default);
    a.insert(LEADER_ANNOTATION.to_owned(), record.to_json());
    match term {
        Some(t) => a.insert(TERM_ANNOTATION.to_owned(), t.to_owned()),
        None => a.remove(TERM_ANNOTATION),
    };
    e
}

pub fn holder_of(e: &Endpoints) -> Holder {
    Holder {
        identity: record_of(e).holder_identity,
        fencing_token: 0,
        term_id: TermId::new(holder_key(e)),
        revision: None,
        expires_in: None,
    }
}

/// The last version of the object this process saw change, and when.
#[derive(Clone, Debug)]
struct Seen {
    /// The record's raw value and our term id: a change of either is a
    /// change (the old image only writes the record).
    raw: (Option<String>, Option<String>),
    record: Record,
    at: Instant,
}

/// What a candidate found the lock to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The object is absent or its record is free or expired: take it.
    Free,
    /// Someone's record (or a deleted object's last record) may still run
    /// until `until`.
    Held {
        /// The holder identity.
        holder: String,
        /// The end of its term as far as this process can tell.
        until: Instant,
    },
}

/// Everything this process knows of the lock: the last change seen.
#[derive(Debug, Default)]
pub struct LockView {
    seen: Option<Seen>,
}

impl LockView {
    /// The object was read (or written) at `now`; `None`: it is absent. A
    /// record not seen before starts its silence clock now.
    pub fn observe(&mut self, e: Option<&Endpoints>, now: Instant) {
        let Some(e) = e else {
            // Absent: keep the last record, its holder's term may still run.
            return;
        };
        let raw = (raw_of(e).map(str::to_owned), term_of(e).map(str::to_owned));
        if self.seen.as_ref().is_some_and(|s| s.raw == raw) {
            return;
        }
        self.seen = Some(Seen {
            record: record_of(e),
            raw,
            at: now,
        });
    }

    /// When the last change was first seen, if any.
    pub fn changed_at(&self) -> Option<Instant> {
        self.seen.as_ref().map(|s| s.at)
    }

    /// What the lock is at `now` for a candidate whose own lease duration
    /// is `ttl` (the least any record is waited for).
    pub fn standing(&self, ttl: Duration, now: Instant) -> Standing {
        let Some(s) = &self.seen else {
            return Standing::Free;
        };
        if s.record.holder_identity.is_empty() {
            return Standing::Free;
        }
        let declared = Duration::from_secs(s.record.lease_duration_seconds.max(0) as u64);
        let until = s.at + declared.max(ttl);
        if now >= until {
            Standing::Free
        } else {
            Standing::Held {
                holder: s.record.holder_identity.clone(),
                until,
            }
        }
    }
}

/// Whole seconds, rounded up, at least 1: followers wait at least what we
/// claim.
pub fn duration_secs(ttl: Duration) -> i64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn with(record: &Record, term: Option<&str>) -> Endpoints {
        let mut a = std::collections::BTreeMap::new();
        a.insert(LEADER_ANNOTATION.to_owned(), record.to_json());
        if let Some(t) = term {
            a.insert(TERM_ANNOTATION.to_owned(), t.to_owned());
        }
        Endpoints {
            metadata: ObjectMeta {
                annotations: Some(a),
                ..ObjectMeta::default()
            },
            ..Endpoints::default()
        }
    }

    fn held(holder: &str, secs: i64, renew: &str) -> Record {
        Record {
            holder_identity: holder.into(),
            lease_duration_seconds: secs,
            acquire_time: Some("2026-01-01T00:00:00Z".into()),
            renew_time: Some(renew.into()),
            leader_transitions: 3,
        }
    }

    #[test]
    fn the_record_is_client_gos_json() {
        let r = held("pod-a", 10, "2026-01-01T00:00:05Z");
        assert_eq!(
            r.to_json(),
            r#"{"holderIdentity":"pod-a","leaseDurationSeconds":10,"acquireTime":"2026-01-01T00:00:00Z","renewTime":"2026-01-01T00:00:05Z","leaderTransitions":3}"#
        );
        // What client-go writes on release, and fields it may add.
        let back: Record = serde_json::from_str(
            r#"{"holderIdentity":"","leaseDurationSeconds":1,"acquireTime":null,"renewTime":null,"leaderTransitions":4,"strategy":"x"}"#,
        )
        .unwrap();
        assert!(back.holder_identity.is_empty());
        assert_eq!(back.leader_transitions, 4);
        let now = now_seconds();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.ends_with('Z') && !now.contains('.'), "{now}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_expires_only_after_its_duration_unchanged() {
        let ttl = Duration::from_secs(2);
        let mut v = LockView::default();
        assert_eq!(v.standing(ttl, Instant::now()), Standing::Free);
        let t0 = Instant::now();
        v.observe(Some(&with(&held("old", 10, "T1"), None)), t0);
        assert!(matches!(
            v.standing(ttl, t0 + Duration::from_secs(9)),
            Standing::Held { .. }
        ));
        // The same record read again does not restart the clock.
        v.observe(
            Some(&with(&held("old", 10, "T1"), None)),
            t0 + Duration::from_secs(5),
        );
        assert_eq!(
            v.standing(ttl, t0 + Duration::from_secs(10)),
            Standing::Free
        );
        // A renewal does.
        let t1 = t0 + Duration::from_secs(6);
        v.observe(Some(&with(&held("old", 10, "T2"), None)), t1);
        assert!(matches!(
            v.standing(ttl, t0 + Duration::from_secs(10)),
            Standing::Held { .. }
        ));
        assert_eq!(
            v.standing(ttl, t1 + Duration::from_secs(10)),
            Standing::Free
        );
        // A deletion keeps the last record's promise.
        v.observe(None, t1 + Duration::from_secs(1));
        assert!(matches!(
            v.standing(ttl, t1 + Duration::from_secs(9)),
            Standing::Held { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn our_longer_duration_wins_and_an_empty_holder_is_free() {
        let ttl = Duration::from_secs(15);
        let mut v = LockView::default();
        let t0 = Instant::now();
        v.observe(Some(&with(&held("old", 1, "T1"), None)), t0);
        assert!(matches!(
            v.standing(ttl, t0 + Duration::from_secs(14)),
            Standing::Held { .. }
        ));
        v.observe(
            Some(&with(&held("", 1, "T2"), None)),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(v.standing(ttl, t0 + Duration::from_secs(1)), Standing::Free);
        // A new term id beside the same record is a change too.
        let r = held("pod-a", 2, "T3");
        v.observe(Some(&with(&r, Some("a"))), t0 + Duration::from_secs(2));
        v.observe(Some(&with(&r, Some("b"))), t0 + Duration::from_secs(16));
        assert!(matches!(
            v.standing(ttl, t0 + Duration::from_secs(30)),
            Standing::Held { .. }
        ));
        assert_eq!(duration_secs(Duration::from_millis(1500)), 2);
        assert_eq!(duration_secs(Duration::from_millis(10)), 1);
    }
}
