//! The shard keeper: one task per sidecar started with `--shards N` that
//! holds a session on the backend's [`ShardStore`], computes [`assign`]
//! from the live members and the records it reads, releases what the result
//! gives away and acquires the free shards it gives this member.
//!
//! Invariants (the protocol `tests/election_model/shards.rs` checks):
//! - this member claims a shard only while it holds the shard's record and
//!   its session's validity lasts: `TTL - margin` counted from the *send*
//!   instant of the last renewal the store acknowledged, on the monotonic
//!   clock; at that deadline it stops claiming every shard, whatever the
//!   store answers later, and opens a new session (new tokens);
//! - it stops claiming a shard (and publishes that) *before* it sends the
//!   release of the shard's record;
//! - safety rests on the store's compare-and-swap alone: members need not
//!   agree on the owner map, and a member that computes another map only
//!   fails to acquire.
//!
//! A member whose `--shards` differs is left out of the set (and said once
//! per identity); a member whose candidacy gate is closed (unready) holds no
//! session, so it owns nothing and the others take its shards.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::assign;
use crate::backend::shards::{Session, ShardSnapshot, ShardStore};

/// The shortest wait before a failed call is tried again.
const RETRY_MIN: Duration = Duration::from_millis(100);
/// How often the store is read while a shard the map gives this member is
/// still held by another (it is moving).
const PENDING_POLL: Duration = Duration::from_millis(200);

/// The keeper's settings.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    /// This member's identity.
    pub identity: String,
    /// The number of shards of the set (`--shards`, 1–4096).
    pub shards: u32,
    /// The session's TTL (the election's `--lease-duration`).
    pub ttl: Duration,
    /// How often the session is renewed (`--renew-interval`).
    pub renew_interval: Duration,
    /// Subtracted from the TTL for the validity (clock drift, as for a term).
    pub margin: Duration,
    /// Deadline of one store call.
    pub call_timeout: Duration,
}

/// What this member holds now, as published to `/shards`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardView {
    /// Grows with every change of what is published.
    pub index: u64,
    /// The shards this member claims, by id, with their fencing tokens.
    pub mine: BTreeMap<u32, u64>,
    /// Until when the claims hold (monotonic); `None` when none is held.
    pub valid_until: Option<Instant>,
    /// The owner of every shard as last read (`None`: free).
    pub owners: Vec<Option<String>>,
    /// The members of the set as last read.
    pub members: Vec<String>,
    /// When the last read of the store failed, its error in words.
    pub error: Option<String>,
}

impl ShardView {
    /// The shards claimed at `now`: none once the validity has passed.
    pub fn claimed_at(&self, now: Instant) -> BTreeMap<u32, u64> {
        match self.valid_until {
            Some(v) if now < v => self.mine.clone(),
            _ => BTreeMap::new(),
        }
    }
}

/// What one round read and holds: the snapshot, the session and its
/// validity's end.
struct Held<'a> {
    snap: &'a ShardSnapshot,
    session: &'a Session,
    valid_until: Instant,
}

/// The keeper of one member's shards.
pub struct Keeper {
    cfg: KeeperConfig,
    store: Arc<dyn ShardStore>,
    /// The session and the end of its validity.
    session: Option<(Session, Instant)>,
    next_renew: Instant,
    /// The periodic read, in case a change notice was lost.
    next_read: Instant,
    /// The last call failed: read again at the next round.
    failed: bool,
    /// Why nobody owns: members with another N are live (last read).
    mixed: Option<String>,
    view: watch::Sender<ShardView>,
    refused: BTreeSet<String>,
}

impl Keeper {
    /// A keeper over `store`, and the receiver of what it publishes.
    pub fn new(
        cfg: KeeperConfig,
        store: Arc<dyn ShardStore>,
    ) -> (Keeper, watch::Receiver<ShardView>) {
        let (view, rx) = watch::channel(ShardView {
            owners: vec![None; cfg.shards as usize],
            ..ShardView::default()
        });
        let keeper = Keeper {
            cfg,
            store,
            session: None,
            next_renew: Instant::now(),
            next_read: Instant::now(),
            failed: false,
            mixed: None,
            view,
            refused: BTreeSet::new(),
        };
        (keeper, rx)
    }

    /// Run until `stop`; `eligible` is the candidacy gate (`false`: own
    /// nothing). At the stop, stop claiming, then close the session.
    pub async fn run(mut self, mut eligible: watch::Receiver<bool>, stop: CancellationToken) {
        let mut read = true;
        let mut seen = 0;
        // A gate whose sender is gone (no health URL) never changes again:
        // its `changed` would answer at once, forever.
        let mut gated = true;
        loop {
            let open = *eligible.borrow_and_update();
            let wait = self.step(open, read).await;
            read = Instant::now() >= self.next_read;
            let valid_end = self.session.as_ref().map(|s| s.1);
            let left = wait.saturating_duration_since(Instant::now());
            tokio::select! {
                () = stop.cancelled() => break,
                r = eligible.changed(), if gated => match r {
                    Ok(()) => read = true,
                    Err(_) => gated = false,
                },
                () = sleep_until(valid_end.unwrap_or(wait)) => {}
                () = sleep_until(wait) => {}
                notice = self.store.changed(&mut seen, left) => read |= notice,
            }
        }
        self.leave().await;
    }

