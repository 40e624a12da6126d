//! The operator controls as the Elector follows them (`backend::controls`):
//! a task reads the backend's controls, then waits on their watch (reading
//! again with backoff after an error), publishes the pause marker into
//! [`LeaderState::paused`], and, while this candidate leads, acts on a
//! switchover request: it hands over to the named candidate when the
//! registry shows it eligible ([`check_target`]) and clears the request
//! either way. A follower ignores requests; a candidate that starts leading
//! looks at a pending request at once.
//!
//! Invariants:
//! - The pause itself is kept by the backend's campaign (decided in the
//!   step that would take the key); the Elector only shows it. Its
//!   waiting state names [`WaitReason::Paused`](crate::backend::WaitReason::Paused)
//!   when a campaign is refused for it.
//! - A switchover is a handover ([`ElectorHandle::hand_over`]): the leader
//!   stops claiming, then releases naming the target; the backend's
//!   compare-and-swap still decides who leads next, so it can never make
//!   two leaders. It is refused while paused: the target could not take the
//!   released term and nobody would lead.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tracing::{debug, info, warn};

use super::check_target;
use super::config::Backoff;
use super::publish::ControlsWriter;
use super::{ElectorHandle, LeaderState};
use crate::backend::controls::{Controls, Request};
use crate::backend::{About, BackendError, ControlStore};

/// Why a switchover was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SwitchoverRefusal {
    /// This candidate does not lead; `leader` is the leader it knows.
    #[error("this member does not lead; the leader is {}", leader.as_deref().unwrap_or("unknown"))]
    NotLeader {
        /// The leader as this candidate reports it (`None`: nobody or unknown).
        leader: Option<String>,
    },
    /// The target is the leader itself.
    #[error("{0} already leads")]
    Itself(String),
    /// The election is paused: nobody could take the released term.
    #[error("the election is paused: a handover would leave no leader until resume")]
    Paused,
    /// The backend keeps no candidate registry to check the target against.
    #[error("the backend keeps no candidate registry: a switchover cannot check its target")]
    NoRegistry,
    /// The target has no record in the registry.
    #[error("{0} is not a candidate of this election (no record in the candidate registry)")]
    Unknown(String),
    /// The target's record outlived its TTL.
    #[error("{0}'s candidate record lapsed (its sidecar is likely gone)")]
    Lapsed(String),
    /// The target's app is not healthy (its candidacy gate is closed).
    #[error("{0} is not ready (its app is unhealthy)")]
    NotReady(String),
    /// The target has priority 0.
    #[error("{0} has priority 0 and never leads")]
    NeverLeads(String),
    /// The target is frozen (`POST /resign?freeze=`) until the time given.
    #[error("{0} is frozen until {1} (POST /resign?freeze=): not eligible")]
    Frozen(String, String),
    /// A ready candidate has a higher priority than the target: preemption
    /// would undo the switchover. Allowed with `force`.
    #[error(
        "{to} has priority {priority}, below {best} (priority {best_priority}): preemption would undo the switchover; use force=true (--force) to pin {to} as leader"
    )]
    LowerPriority {
        /// The target.
        to: String,
        /// Its priority.
        priority: u32,
        /// The best ready candidate.
        best: String,
        /// Its priority.
        best_priority: u32,
    },
    /// A ready candidate runs a newer revision than the target: the
    /// revision handover would undo the switchover. Allowed with `force`.
    #[error(
        "{to} runs an older revision than {newer}: the rolling-update handover would undo the switchover; use force=true (--force) to pin {to} as leader"
    )]
    OlderRevision {
        /// The target.
        to: String,
        /// A ready candidate of a newer revision.
        newer: String,
    },
    /// The registry could not be read.
    #[error("cannot list the candidates: {0}")]
    Backend(String),
}

/// A handover done by [`ElectorHandle::switchover`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Handover {
    /// The identity that led and released.
    pub from: String,
    /// The identity named as successor.
    pub to: String,
    /// The fencing token of the released term.
    pub fencing_token: u64,
}

