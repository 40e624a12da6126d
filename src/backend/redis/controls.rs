//! Operator controls on Redis, beside the election key (same hash tag):
//! `<prefix>{<election>}:paused` (present: paused) and
//! `<prefix>{<election>}:switchover` (the identity asked for), without a
//! TTL; each change is published on `<prefix>{<election>}:controls`.
//!
//! The campaign script refuses a free key while the pause marker exists on
//! its server ([`super::lua::Lua::Campaign`]): a pause written before a
//! campaign's script ran is seen by it. **Redlock**: a pause counts only
//! when a quorum of servers wrote it (else it is taken back where it was
//! written and refused): a grant needs a quorum too, and two quorums share
//! a server, so no term can be granted while a quorum is paused. The
//! controls read are those a quorum of servers agrees on ([`agreed`]).
//!
//! How a change reaches the sidecars: pub/sub for changes made through
//! [`RedisBackend::pause`] and [`RedisBackend::switchover`]; a hand edit of
//! a control key publishes nothing, so the leader's renew script answers
//! the controls too ([`super::lua`]'s `RENEW_HEAD`), judged by the same
//! quorum rule over the servers that renewed, and a change there wakes the
//! controls watch at the leader's next renewal. Followers (no renewals)
//! read again every [`RedisBackend::set_reread`] (the lease duration).

use redis::{FromRedisValue, Value};

use super::RedisBackend;
use super::answered::Answers;
use super::lua::Lua;
use super::server::Server;
use super::verdict::{Tally, Verdict};
use crate::backend::Result;
use crate::backend::controls::Controls;

/// One server's controls: the pause marker exists, the switchover request.
type Seen = (bool, Option<String>);

/// **The controls a quorum agrees on**, from the servers' answers `seen`:
/// paused when at least `quorum` of them are paused, the switchover
/// request that at least `quorum` of them carry (one server: its own).
pub(super) fn agreed(seen: &[Seen], quorum: usize) -> Controls {
    let paused = seen.iter().filter(|(p, _)| *p).count() >= quorum;
    let switchover = seen.iter().find_map(|(_, to)| {
        let to = to.as_ref()?;
        let n = seen.iter().filter(|(_, t)| t.as_ref() == Some(to)).count();
        (n >= quorum).then(|| to.clone())
    });
    Controls { paused, switchover }
}

/// Split one server's renew answer `{code, paused, switchover}` into the
/// code (for the [`Tally`], which counts any other shape as a failure)
/// and the controls it read.
fn split_renewal(answer: Result<Value>) -> (Result<Value>, Option<Seen>) {
    if let Ok(Value::Array(items)) = &answer
        && let [code @ Value::Int(_), Value::Int(p), to] = items.as_slice()
    {
        let to = <Option<String> as FromRedisValue>::from_redis_value(to);
        if let Ok(to) = to {
            return (Ok(code.clone()), Some((*p == 1, to)));
        }
    }
    (answer, None)
}

impl RedisBackend {
    pub(super) fn paused_key(&self) -> String {
        format!("{}:paused", self.key)
    }

    fn switchover_key(&self) -> String {
        format!("{}:switchover", self.key)
    }

    fn controls_channel(&self) -> String {
        format!("{}:controls", self.key)
    }

    /// One server's controls.
    async fn controls_on(&self, server: &Server) -> Result<(bool, Option<String>)> {
        let (paused, to): (bool, Option<String>) = server
            .query(
                "read",
                redis::pipe()
                    .cmd("EXISTS")
                    .arg(self.paused_key())
                    .cmd("GET")
                    .arg(self.switchover_key()),
            )
            .await?;
        Ok((paused, to))
    }

    /// The controls a quorum of servers agrees on.
    pub(super) async fn read_controls(&self) -> Result<Controls> {
        let servers = self.group.servers();
        let reads = futures_util::future::join_all(servers.iter().map(|s| self.controls_on(s)));
        let seen = Answers::of(reads.await).on_quorum(&self.group, "answered")?;
        Ok(agreed(&seen, self.quorum()))
    }

