//! Operator controls of an election kept in its backend beside the
//! election key: a pause marker and a switchover request. Anyone with
//! access to the backend sets them (`leader-elector pause|resume|switchover`);
//! every sidecar of the election follows them
//! ([`ControlStore::watch_controls`](super::ControlStore::watch_controls)).
//!
//! Invariants:
//! - While [`Controls::paused`], a backend never starts a new term: its
//!   [`campaign`](super::LeaseBackend::campaign) answers
//!   [`Campaign::Waiting`](super::Campaign::Waiting) with [`WaitReason::Paused`](super::WaitReason::Paused) as the
//!   reason, decided in the same atomic step that would take the key (an
//!   etcd transaction's compare, a Redis script, a Lease's
//!   compare-and-swap), so a pause set before a campaign's write can never
//!   lose to it. A holder's renewals are not affected: the leader keeps
//!   its term.
//! - A switchover request is only a request ([`Request`]): the leader acts on it by a
//!   graceful handover naming the target as successor, and the
//!   compare-and-swap still decides who leads.

/// The operator controls of one election.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Controls {
    /// Whether the election is paused: no new term starts; a leader keeps its term.
    pub paused: bool,
    /// The identity a switchover was requested to, until the leader acts on
    /// it (it clears the request when it hands over or refuses).
    pub switchover: Option<String>,
}

/// The prefix of a forced switchover request in [`Controls::switchover`].
const FORCED: &str = "force=";
/// The prefix of a pin left by a forced switchover in [`Controls::switchover`].
const PINNED: &str = "pinned=";

/// What [`Controls::switchover`] holds, typed (the backend keeps it as one
/// string; only this module spells it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Hand over to `to`; `force`: even to a lower priority or an older
    /// revision than the best ready candidate (and pin it).
    Switchover {
        /// The target's identity.
        to: &'a str,
        /// Whether the request is forced.
        force: bool,
    },
    /// A forced switchover made this member the leader: no preemption or
    /// revision handover moves the term away from it until it leaves or a
    /// new switchover.
    Pinned(&'a str),
}

impl Request<'_> {
    /// The stored text of the request.
    pub fn encode(self) -> String {
        match self {
            Request::Switchover { to, force: false } => to.to_owned(),
            Request::Switchover { to, force: true } => format!("{FORCED}{to}"),
            Request::Pinned(to) => format!("{PINNED}{to}"),
        }
    }
}

impl Controls {
    /// The switchover request or pin, typed.
    pub fn request(&self) -> Option<Request<'_>> {
        let s = self.switchover.as_deref()?;
        Some(if let Some(to) = s.strip_prefix(PINNED) {
            Request::Pinned(to)
        } else if let Some(to) = s.strip_prefix(FORCED) {
            Request::Switchover { to, force: true }
        } else {
            Request::Switchover {
                to: s,
                force: false,
            }
        })
    }

    /// The member pinned as leader by a forced switchover, if any.
    pub fn pinned(&self) -> Option<&str> {
        match self.request() {
            Some(Request::Pinned(p)) => Some(p),
            _ => None,
        }
    }

    /// The target of a pending switchover request (not a pin), if any.
    pub fn requested(&self) -> Option<(&str, bool)> {
        match self.request() {
            Some(Request::Switchover { to, force }) => Some((to, force)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_through_its_text() {
        for r in [
            Request::Switchover {
                to: "a",
                force: false,
            },
            Request::Switchover {
                to: "pod-b",
                force: true,
            },
            Request::Pinned("c"),
        ] {
            let c = Controls {
                switchover: Some(r.encode()),
                ..Controls::default()
            };
            assert_eq!(c.request(), Some(r));
        }
        assert_eq!(Controls::default().request(), None);
    }
}
