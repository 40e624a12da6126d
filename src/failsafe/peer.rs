//! The peer channel: a listener that serves only the heartbeat, and the
//! client the leader sends it with.
//!
//! Authentication is a shared secret read from a file (a Kubernetes
//! Secret mounted into every member) that never travels: each heartbeat
//! and each answer is signed with it ([`sign`](super::sign)). A heartbeat
//! that is unsigned, signed with another key, stamped outside the window
//! or replayed is 401 and changes nothing; an answer that fails the same
//! checks is not counted. A heartbeat asking a promise of 0 ms is a probe
//! (admission checks a member's channel with one): it is answered without
//! touching the member's promises.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::time::Instant;

use super::sign::{Keys, Nonces, REASONS, Unauthentic};
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

    /// The secret's bytes (the signatures' key).
    pub(super) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The peer channel's counters, and its warnings said once per reason a
/// minute.
#[derive(Clone)]
pub struct Counters {
    refused: IntCounterVec,
    admission: IntCounter,
    warned: Arc<Mutex<HashMap<&'static str, Instant>>>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counters(..)")
    }
}

impl Counters {
    /// Counters of `election`, not yet registered.
    pub fn new(election: &str) -> Counters {
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label("name", election);
        let refused = IntCounterVec::new(
            opts(
                "leader_election_failsafe_refused_total",
                "Failsafe peer messages refused as not authentic, by side (heartbeat: received by this member, 401; answer: received by this leader, not counted) and reason (unsigned, wrong_key, stale, replayed, crowded).",
            ),
            &["side", "reason"],
        )
        .expect("valid metric options");
        let admission = IntCounter::with_opts(opts(
            "leader_election_failsafe_admission_refused_total",
            "Applicants for the failsafe roster this process could not confirm over their peer channel (a wrong secret, no answer): not admitted.",
        ))
        .expect("valid metric options");
        for side in ["heartbeat", "answer"] {
            for reason in REASONS {
                refused.with_label_values(&[side, reason]);
            }
        }
        Counters {
            refused,
            admission,
            warned: Arc::default(),
        }
    }

    /// Register the counters on `registry`.
    ///
    /// # Errors
    /// Prometheus's, when a metric of the same name is registered already.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.refused.clone()))?;
        registry.register(Box::new(self.admission.clone()))
    }

    /// Count a message refused on `side`; returns whether to warn (the
    /// first of its reason in a minute).
    pub(super) fn refuse(&self, side: &str, why: &Unauthentic) -> bool {
        self.refused.with_label_values(&[side, why.reason()]).inc();
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        let last = warned.get(why.reason());
        let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
        if due {
            warned.insert(why.reason(), Instant::now());
        }
        due
    }

    /// Count an applicant refused at admission.
    pub(super) fn refuse_admission(&self) {
        self.admission.inc();
    }

    /// Messages refused on `side` (`heartbeat`, `answer`) for `reason`.
    pub fn refused(&self, side: &str, reason: &str) -> u64 {
        self.refused.with_label_values(&[side, reason]).get()
    }

    /// Applicants refused at admission.
    pub fn admission_refused(&self) -> u64 {
        self.admission.get()
    }
}

/// What the listener needs: the keys, the nonces seen, this member's
/// promises, and whether this member leads or campaigns right now.
#[derive(Clone)]
pub struct PeerState {
    /// The keys of the peer channel.
    pub keys: Keys,
    /// The heartbeats' nonces seen within the window.
    pub nonces: Arc<Nonces>,
    /// The refusal counters.
    pub counters: Counters,
    /// This member's promises.
    pub promises: Arc<Mutex<Promises>>,
    /// Whether this member leads or has a campaign on the wire.
    pub campaigning: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// The peer listener's router: `POST /failsafe/heartbeat` only.
pub fn router(state: PeerState) -> Router {
    Router::new()
        .route(HEARTBEAT_PATH, post(heartbeat))
        .with_state(state)
}

const REQUEST: [&str; 3] = ["request", "POST", HEARTBEAT_PATH];

fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (status, axum::Json(value)).into_response()
}

