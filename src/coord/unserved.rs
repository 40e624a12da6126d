//! The coordination API on a backend that does not serve it.

use std::time::Duration;

use async_trait::async_trait;

use super::{Acquire, CoordError, Coordinator, Object, Outcome, Result, Try};

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

    fn unsupported<T>(&self) -> Result<T> {
        Err(CoordError::Unsupported(self.message.clone()))
    }
}

#[async_trait]
impl Coordinator for Unserved {
    fn backend(&self) -> &'static str {
        self.backend
    }
    async fn acquire(&self, _: Acquire<'_>, _: &str, _: Duration) -> Result<Try> {
        self.unsupported()
    }
    async fn renew(&self, _: Object<'_>, _: &str, _: Duration) -> Result<Outcome> {
        self.unsupported()
    }
    async fn release(&self, _: Object<'_>, _: &str) -> Result<Outcome> {
        self.unsupported()
    }
    async fn complete(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Outcome> {
        self.unsupported()
    }
}
