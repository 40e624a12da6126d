//! HTTP handlers of read-write locks (`/rwlocks/{name}`) and of the renewal
//! and give-back of job claims (`/jobs/{queue}/{job}/renew`, `DELETE
//! /jobs/{queue}/{job}/claim`); the table of every route is in
//! [`super::http`]. Answers are shaped like the lock routes'.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::post;
use serde::Deserialize;

use super::http::{
    Bad, CoordState, MAX_TTL, MIN_TTL, RenewParams, TokenParams, acquire_params, acquired,
    acquisition_error, backend_error, duration, name_ok, reject, released, renewed, reply, token,
};
use super::{Acquire, Object, RwMode};
use crate::query::Strict;

/// `POST /rwlocks/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RwParams {
    mode: Option<String>,
    ttl: Option<String>,
    wait: Option<String>,
    owner: Option<String>,
}

/// The routes of this module, for [`super::http::routes`].
pub(super) fn routes() -> Router<CoordState> {
    Router::new()
        .route("/rwlocks/{name}", post(rw_acquire).delete(rw_release))
        .route("/rwlocks/{name}/renew", post(rw_renew))
        .route("/jobs/{queue}/{job}/renew", post(job_renew))
}

/// `mode=read|write` (required).
fn mode(p: &RwParams) -> Result<RwMode, Bad> {
    match p.mode.as_deref() {
        Some("read") => Ok(RwMode::Read),
        Some("write") => Ok(RwMode::Write),
        Some(other) => Err(reject(format!(
            "parameter 'mode' ({other}) must be read or write"
        ))),
        None => Err(reject(
            "parameter 'mode' is required: mode=read (shared) or mode=write (exclusive)",
        )),
    }
}

/// `POST /rwlocks/{name}?mode=read|write&ttl=30s&wait=5s&owner=ID`.
async fn rw_acquire(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<RwParams>,
) -> Response {
    let checked = name_ok("read-write lock name", &name)
        .and_then(|_| mode(&p))
        .and_then(|m| {
            let a = acquire_params(
                p.ttl.as_deref(),
                p.wait.as_deref(),
                p.owner.as_ref(),
                &s.service,
            )?;
            Ok((m, a))
        });
    let (mode, (ttl, wait, owner)) = match checked {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    let what = Acquire::RwLock {
        name: &name,
        mode,
        intent: None,
    };
    match s.service.acquire(what, &owner, ttl, wait).await {
        Ok(t) => acquired(t),
        Err(e) => acquisition_error(e, wait),
    }
}

/// The token and `ttl` (default `default_ttl`) of a renewal.
fn renewal(
    p: &RenewParams,
    body: &Result<Bytes, BytesRejection>,
    default_ttl: Duration,
) -> Result<(String, Duration), Bad> {
    let token = token(p.token.as_deref(), body)?;
    Ok((
        token,
        duration(p.ttl.as_deref(), "ttl", default_ttl, MIN_TTL, MAX_TTL)?,
    ))
}

/// `POST /rwlocks/{name}/renew` + token.
async fn rw_renew(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<RenewParams>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let checked = name_ok("read-write lock name", &name)
        .and_then(|_| renewal(&p, &body, super::http::DEFAULT_TTL));
    let (token, ttl) = match checked {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    match s.service.renew(Object::RwLock(&name), &token, ttl).await {
        Ok(o) => renewed(o),
        Err(e) => backend_error(e),
    }
}

/// `DELETE /rwlocks/{name}` + token.
async fn rw_release(
    State(s): State<CoordState>,
    Path(name): Path<String>,
    Strict(p): Strict<TokenParams>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let checked =
        name_ok("read-write lock name", &name).and_then(|_| token(p.token.as_deref(), &body));
    let token = match checked {
        Ok(t) => t,
        Err(r) => return reply(r),
    };
    match s.service.release(Object::RwLock(&name), &token).await {
        Ok(o) => released(o),
        Err(e) => backend_error(e),
    }
}

/// Job `job` of `queue`.
fn job_object<'a>(queue: &'a str, job: &'a str) -> Object<'a> {
    Object::Job { queue, job }
}

fn job_ok(queue: &str, job: &str) -> Result<(), Bad> {
    name_ok("queue name", queue).and_then(|_| name_ok("job id", job))
}

/// `POST /jobs/{queue}/{job}/renew?ttl=5m` + token: the claim's TTL (default
/// 5 min, as a claim's) from now.
async fn job_renew(
    State(s): State<CoordState>,
    Path((queue, job)): Path<(String, String)>,
    Strict(p): Strict<RenewParams>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let checked =
        job_ok(&queue, &job).and_then(|_| renewal(&p, &body, super::http::DEFAULT_JOB_TTL));
    let (token, ttl) = match checked {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    match s.service.renew(job_object(&queue, &job), &token, ttl).await {
        Ok(o) => renewed(o),
        Err(e) => backend_error(e),
    }
}

/// `DELETE /jobs/{queue}/{job}/claim` + token: the job can be claimed again
/// at once.
pub(super) async fn job_release(
    State(s): State<CoordState>,
    Path((queue, job)): Path<(String, String)>,
    Strict(p): Strict<TokenParams>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let token = match job_ok(&queue, &job).and_then(|_| token(p.token.as_deref(), &body)) {
        Ok(t) => t,
        Err(r) => return reply(r),
    };
    match s.service.release(job_object(&queue, &job), &token).await {
        Ok(o) => released(o),
        Err(e) => backend_error(e),
    }
}
