//! Read-write locks on Leases: one Lease per name (`le-rw-…`, kind
//! `rwlock`), its holders any number of readers or one writer, each a
//! holder entry like a lock's; a holder's mode is its token's kind
//! (`v1.r.…` a reader, `v1.w.…` the writer), so the state cannot say one
//! thing and the token another. A waiting writer's intent is the state's
//! `intent` entry (its id, the writer's owner, the intent's TTL).
//!
//! Rules, in the one compare-and-swap write that grants:
//! - a reader is granted when no writer and no writer intent is live by
//!   this sidecar's sight; a writer when no holder is live and the live
//!   intent, if any, is its own (the grant removes it);
//! - every grant, a reader's too, raises the fencing counter, so a writer's
//!   token is greater than every earlier grant's of that name;
//! - a writer that waits and is kept out records its intent when none is
//!   live; the intent lapses when the writer gives up (it removes it), is
//!   granted, or its TTL (what is left of the wait plus one second) ends by
//!   sight, like a holder's: a writer's first sight by any sidecar comes
//!   after its write, so no sidecar drops it before the writer stops waiting.
//!
//! Renew and release are a lock's ([`LeaseCoord::act`]): 410 on renew and
//! 409 on release once the token holds nothing. Waiters wake on the
//! object's watch events ([`LeaseCoord::rw_wait`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use super::book::Sight;
use super::io::{Decision, View, ms};
use super::names::object_name;
use super::state::{Entry, Stored};
use super::{LeaseCoord, entry, grant};
use crate::backend::coordination::{
    Kind, Outcome, Result, RwMode, Token, TokenKind, Try, WriteIntent,
};
use crate::backend::kubernetes::unix_millis;

/// The `resourceVersion` of `lease`.
fn lease_version(lease: &Lease) -> String {
    lease.metadata.resource_version.clone().unwrap_or_default()
}

/// The version of the object a verb looked at (empty: absent).
fn version(v: &View) -> String {
    v.sight
        .lease
        .as_ref()
        .map(lease_version)
        .unwrap_or_default()
}

/// Whether holder `e` is a writer (by its token's kind).
fn is_writer(e: &Entry) -> bool {
    Token::parse(&e.token).is_some_and(|t| t.kind == TokenKind::Writer)
}

/// The state of `v` without the holders and the intent whose TTL ended by
/// this sidecar's sight: the base of every write.
fn cleaned(v: &View) -> Stored {
    let mut state = v.stored.clone();
    state
        .holders
        .retain(|e| !v.sight.expired.contains(&e.token));
    state.intent = v.sight.intent.clone().map(Box::new);
    state
}

/// Who keeps a request of `mode` out in `v` (`id`: its writer intent):
/// the writer; a waiting writer's intent (for readers, and writers whose
/// intent it is not); a reader (for writers).
fn keeper<'a>(v: &'a View, mode: RwMode, id: Option<&str>) -> Option<&'a Entry> {
    let live = &v.sight.live;
    let writer = live.iter().find(|e| is_writer(e));
    let intent = v.sight.intent.as_ref();
    match mode {
        RwMode::Read => writer.or(intent),
        RwMode::Write => writer
            .or(intent.filter(|i| id != Some(i.token.as_str())))
            .or(live.first()),
    }
}

/// The answer to one look at `v` by a request of `mode` for `owner` (see
/// the module docs): a grant of `token`, a refusal, or a refusal that
/// records `intent`.
fn decide(
    v: &View,
    name: &str,
    owner: &str,
    mode: RwMode,
    (token, ttl): (&str, Duration),
    intent: Option<&WriteIntent>,
) -> Decision<Try> {
    let id = intent.map(|i| i.id.as_str());
    if let Some(k) = keeper(v, mode, id) {
        if !v.fresh {
            return Decision::Confirm;
        }
        let held = Try::Held(k.owner.clone());
        let Some(i) = intent.filter(|_| v.sight.intent.is_none()) else {
            return Decision::Answer(held);
        };
        let mut state = cleaned(v);
        state.intent = Some(Box::new(Entry {
            token: i.id.clone(),
            owner: owner.to_owned(),
            ttl_ms: ms(i.ttl),
            at_ms: unix_millis(),
        }));
        return Decision::Write {
            state,
            bump: false,
            answer: held,
        };
    }
    let mut state = cleaned(v);
    if mode == RwMode::Write {
        state.intent = None;
    }
    state.holders.push(entry(token, owner, ttl, None));
    Decision::Write {
        state,
        bump: true,
        answer: Try::Acquired(grant(name, token, v.next_fencing, ttl)),
    }
}

