//! `leader-elector`: one active replica at a time for a singleton workload,
//! elected on a Kubernetes Lease, etcd or Redis (one server or Redlock),
//! with fencing tokens. It ships as a sidecar binary and as this library.
//!
//! # Embedding the Elector
//!
//! Make a backend for one election, build an [`Elector`] over it with
//! [`Elector::builder`], run it on a task, and do leader-only work while
//! the published [`LeaderState`] says this candidate leads:
//!
//! ```no_run
//! use std::time::Duration;
//! use leader_elector::backends::{KubeLeaseBackend, KubeOptions};
//! use leader_elector::{Elector, until_leading, until_not_leading};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The Lease "my-operator" in the kubeconfig's (or the Pod's) namespace.
//! let backend = KubeLeaseBackend::new("my-operator", KubeOptions::default());
//! // It also keeps the candidate registry and the operator controls.
//! let (elector, mut state) = Elector::builder(backend.clone())
//!     .registry(backend.clone())
//!     .controls(backend)
//!     .election("my-operator")
//!     .lease_duration(Duration::from_secs(15))
//!     .renew_interval(Duration::from_secs(5))
//!     .build()?;
//! let shutdown = CancellationToken::new();
//! let running = tokio::spawn(elector.run(shutdown.clone()));
//! if let Some(fencing_token) = until_leading(&mut state).await {
//!     // Leader-only work here, carrying `fencing_token` to what it writes.
//!     until_not_leading(&mut state).await; // stop the work when this returns
//! }
//! shutdown.cancel(); // stop claiming at once, then release the Lease
//! running.await?;
//! # Ok(()) }
//! ```
//!
//! `examples/operator.rs` is a kube-rs controller built this way.
//!
//! # The safety rule
//!
//! A candidate says it leads only while `now < valid_until`: the instant its
//! last acknowledged renewal (or acquisition) was *sent*, plus the granted
//! TTL, minus a drift margin, on the monotonic clock (host suspends
//! counted). The backend keeps the key at least that long, so no other
//! candidate takes over while this one still claims. [`LeaderState::is_leader`]
//! is computed when asked, never stored. Fencing tokens grow with every new
//! term: pass them to the systems you write to, so they can refuse a
//! deposed leader's late writes.
//!
//! What the library does not do: it does not stop your work for you (watch
//! the state), it does not retry inside a backend call (the Elector owns
//! timing and backoff), and it spawns nothing but what you run.
//!
//! # Internals
//!
//! The modules not shown here (`app`, `config`, `ops`, `serve`, `http`,
//! `control`, `coord`, `supervisor`, `hooks`, `kube_label`, `metrics`,
//! `shutdown`, and the backends' inner modules) are the sidecar binary's
//! internals. They are public for its integration tests only and are not a
//! stable API.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// A build with fewer backends (cargo features) leaves some shared helpers
// unused; the full build (the default) is where dead code is caught.
#![cfg_attr(
    not(all(feature = "etcd", feature = "redis", feature = "kubernetes")),
    allow(dead_code, unused_imports)
)]

#[doc(hidden)]
pub mod app;
#[doc(hidden)]
pub mod backend;
pub(crate) mod budget;
#[doc(hidden)]
pub mod cli;
// The flags' doc comments are clap's `--help` text, not Markdown.
#[doc(hidden)]
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
pub mod config;
#[doc(hidden)]
pub mod console;
#[doc(hidden)]
pub mod control;
#[doc(hidden)]
pub mod coord;
#[doc(hidden)]
pub mod elector;
#[doc(hidden)]
pub mod endpoint_slice;
/// Failsafe: a leader that outlives a backend outage while every roster
/// member confirms it (opt-in; the protocol, not yet wired to the Elector).
pub mod failsafe;
#[doc(hidden)]
pub mod flags;
#[doc(hidden)]
pub mod hooks;
#[doc(hidden)]
pub mod http;
#[doc(hidden)]
#[cfg(feature = "kubernetes")]
pub mod kube_client;
#[doc(hidden)]
pub mod kube_label;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod ops;
#[doc(hidden)]
pub mod query;
#[doc(hidden)]
pub mod serve;
/// Shards: the KEP-5866 hash ranges of N shards, their selector strings,
/// and which member owns which (pure arithmetic; the runtime comes next).
pub mod shards;
#[doc(hidden)]
pub mod shutdown;
#[doc(hidden)]
pub mod supervisor;

pub use elector::{
    Elector, ElectorBuilder, ElectorConfig, ElectorConfigError, ElectorHandle, Event, EventKind,
    LeaderState, Observation, Observer, OwnTerm, Standing, Waiting, until_leading,
    until_not_leading,
};

pub use backend::{
    About, BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Term, TermId,
};

/// The backends an [`Elector`] campaigns on, each behind its cargo feature
/// (`etcd`, `redis`, `kubernetes`; all three by default).
pub mod backends {
    #[cfg(feature = "etcd")]
    pub use crate::backend::etcd::{EtcdBackend, EtcdOptions};
    #[cfg(feature = "kubernetes")]
    pub use crate::backend::kubernetes::{KubeLeaseBackend, KubeOptions};
    #[cfg(feature = "redis")]
    pub use crate::backend::redis::{RedisBackend, RedisOptions};
    #[cfg(feature = "kubernetes")]
    pub use crate::kube_client::build_client as build_kube_client;
}
