//! [`BackendError`], the one error type of every backend call, and how it
//! reads: its metric reason, its hint, and its causes on one line.

use std::time::Duration;

use super::About;

/// Errors of any backend call. `Display` describes what failed; the cause is
/// in `source()`; [`BackendError::hint`] says what to do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend could not be reached (connection refused, reset, DNS).
    #[error("cannot reach {backend} at {endpoints}")]
    Unreachable {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The TLS handshake failed (unknown CA, bad certificate, name mismatch).
    #[error("TLS handshake with {backend} at {endpoints} failed")]
    Tls {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// The configured endpoints.
        endpoints: String,
        /// The TLS error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend rejected our credentials or permissions.
    #[error("{backend} rejected the credentials or permissions")]
    Auth {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// The server's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A call did not finish within its deadline.
    #[error("{backend} {call} timed out after {timeout_ms} ms")]
    Timeout {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// The verb that timed out (`campaign`, `renew`, `resign`).
        call: &'static str,
        /// The deadline in milliseconds.
        timeout_ms: u64,
    },
    /// A watch ended on the server's side (cancelled, or its revision compacted).
    #[error("{backend} watch ended: {reason}")]
    WatchEnded {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// What the server said.
        reason: String,
    },
    /// The backend refused the command for a reason an operator must fix or
    /// wait out (Redis `WRONGTYPE`, `READONLY`, `LOADING`, `OOM`).
    #[error("{backend} refused the command ({code})")]
    Rejected {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// Short error code, also the metric reason.
        code: &'static str,
        /// The server's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend is throttling this client (Kubernetes: `429 Too Many
    /// Requests` from API Priority and Fairness) and asked it to wait
    /// `retry_after` before its next request.
    #[error("{backend} is throttling this client (retry after {} ms)", retry_after.as_millis())]
    Throttled {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// How long the backend asked this client to wait, from when the
        /// error was made (`Retry-After`).
        retry_after: Duration,
        /// The server's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend answered with an error not covered above.
    #[error("{backend} answered an error")]
    Server {
        /// The backend (its name in the message, its hints).
        backend: &'static About,
        /// The error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BackendError {
    /// A short, stable label for the `reason` label of failure metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            BackendError::Unreachable { .. } => "unreachable",
            BackendError::Tls { .. } => "tls",
            BackendError::Auth { .. } => "auth",
            BackendError::Timeout { .. } => "timeout",
            BackendError::WatchEnded { .. } => "watch_ended",
            BackendError::Rejected { code, .. } => code,
            BackendError::Throttled { .. } => "throttled",
            BackendError::Server { .. } => "server",
        }
    }

    /// How long the backend asked to wait before the next request, when it
    /// is throttling this client ([`BackendError::Throttled`]).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            BackendError::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether trying again can help without a change of configuration.
    /// TLS and auth failures are retried anyway (a certificate or a user may be
    /// fixed while we run), but they are reported as configuration problems.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, BackendError::Tls { .. } | BackendError::Auth { .. })
    }

    /// What an operator should do about this error: the backend's own
    /// advice ([`About`]) for TLS, credentials and refused commands, shared
    /// advice for the rest.
    pub fn hint(&self) -> &'static str {
        match self {
            BackendError::Unreachable { .. } => {
                "check that the backend runs and that the endpoints are right; retrying with backoff"
            }
            BackendError::Tls { backend, .. } => backend.tls_hint,
            BackendError::Auth { backend, .. } => backend.auth_hint,
            BackendError::Timeout { .. } => {
                "the backend is slow or the network drops packets; retrying with backoff"
            }
            BackendError::WatchEnded { .. } => "re-reading the key and watching again",
            BackendError::Rejected { backend, code, .. } => backend
                .rejected
                .iter()
                .find(|(c, _)| c == code)
                .map_or("retrying with backoff", |(_, hint)| hint),
            BackendError::Throttled { .. } => {
                "the server is throttling this client (HTTP 429; Kubernetes: API Priority and Fairness); the next request waits the Retry-After it asked for, at most one renew interval"
            }
            BackendError::Server { .. } => "retrying with backoff",
        }
    }

    /// The backend that failed.
    pub fn about(&self) -> &'static About {
        match self {
            BackendError::Unreachable { backend, .. }
            | BackendError::Tls { backend, .. }
            | BackendError::Auth { backend, .. }
            | BackendError::Timeout { backend, .. }
            | BackendError::WatchEnded { backend, .. }
            | BackendError::Rejected { backend, .. }
            | BackendError::Throttled { backend, .. }
            | BackendError::Server { backend, .. } => backend,
        }
    }

    /// The [`hint`](Self::hint) without what the running sidecar does about
    /// the error (retrying, watching again, waiting out a `Retry-After`):
    /// the advice for whoever got an answer that nobody retries (a command
    /// that tries once, a coordination request answered 503). `None` when
    /// the hint is only that.
    pub fn advice(&self) -> Option<&'static str> {
        let hint = self.hint();
        let advice = match self {
            BackendError::WatchEnded { .. } => "",
            BackendError::Throttled { .. } => hint
                .split_once("; the next request")
                .map_or(hint, |(a, _)| a),
            _ => SIDECAR_RETRIES
                .iter()
                .find_map(|tail| hint.strip_suffix(tail))
                .unwrap_or(hint),
        };
        (!advice.is_empty()).then_some(advice)
    }

    /// [`report`](Self::report) for an answer nobody retries (`status`,
    /// `pause`, `switchover`, a coordination request's 503): the
    /// [`advice`](Self::advice) as its hint, never "retrying", which only a
    /// running sidecar does.
    pub fn report_once(&self) -> String {
        self.report_with(self.advice())
    }

    /// The whole error as one line: this layer, its causes, and the hint.
    /// gRPC statuses are reduced to their message and their own causes
    /// (their `Display` dumps the `Debug` text of the transport error), and a
    /// cause that repeats what is already said is left out. Answers nobody
    /// retries use [`report_once`](Self::report_once).
    pub fn report(&self) -> String {
        self.report_with(Some(self.hint()))
    }

    /// The error, its causes and `hint`, if any, as one line.
    fn report_with(&self, hint: Option<&str>) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            let (text, next) = cause_text(self.about(), cause);
            if !text.is_empty() && !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            source = next;
        }
        if let Some(hint) = hint {
            out.push_str(" (hint: ");
            out.push_str(hint);
            out.push(')');
        }
        out
    }
}

/// How a hint ends when it says that the running sidecar retries (the
/// shared hints, and a backend's advice on a code it waits out):
/// [`BackendError::advice`] leaves it out.
const SIDECAR_RETRIES: [&str; 4] = [
    "; retrying with backoff",
    "; retrying",
    ", retrying",
    "retrying with backoff",
];

/// One cause's own text and the next cause: the backend's own opener first
/// ([`About::open_cause`]), else the cause's `Display` and `source()`.
fn cause_text<'a>(
    backend: &About,
    cause: &'a (dyn std::error::Error + 'static),
) -> (String, Option<&'a (dyn std::error::Error + 'static)>) {
    backend
        .open_cause
        .and_then(|open| open(cause))
        .unwrap_or_else(|| (cause.to_string(), cause.source()))
}

/// Whether a rustls error sits anywhere in the error's cause chain
/// (classification by type, never by message text).
pub(crate) fn is_tls_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if e.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && is_tls_error(inner)
        {
            return true;
        }
        current = e.source();
    }
    false
}