    /// One round: keep the session, read when `read` (or when the session
    /// is new, or a call failed), release, acquire, publish. Answers when
    /// the next round is due at the latest.
    async fn step(&mut self, eligible: bool, read: bool) -> Instant {
        let now = Instant::now();
        if self.session.as_ref().is_some_and(|s| now >= s.1) {
            warn!(
                shards = self.cfg.shards,
                "shard session's validity ended without a renewal: claiming no shard"
            );
            self.drop_all(None);
        }
        if !eligible {
            if self.session.is_some() {
                info!("candidacy gate closed: giving up every shard");
                self.leave().await;
            }
            return now + self.cfg.renew_interval;
        }
        let retry = now + RETRY_MIN.max(self.cfg.renew_interval / 4);
        let fresh = self.session.is_none();
        if let Err(e) = self.keep_session(now).await {
            self.failed = true;
            self.publish_error(e);
            return retry;
        }
        if !fresh {
            let v = self.view.borrow().clone();
            let valid = self.session.as_ref().map(|s| s.1);
            self.publish(v.mine, valid, v.owners, v.members, self.mixed.clone());
        }
        if read || fresh || self.failed {
            match self.call(self.store.read(self.cfg.shards)).await {
                Ok(snap) => {
                    self.failed = false;
                    self.next_read = now + self.cfg.ttl;
                    self.reconcile(snap).await;
                }
                Err(e) => {
                    self.failed = true;
                    self.publish_error(e);
                    return retry;
                }
            }
        }
        self.next_renew.min(self.next_read)
    }

