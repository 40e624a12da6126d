//! How a Redis error becomes a [`BackendError`]: by kind and code, naming
//! the server that failed.

use super::{Server, Target};
use crate::backend::redis::BACKEND;
use crate::backend::{BackendError, is_tls_error};

impl Server {
    /// Classify a Redis error by kind and code (never by text, except Redis
    /// 7.0's ACL denial inside a script, which has no code of its own).
    pub fn classify(&self, err: redis::RedisError) -> BackendError {
        let auth = |err| BackendError::Auth {
            backend: BACKEND,
            source: Box::new(err),
        };
        if is_tls_error(&err) {
            return BackendError::Tls {
                backend: BACKEND,
                endpoints: self.endpoint(),
                source: Box::new(err),
            };
        }
        if err.kind() == redis::ErrorKind::AuthenticationFailed {
            return auth(err);
        }
        let code = match err.code() {
            Some("NOPERM" | "NOAUTH" | "WRONGPASS") => return auth(err),
            Some("ERR")
                if err
                    .detail()
                    .is_some_and(|d| d.contains("can't run this command")) =>
            {
                return auth(err);
            }
            Some("WRONGTYPE") => Some("wrongtype"),
            // Answered by loading the script (EVAL); one that still escapes
            // is a refusal, never an outage (failsafe must not start on it).
            Some("NOSCRIPT") => Some("noscript"),
            Some("READONLY") => Some("readonly"),
            Some("LOADING") => Some("loading"),
            Some("OOM") => Some("oom"),
            _ => None,
        };
        if let Some(code) = code {
            return BackendError::Rejected {
                backend: BACKEND,
                code,
                source: Box::new(err),
            };
        }
        if err.is_timeout() {
            return self.timed_out("request");
        }
        let cluster = crate::backend::redis::cluster::is_transient(err.kind());
        if cluster
            || err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
        {
            return BackendError::Unreachable {
                backend: BACKEND,
                endpoints: self.endpoint(),
                source: Box::new(err),
            };
        }
        BackendError::Server {
            backend: BACKEND,
            source: Box::new(err),
        }
    }

    /// The server an error of a request names: with Sentinel the primary
    /// they named last (the server that failed), with the group it came
    /// from; else [`Server::label`].
    fn endpoint(&self) -> String {
        if let Target::Sentinel { current, .. } = &self.target
            && let Some((at, _)) = current.lock().expect("current lock").as_ref()
        {
            return format!("{at} (the primary named by {})", self.label);
        }
        self.label.clone()
    }
}
