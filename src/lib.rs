//! `leader-elector`: a sidecar that gives a singleton workload one active
//! replica at a time, on etcd.
//!
//! The library holds everything; the binary is a thin `main.rs` over
//! [`app::run`]. The [`elector::Elector`] can be embedded in a Rust program
//! with any [`backend::LeaseBackend`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

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
