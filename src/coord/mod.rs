//! The coordination API beyond leadership: named locks, fair locks,
//! semaphores and job claims, over the same backend as the election, with
//! fencing tokens. The HTTP handlers ([`http`]) are thin over the
//! [`Service`], which waits, remembers grants and counts; each backend's
//! verbs are its [`Coordinator`] (the seam, `crate::backend::coordination`).
//! A backend without coordination gets [`Unserved`], which answers every
//! call with the backends that do serve it.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

pub mod http;
mod http_rw;
mod metrics;
mod params;
pub mod periods;
mod service;
mod unserved;

pub use crate::backend::coordination::*;
pub use metrics::{CoordMetrics, MAX_TRACKED_NAMES};
pub use service::{DEFAULT_MAX_WAITERS, Service};
pub use unserved::Unserved;
