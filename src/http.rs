//! The read-only HTTP API (DESIGN.md, "HTTP contract"): `/leader`, the old
//! `leader-elector` sidecar's `/` and `/isLeader`, `/healthz`, `/readyz` and
//! `/metrics`.
//!
//! Invariant: every answer computes `is_leader` from the state at the moment it
//! is answered (`tokio::time::Instant::now()`), never from a cached boolean.
//! Handlers never call the backend. [`router`] is a pure function of the state
//! so handlers are tested with `tower::ServiceExt::oneshot`, without a socket.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::elector::LeaderState;
use crate::metrics::Metrics;
use crate::query::{NoParams, Strict};

/// Response header carrying the long-poll index (`transitions`).
pub const INDEX_HEADER: &str = "x-leader-index";
/// Response header carrying the fencing token of the observed term.
pub const FENCING_TOKEN_HEADER: &str = "x-fencing-token";
/// Longest accepted `wait` of a `/leader` long-poll.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// `wait` of a long-poll that gives `index` without `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    /// The Elector's state.
    pub state: watch::Receiver<LeaderState>,
    /// Metrics to render on `/metrics`; `None` serves an empty page.
    pub metrics: Option<Arc<Metrics>>,
}

/// The JSON body of `GET /leader`.
#[derive(Debug, Serialize)]
pub struct LeaderBody {
    /// Election name.
    pub election: String,
    /// This candidate's identity.
    pub identity: String,
    /// Identity of the leader as this candidate knows it; `null` for nobody or unknown.
    pub leader: Option<String>,
    /// Whether this candidate leads at the instant of the answer.
    pub is_leader: bool,
    /// Fencing token of the observed term.
    pub fencing_token: Option<u64>,
    /// RFC 3339 wall-clock time at which this sidecar first observed the
    /// current term (by its own clock; no backend records when a term
    /// started, so two sidecars that saw the term at different moments
    /// show different times).
    pub term_observed_at: Option<String>,
    /// Lease TTL in force, in seconds.
    pub lease_duration_seconds: f64,
    /// Milliseconds this candidate may still claim to lead (0 when not leading).
    pub valid_for_ms: u64,
    /// Backend name.
    pub backend: &'static str,
    /// Whether the last backend call succeeded.
    pub backend_healthy: bool,
    /// The long-poll index: leader changes observed.
    pub transitions: u64,
    /// Whether the election is paused by an operator (`leader-elector
    /// pause`): no candidate takes a released or expired term.
    pub paused: bool,
    /// This candidate's priority (`--priority`; 0 never leads).
    pub priority: u32,
    /// The member a forced switchover pinned as leader (`switchover
    /// --force`), while the pin holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// Redlock, while leading: servers that answered the last renewal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub servers_answered: Option<usize>,
    /// Redlock, while leading: servers in the group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub servers_total: Option<usize>,
    /// Why this candidate cannot currently tell (backend error, validity expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What keeps this candidate from campaigning right now:
    /// `{"what": "...", "until": "<RFC 3339>"}` (no `until` for priority 0,
    /// which never campaigns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitingBody>,
    /// Failsafe (absent when off): whether this leader claims on its
    /// members' promises, for how many more milliseconds their confirmed
    /// bound lasts, and how many members hold a promise now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<FailsafeBody>,
}

/// The `failsafe` field of `GET /leader`.
#[derive(Debug, Serialize)]
pub struct FailsafeBody {
    /// Whether this leader claims on its members' promises right now.
    pub active: bool,
    /// Milliseconds from now until the bound every member confirmed
    /// (`null` when none holds).
    pub until: Option<u64>,
    /// Members whose promise holds now.
    pub members_confirmed: usize,
}

/// The `waiting.what` of a candidate with priority 0.
pub const NEVER_LEADS: &str =
    "priority 0 (--priority 0): this candidate never leads; it follows and reports the leader";

/// The `waiting` field of `GET /leader`.
#[derive(Debug, Serialize)]
pub struct WaitingBody {
    /// What is waited for, in words.
    pub what: &'static str,
    /// RFC 3339 wall-clock time at which the wait is expected to end;
    /// `"resume"` for a pause (it ends when an operator resumes, not at a
    /// time); `None` when it never ends or ends on an event (a closed
    /// health gate opens when the app answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

impl LeaderBody {
    /// The body for `state` at `now`.
    pub fn at(state: &LeaderState, now: Instant) -> Self {
        let is_leader = state.is_leader(now);
        let mut error = state.error.as_ref().map(|e| e.report());
        if state.own_term.is_some() && !is_leader && !state.stopping && error.is_none() {
            error = Some("leadership validity expired before a renewal was acknowledged".into());
        }
        if error.is_none() && !state.is_ready() && !state.stopping {
            error = Some("not ready: the backend has not answered yet".into());
        }
        LeaderBody {
            election: state.election.clone(),
            identity: state.identity.clone(),
            leader: state.leader_at(now).map(str::to_owned),
            is_leader,
            fencing_token: state.fencing_token,
            term_observed_at: state
                .term_observed_at
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
            lease_duration_seconds: state.lease_duration.as_secs_f64(),
            valid_for_ms: state.valid_for(now).as_millis() as u64,
            backend: state.backend,
            backend_healthy: state.backend_healthy,
            transitions: state.transitions,
            paused: state.paused,
            priority: state.priority,
            pinned: state.pinned.clone(),
            servers_answered: state.servers.map(|(a, _)| a),
            servers_total: state.servers.map(|(_, n)| n),
            error,
            failsafe: state.failsafe.map(|f| FailsafeBody {
                active: f.active && is_leader,
                until: f
                    .until
                    .filter(|u| *u > now && is_leader)
                    .map(|u| (u - now).as_millis() as u64),
                members_confirmed: f.members_confirmed,
            }),
            waiting: match state.waiting.filter(|_| !is_leader) {
                _ if state.priority == 0 => Some(WaitingBody {
                    what: NEVER_LEADS,
                    until: None,
                }),
                w => w.map(|w| WaitingBody {
                    what: w.what.as_str(),
                    until: w.until_text(),
                }),
            },
        }
    }
}

/// The read-only API router over `app`.
pub fn router(app: AppState) -> Router {
    Router::new()
        .route("/leader", get(leader))
        .route("/", get(compat_name))
        .route("/isLeader", get(compat_is_leader))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(json_errors))
        .with_state(app)
}

