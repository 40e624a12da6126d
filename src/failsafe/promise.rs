//! A member's promises: not to campaign until the latest promise it gave
//! has run out on its own monotonic clock, nor before one maximum promise
//! after it started.

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
}

impl Promises {
    /// A process started at `started`: it campaigns no sooner than
    /// `max_promise` after it (whatever the old process promised has run
    /// out by then). `max_promise` also caps what a heartbeat may ask.
    pub fn new(election: &str, identity: &str, max_promise: Duration, started: Instant) -> Self {
        Promises {
            election: election.to_owned(),
            identity: identity.to_owned(),
            max_promise,
            until: started + max_promise,
            highest_token: 0,
            leader: None,
        }
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
        let promise = hb.promise().min(self.max_promise);
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
