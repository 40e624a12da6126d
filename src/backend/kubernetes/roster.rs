//! The Lease backend's failsafe roster ([`RosterStore`]).
//!
//! - **The roster** is the annotation [`ROSTER_ANNOTATION`] of the election
//!   Lease itself (JSON, [`Roster::to_json`]), so it is written in the same
//!   compare-and-swap (a PUT carrying the `resourceVersion` read) as the
//!   campaign and every renewal: the acquisition, the create of an absent
//!   Lease and each renewal carry the roster staged last. It outlives the
//!   term: a release keeps it, as every write of ours keeps annotations it
//!   does not own. Each renewal writes it again, so a hand edit is undone at
//!   the leader's next renewal.
//! - **A Lease without a roster.** An annotation anyone with `update` may
//!   remove must not let a non-member campaign while a leader it never heard
//!   of leads on through failsafe (the leader, cut from the API server, may
//!   not see the edit). So a member trusts "no roster" (anyone may campaign)
//!   only when the Lease is absent, released by its holder (the release
//!   mark), or held by a holder this process saw *renew* without a roster
//!   (two versions of its term in a row without one, `renewTime` moved: it
//!   runs without failsafe, e.g. during the rollout that turns failsafe on);
//!   a term this process ever saw carrying a roster never counts as
//!   roster-less again. Otherwise [`RosterStore::roster`] answers an error
//!   and the member does not campaign until the leader re-asserts the roster
//!   or releases the Lease. The price: a failsafe leader that crashed after
//!   its roster was removed by hand leaves the election without a leader
//!   until an operator deletes the Lease (the troubleshooting step).
//! - **Applications**: one Lease per member, `<election>-failsafe-<suffix>`
//!   (the candidate records' naming), labelled [`ELECTION_LABEL`] and
//!   [`ROLE_LABEL`]` = failsafe-member`, `holderIdentity` the identity,
//!   `leaseDurationSeconds` the application's TTL, `renewTime` its last
//!   write, the peer address in [`PEER_ADDR_ANNOTATION`]. Chosen over an
//!   annotation on the candidate records because those are written with the
//!   registry's own precondition (a second writer would make each conflict
//!   with the other), and the registry is not always on; a Lease of its own
//!   needs no verb beyond the election's. The API server never expires
//!   them: a reader drops one whose `renewTime` + duration has passed on its
//!   wall clock. Only admission reads them, which decides liveness, never
//!   safety (a member left off is refused the campaign; a dead one admitted
//!   is required until its application lapses).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams};

use super::candidates::{ELECTION_LABEL, ROLE_LABEL, candidate_suffix, election_label_value};
use super::verbs::post_params;
use super::*;
use crate::backend::roster::{Member, Roster, RosterStore};

/// Annotation of the election Lease holding the failsafe roster (JSON).
pub const ROSTER_ANNOTATION: &str = "leader-elector.io/failsafe-roster";
/// Annotation of a member's application Lease: its peer address.
pub const PEER_ADDR_ANNOTATION: &str = "leader-elector.io/peer-addr";
/// [`ROLE_LABEL`] value of an application Lease.
const MEMBER_ROLE: &str = "failsafe-member";

/// This process's roster state: what its next write carries, and what it
/// saw of the current term's roster.
#[derive(Debug, Default)]
pub(super) struct RosterState {
    /// The roster staged last (written by every campaign and renewal).
    staged: Option<Roster>,
    /// The holder of the last version seen.
    holder: String,
    /// That version's `renewTime`, and whether it carried no roster.
    renewed: Option<String>,
    bare: bool,
    /// A version of this holder's term carried a roster.
    carried: bool,
    /// This holder renewed without a roster (two bare versions in a row,
    /// `renewTime` moved).
    renews_bare: bool,
}

impl RosterState {
    /// A version of the election Lease was seen.
    fn saw(&mut self, lease: &Lease) {
        let holder = holder_of(lease);
        let has = roster_text(lease).is_some();
        let renewed = lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        if holder != self.holder {
            self.holder = holder.to_owned();
            self.carried = false;
            self.renews_bare = false;
        } else if !has && self.bare && renewed != self.renewed && !self.carried {
            self.renews_bare = true;
        }
        self.carried |= has;
        self.renews_bare &= !self.carried;
        self.bare = !has;
        self.renewed = renewed;
    }
}

fn roster_text(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(ROSTER_ANNOTATION)
        .map(String::as_str)
}

impl KubeLeaseBackend {
    /// A version of the election Lease was seen (every read, watch event
    /// and write answer).
    pub(super) fn roster_saw(&self, lease: &Lease) {
        self.roster_state(|s| s.saw(lease));
    }

    fn roster_state<R>(&self, f: impl FnOnce(&mut RosterState) -> R) -> R {
        f(&mut self.roster.lock().expect("roster state poisoned"))
    }