impl LeaseCoord {
    /// Try once to take read-write lock `name` in `mode`
    /// ([`Acquire::RwLock`](crate::backend::coordination::Acquire::RwLock)).
    pub(super) async fn rw_acquire(
        &self,
        name: &str,
        owner: &str,
        mode: RwMode,
        ttl: Duration,
        intent: Option<&WriteIntent>,
    ) -> Result<Try> {
        let object = object_name(Kind::RwLock, name);
        let t = self.target(Kind::RwLock, name, &object);
        let kind = match mode {
            RwMode::Read => TokenKind::Reader,
            RwMode::Write => TokenKind::Writer,
        };
        let token = Token::new(kind, 0).to_string();
        let mut looked = String::new();
        let r = self
            .update(&t, |v| {
                looked = version(v);
                Ok(decide(v, name, owner, mode, (&token, ttl), intent))
            })
            .await;
        if let Some(i) = intent {
            let granted = matches!(r, Ok(Try::Acquired(_)));
            let end = Instant::now() + i.ttl;
            self.waiting_writer(&i.id, (!granted).then_some((end, looked)));
        }
        r
    }

    /// Remember (`Some`: the end of its TTL, the version its last refusal
    /// was decided on) or forget the intent `id` of a writer waiting on this
    /// sidecar.
    fn waiting_writer(&self, id: &str, waits: Option<(Instant, String)>) {
        let mut w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        w.retain(|_, (end, _)| *end > now);
        match waits {
            Some(x) => w.insert(id.to_owned(), x),
            None => w.remove(id),
        };
    }

    /// Whether `id` is the intent of a writer waiting on this sidecar that
    /// has not looked at the object's version `seen` yet.
    fn may_look_again(&self, id: &str, seen: &str) -> bool {
        let w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        w.get(id)
            .is_some_and(|(end, looked)| *end > Instant::now() && looked != seen)
    }

    /// Remove writer intent `id` of read-write lock `name` when it is still
    /// there ([`Coordinator::give_up`](crate::backend::coordination::Coordinator::give_up)).
    pub(super) async fn rw_drop_intent(&self, name: &str, id: &str) -> Result<()> {
        self.waiting_writer(id, None);
        let object = object_name(Kind::RwLock, name);
        let t = self.target(Kind::RwLock, name, &object);
        self.update(&t, |v| {
            if v.stored.intent.as_ref().is_none_or(|i| i.token != id) {
                return Ok(Decision::Answer(()));
            }
            let mut state = v.stored.clone();
            state.intent = None;
            Ok(Decision::Write {
                state,
                bump: false,
                answer: (),
            })
        })
        .await
    }

    /// Renew (`ttl`) or release (`None`) a reader's or writer's hold of
    /// read-write lock `name`.
    pub(super) async fn rw_act(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
    ) -> Result<Outcome> {
        let ours = Token::parse(token).is_some_and(|t| {
            t.lease == 0 && matches!(t.kind, TokenKind::Reader | TokenKind::Writer)
        });
        if !ours {
            return Ok(Outcome::Gone);
        }
        let object = object_name(Kind::RwLock, name);
        let t = self.target(Kind::RwLock, name, &object);
        self.act(&t, token, ttl).await
    }

