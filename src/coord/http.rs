//! HTTP handlers of the coordination API, on the control listener:
//!
//! | request | success | otherwise |
//! |---|---|---|
//! | `POST /locks/{name}?ttl=30s&wait=5s&fair=false&owner=ID` | 200 grant | 409 `{holder}` |
//! | `POST /locks/{name}/renew` + token | 200 `{ttl_ms}` | 410 no longer ours |
//! | `DELETE /locks/{name}` + token | 200 | 409 not ours |
//! | `POST /semaphores/{name}?permits=N&ttl=30s&wait=5s` | 200 grant | 409 `{live_permits}`, or `{permits}` of another size |
//! | `POST /semaphores/{name}/renew`, `DELETE /semaphores/{name}` | as locks | |
//! | `POST /jobs/{queue}/{job}/claim?ttl=5m` | 200 grant | 409 `{state}` |
//! | `POST /jobs/{queue}/{job}/complete` + token | 200 | 409 / 410 |
//! | `POST /jobs/{queue}/{job}/renew?ttl=5m` + token | 200 `{ttl_ms}` | 410 no longer ours |
//! | `DELETE /jobs/{queue}/{job}/claim` + token | 200 | 409 not ours |
//! | `POST /rwlocks/{name}?mode=read\|write&ttl=30s&wait=5s&owner=ID` | 200 grant | 409 `{holder}` |
//! | `POST /rwlocks/{name}/renew`, `DELETE /rwlocks/{name}` + token | as locks | |
//! | `POST /jobs/{name}/periods/{start}/claim?every=5m&ttl=` | 200 grant | 409 `{state}`: claimed, completed, ended, not_started |
//! | `POST /jobs/{name}/periods/{start}/complete?every=5m` + token | as jobs | |
//!
//! The token comes as `?token=` or a JSON body `{"token": "…"}` (at most
//! 4 KiB). Every answer is JSON with `Cache-Control: no-store`; bad input is
//! a 4xx whose `error` names the field and the fix; a backend error is a 503
//! whose `error` says what the sidecar did with the request (tried it once,
//! or kept trying within its `wait`) and what the client should do.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde_json::json;

use super::params::{ClaimParams, LockParams, SemaphoreParams};
pub(super) use super::params::{RenewParams, TokenParams, token};
use super::{Acquire, CoordError, Object, Outcome, Service, Try, check_name, check_owner};
use crate::backend::BackendError;
use crate::http::{error_response, json_response};
use crate::query::Strict;

/// Largest accepted request body, in bytes.
pub const MAX_BODY: usize = 4096;
/// TTL bounds of locks, permits and claims.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The `ttl` of a lock, semaphore permit or read-write lock (and of their
/// renewals) when the request gives none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The `ttl` of a job claim (and of its renewal) when the request gives none.
pub const DEFAULT_JOB_TTL: Duration = Duration::from_secs(300);
/// Upper TTL bound.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest `wait`.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// Most permits of a semaphore.
pub const MAX_PERMITS: u32 = 10_000;

mod periods;

/// State of the coordination handlers.
#[derive(Clone)]
pub struct CoordState {
    /// The service.
    pub service: Arc<Service>,
    /// How long completed jobs are remembered (`--completed-retention`).
    pub completed_retention: Duration,
}

