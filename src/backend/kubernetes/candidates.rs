//! The candidate registry on Leases: one Lease per candidate,
//! `<election>-candidate-<suffix>`, in the shape of Coordinated Leader
//! Election's LeaseCandidate (which a v1.36 API server serves only behind
//! a feature gate, so a plain Lease): `spec.holderIdentity` is the
//! identity, `leaseDurationSeconds` the record's TTL and `renewTime` its
//! last renewal; priority, revision and readiness are annotations
//! ([`PRIORITY_ANNOTATION`], [`REVISION_ANNOTATION`], [`READY_ANNOTATION`]).
//! Labels [`ELECTION_LABEL`] and [`ROLE_LABEL`] select them in one LIST.
//!
//! Names and label values must be valid whatever the identity and the
//! election name: [`candidate_suffix`] and [`election_label_value`] keep
//! a readable prefix and add a hash of the exact text.
//!
//! The record is written by a compare-and-swap on the version this process
//! last wrote (one PUT per renewal); a conflict or an absence (a record
//! deleted by hand) is answered by one read and one write. The API server
//! never expires it: a reader judges it lapsed by `renewTime` + duration on
//! its own wall clock (it is only a hint, see `backend::candidates`).
//!
//! A leader follows the registry by one watch of the records' label
//! selector (`registry_watch`), which keeps a copy of the records: at rest
//! it sends nothing but that watch, and reads no LIST.

use std::hash::Hasher;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DeleteParams;
use std::collections::BTreeMap;

use super::verbs::post_params;
use super::*;
use crate::backend::candidates::{Candidate, Listed};

/// Label naming the election a candidate Lease belongs to (its value: the
/// election, or a hashed rendering of a long one, `election_label_value`).
pub const ELECTION_LABEL: &str = "leader-elector.io/election";
/// Label marking a Lease as a candidate record (value `candidate`).
pub const ROLE_LABEL: &str = "leader-elector.io/role";
/// Annotation: until when the candidate is frozen, in ms since the Unix
/// epoch (absent: not frozen).
pub const FROZEN_UNTIL_ANNOTATION: &str = "leader-elector.io/frozen-until-ms";
/// The annotation holding a candidate's `--preempt-after` in ms
/// (election-wide: the leader's counts).
pub const PREEMPT_AFTER_ANNOTATION: &str = "leader-elector.io/preempt-after-ms";

/// Annotation: the candidate's priority (a decimal number).
pub const PRIORITY_ANNOTATION: &str = "leader-elector.io/priority";
/// Annotation: the revision the candidate runs (may be empty).
pub const REVISION_ANNOTATION: &str = "leader-elector.io/revision";
/// Annotation: `true` when the candidate may lead now, else `false`.
pub const READY_ANNOTATION: &str = "leader-elector.io/ready";

/// Annotation: when the candidate first wrote its record, in ms since the
/// Unix epoch by its own wall clock. The API server's `creationTimestamp`
/// has whole seconds (RFC 3339 without a fraction), so two records created
/// within one second tie by it; within that second this annotation orders
/// them (see [`created_ms`]).
pub const CREATED_MS_ANNOTATION: &str = "leader-elector.io/created-ms";

/// Longest readable part of a rendered name or label value.
const READABLE: usize = 40;

/// FNV-1a (64 bits) of `text`, as 16 hex digits.
fn hash16(text: &str) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(text.as_bytes());
    format!("{:016x}", h.finish())
}

/// `text` lowercased with every character but `a-z`, `0-9` and `-`
/// replaced by `-`, cut to [`READABLE`] characters, without `-` at the ends.
fn readable(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(READABLE)
        .collect();
    mapped.trim_matches('-').to_owned()
}

/// The name suffix of `identity`'s record: `<readable>-<hash>`, where the
/// readable part is [`readable`] and the hash is 16 hex digits of the
/// 64-bit FNV-1a hash of the exact identity. Always a valid DNS-1123
/// label; two identities collide only if both parts are equal.
pub fn candidate_suffix(identity: &str) -> String {
    match readable(identity) {
        r if r.is_empty() => hash16(identity),
        r => format!("{r}-{}", hash16(identity)),
    }
}

/// The [`ELECTION_LABEL`] value of `election`: itself when it is a valid
/// label value (at most 63 characters of `a-z`, `0-9`, `-`, `.`, alphanumeric
/// at both ends), else [`candidate_suffix`] of it (at most 57 characters).
pub fn election_label_value(election: &str) -> String {
    let valid = election.len() <= 63
        && election
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && election.starts_with(|c: char| c.is_ascii_alphanumeric())
        && election.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        election.to_owned()
    } else {
        candidate_suffix(election)
    }
}

