//! The typed query of each coordination route (parsed strictly by
//! `crate::query::Strict`: an unknown, repeated, empty or overlong
//! parameter is a 400 naming it) and the token of a request, from
//! `?token=` or a JSON body, never both.

use axum::body::Bytes;
use axum::http::StatusCode;
use serde::Deserialize;

use super::http::{Bad, MAX_BODY, reject};

/// `POST /locks/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LockParams {
    pub(crate) ttl: Option<String>,
    pub(crate) wait: Option<String>,
    pub(crate) fair: Option<String>,
    pub(crate) owner: Option<String>,
}

/// `POST /semaphores/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SemaphoreParams {
    pub(crate) permits: Option<String>,
    pub(crate) ttl: Option<String>,
    pub(crate) wait: Option<String>,
    pub(crate) owner: Option<String>,
}

/// A renewal: `POST /locks/{name}/renew`, `/semaphores/{name}/renew`,
/// `/rwlocks/{name}/renew`, `/jobs/{queue}/{job}/renew`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenewParams {
    pub(crate) token: Option<String>,
    pub(crate) ttl: Option<String>,
}

/// A give-back or completion with the token only: `DELETE` of a lock,
/// semaphore, read-write lock or job claim; `POST /jobs/{queue}/{job}/complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenParams {
    pub(crate) token: Option<String>,
}

/// `POST /jobs/{queue}/{job}/claim`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimParams {
    pub(crate) ttl: Option<String>,
    pub(crate) owner: Option<String>,
}

/// The body of a request that carries its token there.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenBody {
    token: serde_json::Value,
}

/// The token from `?token=` or a JSON body `{"token": "..."}`, not both.
pub(crate) fn token(
    query: Option<&str>,
    body: &Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<String, Bad> {
    let bytes = match body {
        Ok(b) => b,
        Err(rej) => {
            // 413 only for a body over the limit; a malformed (e.g. bad
            // chunked encoding) or stalled body is the client's 400.
            let status = rej.status();
            let what = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "too large"
            } else {
                "unreadable"
            };
            return Err((
                status,
                format!(
                    "the request body is {what} ({rej}); send at most {MAX_BODY} bytes: {{\"token\": \"...\"}}"
                ),
            ));
        }
    };
    match (query, bytes.is_empty()) {
        (Some(_), false) => Err(reject(
            "token is given twice (parameter 'token' and the body): give it once",
        )),
        (Some(t), true) => check_token(t),
        (None, true) => Err(reject(
            "token is missing: pass ?token=TOKEN or a JSON body {\"token\": \"TOKEN\"} from the acquisition's answer",
        )),
        (None, false) => body_token(bytes),
    }
}

/// The token of a JSON body `{"token": "..."}` with no other field.
fn body_token(bytes: &[u8]) -> Result<String, Bad> {
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
        .map_err(|_| reject("the body is not a JSON object; send {\"token\": \"TOKEN\"}"))?;
    if let Some(other) = v.keys().find(|k| *k != "token") {
        return Err(reject(crate::query::unknown(
            "body field",
            other,
            &["token"],
        )));
    }
    let body: TokenBody = serde_json::from_value(serde_json::Value::Object(v))
        .map_err(|_| reject("the body has no field token; send {\"token\": \"TOKEN\"}"))?;
    match body.token.as_str() {
        Some(t) => check_token(t),
        None => Err(reject(
            "body field 'token' must be a string; send {\"token\": \"TOKEN\"}",
        )),
    }
}

fn check_token(t: &str) -> Result<String, Bad> {
    if t.is_empty() || t.len() > 128 || !t.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
        return Err(reject(
            "token is malformed: use the token string from the acquisition's answer",
        ));
    }
    Ok(t.to_owned())
}