/// Largest error body [`json_errors`] reads to rewrap.
const MAX_ERROR_BODY: usize = 8 * 1024;

/// Middleware: every 4xx/5xx answer has a JSON body `{"error": ...}`. Answers
/// that are not JSON (axum's plain-text rejections, e.g. a path that is not
/// UTF-8 after percent-decoding) are rewrapped, keeping status and headers.
pub async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_ERROR_BODY)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    let mut out = error_response(status, message);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// A JSON response with `Cache-Control: no-store`.
pub fn json_response(status: StatusCode, body: impl Serialize) -> Response {
    let mut resp = (status, axum::Json(body)).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A JSON error body `{"error": message}` with `status`.
pub fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, json!({ "error": message.into() }))
}

/// The query of `GET /leader`: a long-poll's `index` and `wait`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollParams {
    /// The `transitions` of the caller's last answer.
    pub index: Option<String>,
    /// How long to wait for a change (humantime).
    pub wait: Option<String>,
}

impl PollParams {
    /// The long-poll asked for, if any: `(index, wait)`. Each value is checked
    /// on its own first, so a `wait` out of range says so even without `index`.
    ///
    /// # Errors
    /// A message naming the parameter and the fix.
    pub fn poll(&self) -> Result<Option<(u64, Duration)>, String> {
        let wait = match &self.wait {
            None => DEFAULT_WAIT,
            Some(w) => {
                let d = crate::flags::parse_duration(w)
                    .map_err(|e| format!("parameter 'wait' ({w}): {e}"))?;
                if d > MAX_WAIT {
                    return Err(format!(
                        "parameter 'wait' ({w}) must be at most {}; ask again after it ends",
                        crate::flags::format_duration(MAX_WAIT)
                    ));
                }
                d
            }
        };
        let Some(index) = &self.index else {
            if self.wait.is_some() {
                return Err("parameter 'wait' needs 'index': pass the transitions value of your last answer as ?index=N".into());
            }
            return Ok(None);
        };
        let index: u64 = index.parse().map_err(|_| {
            format!("parameter 'index' ({index}) must be a non-negative integer: the transitions value of your last answer")
        })?;
        Ok(Some((index, wait)))
    }
}

async fn leader(State(app): State<AppState>, Strict(params): Strict<PollParams>) -> Response {
    let poll = match params.poll() {
        Ok(p) => p,
        Err(msg) => return error_response(StatusCode::BAD_REQUEST, msg),
    };
    let mut rx = app.state.clone();
    if let Some((index, wait)) = poll {
        let deadline = Instant::now() + wait;
        // A drain stops claiming without a change of holder: that, too, ends
        // the poll, so an app that follows the long-poll learns at once.
        let stopping = rx.borrow().stopping;
        loop {
            {
                let s = rx.borrow_and_update();
                if s.transitions != index || s.stopping != stopping {
                    break;
                }
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { break },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }
    let now = Instant::now();
    let body = LeaderBody::at(&rx.borrow(), now);
    let status = if body.is_leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut headers = HeaderMap::new();
    headers.insert(INDEX_HEADER, HeaderValue::from(body.transitions));
    if let Some(token) = body.fencing_token {
        headers.insert(FENCING_TOKEN_HEADER, HeaderValue::from(token));
    }
    let mut resp = json_response(status, body);
    resp.headers_mut().extend(headers);
    resp
}

async fn compat_name(State(app): State<AppState>, _: Strict<NoParams>) -> Response {
    let now = Instant::now();
    let name = app.state.borrow().leader_at(now).unwrap_or("").to_owned();
    json_response(StatusCode::OK, json!({ "name": name }))
}

async fn compat_is_leader(State(app): State<AppState>, _: Strict<NoParams>) -> Response {
    let is_leader = app.state.borrow().is_leader(Instant::now());
    json_response(StatusCode::OK, json!({ "isLeader": is_leader }))
}

async fn healthz(_: Strict<NoParams>) -> Response {
    json_response(StatusCode::OK, json!({ "status": "ok" }))
}

async fn readyz(State(app): State<AppState>, _: Strict<NoParams>) -> Response {
    let (ready, stopping, error) = {
        let s = app.state.borrow();
        (
            s.is_ready(),
            s.stopping,
            s.error.as_ref().map(|e| e.report()),
        )
    };
    if ready {
        json_response(StatusCode::OK, json!({ "status": "ready" }))
    } else {
        let reason = if stopping {
            "shutting down".to_owned()
        } else {
            error.unwrap_or_else(|| "the backend has not answered yet".into())
        };
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "not ready", "error": reason }),
        )
    }
}

async fn metrics(State(app): State<AppState>, _: Strict<NoParams>) -> Response {
    let Some(m) = &app.metrics else {
        return (StatusCode::OK, "").into_response();
    };
    m.refresh(&app.state.borrow(), Instant::now());
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        m.render(),
    )
        .into_response()
}

async fn not_found(uri: Uri) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        format!(
            "no such path: {}; paths are /leader, /, /isLeader, /healthz, /readyz, /metrics",
            uri.path()
        ),
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: this API is read-only, use GET",
    )
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
