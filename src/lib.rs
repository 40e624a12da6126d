//! `leader-elector`: a sidecar that gives a singleton workload one active
//! replica at a time, on etcd.
//!
//! The library holds everything; the binary is a thin `main.rs` over
//! [`app::run`]. The [`elector::Elector`] can be embedded in a Rust program
//! with any [`backend::LeaseBackend`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// A build with fewer backends (cargo features) leaves some shared helpers
// unused; the full build (the default) is where dead code is caught.
#![cfg_attr(
    not(all(feature = "etcd", feature = "redis", feature = "kubernetes")),
    allow(dead_code, unused_imports)
)]

pub mod app;
pub mod backend;
pub(crate) mod budget;
pub mod cli;
pub mod config;
pub mod control;
pub mod coord;
pub mod elector;
pub mod flags;
pub mod hooks;
pub mod http;
pub mod kube_label;
pub mod metrics;
pub mod ops;
pub mod serve;
pub mod shutdown;
pub mod supervisor;

pub use backend::{Campaign, Holder, LeaseBackend, Term};
pub use elector::{Elector, ElectorConfig, LeaderState};
