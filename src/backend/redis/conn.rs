//! A connection to where one [`super::server::Server`]'s requests go: one
//! server (a fixed address or the primary a Sentinel group names), or a
//! **Redis Cluster** (`--redis-cluster`), whose client routes each request
//! by its first key's slot and follows `MOVED`, `ASK` and failovers.
//!
//! Every key one script or pipeline touches shares a hash tag (the election's
//! `{<election>}`, a coordination object's `{<kind>:<name>}`), so a cluster
//! request always lands on one slot's primary. Scripts go to a cluster as
//! `EVAL` with their source, not `EVALSHA`: a promoted replica has no script
//! cache, and loading a script there is a request to every node, which
//! fails while a node is down — exactly during a failover.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};
use tokio::time::{Duration, timeout};
use tracing::warn;

use super::lua::Lua;

/// One connection: to one server, or to a cluster.
#[derive(Clone)]
pub enum Conn {
    /// One server's multiplexed connection.
    Single(MultiplexedConnection),
    /// A cluster connection (one multiplexed connection per node inside).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Run script `lua` with `keys` and `args`: `EVALSHA` (loading the
    /// script when the server lacks it) on one server, `EVAL` on a cluster.
    ///
    /// # Errors
    /// What the server or the cluster client answered.
    pub async fn eval<K: AsRef<str>, A: AsRef<str>>(
        &mut self,
        lua: Lua,
        keys: &[K],
        args: &[A],
    ) -> RedisResult<Value> {
        if let Conn::Cluster(_) = self {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(lua.source()).arg(keys.len());
            for k in keys {
                cmd.arg(k.as_ref());
            }
            for a in args {
                cmd.arg(a.as_ref());
            }
            return cmd.query_async(self).await;
        }
        let mut inv = lua.script().prepare_invoke();
        for k in keys {
            inv.key(k.as_ref());
        }
        for a in args {
            inv.arg(a.as_ref());
        }
        inv.invoke_async::<Value>(self).await
    }

    /// `WAIT replicas ms` on the node that holds `key` (a cluster client
    /// would otherwise send `WAIT` to every primary).
    ///
    /// # Errors
    /// What the server answered.
    pub async fn wait(&mut self, key: &str, replicas: u32, ms: u64) -> RedisResult<i64> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(ms);
        match self {
            Conn::Single(c) => wait.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::new(slot(key.as_bytes()), SlotAddr::Master);
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let v = c.route_command(&wait, route).await?;
                i64::from_redis_value(&v)
            }
        }
    }
}

impl Conn {
    /// Warn when the server can forget or evict the keys (`appendonly no`,
    /// an `allkeys-*` eviction policy), or has fewer replicas linked than
    /// `min_replicas` (one server only: a cluster's nodes differ).
    pub async fn warn_config(&self, label: &str, limit: Duration, min_replicas: u32) {
        let get = |name: &'static str| {
            let mut conn = self.clone();
            async move {
                let r: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(name)
                    .query_async(&mut conn)
                    .await;
                r.ok().and_then(|v| v.get(1).cloned())
            }
        };
        if let Ok(Some(aof)) = timeout(limit, get("appendonly")).await
            && aof == "no"
        {
            warn!(server = %label, "appendonly is off: if this Redis restarts it forgets the election key and the fencing counter (run it with --appendonly yes, or keep a restarted server out for one TTL)");
        }
        if let Ok(Some(policy)) = timeout(limit, get("maxmemory-policy")).await
            && policy.starts_with("allkeys")
        {
            warn!(server = %label, policy = %policy, "maxmemory-policy can evict the election key: use noeviction or a volatile-* policy");
        }
        if min_replicas == 0 || matches!(self, Conn::Cluster(_)) {
            return;
        }
        let mut cmd = redis::cmd("INFO");
        cmd.arg("replication");
        let mut conn = self.clone();
        let Ok(Ok(info)) = timeout(limit, cmd.query_async::<String>(&mut conn)).await else {
            return;
        };
        let linked: Option<u32> = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse().ok());
        if let Some(linked) = linked
            && linked < min_replicas
        {
            warn!(server = %label, replicas = linked, min_replicas, "fewer replicas are linked to this Redis than --redis-min-replicas asks for: no grant on it counts until they are");
        }
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the whole
/// key, modulo 16384 (the Redis Cluster specification).
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // CLUSTER KEYSLOT answers, from a Redis 7 cluster.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
    }

    #[test]
    fn every_key_of_an_election_or_object_shares_its_slot() {
        let election = "leader-elector:{billing}";
        let s = slot(election.as_bytes());
        for suffix in [
            ":fencing",
            ":released",
            ":successor",
            ":primary",
            ":paused",
            ":candidates:pod-0",
        ] {
            assert_eq!(
                slot(format!("{election}{suffix}").as_bytes()),
                s,
                "{suffix}"
            );
        }
        let lock = "leader-elector:{lock:a}b}";
        let s = slot(lock.as_bytes());
        for suffix in [":fencing", ":slot:3", ":size", ":intent", ":readers"] {
            assert_eq!(slot(format!("{lock}{suffix}").as_bytes()), s, "{suffix}");
        }
    }
}