impl ElectorHandle {
    /// Hand over to `to` if this candidate leads, the election is not
    /// paused and the candidate registry shows `to` eligible
    /// ([`check_target`]: with `force`, even to a lower priority or an
    /// older revision than the best ready candidate, and then `to` is
    /// pinned as leader in the controls); answers once the release naming
    /// `to` was sent.
    ///
    /// # Errors
    /// A [`SwitchoverRefusal`]; nothing changed then.
    pub async fn switchover(&self, to: &str, force: bool) -> Result<Handover, SwitchoverRefusal> {
        let (me, fencing_token, paused, priority) = {
            let s = self.state.borrow();
            if !s.is_leader_now() {
                let leader = s.leader_at(Instant::now()).map(str::to_owned);
                return Err(SwitchoverRefusal::NotLeader { leader });
            }
            (
                s.identity.clone(),
                s.fencing_token.unwrap_or(0),
                s.paused,
                s.priority,
            )
        };
        if paused {
            return Err(SwitchoverRefusal::Paused);
        }
        if to == me {
            return Err(SwitchoverRefusal::Itself(me));
        }
        let now = std::time::SystemTime::now();
        let Some(registry) = &self.registry else {
            return Err(SwitchoverRefusal::NoRegistry);
        };
        // Read afresh: the leader's watched copy may trail what the
        // operator just saw in `status` (the matrix caught a switchover
        // refused 60 ms after the target turned ready).
        let listed = match timeout(self.call_timeout, registry.candidates_now()).await {
            Ok(Ok(listed)) => super::known::judged(&self.known, listed, false),
            Ok(Err(e)) => return Err(SwitchoverRefusal::Backend(e.report_once())),
            Err(_) => return Err(SwitchoverRefusal::Backend("the call timed out".into())),
        };
        check_target(&listed, (&me, Some(priority), paused), to, (force, now))?;
        if force {
            self.pin(Some(to)).await;
        }
        if !self.hand_over(to).await {
            return Err(SwitchoverRefusal::NotLeader { leader: None });
        }
        Ok(Handover {
            from: me,
            to: to.to_owned(),
            fencing_token,
        })
    }
}