/// The coordination routes (merge into the control router).
pub fn routes(state: CoordState) -> Router {
    Router::new()
        .route("/locks/{name}", post(lock_acquire).delete(release::<false>))
        .route("/locks/{name}/renew", post(renew::<false>))
        .route(
            "/semaphores/{name}",
            post(sem_acquire).delete(release::<true>),
        )
        .route("/semaphores/{name}/renew", post(renew::<true>))
        .route(
            "/jobs/{queue}/{job}/claim",
            post(job_claim).delete(super::http_rw::job_release),
        )
        .route("/jobs/{queue}/{job}/complete", post(job_complete))
        .merge(super::http_rw::routes())
        .route("/jobs/{name}/periods/{start}/claim", post(periods::claim))
        .route(
            "/jobs/{name}/periods/{start}/complete",
            post(periods::complete),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

pub(super) fn bad(msg: impl Into<String>) -> Response {
    error_response(StatusCode::BAD_REQUEST, msg)
}

/// A rejected request: status and message (small, unlike a `Response`).
pub(super) type Bad = (StatusCode, String);

pub(super) fn reject(msg: impl Into<String>) -> Bad {
    (StatusCode::BAD_REQUEST, msg.into())
}

pub(super) fn reply((status, msg): Bad) -> Response {
    error_response(status, msg)
}

/// The duration of parameter `field` (`value`; `default` when absent),
/// checked to lie in `min..=max`.
pub(super) fn duration(
    value: Option<&str>,
    field: &str,
    default: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, Bad> {
    let Some(text) = value else {
        return Ok(default);
    };
    let d = crate::flags::parse_duration(text)
        .map_err(|e| reject(format!("parameter '{field}' ({text}): {e}")))?;
    if d < min || d > max {
        return Err(reject(format!(
            "parameter '{field}' ({text}) must be between {} and {}",
            crate::flags::format_duration(min),
            crate::flags::format_duration(max)
        )));
    }
    Ok(d)
}

pub(super) fn owner(value: Option<&String>, service: &Service) -> Result<String, Bad> {
    match value {
        None => Ok(service.default_owner.clone()),
        Some(o) => check_owner(o).map(|_| o.clone()).map_err(reject),
    }
}

/// `ttl` (default 30 s), `wait` (default 0) and `owner` of an acquisition.
pub(super) fn acquire_params(
    ttl: Option<&str>,
    wait: Option<&str>,
    owner_value: Option<&String>,
    service: &Service,
) -> Result<(Duration, Duration, String), Bad> {
    Ok((
        duration(ttl, "ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?,
        duration(wait, "wait", Duration::ZERO, Duration::ZERO, MAX_WAIT)?,
        owner(owner_value, service)?,
    ))
}

pub(super) fn name_ok(what: &str, name: &str) -> Result<(), Bad> {
    check_name(what, name).map_err(|m| (StatusCode::BAD_REQUEST, m))
}

/// The answer to a request that never waits (a renewal, a release, a
/// completion, a job claim) and failed with `e`.
pub(super) fn backend_error(e: CoordError) -> Response {
    answer_error(e, None)
}

/// The answer to an acquisition with `wait` (zero: none) that failed with
/// `e`.
pub(super) fn acquisition_error(e: CoordError, wait: Duration) -> Response {
    answer_error(e, Some(wait))
}

/// What the client of a request answered with backend error `b` should do:
/// the error, its advice ([`BackendError::report_once`]: never "retrying",
/// as nothing retries the request once it is answered), and what the
/// sidecar did with the request and the client should do next. `wait`: the
/// acquisition's, `None` for a request that never waits.
fn unavailable(b: &BackendError, wait: Option<Duration>) -> String {
    let next = match wait {
        _ if !b.is_retryable() => "not retried: a retry does not mend this error; fix what the hint says, then retry the request".to_owned(),
        None => "the sidecar tried this request once and does not retry it: retry the request".to_owned(),
        Some(w) if w.is_zero() => "the sidecar tried this request once and does not retry it: retry the request, or give it a wait= within which the sidecar retries such errors".to_owned(),
        Some(w) => format!(
            "the sidecar kept trying it within its wait ({}) until its budget ran out, and tries no more: retry the request later, or with a longer wait",
            crate::flags::format_duration(w)
        ),
    };
    format!("{}; {next}", b.report_once())
}

fn answer_error(e: CoordError, wait: Option<Duration>) -> Response {
    match e {
        CoordError::Unsupported(msg) => bad(msg),
        CoordError::Backend(b) => {
            error_response(StatusCode::SERVICE_UNAVAILABLE, unavailable(&b, wait))
        }
        e @ CoordError::Corrupt { .. } => {
            error_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
        e @ CoordError::PermitsMismatch { established, .. } => json_response(
            StatusCode::CONFLICT,
            json!({ "error": e.to_string(), "permits": established }),
        ),
        e @ CoordError::QueueLost { .. } => error_response(StatusCode::CONFLICT, e.to_string()),
        e @ CoordError::TooManyWaiters { .. } => {
            error_response(StatusCode::TOO_MANY_REQUESTS, e.to_string())
        }
        e @ CoordError::HoldOff { retry_after } => held_off(&e.to_string(), retry_after),
    }
}

/// 503 during a promotion hold-off: `waiting` says what and until when,
/// `Retry-After` in whole seconds (rounded up).
fn held_off(message: &str, retry_after: Duration) -> Response {
    let ms = retry_after.as_millis() as u64;
    let what = "promotion hold-off";
    let body = json!({ "error": message, "waiting": { "what": what, "retry_after_ms": ms } });
    let mut resp = json_response(StatusCode::SERVICE_UNAVAILABLE, body);
    let secs = axum::http::HeaderValue::from(ms.div_ceil(1000).max(1));
    resp.headers_mut()
        .insert(axum::http::header::RETRY_AFTER, secs);
    resp
}

pub(super) fn acquired(t: Try) -> Response {
    const BUSY: &str = "still held after the wait; try again later or with a longer wait";
    match t {
        Try::Acquired(g) => json_response(StatusCode::OK, g),
        Try::Held(h) => json_response(StatusCode::CONFLICT, json!({ "error": BUSY, "holder": h })),
        Try::Full(live) => json_response(
            StatusCode::CONFLICT,
            json!({ "error": BUSY, "live_permits": live }),
        ),
        Try::Completed => json_response(
            StatusCode::CONFLICT,
            json!({ "error": "already completed", "state": "completed" }),
        ),
    }
}

pub(super) fn renewed(o: Outcome) -> Response {
    match o {
        Outcome::Ok(ttl) => json_response(
            StatusCode::OK,
            json!({ "renewed": true, "ttl_ms": ttl.map(|t| t.as_millis() as u64) }),
        ),
        Outcome::Gone | Outcome::NotYours | Outcome::AlreadyReleased => error_response(
            StatusCode::GONE,
            "no longer yours: it expired or was taken by someone else since; acquire it again (a renewal never re-creates it)",
        ),
    }
}

pub(super) fn released(o: Outcome) -> Response {
    match o {
        Outcome::Ok(_) => json_response(StatusCode::OK, json!({ "released": true })),
        Outcome::Gone => error_response(
            StatusCode::CONFLICT,
            "not held by this token: it was released already, or it expired (nothing was deleted)",
        ),
        Outcome::AlreadyReleased => error_response(
            StatusCode::CONFLICT,
            "already released with this token (nothing was deleted)",
        ),
        Outcome::NotYours => error_response(
            StatusCode::CONFLICT,
            "not yours: someone else holds it now (nothing was deleted)",
        ),
    }
}

async fn lock_acquire(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<LockParams>,
) -> Response {
    if let Err(r) = name_ok("lock name", &name) {
        return reply(r);
    }
    let (ttl, wait, owner) = match acquire_params(
        p.ttl.as_deref(),
        p.wait.as_deref(),
        p.owner.as_ref(),
        &s.service,
    ) {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    let fair = match p.fair.as_deref() {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(other) => {
            return bad(format!("parameter 'fair' ({other}) must be true or false"));
        }
    };
    let what = if fair {
        Acquire::FairLock { name: &name, wait }
    } else {
        Acquire::Lock(&name)
    };
    let queued = s.service.is_queued(&what, wait);
    match s.service.acquire(what, &owner, ttl, wait).await {
        Ok(t) => acquired(t),
        // Tried once: a queued request answers its first error.
        Err(e) if queued => answer_error(e, None),
        Err(e) => acquisition_error(e, wait),
    }
}

/// What a route of `/locks` (`SEM = false`) or `/semaphores` (`SEM =
/// true`) serves, and how its name is called in errors.
fn object_of(sem: bool, name: &str) -> (Object<'_>, &'static str) {
    if sem {
        (Object::Semaphore(name), "semaphore name")
    } else {
        (Object::Lock(name), "lock name")
    }
}

/// The checked name and token of a renew or release.
fn name_and_token(
    what: &str,
    name: &str,
    query_token: Option<&str>,
    body: &Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<String, Bad> {
    name_ok(what, name)?;
    token(query_token, body)
}

/// `POST /locks/{name}/renew` and `POST /semaphores/{name}/renew`.
async fn renew<const SEM: bool>(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<RenewParams>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let (object, what) = object_of(SEM, &name);
    let checked = name_and_token(what, &name, p.token.as_deref(), &body).and_then(|token| {
        let ttl = duration(p.ttl.as_deref(), "ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?;
        Ok((token, ttl))
    });
    let (token, ttl) = match checked {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    match s.service.renew(object, &token, ttl).await {
        Ok(o) => renewed(o),
        Err(e) => backend_error(e),
    }
}

/// `DELETE /locks/{name}` and `DELETE /semaphores/{name}`.
async fn release<const SEM: bool>(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<TokenParams>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let (object, what) = object_of(SEM, &name);
    let token = match name_and_token(what, &name, p.token.as_deref(), &body) {
        Ok(t) => t,
        Err(r) => return reply(r),
    };
    match s.service.release(object, &token).await {
        Ok(o) => released(o),
        Err(e) => backend_error(e),
    }
}

async fn sem_acquire(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<SemaphoreParams>,
) -> Response {
    if let Err(r) = name_ok("semaphore name", &name) {
        return reply(r);
    }
    let permits: u32 = match p.permits.as_deref().map(|v| (v, v.parse::<u32>())) {
        Some((_, Ok(n))) if (1..=MAX_PERMITS).contains(&n) => n,
        Some((v, _)) => {
            return bad(format!(
                "parameter 'permits' ({v}) must be an integer from 1 to {MAX_PERMITS}"
            ));
        }
        None => {
            return bad(
                "parameter 'permits' is required: the most holders at once, e.g. permits=3",
            );
        }
    };
    let (ttl, wait, owner) = match acquire_params(
        p.ttl.as_deref(),
        p.wait.as_deref(),
        p.owner.as_ref(),
        &s.service,
    ) {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    let what = Acquire::Semaphore {
        name: &name,
        permits,
    };
    match s.service.acquire(what, &owner, ttl, wait).await {
        Ok(t) => acquired(t),
        Err(e) => acquisition_error(e, wait),
    }
}

async fn job_claim(
    State(s): State<CoordState>,
    Path((queue, job)): Path<(String, String)>,
    Strict(p): Strict<ClaimParams>,
) -> Response {
    if let Err(r) = name_ok("queue name", &queue).and_then(|_| name_ok("job id", &job)) {
        return reply(r);
    }
    let (ttl, owner) = match (
        duration(p.ttl.as_deref(), "ttl", DEFAULT_JOB_TTL, MIN_TTL, MAX_TTL),
        owner(p.owner.as_ref(), &s.service),
    ) {
        (Ok(t), Ok(o)) => (t, o),
        (Err(r), _) | (_, Err(r)) => return reply(r),
    };
    let what = Acquire::Job {
        queue: &queue,
        job: &job,
    };
    claimed(s.service.acquire(what, &owner, ttl, Duration::ZERO).await)
}

/// The answer to a job claim.
fn claimed(r: Result<Try, CoordError>) -> Response {
    match r {
        Ok(Try::Acquired(g)) => json_response(StatusCode::OK, g),
        Ok(Try::Held(h)) => json_response(
            StatusCode::CONFLICT,
            json!({ "error": "claimed by someone else", "state": "claimed", "holder": h }),
        ),
        Ok(other @ (Try::Completed | Try::Full(_))) => acquired(other),
        Err(e) => backend_error(e),
    }
}

async fn job_complete(
    State(s): State<CoordState>,
    Path((queue, job)): Path<(String, String)>,
    Strict(p): Strict<TokenParams>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    if let Err(r) = name_ok("queue name", &queue).and_then(|_| name_ok("job id", &job)) {
        return reply(r);
    }
    let token = match token(p.token.as_deref(), &body) {
        Ok(t) => t,
        Err(r) => return reply(r),
    };
    completed(
        s.service
            .complete(&queue, &job, &token, s.completed_retention)
            .await,
    )
}

/// The answer to a job completion.
fn completed(r: Result<Outcome, CoordError>) -> Response {
    match r {
        Ok(Outcome::Ok(_)) => json_response(StatusCode::OK, json!({ "completed": true })),
        Ok(Outcome::Gone | Outcome::AlreadyReleased) => error_response(
            StatusCode::GONE,
            "the claim expired before completion; claim the job again",
        ),
        Ok(Outcome::NotYours) => error_response(
            StatusCode::CONFLICT,
            "not yours: someone else claimed or completed the job",
        ),
        Err(e) => backend_error(e),
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