    /// Run the election's renew script (`keys[0]` the key, `args` as
    /// [`Lua::ElectionRenew`] takes them) with the control keys beside it,
    /// and judge it; a renewal done on a quorum also records the controls
    /// its servers answered ([`agreed`]), which wakes the controls watch
    /// when they changed since the last renewal.
    pub(super) async fn renew_reading_controls(
        &self,
        more_keys: &[&str],
        args: &[&str],
    ) -> Verdict {
        let (paused, to) = (self.paused_key(), self.switchover_key());
        let mut keys = vec![self.key.as_str(), &paused, &to];
        keys.extend_from_slice(more_keys);
        let answers = self.group.eval_all(Lua::ElectionRenew, &keys, args).await;
        let (codes, seen): (Vec<_>, Vec<_>) = answers.into_iter().map(split_renewal).unzip();
        let verdict = self.group.renew_verdict(Tally::of(codes), "renewed");
        if let Verdict::Done { .. } = verdict {
            let seen: Vec<Seen> = seen.into_iter().flatten().collect();
            let now = agreed(&seen, self.quorum());
            self.renewed_controls.send_if_modified(|last| {
                let changed = last.as_ref() != Some(&now);
                if changed {
                    *last = Some(now);
                }
                changed
            });
        }
        verdict
    }

    /// Set (`Some`) or delete `key` on every server and publish the change;
    /// the number of servers that did.
    async fn set_everywhere(
        &self,
        key: &str,
        value: Option<&str>,
        only: Option<&[bool]>,
    ) -> Vec<bool> {
        let channel = self.controls_channel();
        let writes = self.group.servers().iter().enumerate().map(|(i, s)| {
            let mut pipe = redis::pipe();
            match value {
                Some(v) => pipe.cmd("SET").arg(key).arg(v).ignore(),
                None => pipe.cmd("DEL").arg(key).ignore(),
            };
            pipe.cmd("PUBLISH").arg(&channel).arg("changed").ignore();
            let skip = only.is_some_and(|o| !o[i]);
            async move { !skip && s.query::<Value>("write", &pipe).await.is_ok() }
        });
        futures_util::future::join_all(writes).await
    }

    /// Write or clear the control `key` on a quorum; a write on fewer is
    /// taken back and refused.
    async fn set_control(&self, key: &str, value: Option<&str>) -> Result<()> {
        let done = self.set_everywhere(key, value, None).await;
        let n = done.iter().filter(|d| **d).count();
        let enough = self.group.enough(n, None, "took the change");
        if enough.is_err() && value.is_some() {
            self.set_everywhere(key, None, Some(&done)).await;
        }
        enough
    }

    /// Pause or resume the election.
    pub(super) async fn pause(&self, paused: bool) -> Result<()> {
        self.set_control(&self.paused_key(), paused.then_some("paused"))
            .await
    }

    /// Ask for a switchover to `to`, or clear the request.
    pub(super) async fn switchover(&self, to: Option<&str>) -> Result<()> {
        self.set_control(&self.switchover_key(), to).await
    }

    /// The controls once they differ from `seen`: subscribed before each
    /// read, waiting between reads for a message, a renewal that answered
    /// other controls than the one before it, or the re-read period
    /// ([`RedisBackend::set_reread`]).
    pub(super) async fn watch_controls_from(&self, seen: &Controls) -> Result<Controls> {
        let channel = self.controls_channel();
        let mut renewed = self.renewed_controls.subscribe();
        loop {
            self.control_notes.subscribe(&self.group, &channel).await;
            let now = self.read_controls().await?;
            if now != *seen {
                return Ok(now);
            }
            let noticed = async {
                tokio::select! {
                    alive = self.control_notes.any() => alive,
                    // The sender lives as long as `self`.
                    _ = renewed.changed() => true,
                }
            };
            if let Ok(false) = tokio::time::timeout(self.reread(), noticed).await {
                return Err(self.broken("controls"));
            }
        }
    }
}
