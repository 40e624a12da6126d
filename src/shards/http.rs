//! `GET /shards`: this member's shards now, each with its hash range, its
//! KEP-5866 selector term and its fencing token; the whole set's owner map
//! as this member last read it; one selector for all of the member's
//! ranges; a long-poll on change (`?index=&wait=`, as `/leader`).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::keeper::ShardView;
use super::{ShardField, member_selector, shard_range};
use crate::http::{PollParams, error_response, json_response};
use crate::query::Strict;

/// Response header carrying the long-poll index of `/shards`.
pub const SHARDS_INDEX_HEADER: &str = "x-shards-index";

/// What `/shards` reads: the keeper's view, or `None` when the sidecar was
/// started without `--shards`.
#[derive(Clone)]
pub struct ShardsState {
    /// The election name.
    pub election: String,
    /// This member's identity.
    pub identity: String,
    /// `--shards`.
    pub shards: u32,
    /// The keeper's view.
    pub view: Option<watch::Receiver<ShardView>>,
}

/// One shard of this member in the body of `GET /shards`.
#[derive(Debug, Serialize)]
pub struct OwnedShard {
    /// The shard id, `0..shards_total`.
    pub id: u32,
    /// The first hash of its range, `0x` + 16 hex digits.
    pub start: String,
    /// One past its last hash (`0x10000000000000000` for the last shard).
    pub end: String,
    /// Its KEP-5866 selector term, on `object.metadata.uid`.
    pub selector: String,
    /// Its fencing token: grows with every owner of the shard.
    pub fencing_token: u64,
}

/// The JSON body of `GET /shards`.
#[derive(Debug, Serialize)]
pub struct ShardsBody {
    /// Election name.
    pub election: String,
    /// This member's identity.
    pub identity: String,
    /// The number of shards of the set (`--shards`).
    pub shards_total: u32,
    /// Grows with every change of this answer; pass it back as `?index=`.
    pub index: u64,
    /// The shards this member may act on now (none once `valid_for_ms` is 0).
    pub shards: Vec<OwnedShard>,
    /// All of them as one selector (terms joined by ` || `; empty: none).
    pub selector: String,
    /// How long the claims hold from this answer, in milliseconds, unless
    /// renewed: stop acting on them when it runs out.
    pub valid_for_ms: u64,
    /// The owner of every shard, by id, as last read (`null`: free).
    pub owners: Vec<Option<String>>,
    /// The members of the set as last read.
    pub members: Vec<String>,
    /// The last backend error, when the last call failed.
    pub error: Option<String>,
}

impl ShardsBody {
    /// The body for `view` at `now`.
    pub fn at(state: &ShardsState, view: &ShardView, now: Instant) -> ShardsBody {
        let n = state.shards as usize;
        let claimed = view.claimed_at(now);
        let ids: Vec<usize> = claimed.keys().map(|&i| i as usize).collect();
        let shards = claimed
            .iter()
            .map(|(&id, &fencing_token)| {
                let r = shard_range(id as usize, n);
                OwnedShard {
                    id,
                    start: r.start_hex(),
                    end: r.end_hex(),
                    selector: r.selector(ShardField::Uid),
                    fencing_token,
                }
            })
            .collect();
        let valid_for_ms = match (view.valid_until, claimed.is_empty()) {
            (Some(v), false) => v.saturating_duration_since(now).as_millis() as u64,
            _ => 0,
        };
        ShardsBody {
            election: state.election.clone(),
            identity: state.identity.clone(),
            shards_total: state.shards,
            index: view.index,
            shards,
            selector: member_selector(&ids, n, ShardField::Uid),
            valid_for_ms,
            owners: view.owners.clone(),
            members: view.members.clone(),
            error: view.error.clone(),
        }
    }
}

/// The router of `GET /shards` over `state`.
pub fn shards_router(state: ShardsState) -> Router {
    Router::new()
        .route("/shards", get(shards))
        .layer(axum::middleware::from_fn(crate::http::json_errors))
        .with_state(state)
}

async fn shards(State(state): State<ShardsState>, Strict(params): Strict<PollParams>) -> Response {
    let poll = match params.poll() {
        Ok(p) => p,
        Err(msg) => return error_response(StatusCode::BAD_REQUEST, msg),
    };
    let Some(mut rx) = state.view.clone() else {
        return error_response(
            StatusCode::NOT_FOUND,
            "this sidecar keeps no shards: start it with --shards N (1-4096) to own a share of N shards",
        );
    };
    if let Some((index, wait)) = poll {
        let deadline = Instant::now() + wait;
        loop {
            // A claim that runs out changes the answer too.
            let valid_until = {
                let v = rx.borrow_and_update();
                if v.index != index {
                    break;
                }
                v.valid_until
            };
            let until = valid_until.map_or(deadline, |v| v.min(deadline));
            tokio::select! {
                r = rx.changed() => if r.is_err() { break },
                () = tokio::time::sleep_until(until) => break,
            }
        }
    }
    let body = ShardsBody::at(&state, &rx.borrow(), Instant::now());
    let index = body.index;
    let mut resp = json_response(StatusCode::OK, body);
    resp.headers_mut()
        .insert(SHARDS_INDEX_HEADER, HeaderValue::from(index));
    resp
}
