//! The backend servers (a throwaway etcd member or redis-server of the test
//! kit), what they served, and what a process used.

use super::*;
use support::backends::Backend;

// ---------------------------------------------------------------- backends

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    Etcd,
    Redis,
}

/// A throwaway etcd member or redis-server on loopback (the test kit's),
/// killed on drop.
pub(super) struct Server {
    pub(super) kind: Kind,
    pub(super) url: String,
    pub(super) port: u16,
    pub(super) process: Backend,
    /// A connection kept open for `INFO commandstats` (a new one would add
    /// HELLO/CLIENT commands to the counts).
    pub(super) redis: Option<redis::aio::MultiplexedConnection>,
}

impl Server {
    pub(super) async fn start(kind: Kind) -> Arc<Server> {
        Arc::new(match kind {
            Kind::Etcd => {
                let process = Backend::start("etcd").await;
                let Backend::Etcd(e) = &process else {
                    unreachable!("an etcd fixture")
                };
                Server {
                    kind,
                    url: e.url.clone(),
                    port: e.port(),
                    redis: None,
                    process,
                }
            }
            Kind::Redis => {
                let process = Backend::start("redis").await;
                let Backend::Redis(r) = &process else {
                    unreachable!("a Redis fixture")
                };
                Server {
                    kind,
                    url: r.url.clone(),
                    port: r.port,
                    redis: Some(r.conn().await),
                    process,
                }
            }
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.process.pids().first().copied().unwrap_or(0)
    }

    /// etcd's WAL fsyncs so far: (seconds spent, count); (0, 0) for Redis.
    pub(super) async fn fsyncs(&self) -> (f64, f64) {
        if self.kind != Kind::Etcd {
            return (0.0, 0.0);
        }
        let (_, text) = http_get(self.port, "/metrics")
            .await
            .expect("etcd /metrics");
        let get = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        (
            get("etcd_disk_wal_fsync_duration_seconds_sum "),
            get("etcd_disk_wal_fsync_duration_seconds_count "),
        )
    }

    /// Requests served so far, by method: etcd's `grpc_server_msg_received_total`,
    /// Redis's `INFO commandstats` calls (less our own INFO).
    pub(super) async fn counts(&self) -> BTreeMap<String, f64> {
        match self.kind {
            Kind::Etcd => support::etcd_messages(self.port).await,
            Kind::Redis => {
                let mut c = self.redis.clone().unwrap();
                let mut out = support::redis_calls(&mut c).await;
                out.remove("info");
                out.remove("monitor");
                out
            }
        }
    }
}

pub(super) fn delta(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

// ---------------------------------------------------------------- processes

/// RSS (MiB), PSS (MiB) and CPU seconds (user + system) of a process.
pub(super) fn proc_stat(pid: u32) -> (f64, f64, f64) {
    (
        rss_kib(pid) as f64 / 1024.0,
        pss_kib(pid) as f64 / 1024.0,
        cpu_seconds(pid),
    )
}

/// GET with a caller-chosen timeout (long-polls outlive `support::http_get`'s 3 s).
pub(super) async fn get(port: u16, path: &str, limit: Duration) -> std::io::Result<(u16, String)> {
    support::http_get_within(port, path, limit).await
}

/// The commands clients send to Redis during `window`, by name, read with
/// MONITOR (whose lines mark commands run inside scripts as `[db lua]`; those
/// are left out: a script call counts once). Returns the counts and seconds.
pub(super) async fn redis_monitor(port: u16, window: Duration) -> (BTreeMap<String, f64>, f64) {
    let mut top = BTreeMap::new();
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (top, window.as_secs_f64());
    };
    let _ = s.write_all(b"MONITOR\r\n").await;
    let t0 = Instant::now();
    let end = t0 + window;
    let mut lines = BufReader::new(s).lines();
    // +1764400000.123456 [0 127.0.0.1:40000] "EVALSHA" "…" …   or   [0 lua] "get" …
    while let Ok(Ok(Some(line))) = timeout_at(end, lines.next_line()).await {
        let Some((src, cmd)) = line
            .split_once(" [")
            .and_then(|(_, rest)| rest.split_once("] "))
        else {
            continue;
        };
        let name = cmd.split('"').nth(1).unwrap_or("").to_lowercase();
        if !src.ends_with(" lua") && name != "info" {
            *top.entry(name).or_insert(0.0) += 1.0;
        }
    }
    (top, t0.elapsed().as_secs_f64())
}