    /// Wait until read-write lock `name` may have changed, or `until`: at
    /// once when, by this sidecar's sight, a reader could enter (no live
    /// writer or intent) or a writer waiting here could (no live holder,
    /// its intent live) and has not looked at this version yet, so a change
    /// seen between the caller's look and this wait is not slept through
    /// (and nobody spins while the writer takes its turn); else until the
    /// object's next watch event or the next expiry by sight.
    pub(super) async fn rw_wait(&self, name: &str, until: Instant) -> Result<()> {
        let object = object_name(Kind::RwLock, name);
        let may_enter = |s: &Sight| {
            let intent = s.intent.as_ref();
            let reader = !s.live.iter().any(is_writer) && intent.is_none();
            let seen = s.lease.as_ref().map(lease_version).unwrap_or_default();
            let writer = intent.is_some_and(|i| self.may_look_again(&i.token, &seen));
            reader || s.live.is_empty() && writer
        };
        self.sleep_on(&object, until, may_enter).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(kind: TokenKind, owner: &str) -> Entry {
        entry(
            &Token::new(kind, 0).to_string(),
            owner,
            Duration::from_secs(9),
            None,
        )
    }

    /// A fresh view of `holders` live and `intent`, next fencing token 7.
    fn view(holders: Vec<Entry>, intent: Option<Entry>) -> View {
        let stored = Stored {
            holders: holders.clone(),
            intent: intent.clone().map(Box::new),
            ..Stored::default()
        };
        View {
            sight: Sight {
                live: holders,
                intent,
                ..Sight::default()
            },
            stored,
            next_fencing: 7,
            fresh: true,
        }
    }

    fn ask(v: &View, mode: RwMode, intent: Option<&WriteIntent>) -> Decision<Try> {
        let kind = match mode {
            RwMode::Read => TokenKind::Reader,
            RwMode::Write => TokenKind::Writer,
        };
        let token = Token::new(kind, 0).to_string();
        decide(
            v,
            "doc",
            "me",
            mode,
            (&token, Duration::from_secs(5)),
            intent,
        )
    }

    fn waiting(id: &str) -> WriteIntent {
        WriteIntent {
            id: id.into(),
            ttl: Duration::from_secs(3),
        }
    }

    #[test]
    fn readers_share_and_every_grant_raises_the_fencing_token() {
        let v = view(vec![holder(TokenKind::Reader, "ra")], None);
        let Decision::Write {
            state,
            bump,
            answer,
        } = ask(&v, RwMode::Read, None)
        else {
            panic!("a second reader is refused");
        };
        assert!(bump && state.holders.len() == 2);
        assert!(matches!(answer, Try::Acquired(g) if g.fencing_token == 7));
    }

    #[test]
    fn a_waiting_writer_kept_out_by_readers_records_its_intent_and_readers_wait() {
        let v = view(vec![holder(TokenKind::Reader, "ra")], None);
        let w = waiting("i1");
        let Decision::Write {
            state,
            bump,
            answer,
        } = ask(&v, RwMode::Write, Some(&w))
        else {
            panic!("no intent recorded");
        };
        assert_eq!((bump, answer), (false, Try::Held("ra".into())));
        let intent = *state.intent.clone().expect("an intent");
        assert_eq!((intent.token.as_str(), intent.owner.as_str()), ("i1", "me"));
        assert_eq!(intent.ttl_ms, 3000);
        // A new reader is kept out by the intent, naming the writer.
        let v = view(vec![holder(TokenKind::Reader, "ra")], Some(intent.clone()));
        assert!(matches!(ask(&v, RwMode::Read, None), Decision::Answer(Try::Held(o)) if o == "me"));
        // Another writer waits behind it without replacing it.
        let other = waiting("i2");
        assert!(matches!(
            ask(&v, RwMode::Write, Some(&other)),
            Decision::Answer(Try::Held(_))
        ));
        // Readers gone: the writer whose intent it is is granted, and its
        // intent goes in the same write.
        let v = view(vec![], Some(intent));
        let Decision::Write { state, bump, .. } = ask(&v, RwMode::Write, Some(&w)) else {
            panic!("the writer is refused");
        };
        assert!(bump && state.intent.is_none() && state.holders.len() == 1);
    }

    #[test]
    fn a_writer_excludes_everyone_and_refusals_need_a_fresh_read() {
        let mut v = view(vec![holder(TokenKind::Writer, "w")], None);
        for mode in [RwMode::Read, RwMode::Write] {
            assert!(matches!(ask(&v, mode, None), Decision::Answer(Try::Held(o)) if o == "w"));
        }
        v.fresh = false;
        assert!(matches!(ask(&v, RwMode::Read, None), Decision::Confirm));
        // Liveness twin: with nothing live, a writer is granted at once.
        let v = view(vec![], None);
        assert!(matches!(
            ask(&v, RwMode::Write, None),
            Decision::Write { bump: true, .. }
        ));
    }
}
