//! The roster record as a capability beside the election: a backend that
//! can keep a roster offers a [`RosterStore`] on the same connection; the
//! election seam ([`LeaseBackend`](crate::backend::LeaseBackend)) does not
//! change. The roster itself is written by the backend's own campaign and
//! renewal, in the same atomic step as the term (etcd: the same `Txn`;
//! Redis: the same script; a Lease: the same update), from what the
//! Elector staged for that identity just before it sent them.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::BackendError;

/// One admitted member: who it is and where its peer listener answers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Member {
    /// The candidate's identity (the Pod name by default).
    pub identity: String,
    /// `host:port` of its peer listener (`--peer-addr`).
    pub peer_addr: String,
}

/// The roster: every member admitted by the leader, sorted by identity.
/// Only roster members campaign while failsafe is on (an empty roster,
/// before the first failsafe term, lets anyone campaign).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roster {
    /// The members, sorted by identity, each identity once.
    pub members: Vec<Member>,
}

impl Roster {
    /// A roster of `members` (sorted; a repeated identity keeps its last
    /// address).
    pub fn new(members: impl IntoIterator<Item = Member>) -> Roster {
        let mut all: Vec<Member> = members.into_iter().collect();
        all.reverse();
        all.sort_by(|a, b| a.identity.cmp(&b.identity));
        all.dedup_by(|a, b| a.identity == b.identity);
        Roster { members: all }
    }

    /// Whether `identity` may campaign: it is a member, or nobody is.
    pub fn may_campaign(&self, identity: &str) -> bool {
        self.members.is_empty() || self.contains(identity)
    }

    /// Whether `identity` is a member.
    pub fn contains(&self, identity: &str) -> bool {
        self.members.iter().any(|m| m.identity == identity)
    }

    /// The members other than `me`: those the leader must hear from.
    pub fn others<'a>(&'a self, me: &'a str) -> impl Iterator<Item = &'a Member> + 'a {
        self.members.iter().filter(move |m| m.identity != me)
    }

    /// The roster as JSON, for the election record.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a roster serializes")
    }

    /// A roster read from the election record.
    ///
    /// # Errors
    /// The text is not a roster's JSON.
    pub fn from_json(text: &str) -> Result<Roster, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// Where a backend keeps the failsafe roster and the members' applications.
#[async_trait]
pub trait RosterStore: Send + Sync {
    /// The roster the election record holds; `None` before the first
    /// failsafe term wrote one (anyone may campaign then).
    ///
    /// # Errors
    /// Any [`BackendError`]; the caller must then not campaign.
    async fn roster(&self) -> Result<Option<Roster>, BackendError>;

    /// Ask to be admitted (or stay admitted): `member`'s application, kept
    /// for `ttl` unless written again. The leader admits the applicants at
    /// its next campaign or renewal.
    ///
    /// # Errors
    /// Any [`BackendError`]; the application then lapses at its last TTL.
    async fn apply(&self, member: &Member, ttl: Duration) -> Result<(), BackendError>;

    /// Withdraw `identity`'s application (graceful shutdown): the leader's
    /// next write leaves it off the roster.
    ///
    /// # Errors
    /// Any [`BackendError`]; the application then lapses by its TTL.
    async fn withdraw(&self, identity: &str) -> Result<(), BackendError>;

    /// The applications alive now.
    ///
    /// # Errors
    /// Any [`BackendError`].
    async fn applicants(&self) -> Result<Vec<Member>, BackendError>;

    /// The roster `identity`'s next campaign or renewal writes with its
    /// term, in the same compare-and-swap (replacing any staged before).
    fn stage(&self, identity: &str, roster: Roster);
}