async fn heartbeat(
    State(st): State<PeerState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let nonce = match st.keys.verify(REQUEST, &headers, &body, &st.nonces) {
        Ok(nonce) => nonce,
        Err(why) => {
            if st.counters.refuse("heartbeat", &why) {
                tracing::warn!(
                    reason = why.reason(),
                    "refused a failsafe heartbeat (401): {why}; this member cannot confirm its sender during an outage"
                );
            }
            let msg = format!("failsafe heartbeat refused: {why}");
            return json(
                StatusCode::UNAUTHORIZED,
                serde_json::json!({ "error": msg }),
            );
        }
    };
    let (status, value) = answer(&st, &body);
    let bytes = serde_json::to_vec(&value).expect("JSON values serialize");
    let stamp = st.keys.sign(["answer", status.as_str(), &nonce], &bytes);
    let mut resp = (status, bytes).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in stamp.headers() {
        h.insert(name, HeaderValue::from_str(&value).expect("ASCII digits"));
    }
    resp
}

/// The answer to an authentic heartbeat `body`.
fn answer(st: &PeerState, body: &[u8]) -> (StatusCode, serde_json::Value) {
    let hb: Heartbeat = match serde_json::from_slice(body) {
        Ok(hb) => hb,
        Err(e) => {
            let msg = format!("the body is not a heartbeat: {e}");
            return (StatusCode::BAD_REQUEST, serde_json::json!({ "error": msg }));
        }
    };
    // Read under the promises' lock: the Elector checks its promise and
    // sets `campaigning` under the same lock, so no promise is given
    // between its check and its campaign.
    let answer = {
        let mut promises = st.promises.lock().expect("the promises lock");
        if hb.promise_ms == 0 {
            promises.probe(&hb)
        } else {
            let campaigning = (st.campaigning)();
            promises.heartbeat(&hb, Instant::now(), campaigning)
        }
    };
    match answer {
        Ok(ack) => (StatusCode::OK, serde_json::json!(ack)),
        Err(refusal) => (
            StatusCode::CONFLICT,
            serde_json::json!({ "error": refusal.to_string() }),
        ),
    }
}

/// The leader's side of the channel: its keys, the answers' nonces seen,
/// and the counters.
#[derive(Clone, Copy)]
pub struct Sender<'a> {
    /// The HTTP client.
    pub client: &'a reqwest::Client,
    /// The keys.
    pub keys: &'a Keys,
    /// The answers' nonces seen within the window.
    pub nonces: &'a Nonces,
    /// The refusal counters.
    pub counters: &'a Counters,
}

/// Sends `hb` to the member at `peer_addr` and returns its
/// acknowledgement.
///
/// # Errors
/// Why the leader cannot count it, in words for the log: no answer within
/// `timeout` or no connection, a refusal (401: the secrets differ; 409:
/// the member's reason), an answer not signed with our keys (counted), or
/// one that is not an acknowledgement.
pub async fn send(
    by: Sender<'_>,
    peer_addr: &str,
    hb: &Heartbeat,
    timeout: Duration,
) -> Result<Ack, String> {
    let url = format!("http://{peer_addr}{HEARTBEAT_PATH}");
    let body = serde_json::to_vec(hb).expect("a heartbeat serializes");
    let stamp = by.keys.sign(REQUEST, &body);
    let mut req = (by.client.post(url))
        .header(header::CONTENT_TYPE, "application/json")
        .timeout(timeout);
    for (name, value) in stamp.headers() {
        req = req.header(name, value);
    }
    let resp = req.body(body).send().await.map_err(|e| {
        if e.is_timeout() {
            format!("no answer from {peer_addr} within {timeout:?}")
        } else {
            format!("cannot reach {peer_addr}: {e}")
        }
    })?;
    let status = resp.status();
    if status == StatusCode::UNAUTHORIZED {
        return Err(format!(
            "{peer_addr} refused our heartbeat's signature (401): the members' --failsafe-secret-file differ, or their clocks are more than a lease duration apart"
        ));
    }
    let headers = resp.headers().clone();
    let bytes = (resp.bytes().await).map_err(|e| format!("{peer_addr} answered {status}: {e}"))?;
    let head = ["answer", status.as_str(), &stamp.nonce];
    if let Err(why) = by.keys.verify(head, &headers, &bytes, by.nonces) {
        by.counters.refuse("answer", &why);
        return Err(format!("{peer_addr}'s answer ({status}) is refused: {why}"));
    }
    match status {
        StatusCode::OK => serde_json::from_slice::<Ack>(&bytes)
            .map_err(|e| format!("{peer_addr} answered 200 without an acknowledgement: {e}")),
        status => {
            let text = String::from_utf8_lossy(&bytes);
            Err(format!("{peer_addr} answered {status}: {}", text.trim()))
        }
    }
}
