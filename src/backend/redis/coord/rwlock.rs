//! Read-write locks on Redis, one server or a Redlock group (the scripts
//! and keys are in [`crate::backend::redis::lua_rw`]): the writer is a lock
//! on the base key, the readers a sorted set beside it, a waiting writer's
//! intent a key with its TTL. Each acquisition is one script per server, so
//! on one server a reader and a writer never both pass; on a Redlock group
//! each is granted by [`Group`](crate::backend::redis::group::Group)'s rule
//! (a quorum within the validity), and a reader's and a writer's quorums
//! share a server that refused one of them. Unlike a semaphore's count,
//! "no writer" and "no reader" hold per server, so a majority vote keeps
//! them. Readers take a fencing token from the same counter as the writer
//! (raised on a quorum before the grant), so a writer's is greater than
//! every earlier grant's.

use std::time::Duration;

use tokio::time::Instant;

use super::{Ask, Got, RedisCoord, held_by, outcome};
use crate::backend::coordination::{Outcome, Result, RwMode, Token, TokenKind, Try, WriteIntent};
use crate::backend::redis::lua::{Lua, ms};

impl RedisCoord {
    /// The base key of read-write lock `name` (the writer's value).
    pub(super) fn rw_base(&self, name: &str) -> String {
        self.key("rw", name)
    }

    /// Try once to take read-write lock `name` in `mode`.
    pub(super) async fn rw_acquire(
        &self,
        name: &str,
        owner: &str,
        mode: RwMode,
        ttl: Duration,
        intent: Option<&WriteIntent>,
    ) -> Result<Try> {
        let base = self.rw_base(name);
        let keys = [base.clone(), format!("{base}:fencing")];
        let (lua, kind, args) = match mode {
            RwMode::Read => (Lua::RwRead, TokenKind::Reader, vec![ms(ttl)]),
            RwMode::Write => {
                let (id, left) = intent.map_or((String::new(), "0".to_owned()), |i| {
                    (i.id.clone(), ms(i.ttl))
                });
                (Lua::RwWrite, TokenKind::Writer, vec![ms(ttl), id, left])
            }
        };
        let ask = Ask {
            lua,
            keys: &keys,
            owner,
            args,
            name,
            token: Token::new(kind, 0),
            ttl,
        };
        match self.attempt(ask).await? {
            Got::Granted(g) => {
                if let Some(i) = intent
                    && self.group.is_redlock()
                {
                    // A server that refused this writer may have recorded
                    // its intent (the grant removed it only where it
                    // granted): remove it there too.
                    self.rw_drop_intent(name, &i.id).await;
                }
                Ok(Try::Acquired(g))
            }
            Got::Refused(round) => Ok(Try::Held(held_by(&round).unwrap_or_default())),
        }
    }

    /// A reader's or writer's token issued on Redis.
    fn rw_token(token: &str) -> Option<Token> {
        Token::parse(token)
            .filter(|t| t.lease == 0 && matches!(t.kind, TokenKind::Reader | TokenKind::Writer))
    }

    /// Renew a reader's or writer's hold (a quorum must renew it).
    pub(super) async fn rw_extend(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Outcome> {
        let Some(t) = Self::rw_token(token) else {
            return Ok(Outcome::Gone);
        };
        let base = self.rw_base(name);
        let start = Instant::now();
        let lua = match t.kind {
            TokenKind::Reader => Lua::RwReadRenew,
            _ => Lua::Renew,
        };
        let verdict = self.group.renew(lua, &[&base], &[token, &ms(ttl)]).await;
        let promise = self.promise(ttl, self.group.validity(ttl, start));
        outcome(verdict, Some(promise), &[&base])
    }

    /// Release a reader's or writer's hold on every server.
    pub(super) async fn rw_drop(&self, name: &str, token: &str) -> Result<Outcome> {
        let Some(t) = Self::rw_token(token) else {
            return Ok(Outcome::Gone);
        };
        let base = self.rw_base(name);
        let verdict = match t.kind {
            TokenKind::Reader => self.group.release(Lua::RwUnread, &[&base], &[token]).await,
            _ => {
                let args = [token, base.as_str(), "released"];
                self.group.release(Lua::Release, &[&base], &args).await
            }
        };
        outcome(verdict, None, &[&base])
    }

    /// Remove writer intent `id` on every server that has it.
    pub(super) async fn rw_drop_intent(&self, name: &str, id: &str) {
        let base = self.rw_base(name);
        self.group.eval_all(Lua::RwGiveUp, &[&base], &[id]).await;
    }
}
