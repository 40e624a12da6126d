//! One backend fixture for tests and benches: the servers of one backend (a
//! throwaway etcd member, an etcd cluster of 1–3 members, a redis-server, a
//! Redlock group of three, or the Kubernetes API stand-in with one endpoint
//! per sidecar), the flags and
//! environment a sidecar needs to use them, and what tests do to them
//! (signals, restarts). The servers stop when the fixture is dropped.

use std::sync::Arc;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::kube_api::{Endpoint, KubeApi};
use super::{Etcd, EtcdCluster, RedisServer, Sidecar};

/// The servers of one backend.
pub enum Backend {
    /// One etcd member.
    Etcd(Etcd),
    /// etcd members (1–3) that form one cluster, each killed and restarted
    /// on its own (the fault suite's).
    EtcdCluster(EtcdCluster),
    /// One Redis server.
    Redis(RedisServer),
    /// Three Redis servers: a Redlock group (every sidecar names all three).
    Redlock(Vec<RedisServer>),
    /// The Kubernetes API stand-in and the endpoints handed out so far (one
    /// per sidecar, kept open while the fixture lives).
    Kube(KubeApi, Vec<Arc<Endpoint>>),
}

/// The namespace of [`Backend::start`]'s stand-in.
pub const NAMESPACE: &str = "team-a";

impl Backend {
    /// Start `kind`: `etcd`, `redis`, `redlock` or `kubernetes` (the
    /// stand-in in [`NAMESPACE`]).
    pub async fn start(kind: &str) -> Backend {
        Self::start_with(kind, &[]).await
    }

    /// [`Backend::start`] with extra `redis-server` arguments for every Redis
    /// server (e.g. `--appendonly yes`).
    pub async fn start_with(kind: &str, redis_args: &[&str]) -> Backend {
        match kind {
            "etcd" => Backend::Etcd(Etcd::start().await),
            "redis" => Backend::Redis(RedisServer::start_with(redis_args).await),
            "redlock" => Backend::Redlock(vec![
                RedisServer::start_with(redis_args).await,
                RedisServer::start_with(redis_args).await,
                RedisServer::start_with(redis_args).await,
            ]),
            "kubernetes" => Self::kubernetes(NAMESPACE),
            other => panic!("no backend fixture {other:?}: etcd, redis, redlock or kubernetes"),
        }
    }

    /// The Kubernetes API stand-in serving namespace `ns`.
    pub fn kubernetes(ns: &str) -> Backend {
        Backend::Kube(KubeApi::start(ns), Vec::new())
    }

    /// Its kind, as [`Backend::start`] takes it.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Etcd(_) | Backend::EtcdCluster(_) => "etcd",
            Backend::Redis(_) => "redis",
            Backend::Redlock(_) => "redlock",
            Backend::Kube(..) => "kubernetes",
        }
    }

    /// The servers' URLs (none for the stand-in).
    pub fn urls(&self) -> Vec<String> {
        match self {
            Backend::Etcd(e) => vec![e.url.clone()],
            Backend::EtcdCluster(c) => c.urls(),
            Backend::Redis(r) => vec![r.url.clone()],
            Backend::Redlock(g) => g.iter().map(|r| r.url.clone()).collect(),
            Backend::Kube(..) => Vec::new(),
        }
    }

    /// The flags naming the servers (`--etcd-endpoints`, `--redis-url` per
    /// server). Panics on the stand-in, which needs an endpoint per sidecar
    /// ([`Backend::sidecar_flags`]).
    pub fn server_flags(&self) -> Vec<String> {
        let flag = match self {
            Backend::EtcdCluster(c) => return vec!["--etcd-endpoints".into(), c.urls().join(",")],
            Backend::Etcd(_) => "--etcd-endpoints",
            Backend::Redis(_) | Backend::Redlock(_) => "--redis-url",
            Backend::Kube(..) => panic!("the stand-in has no server URL: use sidecar_flags"),
        };
        self.urls()
            .into_iter()
            .flat_map(|u| [flag.to_owned(), u])
            .collect()
    }

    /// The backend flags and environment of sidecar `id`: the servers'
    /// URLs, or on the stand-in a new endpoint of its own (`--backend
    /// kubernetes` and a `KUBECONFIG`).
    pub async fn sidecar_flags(&mut self, id: &str) -> (Vec<String>, Vec<(String, String)>) {
        let Backend::Kube(api, endpoints) = self else {
            return (self.server_flags(), Vec::new());
        };
        let ep = api.endpoint(id).await;
        let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
        endpoints.push(ep);
        let flags = vec!["--backend".into(), "kubernetes".into()];
        (flags, vec![("KUBECONFIG".into(), kubeconfig)])
    }

    /// Sidecar `id` of `election` on this backend, with `flags` after the
    /// backend's own.
    pub async fn sidecar(&mut self, election: &str, id: &str, flags: &[String]) -> Sidecar {
        let (mut args, env) = self.sidecar_flags(id).await;
        args.extend(flags.iter().cloned());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Sidecar::start_env(election, id, &args, &env)
    }

    /// The servers' process ids (none for the in-process stand-in).
    pub fn pids(&self) -> Vec<u32> {
        self.processes()
            .into_iter()
            .map(|p| p.expect("the server runs"))
            .collect()
    }

    /// Each server's process id, `None` while it is stopped.
    fn processes(&self) -> Vec<Option<u32>> {
        match self {
            Backend::Etcd(e) => vec![e.pid()],
            Backend::EtcdCluster(c) => c.pids().into_iter().map(Some).collect(),
            Backend::Redis(r) => vec![r.pid()],
            Backend::Redlock(g) => g.iter().map(RedisServer::pid).collect(),
            Backend::Kube(..) => Vec::new(),
        }
    }

    /// Send `sig` to every server process that runs (`SIGSTOP` freezes the
    /// backend, `SIGCONT` thaws it).
    pub fn signal(&self, sig: Signal) {
        for pid in self.processes().into_iter().flatten() {
            kill(Pid::from_raw(pid as i32), sig).unwrap();
        }
    }

    /// The Redis servers, one or a Redlock group (none for other backends).
    pub fn redis_servers(&self) -> &[RedisServer] {
        match self {
            Backend::Redis(r) => std::slice::from_ref(r),
            Backend::Redlock(g) => g,
            _ => &[],
        }
    }

    /// [`Backend::redis_servers`], to stop or restart one.
    pub fn redis_servers_mut(&mut self) -> &mut [RedisServer] {
        match self {
            Backend::Redis(r) => std::slice::from_mut(r),
            Backend::Redlock(g) => g,
            _ => &mut [],
        }
    }
}