    /// Put the staged roster, if any, into `lease` (a write of our term).
    pub(super) fn carry_roster(&self, lease: &mut Lease) {
        if let Some(r) = self.roster_state(|s| s.staged.clone()) {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ROSTER_ANNOTATION.to_owned(), r.to_json());
        }
    }

    /// Whether "no roster" may be trusted for `lease` (see the module doc).
    fn roster_less(&self, lease: &Lease) -> bool {
        let holder = holder_of(lease);
        if holder.is_empty() {
            let annotations = lease.metadata.annotations.as_ref();
            return annotations.is_some_and(|a| a.contains_key(RELEASED_ANNOTATION));
        }
        self.roster_state(|s| s.holder == holder && s.renews_bare)
    }

    fn member_lease_name(&self, identity: &str) -> String {
        let name = format!("{}-failsafe-{}", self.name, candidate_suffix(identity));
        if name.len() <= 253 {
            name
        } else {
            let election = election_label_value(&self.name);
            format!("{election}-failsafe-{}", candidate_suffix(identity))
        }
    }

    fn application(&self, conn: &Conn, member: &Member, ttl: Duration) -> Lease {
        let labels = BTreeMap::from([
            (ELECTION_LABEL.to_owned(), election_label_value(&self.name)),
            (ROLE_LABEL.to_owned(), MEMBER_ROLE.to_owned()),
        ]);
        let annotations =
            BTreeMap::from([(PEER_ADDR_ANNOTATION.to_owned(), member.peer_addr.clone())]);
        Lease {
            metadata: ObjectMeta {
                name: Some(self.member_lease_name(&member.identity)),
                namespace: Some(conn.namespace.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(member.identity.clone()),
                lease_duration_seconds: Some(lease_duration_secs(ttl)),
                renew_time: Some(now_micro()),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// A member's application as listed, if it has not lapsed by this
/// machine's wall clock.
fn applicant(lease: &Lease) -> Option<Member> {
    let spec = lease.spec.as_ref()?;
    let identity = spec.holder_identity.clone()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let ttl = Duration::from_secs(spec.lease_duration_seconds?.max(0) as u64);
    let age_ms = k8s_openapi::jiff::Timestamp::now()
        .duration_since(renewed)
        .as_millis()
        .max(0) as u64;
    if Duration::from_millis(age_ms) >= ttl {
        return None;
    }
    let peer_addr = lease
        .metadata
        .annotations
        .as_ref()?
        .get(PEER_ADDR_ANNOTATION)?
        .clone();
    Some(Member {
        identity,
        peer_addr,
    })
}

#[async_trait]
impl RosterStore for KubeLeaseBackend {
    async fn roster(&self) -> Result<Option<Roster>> {
        let conn = self.conn().await?;
        let Some(lease) = self.get(conn).await? else {
            return Ok(None);
        };
        let refuse = |why: &str| BackendError::Rejected {
            backend: ABOUT,
            code: "roster_unknown",
            source: why.to_owned().into(),
        };
        match roster_text(&lease) {
            Some(text) => Roster::from_json(text)
                .map(Some)
                .map_err(|_| refuse("the Lease's failsafe roster annotation is not a roster")),
            None if self.roster_less(&lease) => Ok(None),
            None => Err(refuse(
                "the Lease is held and carries no failsafe roster: not campaigning until its holder writes one or releases it",
            )),
        }
    }

    async fn apply(&self, member: &Member, ttl: Duration) -> Result<()> {
        let conn = self.conn().await?;
        let mut next = self.application(conn, member, ttl);
        let name = next.metadata.name.clone().unwrap_or_default();
        let found = conn
            .api
            .get_opt(&name)
            .await
            .map_err(|e| self.classify(conn, "get", e))?;
        let written = match found {
            Some(old) => {
                next.metadata.resource_version = old.metadata.resource_version;
                conn.api.replace(&name, &post_params(), &next).await
            }
            None => conn.api.create(&post_params(), &next).await,
        };
        match written {
            Ok(_) => Ok(()),
            // Someone wrote it between our read and our write: the next
            // application (one renew interval on) writes again.
            Err(e) if Self::is_conflict(&e) => Ok(()),
            Err(e) => Err(self.classify(conn, "update", e)),
        }
    }

    async fn withdraw(&self, identity: &str) -> Result<()> {
        let conn = self.conn().await?;
        let name = self.member_lease_name(identity);
        match conn.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.classify(conn, "delete", e)),
        }
    }

    async fn applicants(&self) -> Result<Vec<Member>> {
        let conn = self.conn().await?;
        let selector = format!(
            "{ELECTION_LABEL}={},{ROLE_LABEL}={MEMBER_ROLE}",
            election_label_value(&self.name)
        );
        let list = conn
            .api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| self.classify(conn, "list", e))?;
        Ok(list.items.iter().filter_map(applicant).collect())
    }

    fn stage(&self, _identity: &str, roster: Roster) {
        self.roster_state(|s| s.staged = Some(roster));
    }
}

#[cfg(test)]
#[path = "roster_tests.rs"]
mod tests;
