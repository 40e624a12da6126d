//! The candidate registry on Redis: per candidate a hash
//! `<prefix>{<election>}:candidates:<identity>` with `PX` = the record's
//! TTL, and the sorted set `<prefix>{<election>}:candidates` of identities
//! scored by expiry (the election's hash tag keeps them on one cluster
//! slot with the election key). `created` is the server's `TIME` (ms) at
//! the record's first write and is kept by renewals; `renewed` gives the
//! record's age by the server's own clock. Scripts: [`super::lua_ops`].
//!
//! Every write and withdrawal publishes on `<prefix>{<election>}:candidates`;
//! [`RedisBackend::watch_registry`] resolves on such a message, or after
//! [`FALLBACK`] at the latest, so a lost message costs at most that.
//!
//! **Redlock**: a record is written to (and withdrawn from) every server
//! and counts as written when a quorum took it. A list needs a quorum of
//! answers and is the union of the records they hold: a record on any of
//! them is a candidate that wrote recently (it is only a hint for the
//! successor choice); for one identity on several servers the most
//! recently renewed copy is listed, with the earliest `created`.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use super::RedisBackend;
use super::answered::Answers;
use super::lua::{Lua, ms};
use super::server::text_of;
use crate::backend::candidates::{Candidate, DEFAULT_PRIORITY, Listed, from_unix_ms, unix_ms};
use crate::backend::{BackendError, Result};

/// The shortest wait of a registry or controls watch for a message before it
/// resolves anyway (the caller reads again); the sidecar waits the lease
/// duration when that is longer ([`RedisBackend::set_reread`]).
pub const FALLBACK: Duration = Duration::from_secs(5);

impl RedisBackend {
    fn record_key(&self, identity: &str) -> String {
        format!("{}:candidates:{identity}", self.key)
    }

    pub(super) fn registry_channel(&self) -> String {
        format!("{}:candidates", self.key)
    }

    /// Run `lua` with `keys` and `args` on every server; `Ok` with the
    /// answers when a quorum answered, else the first error.
    pub(super) async fn on_quorum(
        &self,
        lua: Lua,
        keys: &[&str],
        args: &[&str],
        what: &str,
    ) -> Result<Vec<Value>> {
        Answers::of(self.group.eval_all(lua, keys, args).await).on_quorum(&self.group, what)
    }

    /// Write or renew `candidate`'s record for `ttl`.
    pub(super) async fn publish(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        let key = self.record_key(&candidate.identity);
        let members = self.registry_channel();
        let args = [
            candidate.identity.as_str(),
            &candidate.priority.to_string(),
            &candidate.revision,
            if candidate.ready { "true" } else { "false" },
            &ms(ttl),
            &members,
            &candidate
                .preempt_after
                .map_or(String::new(), |d| d.as_millis().to_string()),
            &candidate
                .frozen_until
                .map_or(String::new(), |t| unix_ms(t).to_string()),
        ];
        self.on_quorum(
            Lua::CandidatePublish,
            &[&key, &members],
            &args,
            "wrote the record",
        )
        .await
        .map(|_| ())
    }

    /// Remove `identity`'s record.
    pub(super) async fn withdraw(&self, identity: &str) -> Result<()> {
        let key = self.record_key(identity);
        let members = self.registry_channel();
        let args = [identity, members.as_str()];
        self.on_quorum(
            Lua::CandidateWithdraw,
            &[&key, &members],
            &args,
            "removed the record",
        )
        .await
        .map(|_| ())
    }

    /// The records of a quorum of servers, merged (module docs).
    pub(super) async fn list(&self) -> Result<Vec<Listed>> {
        let members = self.registry_channel();
        let prefix = self.record_key("");
        let answers = self
            .on_quorum(
                Lua::CandidateList,
                &[&members],
                &[&prefix],
                "listed the records",
            )
            .await?;
        let mut merged: BTreeMap<String, Listed> = BTreeMap::new();
        for answer in answers {
            let Value::Array(records) = answer else {
                return Err(super::group::unexpected(&answer));
            };
            for l in records.iter().filter_map(listed) {
                let id = l.candidate.identity.clone();
                match merged.get_mut(&id) {
                    Some(m) => {
                        let created = m.created.min(l.created);
                        if l.age < m.age {
                            *m = l;
                        }
                        m.created = created;
                    }
                    None => {
                        merged.insert(id, l);
                    }
                }
            }
        }
        Ok(merged.into_values().collect())
    }

    /// Resolve on the next registry message, or after the re-read interval
    /// ([`RedisBackend::set_reread`]).
    ///
    /// # Errors
    /// [`BackendError::Unreachable`] when no server's subscription works.
    pub(super) async fn watch_registry(&self) -> Result<()> {
        let channel = self.registry_channel();
        self.registry_notes.subscribe(&self.group, &channel).await;
        match tokio::time::timeout(self.reread(), self.registry_notes.any()).await {
            Ok(false) => Err(self.broken("registry")),
            _ => Ok(()),
        }
    }

    /// Every subscription to the `what` channel broke.
    pub(super) fn broken(&self, what: &str) -> BackendError {
        BackendError::Unreachable {
            backend: super::BACKEND,
            endpoints: self.group.endpoints(),
            source: format!("the {what} channel subscription broke on every server").into(),
        }
    }
}

/// One record of a list answer.
fn listed(v: &Value) -> Option<Listed> {
    let Value::Array(f) = v else { return None };
    let text: Vec<String> = f.iter().map(|x| text_of(x).unwrap_or_default()).collect();
    let [
        identity,
        priority,
        revision,
        ready,
        ttl,
        created,
        renewed,
        now,
        preempt_after,
        frozen_until,
    ] = text.as_slice()
    else {
        return None;
    };
    let num = |s: &String| s.parse::<u64>().ok();
    let (now, renewed) = (num(now)?, num(renewed).unwrap_or(0));
    Some(Listed {
        candidate: Candidate {
            identity: identity.clone(),
            priority: priority.parse().unwrap_or(DEFAULT_PRIORITY),
            revision: revision.clone(),
            ready: ready != "false",
            frozen_until: num(frozen_until).map(from_unix_ms),
            preempt_after: num(preempt_after).map(Duration::from_millis),
        },
        age: Some(Duration::from_millis(now.saturating_sub(renewed))),
        ttl: Duration::from_millis(num(ttl).unwrap_or(0)),
        created: num(created),
        written_ago: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_listed_record_reads_back() {
        let v = Value::Array(
            [
                "a", "3", "r1", "false", "2000", "100", "150", "400", "3000", "5000",
            ]
            .map(bulk)
            .to_vec(),
        );
        let l = listed(&v).expect("a record");
        assert_eq!(l.candidate.frozen_until, Some(from_unix_ms(5000)));
        assert_eq!(l.candidate.identity, "a");
        assert_eq!((l.candidate.priority, l.candidate.ready), (3, false));
        assert_eq!(l.age, Some(Duration::from_millis(250)));
        assert_eq!((l.ttl, l.created), (Duration::from_secs(2), Some(100)));
        assert_eq!(l.candidate.preempt_after, Some(Duration::from_secs(3)));
        let unfrozen = ["a", "1", "", "true", "2000", "100", "150", "400", "", ""];
        let l = listed(&Value::Array(unfrozen.map(bulk).to_vec())).expect("a record");
        assert_eq!(l.candidate.frozen_until, None);
        assert!(listed(&Value::Array(vec![bulk("a")])).is_none());
    }
}
