//! A member's promises: not to campaign until the latest promise it gave
//! has run out on its own monotonic clock, nor before one maximum promise
//! after it started. A member that reads the backend promises only a term
//! it sees there, and the promises to one term add up to at most
//! `max_outage` until it sees that term live again while no promise holds.

use std::time::Duration;

use tokio::time::Instant;

use super::{Ack, Heartbeat};

/// Why a member refuses a heartbeat (the leader then cannot count it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The heartbeat names another election.
    #[error("the heartbeat is for election {0:?}, not this one")]
    OtherElection(String),
    /// This member leads (or has a campaign on the wire): a promise now
    /// could be broken by its own term.
    #[error("this member leads or is campaigning")]
    Campaigning,
    /// The heartbeat's term is older than one this member has seen.
    #[error("fencing token {got} is older than {seen}, seen before")]
    Stale {
        /// The heartbeat's token.
        got: u64,
        /// The highest token this member has seen.
        seen: u64,
    },
    /// This member reads the backend and the heartbeat's term is not there
    /// (the key is absent, or another term holds it).
    #[error("this member reads the backend and term {got} is not live there (it sees {seen})")]
    NotInBackend {
        /// The heartbeat's token.
        got: u64,
        /// What the backend showed: a term's token, or nobody.
        seen: String,
    },
    /// The promises to this term since it was last seen live in the
    /// backend reached `--failsafe-max-outage`.
    #[error(
        "the promises to term {token} reached --failsafe-max-outage ({max_ms} ms) without a sight of it in the backend"
    )]
    Spent {
        /// The term's token.
        token: u64,
        /// The bound, in milliseconds.
        max_ms: u64,
    },
}

/// A member's promises (one per process).
#[derive(Debug)]
pub struct Promises {
    election: String,
    identity: String,
    max_promise: Duration,
    /// No campaign before this instant.
    until: Instant,
    highest_token: u64,
    /// The leader of the last heartbeat accepted.
    leader: Option<String>,
    /// What the last backend answer showed (`Some(None)`: nobody holds the
    /// key); `None` when the last backend call failed.
    sight: Option<Option<u64>>,
    /// The most promises to one term may cover without a sight of it.
    max_outage: Duration,
    /// The term promised last and the instant of its first promise since
    /// it was last seen live while no promise held.
    budget: Option<(u64, Instant)>,
    /// The budget whose end was last warned of (one WARN per budget).
    warned_spent: Option<(u64, Instant)>,
}

impl Promises {
    /// A process started at `started`: it campaigns no sooner than
    /// `max_promise` after it (whatever the old process promised has run
    /// out by then). `max_promise` also caps what a heartbeat may ask.
    /// `max_outage` bounds the promises to one term (see [`Promises::saw`]).
    pub fn new(
        election: &str,
        identity: &str,
        (max_promise, max_outage): (Duration, Duration),
        started: Instant,
    ) -> Self {
        Promises {
            election: election.to_owned(),
            identity: identity.to_owned(),
            max_promise,
            until: started + max_promise,
            highest_token: 0,
            leader: None,
            sight: None,
            max_outage,
            budget: None,
            warned_spent: None,
        }
    }

    /// Answers a probe (a heartbeat asking no promise): this member's
    /// identity, nothing promised, nothing changed.
    ///
    /// # Errors
    /// [`Refusal::OtherElection`].
    pub fn probe(&self, hb: &Heartbeat) -> Result<Ack, Refusal> {
        if hb.election != self.election {
            return Err(Refusal::OtherElection(hb.election.clone()));
        }
        Ok(Ack {
            member: self.identity.clone(),
            promise_ms: 0,
        })
    }

    /// Handles a heartbeat received at `now`; `campaigning` says whether
    /// this member leads or has a campaign on the wire.
    ///
    /// # Errors
    /// [`Refusal`]: the heartbeat is not counted and nothing changes.
    pub fn heartbeat(
        &mut self,
        hb: &Heartbeat,
        now: Instant,
        campaigning: bool,
    ) -> Result<Ack, Refusal> {
        if hb.election != self.election {
            return Err(Refusal::OtherElection(hb.election.clone()));
        }
        if campaigning {
            return Err(Refusal::Campaigning);
        }
        if hb.fencing_token < self.highest_token {
            return Err(Refusal::Stale {
                got: hb.fencing_token,
                seen: self.highest_token,
            });
        }
        let token = hb.fencing_token;
        if let Some(seen) = self.sight
            && seen != Some(token)
        {
            let seen = seen.map_or("nobody".to_owned(), |t| format!("term {t}"));
            return Err(Refusal::NotInBackend { got: token, seen });
        }
        let start = match self.budget {
            Some((t, start)) if t == token => start,
            _ => now,
        };
        let end = start + self.max_outage;
        let asked = hb.promise().min(self.max_promise);
        let promise = asked.min(end.saturating_duration_since(now));
        if promise < asked && self.warned_spent != Some((token, start)) {
            self.warned_spent = Some((token, start));
            let max_outage = crate::flags::format_duration(self.max_outage);
            tracing::warn!(election = %self.election, leader = %hb.leader, fencing_token = token, %max_outage, "failsafe: this member's promises to the leader's term reach --failsafe-max-outage without a sight of the term in the backend; it promises no more to this term, so the leader steps down when its last promise ends");
        }
        if now >= end {
            let max_ms = self.max_outage.as_millis() as u64;
            return Err(Refusal::Spent { token, max_ms });
        }
        self.budget = Some((token, start));
        self.highest_token = hb.fencing_token;
        self.until = self.until.max(now + promise);
        self.leader = Some(hb.leader.clone());
        Ok(Ack {
            member: self.identity.clone(),
            promise_ms: promise.as_millis() as u64,
        })
    }

    /// Records a fencing token seen in the backend (a newer term).
    pub fn saw_token(&mut self, token: u64) {
        self.highest_token = self.highest_token.max(token);
    }

    /// A backend answer at `now` showed the term with fencing token `token`
    /// holding the key (`None`: nobody): heartbeats of any other term are
    /// refused until the next sight. Seen while no promise holds, the term
    /// gets a new budget of `max_outage`.
    pub fn saw(&mut self, token: Option<u64>, now: Instant) {
        self.sight = Some(token);
        if let Some(t) = token {
            self.saw_token(t);
            if now >= self.until && self.budget.is_some_and(|(b, _)| b == t) {
                self.budget = None;
            }
        }
    }

    /// A backend call failed: this member cannot see the backend, and
    /// promises any term (within its budget) until the next sight.
    pub fn blind(&mut self) {
        self.sight = None;
    }

    /// Whether this member may campaign at `now` (no promise holds).
    pub fn may_campaign(&self, now: Instant) -> bool {
        now >= self.until
    }

    /// The leader of the last heartbeat accepted, while a promise holds at `now`.
    pub fn leader_at(&self, now: Instant) -> Option<&str> {
        self.leader.as_deref().filter(|_| now < self.until)
    }

    /// Whether a heartbeat was accepted since this process started (else
    /// [`Promises::until`] is the start-up wait's end).
    pub fn promised(&self) -> bool {
        self.leader.is_some()
    }

    /// The instant the last promise (or the start-up wait) ends.
    pub fn until(&self) -> Instant {
        self.until
    }
}