/// The Lease name of `identity`'s record in `election`; when the election
/// name leaves no room (253 characters), its label value stands for it.
pub fn candidate_lease_name(election: &str, identity: &str) -> String {
    let name = format!("{election}-candidate-{}", candidate_suffix(identity));
    if name.len() <= 253 {
        name
    } else {
        format!(
            "{}-candidate-{}",
            election_label_value(election),
            candidate_suffix(identity)
        )
    }
}

/// The label selector of `election`'s candidate records.
pub fn candidate_selector(election: &str) -> String {
    format!(
        "{ELECTION_LABEL}={},{ROLE_LABEL}=candidate",
        election_label_value(election)
    )
}

/// `candidate`'s record in `election` for `ttl`, renewed now, at version
/// `rv` (`None`: a create), first written at `born` (ms since the Unix
/// epoch, [`CREATED_MS_ANNOTATION`]).
fn record(
    election: &str,
    namespace: &str,
    candidate: &Candidate,
    ttl: Duration,
    rv: Option<String>,
    born: u64,
) -> Lease {
    let labels = BTreeMap::from([
        (ELECTION_LABEL.to_owned(), election_label_value(election)),
        (ROLE_LABEL.to_owned(), "candidate".to_owned()),
    ]);
    let mut annotations = BTreeMap::from([
        (
            PRIORITY_ANNOTATION.to_owned(),
            candidate.priority.to_string(),
        ),
        (REVISION_ANNOTATION.to_owned(), candidate.revision.clone()),
        (READY_ANNOTATION.to_owned(), candidate.ready.to_string()),
        (CREATED_MS_ANNOTATION.to_owned(), born.to_string()),
    ]);
    if let Some(t) = candidate.frozen_until {
        let ms = crate::backend::candidates::unix_ms(t).to_string();
        annotations.insert(FROZEN_UNTIL_ANNOTATION.to_owned(), ms);
    }
    if let Some(d) = candidate.preempt_after {
        let ms = d.as_millis().to_string();
        annotations.insert(PREEMPT_AFTER_ANNOTATION.to_owned(), ms);
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(candidate_lease_name(election, &candidate.identity)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            resource_version: rv,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(candidate.identity.clone()),
            lease_duration_seconds: Some(lease_duration_secs(ttl)),
            renew_time: Some(now_micro()),
            ..LeaseSpec::default()
        }),
    }
}

/// A record as listed, its age by this machine's wall clock.
pub(super) fn listed(lease: &Lease) -> Option<Listed> {
    let labels = lease.metadata.labels.as_ref()?;
    if labels.get(ROLE_LABEL).map(String::as_str) != Some("candidate") {
        return None;
    }
    let spec = lease.spec.as_ref()?;
    let identity = spec.holder_identity.clone().filter(|i| !i.is_empty())?;
    let notes = lease.metadata.annotations.clone().unwrap_or_default();
    let note = |k: &str| notes.get(k).map(|v| v.trim().to_owned());
    let age = spec.renew_time.as_ref().map(|t| {
        let ms = k8s_openapi::jiff::Timestamp::now()
            .duration_since(t.0)
            .as_millis()
            .max(0);
        Duration::from_millis(ms as u64)
    });
    Some(Listed {
        candidate: Candidate {
            identity,
            priority: note(PRIORITY_ANNOTATION)
                .and_then(|p| p.parse().ok())
                .unwrap_or(crate::backend::candidates::DEFAULT_PRIORITY),
            revision: note(REVISION_ANNOTATION).unwrap_or_default(),
            ready: note(READY_ANNOTATION).is_none_or(|r| r == "true"),
            frozen_until: note(FROZEN_UNTIL_ANNOTATION)
                .and_then(|v| v.parse().ok())
                .map(crate::backend::candidates::from_unix_ms),
            preempt_after: note(PREEMPT_AFTER_ANNOTATION)
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
        },
        age,
        ttl: duration_of(lease, Duration::from_secs(1)),
        created: created_ms(lease),
        written_ago: None,
    })
}

/// The record's place in the order of creation, in ms: the server's
/// `creationTimestamp` (whole seconds), refined within that second by the
/// writer's [`CREATED_MS_ANNOTATION`], which is clamped into the second so
/// that a skewed clock, an edited annotation or a record re-created after a
/// deletion never reorders records the server's seconds tell apart.
fn created_ms(lease: &Lease) -> Option<u64> {
    let server = lease.metadata.creation_timestamp.as_ref()?;
    let server = server.0.as_millisecond().max(0) as u64;
    let own = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CREATED_MS_ANNOTATION))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let second = server - server % 1000;
    Some(own.map_or(server, |ms| ms.clamp(second, second + 999).max(server)))
}

impl KubeLeaseBackend {
    fn registry_rv(&self) -> Option<String> {
        self.registry_rv.lock().expect("registry poisoned").clone()
    }

    fn set_registry_rv(&self, rv: Option<String>) {
        *self.registry_rv.lock().expect("registry poisoned") = rv;
    }

