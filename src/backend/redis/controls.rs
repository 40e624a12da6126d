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
//! controls read are those a quorum of servers agrees on.

use redis::Value;

use super::RedisBackend;
use super::answered::Answers;

use super::server::Server;
use crate::backend::Result;
use crate::backend::controls::Controls;

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
        let q = self.quorum();
        let paused = seen.iter().filter(|(p, _)| *p).count() >= q;
        let switchover = seen.iter().find_map(|(_, to)| {
            let to = to.as_ref()?;
            (seen.iter().filter(|(_, t)| t.as_ref() == Some(to)).count() >= q).then(|| to.clone())
        });
        Ok(Controls { paused, switchover })
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
    /// read, waiting for a message (or [`FALLBACK`]) between reads.
    pub(super) async fn watch_controls_from(&self, seen: &Controls) -> Result<Controls> {
        let channel = self.controls_channel();
        loop {
            self.control_notes.subscribe(&self.group, &channel).await;
            let now = self.read_controls().await?;
            if now != *seen {
                return Ok(now);
            }
            if let Ok(false) = tokio::time::timeout(self.reread(), self.control_notes.any()).await {
                return Err(self.broken("controls"));
            }
        }
    }
}
