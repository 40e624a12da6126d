//! [`Both`]: one election held on two locks at once, a primary (whose term,
//! fencing token and holder are the election's) and a bridge (another
//! elector's lock that must not see two holders either, e.g. the old
//! `leader-elector` image's Endpoints lock during a migration).
//!
//! Invariant: this candidate is elected only while it holds both; losing
//! either ends the term. The Elector's safety rule then covers both locks:
//! the term's TTL is the shorter of the two, counted from the Elector's send
//! instant, which precedes both writes, and each renewal renews both.
//!
//! Order, and why:
//! - Campaign takes the bridge first, then the primary. While another
//!   elector holds the bridge (the old image leads), candidates only read it
//!   and follow; the primary is not written, so its term ids, transitions and
//!   fencing tokens do not churn. A bridge taken but a primary not (a
//!   primary-only candidate leads) is released at once: it was never
//!   claimed.
//! - Resign releases the primary first, then the bridge: a candidate that
//!   finds the bridge free goes straight on to the primary, which is then
//!   free too. The Elector has stopped claiming before it resigns, so either
//!   order is safe; this one is the quicker handover.
//! - While the primary answers that the election is paused, the next
//!   campaigns only read the primary's controls and give the same answer,
//!   without taking the bridge: taking and giving it back every retry
//!   period would hand it to the other elector at each release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::WaitReason;
use super::candidates::{Candidate, Listed};
use super::controls::Controls;
use super::{About, Campaign, Holder, LeaseBackend, Renewal, Result, Term, TermId};
use super::{CandidateRegistry, ControlStore};

/// One election on a primary and a bridge lock (see the module docs).
pub struct Both {
    primary: Arc<dyn LeaseBackend>,
    /// The primary's registry (the same backend as `primary`).
    registry: Arc<dyn CandidateRegistry>,
    /// The primary's controls (the same backend as `primary`).
    controls: Arc<dyn ControlStore>,
    bridge: Arc<dyn LeaseBackend>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The term held: the primary's term and the bridge's.
    held: Option<(Term, Term)>,
    /// The term id of the last holder reported from the bridge (its watch
    /// and `heard_at` go to the bridge).
    bridge_holder: Option<TermId>,
    /// The primary's last answer, when it was that the election is paused.
    paused: Option<Campaign>,
}

impl std::fmt::Debug for Both {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Both")
            .field("primary", &self.primary.name())
            .field("bridge", &self.bridge.name())
            .finish()
    }
}

impl Both {
    /// An election on `primary` (term, fencing token, holder, and the
    /// registry and controls it keeps) that also holds `bridge`.
    pub fn new<P>(primary: Arc<P>, bridge: Arc<dyn LeaseBackend>) -> Arc<Both>
    where
        P: LeaseBackend + CandidateRegistry + ControlStore + 'static,
    {
        Arc::new(Both {
            registry: primary.clone(),
            controls: primary.clone(),
            primary,
            bridge,
            state: Mutex::new(State::default()),
        })
    }

    fn state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().expect("both state poisoned"))
    }

    /// Remember `holder` as the bridge's.
    fn remember_bridge(&self, holder: Holder) -> Holder {
        self.state(|s| s.bridge_holder = Some(holder.term_id.clone()));
        holder
    }

    fn is_bridge(&self, holder: &Holder) -> bool {
        self.state(|s| s.bridge_holder.as_ref() == Some(&holder.term_id))
    }

    /// Our two terms, if `term` is the one held.
    fn held(&self, term: &Term) -> Option<(Term, Term)> {
        self.state(|s| s.held.clone())
            .filter(|(p, _)| p.holder.term_id == term.holder.term_id)
    }

    /// While the primary's last answer was that the election is paused,
    /// that answer again as long as its controls still say so (one read
    /// of the primary, none of the bridge).
    async fn still_paused(&self) -> Result<Option<Campaign>> {
        let Some(answer) = self.state(|s| s.paused.clone()) else {
            return Ok(None);
        };
        if self.controls.controls().await?.paused {
            return Ok(Some(answer));
        }
        self.state(|s| s.paused = None);
        Ok(None)
    }

    /// A bridge answer that is not an election, its holder remembered.
    fn bridge_answer(&self, c: Campaign) -> Campaign {
        match c {
            Campaign::Following(h) => Campaign::Following(self.remember_bridge(h)),
            Campaign::Waiting {
                previous,
                retry_after,
                why,
            } => Campaign::Waiting {
                previous: previous.map(|h| self.remember_bridge(h)),
                retry_after,
                why,
            },
            elected => elected,
        }
    }
}

