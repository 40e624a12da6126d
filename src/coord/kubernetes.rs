//! The coordination API on the Lease backend: not served.

use std::time::Duration;

use async_trait::async_trait;

use super::{Claim, CoordError, Coordinator, Kind, Outcome, Try};
use crate::backend::kubernetes::NAME;

/// The coordination API on this backend: not served. Named locks, semaphores
/// and job claims need etcd (all of them) or Redis, one server or Redlock (all but fair
/// locks); every call answers [`CoordError::Unsupported`], which the control
/// API turns into 400 with this message.
#[derive(Debug, Default, Clone, Copy)]
pub struct KubeCoord;

/// The message of every coordination call on the Lease backend.
pub const COORD_UNSUPPORTED: &str = "the coordination API (locks, semaphores, job claims) is not served by the kubernetes backend: use --backend etcd (locks, fair locks, semaphores, job claims) or --backend redis, one server or a Redlock group (locks, semaphores, job claims); leadership works on all three";

fn unsupported<T>() -> std::result::Result<T, CoordError> {
    Err(CoordError::Unsupported(COORD_UNSUPPORTED.into()))
}

#[async_trait]
impl Coordinator for KubeCoord {
    fn backend(&self) -> &'static str {
        NAME
    }
    async fn lock(&self, _: &str, _: &str, _: Duration) -> std::result::Result<Try, CoordError> {
        unsupported()
    }
    async fn lock_fair(
        &self,
        _: &str,
        _: &str,
        _: Duration,
        _: Duration,
    ) -> std::result::Result<Try, CoordError> {
        unsupported()
    }
    async fn semaphore(
        &self,
        _: &str,
        _: &str,
        _: u32,
        _: Duration,
    ) -> std::result::Result<Try, CoordError> {
        unsupported()
    }
    async fn renew(
        &self,
        _: Kind,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        unsupported()
    }
    async fn release(&self, _: Kind, _: &str, _: &str) -> std::result::Result<Outcome, CoordError> {
        unsupported()
    }
    async fn claim(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Claim, CoordError> {
        unsupported()
    }
    async fn complete(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        unsupported()
    }
}
