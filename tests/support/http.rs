//! One HTTP/1.1 client for tests and benches, always with a time limit: a
//! request on a fresh connection (loopback unless an address is given) (`Connection: close`), its answer
//! read to the end. Enough for the sidecar's APIs and the stand-ins; nothing
//! here follows redirects or reuses connections.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// The limit of [`http_get`]: long enough for a loaded machine, short enough
/// that a hung server fails the test.
pub const HTTP_LIMIT: Duration = Duration::from_secs(3);

/// How far a request got, for the message when its limit runs out.
#[derive(Clone, Copy)]
enum Stage {
    Connecting,
    Sending,
    Reading,
}

impl Stage {
    /// What probably hung when the limit ran out at this stage.
    fn suspect(self) -> &'static str {
        match self {
            Stage::Connecting => {
                "no connection: the server probably stopped accepting (a full backlog, a stopped process)"
            }
            Stage::Sending => "the request could not be sent: the server stopped reading it",
            Stage::Reading => {
                "connected and sent, but no complete answer: the server's handler probably hung (on a stalled backend, a long wait)"
            }
        }
    }
}

/// `method path` on `127.0.0.1:port` with an optional JSON `body`; returns the
/// status code and the body as text. Errors: connection failures, an answer
/// that is not HTTP, and `limit` running out (all as `std::io::Error`, their
/// message naming the request and, on a timeout, what probably hung).
pub async fn http_request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> std::io::Result<(u16, String)> {
    http_request_at(LOOPBACK, port, method, path, body, limit).await
}

/// The loopback address every server of the kit listens on by default.
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// [`http_request`] to `ip:port` (a process in a network namespace answers
/// on its own address, not the host's loopback).
pub async fn http_request_at(
    ip: IpAddr,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> std::io::Result<(u16, String)> {
    // A plain variable (not a `Cell`) keeps the future `Send` for spawned callers.
    let mut stage = Stage::Connecting;
    let fut = async {
        let mut s = tokio::net::TcpStream::connect((ip, port)).await?;
        s.set_nodelay(true)?;
        let head = match body {
            Some(b) => format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ),
            None if method == "GET" => String::new(),
            None => "Content-Length: 0\r\n".to_owned(),
        };
        stage = Stage::Sending;
        s.write_all(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: {ip}\r\n{head}Connection: close\r\n\r\n{}",
                body.unwrap_or("")
            )
            .as_bytes(),
        )
        .await?;
        stage = Stage::Reading;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        parse_answer(&String::from_utf8_lossy(&buf))
    };
    let request = format!("{method} {path} on {ip}:{port}");
    let outcome = timeout(limit, fut).await;
    match outcome {
        Ok(answer) => answer.map_err(|e| std::io::Error::new(e.kind(), format!("{request}: {e}"))),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{request}: timed out after {limit:?}: {}", stage.suspect()),
        )),
    }
}

/// [`http_request`] with the answer's body parsed as JSON (`Value::Null` when
/// it is empty or not JSON), for the sidecar's JSON APIs.
pub async fn http_json(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> std::io::Result<(u16, Value)> {
    let (status, text) = http_request(port, method, path, body, limit).await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// The status and body of an HTTP/1.1 answer (the body after the blank line).
fn parse_answer(text: &str) -> std::io::Result<(u16, String)> {
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "no HTTP answer (did the server die mid-request?): {text:?}"
            ))
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// GET `path` on a loopback port within [`HTTP_LIMIT`]; returns the status code and body.
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_request(port, "GET", path, None, HTTP_LIMIT).await
}

/// GET `path` within `limit` (long-polls outlive [`HTTP_LIMIT`]).
pub async fn http_get_within(
    port: u16,
    path: &str,
    limit: Duration,
) -> std::io::Result<(u16, String)> {
    http_request(port, "GET", path, None, limit).await
}
