//! Socket tests of the listener limits: loopback, port 0, bounded.

use super::*;
use axum::body::Bytes;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// A hang guard, not a measurement: far above every timeout under test.
const GUARD: Duration = Duration::from_secs(10);

fn test_router() -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        // Never answers on its own: holds its connection like a long-poll.
        .route(
            "/hold",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        )
        .route(
            "/echo",
            post(
                |b: Result<Bytes, axum::extract::rejection::BytesRejection>| async move {
                    match b {
                        Ok(b) => (StatusCode::OK, b.len().to_string()),
                        Err(e) => (e.status(), e.body_text()),
                    }
                },
            ),
        )
}

async fn start(limits: Limits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(
        Listener {
            listener,
            flag: "--http-addr",
            router: test_router(),
            healthz: true,
            limits,
        },
        stop.clone(),
    ));
    (addr, stop, task)
}

fn limits(max: usize) -> Limits {
    Limits {
        max_connections: max,
        header_read_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_secs(30),
    }
}

/// Send `req` and read until the server closes or a full answer arrived.
async fn exchange(addr: SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    read_to_close(&mut s).await
}

async fn read_to_close(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    timeout(GUARD, s.read_to_end(&mut buf))
        .await
        .expect("the server neither answered nor closed the connection")
        .ok();
    String::from_utf8_lossy(&buf).into_owned()
}

use std::net::SocketAddr;

#[tokio::test]
async fn beyond_the_cap_new_connections_get_503_but_healthz_answers() {
    let (addr, _stop, _task) = start(limits(3)).await;
    // Fill the cap with requests in flight.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    // Let the server accept them and start their requests: a connection
    // with no request in flight would give its slot to the next one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probe = exchange(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let mut tries = 0;
    let mut answer = exchange(addr, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n").await;
    while !answer.starts_with("HTTP/1.1 503") && tries < 50 {
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        answer = exchange(addr, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n").await;
    }
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("--max-connections"), "{answer}");
    assert!(answer.contains("application/json"), "{answer}");
    let health = exchange(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{probe}\n{health}");
    // Closing one held connection frees its slot.
    drop(held.pop());
    let mut freed = false;
    for _ in 0..100 {
        let a = exchange(
            addr,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        if a.starts_with("HTTP/1.1 200") && a.ends_with("ok") {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "a closed connection did not free its slot");
}

#[tokio::test]
async fn partial_headers_are_cut_off_by_the_header_read_timeout() {
    let mut l = limits(8);
    l.header_read_timeout = Duration::from_millis(300);
    let (addr, _stop, _task) = start(l).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    // The server closes (hang guard in read_to_close).
    let _ = read_to_close(&mut s).await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let mut l = limits(8);
    l.header_read_timeout = Duration::from_millis(300);
    let (addr, _stop, _task) = start(l).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_half_sent_body_times_out_with_a_400() {
    let mut l = limits(8);
    l.body_timeout = Duration::from_millis(300);
    let (addr, _stop, _task) = start(l).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let answer = read_to_close(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

#[tokio::test]
async fn a_malformed_chunked_body_is_a_400() {
    let (addr, _stop, _task) = start(limits(8)).await;
    let answer = exchange(
        addr,
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

#[tokio::test]
async fn stop_ends_serve_once_requests_finish() {
    let (addr, stop, task) = start(limits(8)).await;
    let ok = exchange(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    stop.cancel();
    timeout(GUARD, task)
        .await
        .expect("serve did not end")
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after stop"
    );
}

/// Open `n` connections that never send a byte (a flood of idle clients);
/// non-blocking, so [`closed_by_server`] can look without waiting.
fn idle_flood(addr: SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    (0..n).map(|_| raw_connect(addr, b"")).collect()
}

/// A non-blocking client connection that has sent `first`.
fn raw_connect(addr: SocketAddr, first: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(first).unwrap();
    s.set_nonblocking(true).unwrap();
    s
}

/// How many of `conns` the server has closed (a read sees the end or a reset).
fn closed_by_server(conns: &[std::net::TcpStream]) -> usize {
    use std::io::Read;
    let mut buf = [0u8; 256];
    conns
        .iter()
        .filter(|s| match (&**s).read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        })
        .count()
}

/// Wait until the server has closed at least `n` of `conns` (it accepted
/// the whole flood); a hang guard, not a measurement.
async fn until_closed(conns: &[std::net::TcpStream], n: usize) {
    let end = tokio::time::Instant::now() + GUARD;
    while closed_by_server(conns) < n {
        assert!(
            tokio::time::Instant::now() < end,
            "the server closed {} of the flood, expected at least {n}",
            closed_by_server(conns)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A kubelet probe: `GET /healthz` answered within 1 s (its default timeout).
async fn probe(addr: SocketAddr) -> String {
    timeout(
        Duration::from_secs(1),
        exchange(
            addr,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ),
    )
    .await
    .unwrap_or_else(|_| "no answer within 1 s".into())
}

/// With the cap and the overflow allowance full of idle
/// connections (and more arriving), a probe is never refused: the longest-idle
/// connection is closed to admit it. The open connections stay bounded.
#[tokio::test]
async fn probes_are_answered_under_a_flood_of_idle_connections() {
    let cap = 4;
    let (addr, _stop, _task) = start(limits(cap)).await;
    let beyond = 40;
    let flood = idle_flood(addr, cap + OVERFLOW_CONNECTIONS + beyond);
    until_closed(&flood, beyond).await;
    for i in 0..3 {
        let answer = probe(addr).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
            "probe {i} of 3 under the flood: {answer:?}"
        );
    }
    let open = flood.len() - closed_by_server(&flood);
    assert!(
        open <= cap + OVERFLOW_CONNECTIONS,
        "{open} idle connections stay open, more than the cap ({cap}) plus the overflow allowance ({OVERFLOW_CONNECTIONS})"
    );
}

/// With every served connection busy (long-polls) and the
/// overflow allowance full of idle connections, a probe still gets its 200
/// (the longest-idle overflow connection makes room); the busy ones are kept.
#[tokio::test]
async fn probes_are_answered_when_the_cap_is_busy_and_the_overflow_idle() {
    let cap = 3;
    let (addr, _stop, _task) = start(limits(cap)).await;
    let held: Vec<_> = (0..cap)
        .map(|_| raw_connect(addr, b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"))
        .collect();
    // The held requests reach the router before the flood arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let beyond = 20;
    let flood = idle_flood(addr, OVERFLOW_CONNECTIONS + beyond);
    until_closed(&flood, beyond).await;
    for i in 0..3 {
        let answer = probe(addr).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "probe {i} of 3 with the cap busy: {answer:?}"
        );
    }
    assert_eq!(
        closed_by_server(&held),
        0,
        "a busy connection (a request in flight) was closed to admit a probe"
    );
}
