//! Serving a router on a TCP listener with the limits a port reachable by
//! anything in the cluster needs: a cap on concurrent connections,
//! a header-read timeout that also closes idle keep-alive connections, and a
//! request-body inactivity timeout.
//!
//! Invariant: at most `max_connections` connections are served by the router
//! at once. At the cap a new connection takes the slot of the longest-idle
//! one (no request in flight: before its first request or between two),
//! which is closed: a flood of idle connections must not refuse a kubelet
//! probe. When every served connection has a request in flight, new
//! ones are answered by a tiny fixed service (`/healthz` → 200 when the
//! listener has one, anything else → 503 JSON, `Connection: close`, a short
//! header timeout), at most [`OVERFLOW_CONNECTIONS`] of them at once, the
//! longest-waiting one again giving way to a new one. So the file
//! descriptors and memory a client can pin are bounded, requests in flight
//! are never cut, and a liveness probe gets its answer while the cap is
//! reached.
//!
//! HTTP/1.1 only: one request at a time per connection, so the connection
//! cap is also a cap on concurrent requests (HTTP/2 would multiplex many
//! long-polls over one connection).
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;
use tracing::{debug, warn};

use crate::http::error_response;

mod slots;

use slots::{Admission, BusyBody, Slot, Slots};

/// Connections served by the fixed overflow answer at once, beyond the cap.
pub const OVERFLOW_CONNECTIONS: usize = 64;
/// Header-read timeout of an overflow connection.
pub const OVERFLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest buffer hyper keeps per connection (request head included). The
/// API's requests are a request line and a few headers; hyper's default
/// (about 400 KiB) lets one slow client pin far more memory than it needs.
pub const MAX_BUF_SIZE: usize = 16 * 1024;
/// Pause after a failed `accept` (e.g. the file-descriptor limit), so the
/// loop does not spin; existing connections keep being served meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served by the router at once (`--max-connections`).
    pub max_connections: usize,
    /// Time allowed to receive a request's head, which is also how long an
    /// idle keep-alive connection stays open (`--header-read-timeout`).
    pub header_read_timeout: Duration,
    /// Longest pause while reading a request body (`--request-body-timeout`).
    pub body_timeout: Duration,
}

/// Default of `--max-connections` (flags in `config`): a sidecar's clients are its app (a few
/// long-polls), the kubelet and Prometheus; 256 leaves ample room and holds
/// about 6 MiB of connection state at the cap (about 21 KiB each, measured
/// by `benches/longpoll_memory.rs`), far inside the chart's 64 Mi limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default of `--header-read-timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--request-body-timeout`.
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_timeout: DEFAULT_REQUEST_BODY_TIMEOUT,
        }
    }
}

/// What one listener serves.
pub struct Listener {
    /// The bound socket.
    pub listener: TcpListener,
    /// The flag the address came from, for log messages (`--http-addr`).
    pub flag: &'static str,
    /// The router. Requests carry `ConnectInfo<SocketAddr>` of the peer.
    pub router: Router,
    /// Whether `GET /healthz` is answered 200 beyond the cap.
    pub healthz: bool,
    /// The limits.
    pub limits: Limits,
}

/// Serve `l` until `stop` is cancelled, then wait for the open connections to
/// finish their requests (hyper's graceful shutdown). Wrap the call in a
/// timeout to bound the wait.
pub async fn serve(l: Listener, stop: CancellationToken) {
    let Listener {
        listener,
        flag,
        router,
        healthz,
        limits,
    } = l;
    let tiers = Tiers {
        served: Slots::new(limits.max_connections),
        overflow: Slots::new(OVERFLOW_CONNECTIONS),
        router,
        healthz,
        limits,
    };
    let graceful = GracefulShutdown::new();
    let mut warned_cap = false;
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    warn!(flag, error = %e, "cannot accept a connection; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let admission = tiers.admit(TokioIo::new(stream), peer, &graceful);
        if admission == Admission::Free {
            warned_cap = false;
        }
        if admission == Admission::Evicted {
            if !warned_cap {
                warned_cap = true;
                warn!(
                    flag,
                    max_connections = limits.max_connections,
                    "connection cap reached: each new connection closes the longest-idle one; with every connection busy, new ones get 503; raise --max-connections if this load is expected"
                );
            }
            // Let the evicted connection's task run and close its socket
            // before the next accept, so the open connections stay bounded.
            tokio::task::yield_now().await;
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The two tiers of a listener: the router's connections up to the cap, and
/// the overflow answer's beyond it.
struct Tiers {
    served: Arc<Slots>,
    overflow: Arc<Slots>,
    router: Router,
    healthz: bool,
    limits: Limits,
}

impl Tiers {
    /// Give the connection a slot of the router's tier (evicting the
    /// longest-idle connection when full), else of the overflow tier, and
    /// serve it on its own task; close it when neither has room.
    fn admit(
        &self,
        io: TokioIo<TcpStream>,
        peer: SocketAddr,
        graceful: &GracefulShutdown,
    ) -> Admission {
        if let Some((slot, how)) = self.served.admit() {
            let router = self.router.clone();
            tokio::spawn(serve_router(io, peer, slot, router, self.limits, graceful));
            how
        } else if let Some((slot, how)) = self.overflow.admit() {
            tokio::spawn(serve_overflow(io, slot, self.healthz, self.limits));
            how
        } else {
            // Unreachable in practice (overflow connections are answered at
            // once); close rather than queue.
            drop(io);
            Admission::Evicted
        }
    }
}

/// Serve one connection with the router until it ends or is evicted (only
/// while idle: between requests, or before its first).
fn serve_router(
    io: TokioIo<TcpStream>,
    peer: SocketAddr,
    slot: Slot,
    router: Router,
    limits: Limits,
    graceful: &GracefulShutdown,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let slot = Arc::new(slot);
    let body_timeout = limits.body_timeout;
    let conn_slot = slot.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = conn_slot.busy();
        let mut req = req.map(|b| Body::new(TimeoutBody::new(body_timeout, b)));
        req.extensions_mut().insert(ConnectInfo(peer));
        let answer = router.clone().oneshot(req);
        async move {
            let resp = answer.await?;
            Ok::<_, Infallible>(resp.map(|b| Body::new(BusyBody::new(b, busy))))
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_BUF_SIZE)
        .serve_connection(io, svc);
    let conn = graceful.watch(conn);
    async move {
        tokio::select! {
            r = conn => if let Err(e) = r {
                debug!(%peer, error = %e, "connection ended with an error");
            },
            _ = slot.evicted() => debug!(%peer, "closed this idle connection to admit a new one at the cap"),
        }
    }
}

/// Answer one connection beyond the cap with the fixed overflow answer.
async fn serve_overflow(io: TokioIo<TcpStream>, slot: Slot, healthz: bool, limits: Limits) {
    let max = limits.max_connections;
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
        Ok::<_, Infallible>(overflow_answer(req.uri().path(), healthz, max))
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(OVERFLOW_HEADER_TIMEOUT.min(limits.header_read_timeout))
        .max_buf_size(MAX_BUF_SIZE)
        .keep_alive(false)
        .serve_connection(io, svc);
    tokio::select! {
        _ = conn => {}
        _ = slot.evicted() => {}
    }
}

/// The answer to a request on a connection beyond the cap.
fn overflow_answer(path: &str, healthz: bool, max: usize) -> Response {
    let mut resp = if healthz && path == "/healthz" {
        crate::http::json_response(StatusCode::OK, serde_json::json!({ "status": "ok" }))
    } else {
        let mut r = error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "too many connections: this listener serves at most {max} at once (--max-connections); retry shortly"
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    };
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;
