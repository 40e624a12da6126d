//! The coordination API on a backend that does not serve it.

use std::time::Duration;

use async_trait::async_trait;

use super::{Claim, CoordError, Coordinator, Kind, Outcome, RwMode, Try, WriteIntent};

/// The coordination API of a backend that has none: every call answers
/// [`CoordError::Unsupported`] with one message (which backends do serve it,
/// from the backend registry), and the control API turns it into a 400.
#[derive(Debug, Clone)]
pub struct Unserved {
    backend: &'static str,
    message: String,
}

impl Unserved {
    /// Answers for `backend`, with `message` (naming the backends that serve
    /// the coordination API) on every call.
    pub fn new(backend: &'static str, message: String) -> Unserved {
        Unserved { backend, message }
    }

    fn unsupported<T>(&self) -> std::result::Result<T, CoordError> {
        Err(CoordError::Unsupported(self.message.clone()))
    }
}

#[async_trait]
impl Coordinator for Unserved {
    fn backend(&self) -> &'static str {
        self.backend
    }
    async fn lock(&self, _: &str, _: &str, _: Duration) -> std::result::Result<Try, CoordError> {
        self.unsupported()
    }
    async fn lock_fair(
        &self,
        _: &str,
        _: &str,
        _: Duration,
        _: Duration,
    ) -> std::result::Result<Try, CoordError> {
        self.unsupported()
    }
    async fn semaphore(
        &self,
        _: &str,
        _: &str,
        _: u32,
        _: Duration,
    ) -> std::result::Result<Try, CoordError> {
        self.unsupported()
    }
    async fn renew(
        &self,
        _: Kind,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
    async fn release(&self, _: Kind, _: &str, _: &str) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
    async fn claim(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Claim, CoordError> {
        self.unsupported()
    }
    async fn complete(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
    async fn rwlock(
        &self,
        _: &str,
        _: &str,
        _: RwMode,
        _: Duration,
        _: Option<&WriteIntent>,
    ) -> std::result::Result<Try, CoordError> {
        self.unsupported()
    }
    async fn rw_renew(
        &self,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
    async fn rw_release(&self, _: &str, _: &str) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
    async fn job_renew(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
    async fn job_release(
        &self,
        _: &str,
        _: &str,
        _: &str,
    ) -> std::result::Result<Outcome, CoordError> {
        self.unsupported()
    }
}
