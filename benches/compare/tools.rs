//! The tools compared (our sidecar on etcd and on Redis, `etcdctl elect`,
//! the seed loop, redis-py), their candidate processes, and how each one
//! says it leads.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum EvKind {
    Ready,
    Leader,
    Follower,
}

#[derive(Debug)]
pub(super) struct Ev {
    pub(super) id: u64,
    pub(super) kind: EvKind,
    pub(super) at: Instant,
}

/// Follows one of our sidecars with `/leader` long-polls and reports when it
/// knows the leader (Ready), starts leading (its `/leader` answers 200) and stops.
pub(super) async fn watch_ours(
    id: u64,
    port: u16,
    identity: String,
    tx: mpsc::UnboundedSender<Ev>,
) {
    let mut index: Option<u64> = None;
    let mut leading = false;
    let mut ready = false;
    let mut backoff = Duration::from_millis(10);
    loop {
        let path = match index {
            Some(i) => format!("/leader?index={i}&wait=60s"),
            None => "/leader".to_owned(),
        };
        let Ok((status, body)) = get(port, &path, Duration::from_secs(70)).await else {
            // Not listening yet (starting) or gone: retry with backoff.
            sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
            index = None;
            continue;
        };
        let at = Instant::now();
        backoff = Duration::from_millis(10);
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let is = status == 200;
        if is && !leading {
            let _ = tx.send(Ev {
                id,
                kind: EvKind::Leader,
                at,
            });
        } else if !is && leading {
            let _ = tx.send(Ev {
                id,
                kind: EvKind::Follower,
                at,
            });
        }
        leading = is;
        if !ready && v["leader"].is_string() {
            ready = true;
            let _ = tx.send(Ev {
                id,
                kind: EvKind::Ready,
                at,
            });
        }
        if !is && v["leader"].as_str() == Some(identity.as_str()) {
            // Named leader but not (yet) claiming: the next change may not be a
            // transition, so poll briefly instead of long-polling.
            index = None;
            sleep(Duration::from_millis(1)).await;
        } else {
            index = v["transitions"].as_u64();
        }
    }
}

/// Reads a peer's stdout: the Python scripts print READY / LEADER / FOLLOWER;
/// `etcdctl elect` prints the key and proposal once elected and nothing before.
pub(super) async fn read_peer(
    id: u64,
    out: tokio::process::ChildStdout,
    etcdctl: bool,
    tx: mpsc::UnboundedSender<Ev>,
) {
    let mut lines = BufReader::new(out).lines();
    let mut first = true;
    while let Ok(Some(line)) = lines.next_line().await {
        let at = Instant::now();
        let kind = if etcdctl {
            if !first {
                continue;
            }
            first = false;
            EvKind::Leader
        } else {
            match line.split_whitespace().next() {
                Some("READY") => EvKind::Ready,
                Some("LEADER") => EvKind::Leader,
                Some("FOLLOWER") => EvKind::Follower,
                _ => continue,
            }
        };
        let _ = tx.send(Ev { id, kind, at });
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
pub(super) enum Tool {
    OursEtcd,
    Etcdctl,
    OursRedis,
    Seed,
    RedisPy,
}

pub(super) const TOOLS: [Tool; 5] = [
    Tool::OursEtcd,
    Tool::Etcdctl,
    Tool::OursRedis,
    Tool::Seed,
    Tool::RedisPy,
];

impl Tool {
    pub(super) fn key(self) -> &'static str {
        match self {
            Tool::OursEtcd => "ours_etcd",
            Tool::Etcdctl => "etcdctl",
            Tool::OursRedis => "ours_redis",
            Tool::Seed => "seed",
            Tool::RedisPy => "redispy",
        }
    }
    pub(super) fn label(self) -> &'static str {
        match self {
            Tool::OursEtcd => "**leader-elector**, etcd",
            Tool::Etcdctl => "`etcdctl elect`, etcd (lease 60 s: no TTL flag)",
            Tool::OursRedis => "**leader-elector**, Redis",
            Tool::Seed => "seed loop (`SET NX PX` every 10 ms), Redis",
            Tool::RedisPy => "redis-py `Lock` (sleep 0.1 s), Redis",
        }
    }
    pub(super) fn kind(self) -> Kind {
        match self {
            Tool::OursEtcd | Tool::Etcdctl => Kind::Etcd,
            _ => Kind::Redis,
        }
    }
    pub(super) fn ours(self) -> bool {
        matches!(self, Tool::OursEtcd | Tool::OursRedis)
    }
    /// Our tool on the same backend (the numerator of the ratio).
    pub(super) fn ours_here(self) -> Tool {
        match self.kind() {
            Kind::Etcd => Tool::OursEtcd,
            Kind::Redis => Tool::OursRedis,
        }
    }
}

pub(super) enum Proc {
    Ours(Sidecar),
    Peer(tokio::process::Child),
}

pub(super) struct Cand {
    pub(super) id: u64,
    pub(super) pid: u32,
    pub(super) proc_: Proc,
    pub(super) task: Option<JoinHandle<()>>,
}

impl Cand {
    pub(super) fn signal(&self, sig: Signal) {
        if self.pid > 0 {
            let _ = kill(Pid::from_raw(self.pid as i32), sig);
        }
    }

    pub(super) async fn wait_exit(&mut self, limit: Duration) -> bool {
        match &mut self.proc_ {
            Proc::Ours(s) => s.wait_exit(limit).await.is_some(),
            Proc::Peer(c) => timeout(limit, c.wait()).await.is_ok(),
        }
    }

    pub(super) fn dead(&mut self) -> bool {
        match &mut self.proc_ {
            Proc::Ours(s) => s.exited().is_some(),
            Proc::Peer(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    pub(super) fn log(&self, logs: &Path) -> String {
        match &self.proc_ {
            Proc::Ours(s) => s.log(),
            Proc::Peer(_) => {
                std::fs::read_to_string(logs.join(format!("c{}.log", self.id))).unwrap_or_default()
            }
        }
    }
}

impl Drop for Cand {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        if let Proc::Peer(c) = &mut self.proc_ {
            let _ = c.start_kill();
            let _ = c.try_wait();
        }
    }
}
