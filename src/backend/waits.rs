//! Why a candidate does not campaign right now, as a type: backends answer
//! [`Campaign::Waiting`](super::Campaign::Waiting) with a [`WaitReason`],
//! the Elector shows one in [`LeaderState::waiting`](crate::elector::LeaderState::waiting),
//! and only the edges (`GET /leader`, the log, `status`) turn it into
//! words ([`WaitReason::as_str`]). Code that must know whether a wait is a
//! pause compares variants, never sentences.

/// Why a candidate waits before its next campaign.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitReason {
    /// The election is paused by an operator (`leader-elector pause`): no
    /// candidate takes a released or expired term until resume.
    Paused,
    /// This member is frozen (`POST /resign?freeze=`): it is not eligible
    /// and stays out of campaigns until the freeze ends.
    Frozen,
    /// This candidate has priority 0: it never leads.
    PriorityZero,
    /// The health gate is closed: `--candidate-health-url` does not answer
    /// 2xx; the candidate campaigns again once it does.
    HealthGate,
    /// The last release named another candidate as successor: it gets a
    /// head start of a few round trips before the others campaign.
    SuccessorHeadStart,
    /// The key is gone (deleted by hand, or the holder cleared by someone
    /// other than the holder) but the previous term may still run: waiting
    /// out what it promised.
    PreviousTerm,
    /// Another term may have run unseen while the key was absent (a
    /// Kubernetes Lease created and deleted while we waited).
    UnseenTerm,
    /// A race for the key was lost: reading it again.
    LostRace,
    /// Redis: the fencing counter could not be raised on a quorum.
    QuorumUnconfirmed,
    /// Redis: no quorum of servers agrees on a holder (a split).
    Split,
    /// Redis: a server started less than one lease duration ago and may
    /// have forgotten a live term.
    ServerRestarted,
    /// Failsafe: this member promised the leader not to campaign.
    FailsafePromise,
    /// Failsafe: this member started less than one maximum promise ago;
    /// what an earlier process of it promised may still hold.
    FailsafeStartWait,
    /// Failsafe: a roster exists and does not list this candidate yet; the
    /// leader admits it at its next renewal once it confirms its peer
    /// channel.
    NotOnRoster,
    /// Failsafe: the roster cannot be read (the backend is down, or refuses:
    /// a Redis server without `appendonly yes`), so this member cannot know
    /// whether it may campaign.
    RosterUnreadable,
}

impl WaitReason {
    /// The reason in words, for `/leader`, the log and `status`.
    pub const fn as_str(self) -> &'static str {
        match self {
            WaitReason::Paused => {
                "the election is paused (leader-elector pause): no candidate takes a released or expired term until leader-elector resume"
            }
            WaitReason::Frozen => {
                "frozen (POST /resign?freeze=): this member is not eligible and stays out of campaigns until the freeze ends"
            }
            WaitReason::PriorityZero => {
                "priority 0 (--priority 0): this candidate never leads; it follows and reports the leader"
            }
            WaitReason::HealthGate => {
                "the health gate is closed (--candidate-health-url does not answer 2xx): this candidate campaigns again once the app answers"
            }
            WaitReason::SuccessorHeadStart => {
                "the release names another candidate as successor: leaving it a few round trips to take the term"
            }
            WaitReason::PreviousTerm => {
                "the key was deleted (or its holder cleared) by someone other than the holder while the holder's term may still run: waiting out what it promised"
            }
            WaitReason::UnseenTerm => {
                "another term may have run unseen since the key was found absent: our claim waits until that term is over"
            }
            WaitReason::LostRace => "lost a race for the key; reading it again",
            WaitReason::QuorumUnconfirmed => {
                "the fencing counter could not be raised on a quorum of servers; retrying"
            }
            WaitReason::Split => {
                "no quorum of servers agrees on a holder (a split): retrying after a random delay"
            }
            WaitReason::ServerRestarted => {
                "a Redis server started, restarted or was promoted from a replica less than one lease duration ago and may lack a live term: waiting until it has served that long"
            }
            WaitReason::FailsafePromise => {
                "failsafe: this member promised the leader not to campaign until the promise ends"
            }
            WaitReason::FailsafeStartWait => {
                "failsafe: started less than one maximum promise ago; what an earlier process of this member promised may still hold, so it does not campaign yet"
            }
            WaitReason::NotOnRoster => {
                "failsafe: not on the roster yet; the leader admits this candidate at its next renewal once it confirms its peer channel (a wrong secret: never; both logs say so)"
            }
            WaitReason::RosterUnreadable => {
                "failsafe: the roster cannot be read, so this member cannot know whether it may campaign; the log says why (a backend that does not answer, or a Redis server without appendonly yes); retrying"
            }
        }
    }

    /// Whether the wait ends on an operator's act (resume) rather than by
    /// time: its `until` is not a moment ("until resume").
    pub fn until_resume(self) -> bool {
        matches!(self, WaitReason::Paused)
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for WaitReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