    /// Write `candidate`'s record: a PUT at the version we last wrote, a
    /// POST when we wrote none; a 409 or 404 is answered by one GET and
    /// one more write.
    pub(super) async fn publish(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        let conn = self.conn().await?;
        let name = candidate_lease_name(&self.name, &candidate.identity);
        let mut rv = self.registry_rv();
        let born = *self
            .registry_born
            .get_or_init(|| crate::backend::candidates::unix_ms(std::time::SystemTime::now()));
        for _ in 0..2 {
            let lease = record(
                &self.name,
                &conn.namespace,
                candidate,
                ttl,
                rv.clone(),
                born,
            );
            let written = match &rv {
                Some(_) => conn.api.replace(&name, &post_params(), &lease).await,
                None => conn.api.create(&post_params(), &lease).await,
            };
            match written {
                Ok(w) => {
                    self.set_registry_rv(w.metadata.resource_version);
                    return Ok(());
                }
                Err(e)
                    if Self::is_conflict(&e)
                        || matches!(&e, kube::Error::Api(s) if s.code == 404) =>
                {
                    rv = match conn.api.get_opt(&name).await {
                        Ok(found) => found.and_then(|l| l.metadata.resource_version),
                        Err(e) => return Err(self.classify(conn, "get", e)),
                    };
                }
                Err(e) => {
                    return Err(self.classify(
                        conn,
                        if rv.is_some() { "update" } else { "create" },
                        e,
                    ));
                }
            }
        }
        Err(self.contended(conn))
    }

    /// Delete `identity`'s record; gone already is fine.
    pub(super) async fn withdraw(&self, identity: &str) -> Result<()> {
        let conn = self.conn().await?;
        let name = candidate_lease_name(&self.name, identity);
        self.set_registry_rv(None);
        match conn.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.classify(conn, "delete", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_valid_and_distinct() {
        let a = candidate_suffix("pod-a");
        assert!(a.starts_with("pod-a-") && a.len() == 6 + 16, "{a}");
        // Same readable part, different identities: different names.
        assert_ne!(candidate_suffix("Pod_A"), candidate_suffix("pod-a"));
        assert_ne!(candidate_suffix("pod.a"), candidate_suffix("pod-a"));
        let long = "x".repeat(300);
        assert!(candidate_suffix(&long).len() <= 57);
        assert_eq!(candidate_suffix("__").len(), 16);
        assert_eq!(election_label_value("my-election"), "my-election");
        let hashed = election_label_value(&format!("e.{}", "a".repeat(80)));
        assert!(hashed.len() <= 63, "{hashed}");
        assert!(candidate_lease_name(&"e".repeat(250), "p").len() <= 253);
        assert_eq!(
            candidate_selector("e"),
            "leader-elector.io/election=e,leader-elector.io/role=candidate"
        );
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let mut c = Candidate::new("pod-a");
        c.priority = 7;
        c.revision = "abc".into();
        c.ready = false;
        c.preempt_after = Some(Duration::from_millis(2500));
        let lease = record("e", "ns", &c, Duration::from_secs(180), None, 1);
        let l = listed(&lease).expect("listed");
        assert_eq!(l.candidate, c);
        assert_eq!(l.ttl, Duration::from_secs(180));
        assert!(l.alive());
    }

    /// A record created at `created` (RFC 3339, as the server writes it)
    /// by a writer whose annotation says `born` ms.
    fn created(created: &str, born: Option<&str>) -> Option<u64> {
        let mut lease = record(
            "e",
            "ns",
            &Candidate::new("a"),
            Duration::from_secs(1),
            None,
            0,
        );
        let notes = lease.metadata.annotations.as_mut().unwrap();
        match born {
            Some(b) => notes.insert(CREATED_MS_ANNOTATION.to_owned(), b.to_owned()),
            None => notes.remove(CREATED_MS_ANNOTATION),
        };
        lease.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created.parse().unwrap()),
        );
        created_ms(&lease)
    }

    #[test]
    fn records_created_within_one_server_second_are_ordered_by_the_writers_ms() {
        // The server's seconds: 1_700_000_000 s.
        let at = "2023-11-14T22:13:20Z";
        let (first, second) = (
            created(at, Some("1700000000100")),
            created(at, Some("1700000000600")),
        );
        assert!(first < second, "{first:?} {second:?}");
        // No annotation (an older writer, a hand-made record): the second.
        assert_eq!(created(at, None), Some(1_700_000_000_000));
        assert_eq!(created(at, Some("junk")), Some(1_700_000_000_000));
        // A clock ahead, behind, or a record re-created after a deletion
        // (an annotation older than the record): held within the second,
        // so the server's order across seconds stands.
        assert_eq!(created(at, Some("1700000009000")), Some(1_700_000_000_999));
        assert_eq!(created(at, Some("1600000000000")), Some(1_700_000_000_000));
        let next = created("2023-11-14T22:13:21Z", Some("1"));
        assert!(next > created(at, Some("1700000009000")));
    }
}
