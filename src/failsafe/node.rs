//! One process's failsafe: its promises as a member (the gate before every
//! campaign), its applications for the roster, the heartbeat rounds it
//! sends as a leader, and its peer listener. The Elector calls it at four
//! narrow points (before a campaign, after it, before each write of its
//! term, and while a renewal finds the backend unreachable); the protocol's
//! rules stay here and in [`Promises`] / [`Confirmations`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::peer::{self, Counters, PeerState, Sender};
use super::sign::{Keys, Nonces};
use super::{Confirmations, Heartbeat, Member, Promises, Roster, RosterStore};

/// Why a member does not campaign now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// It promised a leader not to campaign until this instant.
    Promised(Instant),
    /// It started less than one maximum promise ago and has promised
    /// nothing since: what an earlier process promised may hold until
    /// this instant.
    StartWait(Instant),
    /// A roster exists and does not list it: it waits to be admitted.
    NotOnRoster,
    /// The roster could not be read: it cannot know whether it may (the
    /// backend says why in the log: a Redis server without persistence
    /// warns once).
    Unknown,
}

/// What keeps a member with these `promises` from campaigning now, if
/// anything does.
pub(super) fn hold_of(promises: &Promises) -> Option<Hold> {
    let until = promises.until();
    if promises.may_campaign(Instant::now()) {
        None
    } else if promises.promised() {
        Some(Hold::Promised(until))
    } else {
        Some(Hold::StartWait(until))
    }
}

/// One process's failsafe state (shared by the Elector, the peer listener
/// and the application task).
pub struct Failsafe {
    election: String,
    me: Member,
    keys: Keys,
    /// The nonces of heartbeats received, and of answers received.
    nonces: (Arc<Nonces>, Nonces),
    counters: Counters,
    max_promise: Duration,
    promises: Arc<Mutex<Promises>>,
    /// Set while this member leads or has a campaign on the wire; read by
    /// the peer listener under the promises' lock.
    campaigning: Arc<AtomicBool>,
    store: Arc<dyn RosterStore>,
    /// The applications as last listed whose peer channel this process
    /// confirmed (the next roster's members).
    applicants: Mutex<Vec<Member>>,
    /// The applicants confirmed (identity → the address confirmed), and
    /// those refused and warned of.
    checked: Mutex<(BTreeMap<String, String>, BTreeMap<String, String>)>,
    client: reqwest::Client,
}

