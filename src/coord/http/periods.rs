//! The routes of at-most-once-per-period jobs (see `crate::coord::periods`):
//! `POST /jobs/{name}/periods/{start}/claim?every=5m[&ttl=&owner=]` and
//! `POST /jobs/{name}/periods/{start}/complete?every=5m` with the token.
//! A claim of a period that ended more than the skew margin ago, or that
//! starts more than the margin from now, is a 409 whose `state` says which
//! (`ended`, `not_started`): the request is well formed, the clock says no.

use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::{
    Bad, CoordState, MAX_TTL, MIN_TTL, claimed, completed, duration, name_ok, owner, reject, reply,
    token,
};
use crate::coord::Acquire;
use crate::query::Strict;

/// `POST /jobs/{name}/periods/{start}/claim`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClaimParams {
    every: Option<String>,
    ttl: Option<String>,
    owner: Option<String>,
}

/// `POST /jobs/{name}/periods/{start}/complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CompleteParams {
    every: Option<String>,
    token: Option<String>,
}
use crate::coord::periods::{self, MAX_EVERY, Period, When};
use crate::http::json_response;

/// The schedule's queue and the period a request names, from its path and
/// `every=`.
fn period_of(name: &str, start: &str, every: Option<&str>) -> Result<(String, Period), Bad> {
    name_ok("job name", name)?;
    if every.is_none() {
        return Err(reject(
            "parameter 'every' is required: the period's length, e.g. every=5m",
        ));
    }
    let every = duration(
        every,
        "every",
        Duration::ZERO,
        Duration::from_secs(1),
        MAX_EVERY,
    )?;
    let every = periods::check_every("parameter 'every'", every).map_err(reject)?;
    let period = Period::parse(start, every).map_err(reject)?;
    Ok((periods::queue(name), period))
}

/// `POST /jobs/{name}/periods/{start}/claim`.
pub(super) async fn claim(
    State(s): State<CoordState>,
    Path((name, start)): Path<(String, String)>,
    Strict(p): Strict<ClaimParams>,
) -> Response {
    let checked = period_of(&name, &start, p.every.as_deref()).and_then(|(queue, period)| {
        let ttl = duration(p.ttl.as_deref(), "ttl", MIN_TTL, MIN_TTL, MAX_TTL)?;
        Ok((queue, period, ttl, owner(p.owner.as_ref(), &s.service)?))
    });
    let (queue, period, ttl, owner) = match checked {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    match period.when(SystemTime::now(), ttl) {
        When::Open(ttl) => {
            let job = period.job();
            let what = Acquire::Job {
                queue: &queue,
                job: &job,
            };
            claimed(s.service.acquire(what, &owner, ttl, Duration::ZERO).await)
        }
        When::Ended => json_response(
            StatusCode::CONFLICT,
            json!({
                "error": format!("the period starting {period} ended (with the clock-skew margin of {}s) by this sidecar's clock; periods are never caught up", periods::SKEW_MARGIN.as_secs()),
                "state": "ended",
            }),
        ),
        When::NotStarted => json_response(
            StatusCode::CONFLICT,
            json!({
                "error": format!("the period starting {period} has not started by this sidecar's clock (allowing {}s of clock skew); claim it when it starts", periods::SKEW_MARGIN.as_secs()),
                "state": "not_started",
            }),
        ),
    }
}

/// `POST /jobs/{name}/periods/{start}/complete`: kept completed for
/// `--completed-retention`, and at least until the period's end plus the
/// skew margin.
pub(super) async fn complete(
    State(s): State<CoordState>,
    Path((name, start)): Path<(String, String)>,
    Strict(p): Strict<CompleteParams>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let checked = period_of(&name, &start, p.every.as_deref()).and_then(|(q, period)| {
        let token = token(p.token.as_deref(), &body)?;
        Ok((q, period, token))
    });
    let (queue, period, token) = match checked {
        Ok(v) => v,
        Err(r) => return reply(r),
    };
    let retention = period.retention(SystemTime::now(), s.completed_retention);
    completed(
        s.service
            .complete(&queue, &period.job(), &token, retention)
            .await,
    )
}
