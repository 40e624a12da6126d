//! A mock Kubernetes API server for unit tests, on kube-rs's mock service
//! (`tower_test::mock`, as kube-rs tests itself in `kube/src/mock_tests.rs`):
//! every request is recorded (method, path with query, content type, JSON
//! body) and answered by a closure. Shared by the Lease backend's and the
//! Pod labeler's tests.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::Value;

/// One request as the API server saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// `GET`, `PUT`, `POST`, `PATCH`, …
    pub method: String,
    /// The path with its query string.
    pub path: String,
    /// The `content-type` header (the patch type of a `PATCH`); empty if none.
    pub content_type: String,
    /// The JSON body; `Value::Null` when empty or not JSON.
    pub body: Value,
}

/// An answer body: raw JSON text or a JSON value.
pub(crate) trait Answer: Send + 'static {
    /// The body's bytes.
    fn into_body(self) -> Vec<u8>;
}

impl Answer for String {
    fn into_body(self) -> Vec<u8> {
        self.into_bytes()
    }
}

impl Answer for Value {
    fn into_body(self) -> Vec<u8> {
        serde_json::to_vec(&self).expect("a JSON value serializes")
    }
}

/// Answers a request with a status code and a body.
pub(crate) type Responder<A> = Arc<dyn Fn(&Seen) -> (u16, A) + Send + Sync>;

/// A client whose requests go to a mock server that records them and
/// answers with `respond`; the log of requests in the order they came.
/// Must be called inside a tokio runtime (the server is a spawned task).
pub(crate) fn mock<A: Answer>(respond: Responder<A>) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    mock_or_hold(Arc::new(move |s: &Seen| Some(respond(s))))
}

/// Answers a request, or `None` to hold it unanswered for as long as the
/// server runs (a hung watch; a write applied whose answer was lost).
pub(crate) type Holder<A> = Arc<dyn Fn(&Seen) -> Option<(u16, A)> + Send + Sync>;

/// [`mock`] whose server may leave requests unanswered ([`Holder`]).
pub(crate) fn mock_or_hold<A: Answer>(respond: Holder<A>) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let path = req
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            let content_type = req
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let s = Seen {
                method,
                path,
                content_type,
                body,
            };
            let answer = respond(&s);
            log.lock().unwrap().push(s);
            let Some((code, answer)) = answer else {
                held.push(send);
                continue;
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(answer.into_body()))
                    .unwrap(),
            );
        }
    });
    (Client::new(svc, "default"), seen)
}