impl std::fmt::Debug for Failsafe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failsafe")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Failsafe {
    /// The failsafe of member `me` in `election`, started now: it campaigns
    /// no sooner than `max_promise` from now (what an earlier process of
    /// it promised has run out by then), and asks no more of its members;
    /// its promises to one term add up to at most `max_outage` without a
    /// sight of that term in the backend. Messages are signed with `keys`
    /// and refused outside a window of `max_promise`.
    pub fn new(
        election: &str,
        me: Member,
        keys: Keys,
        store: Arc<dyn RosterStore>,
        (max_promise, max_outage): (Duration, Duration),
    ) -> Failsafe {
        let limits = (max_promise, max_outage);
        let promises = Promises::new(election, &me.identity, limits, Instant::now());
        Failsafe {
            election: election.to_owned(),
            applicants: Mutex::new(vec![me.clone()]),
            me,
            keys,
            nonces: (Arc::new(Nonces::new(max_promise)), Nonces::new(max_promise)),
            counters: Counters::new(election),
            checked: Mutex::default(),
            max_promise,
            promises: Arc::new(Mutex::new(promises)),
            campaigning: Arc::new(AtomicBool::new(false)),
            store,
            client: reqwest::Client::new(),
        }
    }

    /// This member.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The longest promise asked or given.
    pub fn max_promise(&self) -> Duration {
        self.max_promise
    }

    /// The peer channel's counters (register them to serve them).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The peer listener's router (the heartbeat only).
    pub fn router(&self) -> axum::Router {
        peer::router(PeerState {
            keys: self.keys.clone(),
            nonces: self.nonces.0.clone(),
            counters: self.counters.clone(),
            promises: self.promises.clone(),
            campaigning: {
                let c = self.campaigning.clone();
                Arc::new(move || c.load(Ordering::SeqCst))
            },
        })
    }

    /// Serve the peer listener on `listener` until `stop`.
    ///
    /// # Errors
    /// The server's I/O error.
    pub async fn serve(
        &self,
        listener: TcpListener,
        stop: CancellationToken,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    }

    /// The gate before every campaign. `Ok`: campaign now; this member
    /// refuses heartbeats from here until [`campaign_ended`](Self::campaign_ended)
    /// (or, elected, until [`stepped_down`](Self::stepped_down)).
    ///
    /// # Errors
    /// [`Hold`]: why not now.
    pub async fn before_campaign(&self, call_timeout: Duration) -> Result<(), Hold> {
        let hold = hold_of(&self.promises.lock().expect("the promises lock"));
        if let Some(hold) = hold {
            return Err(hold);
        }
        let roster = tokio::time::timeout(call_timeout, self.store.roster()).await;
        match roster {
            Ok(Ok(Some(r))) if !r.may_campaign(&self.me.identity) => return Err(Hold::NotOnRoster),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                debug!(error = %e.report(), "cannot read the failsafe roster; not campaigning");
                return Err(Hold::Unknown);
            }
            Err(_) => return Err(Hold::Unknown),
        }
        // Checked and set under the promises' lock, so no heartbeat is
        // accepted between the check and the campaign.
        let promises = self.promises.lock().expect("the promises lock");
        if let Some(hold) = hold_of(&promises) {
            return Err(hold);
        }
        self.campaigning.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The campaign's answer came back (or it failed): heartbeats are
    /// accepted again unless this member was `elected`.
    pub fn campaign_ended(&self, elected: bool) {
        if !elected {
            self.campaigning.store(false, Ordering::SeqCst);
        }
    }

    /// This member's term is over: heartbeats are accepted again.
    pub fn stepped_down(&self) {
        self.campaigning.store(false, Ordering::SeqCst);
    }

    /// A fencing token seen in the backend (heartbeats of older terms are refused).
    pub fn saw_token(&self, token: u64) {
        self.promises
            .lock()
            .expect("the promises lock")
            .saw_token(token);
    }

    /// A backend answer showed the term with fencing token `token` holding
    /// the key (`None`: nobody); see [`Promises::saw`].
    pub fn saw(&self, token: Option<u64>) {
        let mut p = self.promises.lock().expect("the promises lock");
        p.saw(token, Instant::now());
    }

    /// A backend call failed (see [`Promises::blind`]).
    pub fn blind(&self) {
        self.promises.lock().expect("the promises lock").blind();
    }

    /// The leader this member promised last and until when (`None`: no
    /// promise holds), so a follower keeps naming it while the backend is
    /// silent.
    pub fn vouched(&self) -> Option<(String, Instant)> {
        let p = self.promises.lock().expect("the promises lock");
        p.leader_at(Instant::now())
            .map(|l| (l.to_owned(), p.until()))
    }

    /// The roster this member's next write of its term would carry:
    /// itself and every application last listed.
    pub fn peek_next(&self) -> Roster {
        let members = self.applicants.lock().expect("the applicants lock").clone();
        Roster::new(members.into_iter().chain([self.me.clone()]))
    }

    /// Stage `roster` for this member's next campaign or renewal.
    pub fn stage(&self, roster: Roster) {
        self.store.stage(&self.me.identity, roster);
    }

    /// [`peek_next`](Self::peek_next), staged.
    pub fn stage_next(&self) -> Roster {
        let roster = self.peek_next();
        self.stage(roster.clone());
        roster
    }

    /// Write this member's application and list the others, every `every`
    /// until `stop`; withdraw it at the end.
    pub async fn keep_applying(
        &self,
        every: Duration,
        call_timeout: Duration,
        stop: CancellationToken,
    ) {
        let ttl = every * 3;
        loop {
            let apply = tokio::time::timeout(call_timeout, self.store.apply(&self.me, ttl)).await;
            if let Ok(Err(e)) = apply {
                debug!(error = %e.report(), "could not write the failsafe application");
            }
            if let Ok(Ok(list)) = tokio::time::timeout(call_timeout, self.store.applicants()).await
            {
                let list = self.confirm_applicants(list, call_timeout).await;
                *self.applicants.lock().expect("the applicants lock") = list;
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
        }
        let _ = tokio::time::timeout(call_timeout, self.store.withdraw(&self.me.identity)).await;
    }

    /// The applicants in `list` whose peer channel answers a signed probe
    /// with a signed acknowledgement in their own name, each probed once
    /// per address (a refused one again at every listing, warned of and
    /// counted once until it passes).
    async fn confirm_applicants(&self, list: Vec<Member>, wait: Duration) -> Vec<Member> {
        let probes = list.into_iter().map(|m| async move {
            let known = {
                let checked = self.checked.lock().expect("the checked lock");
                checked.0.get(&m.identity) == Some(&m.peer_addr)
            };
            if m.identity == self.me.identity || known {
                return Some(m);
            }
            let hb = Heartbeat {
                election: self.election.clone(),
                leader: self.me.identity.clone(),
                fencing_token: 0,
                promise_ms: 0,
            };
            let ack = peer::send(self.sender(), &m.peer_addr, &hb, wait).await;
            let ack = ack.and_then(|a| {
                (a.member == m.identity)
                    .then_some(())
                    .ok_or_else(|| format!("it answered as {:?}", a.member))
            });
            let mut checked = self.checked.lock().expect("the checked lock");
            match ack {
                Ok(()) => {
                    if checked.1.remove(&m.identity).is_some() {
                        info!(member = %m.identity, "a failsafe applicant refused before is confirmed now");
                    }
                    checked.0.insert(m.identity.clone(), m.peer_addr.clone());
                    Some(m)
                }
                Err(why) => {
                    if checked.1.insert(m.identity.clone(), why.clone()).is_none() {
                        self.counters.refuse_admission();
                        warn!(member = %m.identity, peer_addr = %m.peer_addr, reason = %why, "refused a failsafe applicant: this process cannot confirm it over its peer channel, so it is not admitted to the roster");
                    }
                    None
                }
            }
        });
        join_all(probes).await.into_iter().flatten().collect()
    }

    fn sender(&self) -> Sender<'_> {
        Sender {
            client: &self.client,
            keys: &self.keys,
            nonces: &self.nonces.1,
            counters: &self.counters,
        }
    }

    /// One round of heartbeats from this leader (term `fencing_token`) to
    /// every member `confirm` requires, at the addresses in `addresses`,
    /// each answer awaited at most `wait`. Returns the send instant and, per
    /// member, its promise to count or why it cannot be counted.
    pub async fn heartbeat_round(
        &self,
        confirm: &Confirmations,
        addresses: &BTreeMap<String, String>,
        fencing_token: u64,
        wait: Duration,
    ) -> (Instant, Vec<(String, Result<Duration, String>)>) {
        let hb = Heartbeat {
            election: self.election.clone(),
            leader: self.me.identity.clone(),
            fencing_token,
            promise_ms: self.max_promise.as_millis() as u64,
        };
        let sent = Instant::now();
        let sends = confirm.required().filter_map(|id| {
            let addr = addresses.get(id)?;
            let (hb, id) = (&hb, id.to_owned());
            Some(async move {
                let ack = peer::send(self.sender(), addr, hb, wait).await;
                let promise = ack.and_then(|a| {
                    if a.member == id {
                        Ok(Duration::from_millis(a.promise_ms))
                    } else {
                        Err(format!("{addr} answered as {:?}, not {id:?}", a.member))
                    }
                });
                Some((id, promise))
            })
        });
        let acks = join_all(sends).await;
        let acks = acks.into_iter().flatten().collect();
        (sent, acks)
    }
}