/// The task that follows the backend's controls; stopped when dropped.
pub(super) struct Follower {
    task: JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Follower {
    /// Start following through `handle`'s backend, publishing the pause
    /// marker with `writer`. `(retry, refused)`: after an error the
    /// controls are read again with a backoff of up to `retry`; after a
    /// refusal that retrying cannot fix (a missing `list` or `watch`
    /// permission) every `refused`, said once. `None` when the backend
    /// keeps no controls.
    pub(super) fn start(
        handle: ElectorHandle,
        writer: ControlsWriter,
        waits: (Duration, Duration),
    ) -> Option<Self> {
        let store = handle.controls.clone()?;
        let task = tokio::spawn(follow(handle, store, writer, waits));
        Some(Follower { task })
    }
}

async fn follow(
    handle: ElectorHandle,
    store: Arc<dyn ControlStore>,
    writer: ControlsWriter,
    (retry, refused): (Duration, Duration),
) {
    let about = handle.backend.about();
    let mut state = handle.state.clone();
    let mut backoff = Backoff::new(Duration::from_millis(100), retry);
    let mut seen: Option<Controls> = None;
    let mut said = false;
    loop {
        let from_watch = seen.is_some();
        let mut at_start = false;
        let read = match &seen {
            None => read(&*store, about, handle.call_timeout).await,
            Some(s) => tokio::select! {
                r = store.watch_controls(s) => r,
                () = leading_starts(&mut state) => { at_start = true; Ok(s.clone()) }
            },
        };
        match read {
            Ok(c) => {
                // Only a watch that delivered proves the follow works: a
                // read that succeeds before a failing watch keeps the backoff.
                if from_watch {
                    backoff.reset();
                }
                if seen.as_ref().map_or(c.paused, |s| s.paused != c.paused) {
                    let what = if c.paused { "paused" } else { "resumed" };
                    info!(election = %handle.state.borrow().election, "the election is {what}");
                }
                writer.set(&c);
                act(&handle, &c, at_start).await;
                seen = Some(c);
            }
            Err(e) if !e.is_retryable() => {
                // The election's own follow says such a refusal once
                // (the controls need the same verbs); here it is only logged.
                if !std::mem::replace(&mut said, true) {
                    debug!(
                        reason = e.reason(),
                        "cannot follow the operator controls (pause, switchover): refused; reading them again every lease duration"
                    );
                }
                seen = None;
                sleep(refused.max(backoff.next())).await;
            }
            Err(e) => {
                debug!(error = %e.report(), "cannot follow the operator controls; reading them again");
                seen = None;
                sleep(backoff.next()).await;
            }
        }
    }
}

/// Read the controls once within `limit`.
async fn read(
    store: &dyn ControlStore,
    about: &'static About,
    limit: Duration,
) -> Result<Controls, BackendError> {
    match timeout(limit, store.controls()).await {
        Ok(r) => r,
        Err(_) => Err(BackendError::Timeout {
            backend: about,
            call: "controls",
            timeout_ms: limit.as_millis() as u64,
        }),
    }
}

/// Resolves when this candidate starts a term (after not holding one);
/// pends forever once the Elector is gone.
async fn leading_starts(state: &mut watch::Receiver<LeaderState>) {
    let ended = state.wait_for(|s| s.own_term.is_none()).await.is_err();
    if ended || state.wait_for(|s| s.own_term.is_some()).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// While leading, act on `c`'s switchover request: hand over when the
/// target is eligible, then clear the request (a forced one leaves its
/// target pinned instead); refuse (a warning naming why) and clear it
/// otherwise. A request naming this leader is done (forced: pinned). A pin
/// naming another member is cleared by a leader whose term just started
/// (`at_start`): the pinned member left.
async fn act(handle: &ElectorHandle, c: &Controls, at_start: bool) {
    let Some(request) = c.request() else {
        return;
    };
    let (leading, election, me) = {
        let s = handle.state.borrow();
        (s.is_leader_now(), s.election.clone(), s.identity.clone())
    };
    if !leading {
        return;
    }
    let (to, force) = match request {
        Request::Pinned(p) if p != me && at_start => {
            info!(%election, pinned = p, "the member pinned by a forced switchover no longer leads: the pin ends");
            return handle.pin(None).await;
        }
        Request::Pinned(_) => return,
        Request::Switchover { to, force } => (to, force),
    };
    match handle.switchover(to, force).await {
        Ok(h) => {
            info!(%election, from = %h.from, to = %h.to, fencing_token = h.fencing_token, force, "switchover requested through the backend: handed over");
            if force {
                return;
            }
        }
        Err(SwitchoverRefusal::NotLeader { .. }) => return,
        Err(SwitchoverRefusal::Itself(_)) if force => return handle.pin(Some(to)).await,
        Err(SwitchoverRefusal::Itself(_)) => {
            debug!(%election, to, "switchover request names this leader: done")
        }
        Err(why) => {
            warn!(%election, to, reason = %why, "switchover request refused; clearing it")
        }
    }
    handle.pin(None).await;
}

impl ElectorHandle {
    /// Write the pin of a forced switchover naming `to` into the controls
    /// (`None`: clear the request or pin), bounded by the call timeout.
    async fn pin(&self, to: Option<&str>) {
        let Some(store) = &self.controls else {
            return warn!(
                "cannot write the switchover request or pin: the backend keeps no operator controls"
            );
        };
        let value = to.map(|to| Request::Pinned(to).encode());
        let write = store.request_switchover(value.as_deref());
        match timeout(self.call_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e.report(), "cannot write the switchover request or pin"),
            Err(_) => warn!("writing the switchover request or pin timed out"),
        }
    }
}

#[cfg(test)]
#[path = "controls_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "matrix_tests.rs"]
mod matrix_tests;
