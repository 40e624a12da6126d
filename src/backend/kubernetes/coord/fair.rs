//! Fair locks on a Lease: a waiter appends itself to the lock's queue (in
//! its state, by compare-and-swap), so waiters are served in arrival order
//! across sidecars. The first live waiter takes the lock, in one write that
//! removes it from the queue, once no holder is live by its sidecar's sight;
//! waiters ahead of it whose TTL ended by that sight are dropped in the same
//! write. While it waits, its sidecar renews its entry every third of its
//! TTL (others would judge it gone after a TTL of silence), and a waiter
//! whose `wait` ends removes its entry. A waiter whose entry vanished
//! (judged expired by another sidecar while this one stalled) answers
//! [`CoordError::QueueLost`] and holds nothing.

use std::time::Duration;

use tokio::time::Instant;

use super::io::{Decision, View};
use super::names::object_name;
use super::state::{Entry, Target};
use super::{LeaseCoord, entry, grant};
use crate::backend::coordination::{CoordError, Kind, Result, Token, TokenKind, Try};

/// Where a waiter stands after one look.
enum Stand {
    /// Granted.
    Granted(Try),
    /// Queued (or still queued): the holder's or the first waiter's owner.
    Queued(String),
}

/// The holder or, if none, the first waiter: who a refusal names.
fn ahead(v: &View, token: &str) -> String {
    let mut others = v.sight.live.iter().chain(&v.sight.queue);
    let first = others.find(|e| e.token != token);
    first.map(|e| e.owner.clone()).unwrap_or_default()
}

/// The first waiter (`me`, its holder entry) takes the lock: in one write,
/// it becomes the holder, and it and the waiters ahead of it whose TTL
/// ended by this sidecar's sight leave the queue.
fn take_first(v: &View, name: &str, token: &str, me: Entry) -> Decision<Result<Stand>> {
    let mut state = v.stored.clone();
    state
        .holders
        .retain(|e| !v.sight.expired.contains(&e.token));
    let live = |e: &Entry| v.sight.queue.iter().any(|q| q.token == e.token);
    state.queue.retain(|e| e.token != token && live(e));
    let ttl = me.ttl();
    state.holders.push(me);
    let g = grant(name, token, v.next_fencing, ttl);
    Decision::Write {
        state,
        bump: true,
        answer: Ok(Stand::Granted(Try::Acquired(g))),
    }
}

impl LeaseCoord {
    /// Take lock `name` in arrival order, waiting up to `wait` (see the
    /// module docs).
    pub(super) async fn queue_for(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        let object = object_name(Kind::Lock, name);
        let t = self.target(Kind::Lock, name, &object);
        let token = Token::new(TokenKind::FairLock, 0).to_string();
        let until = Instant::now() + wait;
        let mut refreshed = Instant::now();
        let mut joined = false;
        loop {
            let notice = self.book.notice(&object);
            let notified = notice.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let keep_alive = joined && refreshed.elapsed() >= ttl / 3;
            let queue = !wait.is_zero();
            let stand = self.look(&t, &token, owner, ttl, joined, queue, keep_alive);
            let holder = match stand.await? {
                Stand::Granted(g) => return Ok(g),
                Stand::Queued(h) => h,
            };
            if keep_alive || !joined {
                refreshed = Instant::now();
            }
            joined = queue;
            if Instant::now() >= until {
                return self.leave(&t, &token, holder).await;
            }
            let expiry = self.book.sight(&object, Instant::now()).next_expiry;
            let mut wake = (refreshed + ttl / 3)
                .min(until)
                .min(expiry.unwrap_or(until));
            if !self.following() {
                wake = wake.min(Instant::now() + super::NAP_UNFOLLOWED);
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One look: take the lock when this waiter is first and nobody holds
    /// it; else join the queue (`queue`), or renew the entry
    /// (`keep_alive`); `joined`: it should be in the queue.
    #[allow(clippy::too_many_arguments)]
    async fn look(
        &self,
        t: &Target<'_>,
        token: &str,
        owner: &str,
        ttl: Duration,
        joined: bool,
        queue: bool,
        keep_alive: bool,
    ) -> Result<Stand> {
        self.update(t, |v| {
            let mine = v.stored.queue.iter().find(|e| e.token == token);
            if joined && mine.is_none() {
                return Ok(if v.fresh {
                    Decision::Answer(Err(CoordError::QueueLost {
                        name: t.name.to_owned(),
                    }))
                } else {
                    Decision::Confirm
                });
            }
            let first = v.sight.queue.iter().find(|e| e.token != token).is_none()
                || v.sight.queue.first().is_some_and(|e| e.token == token);
            if v.sight.live.is_empty() && first {
                let at = mine.map(|m| m.at_ms);
                return Ok(take_first(v, t.name, token, entry(token, owner, ttl, at)));
            }
            let holder = ahead(v, token);
            if !joined && !queue && !v.fresh {
                return Ok(Decision::Confirm);
            }
            if joined && !keep_alive || !joined && !queue {
                return Ok(Decision::Answer(Ok(Stand::Queued(holder))));
            }
            let mut state = v.stored.clone();
            let me = entry(token, owner, ttl, mine.map(|m| m.at_ms));
            match state.queue.iter_mut().find(|e| e.token == token) {
                Some(e) => *e = me,
                None => state.queue.push(me),
            }
            Ok(Decision::Write {
                state,
                bump: false,
                answer: Ok(Stand::Queued(holder)),
            })
        })
        .await?
    }

    /// Leave the queue at the end of the wait: refused, naming `holder`.
    async fn leave(&self, t: &Target<'_>, token: &str, holder: String) -> Result<Try> {
        self.update(t, |v| {
            if !v.stored.queue.iter().any(|e| e.token == token) {
                return Ok(Decision::Answer(()));
            }
            let mut state = v.stored.clone();
            state.queue.retain(|e| e.token != token);
            Ok(Decision::Write {
                state,
                bump: false,
                answer: (),
            })
        })
        .await?;
        Ok(Try::Held(holder))
    }
}
