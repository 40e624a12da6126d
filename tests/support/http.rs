//! One HTTP/1.1 client for tests and benches, always with a time limit: a
//! request on a fresh loopback connection (`Connection: close`), its answer
//! read to the end. Enough for the sidecar's APIs and the stand-ins; nothing
//! here follows redirects or reuses connections.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// The limit of [`http_get`]: long enough for a loaded machine, short enough
/// that a hung server fails the test.
pub const HTTP_LIMIT: Duration = Duration::from_secs(3);

/// `method path` on `127.0.0.1:port` with an optional JSON `body`; returns the
/// status code and the body as text. Errors: connection failures, an answer
/// that is not HTTP, and `limit` running out (all as `std::io::Error`).
pub async fn http_request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: Duration,
) -> std::io::Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.set_nodelay(true)?;
        let head = match body {
            Some(b) => format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ),
            None if method == "GET" => String::new(),
            None => "Content-Length: 0\r\n".to_owned(),
        };
        s.write_all(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Connection: close\r\n\r\n{}",
                body.unwrap_or("")
            )
            .as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        parse_answer(&String::from_utf8_lossy(&buf))
    };
    timeout(limit, fut)
        .await
        .map_err(|_| std::io::Error::other(format!("HTTP request timed out after {limit:?}")))?
}

/// The status and body of an HTTP/1.1 answer (the body after the blank line).
fn parse_answer(text: &str) -> std::io::Result<(u16, String)> {
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad HTTP answer: {text:?}")))?;
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
