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

/// The fields of a JSON object body in their order, a repeated key kept
/// twice (`serde_json`'s map keeps only the last one).
struct Fields(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Visit)
    }
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

/// The token of a JSON body `{"token": "..."}` with no other field and no
/// key given twice.
fn body_token(bytes: &[u8]) -> Result<String, Bad> {
    let Fields(fields) = serde_json::from_slice(bytes)
        .map_err(|_| reject("the body is not a JSON object; send {\"token\": \"TOKEN\"}"))?;
    let mut token = None;
    for (key, value) in fields {
        if key != "token" {
            return Err(reject(crate::query::unknown(
                "body field",
                &key,
                &["token"],
            )));
        }
        if token.replace(value).is_some() {
            return Err(reject("repeated body field 'token': give it once"));
        }
    }
    match token {
        Some(serde_json::Value::String(t)) => check_token(&t),
        Some(_) => Err(reject(
            "body field 'token' must be a string; send {\"token\": \"TOKEN\"}",
        )),
        None => Err(reject(
            "the body has no field token; send {\"token\": \"TOKEN\"}",
        )),
    }
}

/// A token as issued (`v1.<kind>.<lease>.<nonce>`, see
/// [`Token`](crate::backend::coordination::Token)); any other string is
/// malformed (400), never "no longer yours" (410).
fn check_token(t: &str) -> Result<String, Bad> {
    if crate::backend::coordination::Token::parse(t).is_none() {
        return Err(reject(
            "token is malformed: use the token string from the acquisition's answer",
        ));
    }
    Ok(t.to_owned())
}