    async fn call<T>(
        &self,
        f: impl std::future::Future<Output = crate::backend::Result<T>>,
    ) -> Result<T, String> {
        match timeout(self.cfg.call_timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.cfg.call_timeout)),
        }
    }

    /// Open a session, or renew it when due.
    async fn keep_session(&mut self, now: Instant) -> Result<(), String> {
        let validity = self.cfg.ttl.saturating_sub(self.cfg.margin);
        match &self.session {
            None => {
                let s = self
                    .call(
                        self.store
                            .open(&self.cfg.identity, self.cfg.shards, self.cfg.ttl),
                    )
                    .await?;
                let v = validity.min(s.ttl.saturating_sub(self.cfg.margin));
                self.session = Some((s, now + v));
                self.next_renew = now + self.cfg.renew_interval;
            }
            Some((s, _)) if now >= self.next_renew => {
                let s = s.clone();
                let renewed = self.call(self.store.renew(&s)).await;
                self.next_renew = now + self.cfg.renew_interval;
                match renewed {
                    Ok(true) => {
                        let v = validity.min(s.ttl.saturating_sub(self.cfg.margin));
                        self.session = Some((s, now + v));
                    }
                    Ok(false) => {
                        warn!("the store forgot this member's shard session: claiming no shard");
                        self.drop_all(None);
                        return Err("the shard session ended".into());
                    }
                    Err(e) => {
                        self.next_renew = now + RETRY_MIN.max(self.cfg.renew_interval / 4);
                        return Err(e);
                    }
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Release what [`assign`] gives away, acquire what it gives us.
    async fn reconcile(&mut self, snap: ShardSnapshot) {
        let Some((session, valid_until)) = self.session.clone() else {
            return;
        };
        let (members, mixed) = self.members_of(&snap);
        let current: Vec<Option<String>> = snap
            .shards
            .iter()
            .map(|r| r.as_ref().map(|r| r.member.clone()))
            .collect();
        // Another N's ranges overlap ours: while a member with another N
        // lives, nobody owns (each acquires only after a read, made after
        // its own session is listed, that shows no other N: two sets can
        // never hold at once).
        let next = match mixed {
            Some(_) => vec![None; current.len()],
            None => assign(&members, &current),
        };
        let mut mine = self.view.borrow().mine.clone();
        let held = Held {
            snap: &snap,
            session: &session,
            valid_until,
        };
        self.give_away(&held, &next, &mut mine, (&current, &members))
            .await;
        let mut owners = current.clone();
        self.take(&held, &next, &mut mine, &mut owners).await;
        let me = self.cfg.identity.as_str();
        for (i, o) in owners.iter_mut().enumerate() {
            if o.as_deref() == Some(me) && !mine.contains_key(&(i as u32)) {
                *o = None;
            }
        }
        self.mixed.clone_from(&mixed);
        self.publish(mine, Some(valid_until), owners, members, mixed);
    }

    /// Stop claiming the shards `next` gives to others, publish that, then
    /// delete their records (the model's release rule: in this order).
    async fn give_away(
        &mut self,
        held: &Held<'_>,
        next: &[Option<String>],
        mine: &mut BTreeMap<u32, u64>,
        (current, members): (&[Option<String>], &[String]),
    ) {
        let me = self.cfg.identity.as_str();
        let give: Vec<u32> = (0..self.cfg.shards)
            .filter(|&i| next[i as usize].as_deref() != Some(me))
            .filter(|&i| current[i as usize].as_deref() == Some(me) || mine.contains_key(&i))
            .collect();
        if give.iter().any(|i| mine.contains_key(i)) {
            for i in &give {
                mine.remove(i);
            }
            let valid = Some(held.valid_until);
            self.publish(
                mine.clone(),
                valid,
                current.to_vec(),
                members.to_vec(),
                None,
            );
        }
        for i in give {
            if held.snap.shards[i as usize]
                .as_ref()
                .is_some_and(|r| r.session == held.session.id)
            {
                let _ = self.call(self.store.release(held.session, i)).await;
            }
        }
    }

    /// Acquire the free shards `next` gives this member, while the session
    /// is valid; poll soon when one is still another's.
    async fn take(
        &mut self,
        held: &Held<'_>,
        next: &[Option<String>],
        mine: &mut BTreeMap<u32, u64>,
        owners: &mut [Option<String>],
    ) {
        let me = self.cfg.identity.clone();
        for i in 0..self.cfg.shards {
            let ix = i as usize;
            let wanted = next[ix].as_deref() == Some(me.as_str());
            let free = held.snap.shards[ix]
                .as_ref()
                .is_none_or(|r| r.session == held.session.id);
            if !wanted || !free || mine.contains_key(&i) {
                continue;
            }
            if Instant::now() >= held.valid_until {
                break;
            }
            let acquired = self.call(self.store.acquire(held.session, &me, i)).await;
            if let Ok(Some(token)) = acquired {
                mine.insert(i, token);
                owners[ix] = Some(me.clone());
            }
        }
        // A shard ours by the map but not free yet (its owner has not let it
        // go): look again soon, not only at the next notice.
        let waiting = (0..self.cfg.shards)
            .any(|i| next[i as usize].as_deref() == Some(me.as_str()) && !mine.contains_key(&i));
        if waiting {
            self.next_read = self.next_read.min(Instant::now() + PENDING_POLL);
        }
    }

    /// The members of the set: those with our `--shards`; and, when a live
    /// member runs another N, the error that says so (each such member is
    /// also logged once).
    fn members_of(&mut self, snap: &ShardSnapshot) -> (Vec<String>, Option<String>) {
        let mut out = Vec::new();
        let mut others = Vec::new();
        for m in &snap.members {
            if m.shards == self.cfg.shards {
                out.push(m.identity.clone());
                continue;
            }
            others.push(format!("{} (--shards {})", m.identity, m.shards));
            if self.refused.insert(m.identity.clone()) {
                warn!(member = %m.identity, its_shards = m.shards, shards = self.cfg.shards,
                    "a member of this election runs with another --shards: their hash ranges overlap ours, so no member owns a shard until every member runs the same number");
            }
        }
        if !out.contains(&self.cfg.identity) {
            out.push(self.cfg.identity.clone());
        }
        let mixed = (!others.is_empty()).then(|| {
            format!(
                "members with another --shards are live: {}; no member owns a shard until every member runs --shards {} (or all run theirs)",
                others.join(", "),
                self.cfg.shards
            )
        });
        (out, mixed)
    }

    fn publish(
        &self,
        mine: BTreeMap<u32, u64>,
        valid_until: Option<Instant>,
        owners: Vec<Option<String>>,
        members: Vec<String>,
        error: Option<String>,
    ) {
        self.view.send_if_modified(|v| {
            let valid_until = if mine.is_empty() { None } else { valid_until };
            // A renewal moves only the validity: not a change to wake a
            // long-poll for (the answer's `valid_for_ms` shows it).
            let same =
                v.mine == mine && v.owners == owners && v.members == members && v.error == error;
            v.valid_until = valid_until;
            if !same {
                *v = ShardView {
                    index: v.index + 1,
                    mine,
                    valid_until,
                    owners,
                    members,
                    error,
                };
            }
            !same
        });
    }

    fn publish_error(&self, error: String) {
        let v = self.view.borrow().clone();
        let valid = self.session.as_ref().map(|s| s.1);
        self.publish(v.mine, valid, v.owners, v.members, Some(error));
    }

    /// Stop claiming every shard and forget the session.
    fn drop_all(&mut self, error: Option<String>) {
        self.session = None;
        let v = self.view.borrow().clone();
        let me = self.cfg.identity.as_str();
        let owners = v
            .owners
            .iter()
            .map(|o| o.clone().filter(|o| o != me))
            .collect();
        self.publish(BTreeMap::new(), None, owners, v.members, error);
    }

    /// Stop claiming, then close the session (its records go with it).
    async fn leave(&mut self) {
        let session = self.session.as_ref().map(|s| s.0.clone());
        self.drop_all(None);
        let Some(s) = session else { return };
        if let Err(e) = self.call(self.store.close(&s)).await {
            warn!(error = %e, "cannot close the shard session: its shards move when its TTL runs out");
        }
    }
}