#[async_trait]
impl LeaseBackend for Both {
    fn about(&self) -> &'static About {
        self.primary.about()
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        if let Some(answer) = self.still_paused().await? {
            return Ok(answer);
        }
        let (to_bridge, to_primary) = match previous {
            Some(h) if self.is_bridge(h) => (Some(h), None),
            other => (None, other),
        };
        let bridge = match self.bridge.campaign(identity, ttl, to_bridge).await? {
            Campaign::Elected(t) => t,
            other => return Ok(self.bridge_answer(other)),
        };
        let primary = match self.primary.campaign(identity, ttl, to_primary).await {
            Ok(Campaign::Elected(t)) => t,
            other => {
                // Never claimed: give the bridge back at once.
                let _ = self.bridge.release(&bridge, None).await;
                let paused = matches!(&other, Ok(Campaign::Waiting { why, .. }) if *why == WaitReason::Paused);
                self.state(|s| s.paused = other.as_ref().ok().filter(|_| paused).cloned());
                return other;
            }
        };
        let mut term = primary.clone();
        term.ttl = primary.ttl.min(bridge.ttl);
        self.state(|s| s.held = Some((primary, bridge)));
        Ok(Campaign::Elected(term))
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let Some((primary, bridge)) = self.held(term) else {
            return Ok(Renewal::Lost(super::LostReason::KeyOverwritten));
        };
        let (p, b) = tokio::join!(self.primary.renew(&primary), self.bridge.renew(&bridge));
        Ok(match (p?, b?) {
            (Renewal::Lost(r), _) | (_, Renewal::Lost(r)) => Renewal::Lost(r),
            (Renewal::Renewed { ttl, servers }, Renewal::Renewed { ttl: other, .. }) => {
                Renewal::Renewed {
                    ttl: ttl.min(other),
                    servers,
                }
            }
        })
    }

    /// Release both terms, the primary's naming `successor` (the bridge
    /// has no registry).
    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let Some((primary, bridge)) = self.held(term) else {
            return self.primary.release(term, successor).await;
        };
        let p = self.primary.release(&primary, successor).await;
        let b = self.bridge.release(&bridge, None).await;
        self.state(|s| s.held = None);
        p.and(b)
    }

    /// The bridge's holder when it has one (as a campaign reports it: the
    /// bridge is taken first), else the primary's.
    async fn read(&self) -> Result<Option<Holder>> {
        match self.bridge.read().await? {
            Some(h) => Ok(Some(self.remember_bridge(h))),
            None => self.primary.read().await,
        }
    }

    async fn inspect(&self) -> Result<Option<Holder>> {
        match self.bridge.inspect().await? {
            Some(h) => Ok(Some(self.remember_bridge(h))),
            None => self.primary.inspect().await,
        }
    }

    /// Our own term: resolves when either lock changes. Another holder:
    /// the watch of the lock it was reported from.
    async fn watch(&self, seen: &Holder) -> Result<()> {
        let held = self
            .state(|s| s.held.clone())
            .filter(|(p, _)| p.holder.term_id == seen.term_id);
        if let Some((primary, bridge)) = held {
            return tokio::select! {
                r = self.primary.watch(&primary.holder) => r,
                r = self.bridge.watch(&bridge.holder) => r,
            };
        }
        if self.is_bridge(seen) {
            self.bridge.watch(seen).await
        } else {
            self.primary.watch(seen).await
        }
    }

    fn heard_at(&self, holder: &Holder) -> Option<Instant> {
        if self.is_bridge(holder) {
            self.bridge.heard_at(holder)
        } else {
            self.primary.heard_at(holder)
        }
    }
}

// The candidate registry is the primary's (its release names the
// successor).
#[async_trait]
impl CandidateRegistry for Both {
    fn deletes_lapsed(&self) -> bool {
        self.registry.deletes_lapsed()
    }

    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.registry.publish_candidate(candidate, ttl).await
    }

    async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
        self.registry.withdraw_candidate(identity).await
    }

    async fn candidates(&self) -> Result<Vec<Listed>> {
        self.registry.candidates().await
    }

    async fn candidates_now(&self) -> Result<Vec<Listed>> {
        self.registry.candidates_now().await
    }

    async fn watch_candidates(&self) -> Result<()> {
        self.registry.watch_candidates().await
    }
}

// The operator controls are the primary's too: its campaign, which
// decides the election, honours the pause (a bridge taken first is
// given back at once, as on any primary refusal).
#[async_trait]
impl ControlStore for Both {
    async fn controls(&self) -> Result<Controls> {
        self.controls.controls().await
    }

    async fn watch_controls(&self, seen: &Controls) -> Result<Controls> {
        self.controls.watch_controls(seen).await
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        self.controls.set_paused(paused).await
    }

    async fn request_switchover(&self, to: Option<&str>) -> Result<()> {
        self.controls.request_switchover(to).await
    }
}

#[cfg(test)]
#[path = "both_tests.rs"]
mod tests;
