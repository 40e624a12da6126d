//! Job claims on Redis: the claim is a lock on `<job>:claim` unless its
//! `<job>:done` exists; completion turns the claim into `done`. Renewal and
//! give-back are the lock's scripts on the claim key, by the group's
//! verdict, so a completed job's `done` key is never touched.

use std::time::Duration;

use tokio::time::Instant;

use redis::Value;

use super::{Ask, Got, RedisCoord, held_by, outcome};
use crate::backend::coordination::{Outcome, Result, Token, TokenKind, Try};
use crate::backend::redis::lua::{Lua, ms};
use crate::backend::redis::verdict::Tally;

impl RedisCoord {
    /// The claim key of job `job` of `queue`, when `token` is a job claim's
    /// token issued on Redis.
    fn claim_key(&self, queue: &str, job: &str, token: &str) -> Option<String> {
        Token::parse(token).filter(|t| t.kind == TokenKind::Job && t.lease == 0)?;
        let base = self.key("job", &format!("{queue}/{job}"));
        Some(format!("{base}:claim"))
    }

    /// Renew the claim `token` holds (never re-creates an expired one).
    pub(super) async fn renew_job(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Outcome> {
        let Some(key) = self.claim_key(queue, job, token) else {
            return Ok(Outcome::Gone);
        };
        let start = Instant::now();
        let verdict = self
            .group
            .renew(Lua::Renew, &[&key], &[token, &ms(ttl)])
            .await;
        let promise = self.promise(ttl, self.group.validity(ttl, start));
        outcome(verdict, Some(promise), &[&key])
    }

    /// Give back the claim `token` holds: the job can be claimed at once.
    pub(super) async fn release_job(&self, queue: &str, job: &str, token: &str) -> Result<Outcome> {
        let Some(key) = self.claim_key(queue, job, token) else {
            return Ok(Outcome::Gone);
        };
        let args = [token, key.as_str(), "released"];
        let verdict = self.group.release(Lua::Release, &[&key], &args).await;
        outcome(verdict, None, &[&key])
    }

    /// Claim a job: the lock script on its claim key unless it is done.
    pub(super) async fn claim_job(
        &self,
        queue: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Try> {
        let name = format!("{queue}/{job}");
        let base = self.key("job", &name);
        let keys = [
            format!("{base}:claim"),
            format!("{base}:fencing"),
            format!("{base}:done"),
        ];
        let ask = Ask {
            lua: Lua::Claim,
            keys: &keys,
            owner,
            args: vec![ms(ttl)],
            name: &name,
            token: Token::new(TokenKind::Job, 0),
            ttl,
        };
        match self.attempt(ask).await? {
            Got::Granted(g) => Ok(Try::Acquired(g)),
            Got::Refused(round) => {
                if round
                    .refusals()
                    .any(|r| matches!(r.as_slice(), [Value::Int(2)]))
                {
                    return Ok(Try::Completed);
                }
                Ok(Try::Held(held_by(&round).unwrap_or_default()))
            }
        }
    }

    /// Complete a claimed job: its claim becomes its `done` key, kept for
    /// `retention`.
    pub(super) async fn complete_job(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        if Token::parse(token).is_none_or(|t| t.kind != TokenKind::Job || t.lease != 0) {
            return Ok(Outcome::Gone);
        }
        let base = self.key("job", &format!("{queue}/{job}"));
        let keys = [format!("{base}:claim"), format!("{base}:done")];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let answers = self
            .group
            .eval_all(Lua::Complete, &keys, &[token, &ms(retention)])
            .await;
        let verdict = self.group.renew_verdict(Tally::of(answers), "completed");
        outcome(verdict, None, &keys)
    }
}
