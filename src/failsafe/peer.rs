//! The peer channel: a listener that serves only the heartbeat, and the
//! client the leader sends it with.
//!
//! Authentication is a shared secret read from a file (a Kubernetes
//! Secret mounted into every member), sent as `Authorization: Bearer` and
//! compared in constant time. Why not per-member keys in the roster: the
//! roster lives in the backend, so keys published there protect nothing
//! the backend's writers cannot already change, and they add a key per
//! Pod to generate and rotate. What a forged heartbeat could do is bounded
//! anyway: it makes a member promise not to campaign (a delayed failover),
//! it can never make anyone lead, since acknowledgements travel back on
//! the leader's own connection. A wrong or missing secret is 401 and
//! changes nothing.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::{Ack, Heartbeat, Promises};

/// The path of the one route.
pub const HEARTBEAT_PATH: &str = "/failsafe/heartbeat";

/// The shared secret (never printed).
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why the secret could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read the failsafe secret file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds fewer than 16 bytes (after trimming white space).
    #[error("the failsafe secret in {path} is {len} bytes; at least 16 are needed")]
    TooShort {
        /// The file.
        path: String,
        /// Its length.
        len: usize,
    },
}

impl Secret {
    /// The secret in `path`, trimmed of surrounding white space.
    ///
    /// # Errors
    /// [`SecretError`]: unreadable, or shorter than 16 bytes.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let shown = path.display().to_string();
        let raw = std::fs::read(path).map_err(|source| SecretError::Read {
            path: shown.clone(),
            source,
        })?;
        Secret::new(raw.trim_ascii()).map_err(|len| SecretError::TooShort { path: shown, len })
    }

    /// A secret of these bytes; `Err(len)` when shorter than 16.
    pub fn new(bytes: &[u8]) -> Result<Secret, usize> {
        if bytes.len() < 16 {
            return Err(bytes.len());
        }
        Ok(Secret(bytes.into()))
    }

    /// Whether `headers` carry this secret as a bearer token.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        given.is_some_and(|g| bool::from(g.ct_eq(&self.0)))
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }
}

/// What the listener needs: the secret, this member's promises, and
/// whether this member leads or campaigns right now.
#[derive(Clone)]
pub struct PeerState {
    /// The shared secret.
    pub secret: Secret,
    /// This member's promises.
    pub promises: Arc<Mutex<Promises>>,
    /// Whether this member leads or has a campaign on the wire.
    pub campaigning: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// Say (at most once a minute per process) that a heartbeat was refused
/// for its secret: the leader's `--failsafe-secret-file` differs from this
/// member's, so this member never confirms it, and in an outage the leader
/// steps down at once.
fn warn_refused_secret() {
    static LAST: std::sync::Mutex<Option<tokio::time::Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
        *last = Some(tokio::time::Instant::now());
        tracing::warn!(
            "refused a failsafe heartbeat with a missing or wrong secret (401): the leader's --failsafe-secret-file differs from this member's, so this member cannot confirm it during an outage"
        );
    }
}

/// The peer listener's router: `POST /failsafe/heartbeat` only.
pub fn router(state: PeerState) -> Router {
    Router::new()
        .route(HEARTBEAT_PATH, post(heartbeat))
        .with_state(state)
}

async fn heartbeat(
    State(st): State<PeerState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !st.secret.admits(&headers) {
        warn_refused_secret();
        let msg = "missing or wrong failsafe secret (Authorization: Bearer)";
        return (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": msg })),
        )
            .into_response();
    }
    let hb: Heartbeat = match serde_json::from_slice(&body) {
        Ok(hb) => hb,
        Err(e) => {
            let msg = format!("the body is not a heartbeat: {e}");
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({ "error": msg })),
            )
                .into_response();
        }
    };
    // Read under the promises' lock: the Elector checks its promise and
    // sets `campaigning` under the same lock, so no promise is given
    // between its check and its campaign.
    let answer = {
        let mut promises = st.promises.lock().expect("the promises lock");
        let campaigning = (st.campaigning)();
        promises.heartbeat(&hb, Instant::now(), campaigning)
    };
    match answer {
        Ok(ack) => (StatusCode::OK, Json(ack)).into_response(),
        Err(refusal) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({ "error": refusal.to_string() })),
        )
            .into_response(),
    }
}

/// Sends `hb` to the member at `peer_addr` and returns its
/// acknowledgement.
///
/// # Errors
/// Why the leader cannot count it, in words for the log: no answer within
/// `timeout` or no connection, a refusal (401: the secrets differ; 409:
/// the member's reason), or an answer that is not an acknowledgement.
pub async fn send(
    client: &reqwest::Client,
    peer_addr: &str,
    secret: &Secret,
    hb: &Heartbeat,
    timeout: Duration,
) -> Result<Ack, String> {
    let url = format!("http://{peer_addr}{HEARTBEAT_PATH}");
    let resp = client
        .post(url)
        .header(header::AUTHORIZATION, secret.bearer())
        .json(hb)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                format!("no answer from {peer_addr} within {timeout:?}")
            } else {
                format!("cannot reach {peer_addr}: {e}")
            }
        })?;
    match resp.status() {
        StatusCode::OK => resp
            .json::<Ack>()
            .await
            .map_err(|e| format!("{peer_addr} answered 200 without an acknowledgement: {e}")),
        StatusCode::UNAUTHORIZED => Err(format!(
            "{peer_addr} refused the secret (401): the members' --failsafe-secret-file differ"
        )),
        status => {
            let body = resp.text().await.unwrap_or_default();
            Err(format!("{peer_addr} answered {status}: {}", body.trim()))
        }
    }
}
