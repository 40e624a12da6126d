//! Ports for servers that cannot report a port 0 (etcd, redis-server).
//!
//! The kernel hands out ephemeral ports (`/proc/sys/net/ipv4/ip_local_port_range`,
//! 32768–60999 by default) to every `bind(…:0)` and outgoing connection on the
//! host, so a port probed there and released can be taken before the server
//! binds it. Ports below that range are never handed out by the kernel: this
//! allocator takes them from a per-process offset (derived from the pid, so
//! test binaries running side by side start far apart) plus an atomic counter,
//! skipping ports something already listens on. Whoever starts a server on
//! such a port still retries with another one when the server fails to bind.
//! Processes that can bind port 0 themselves (the sidecar, the in-process
//! stand-ins) do so instead, and a URL that must refuse connections takes a
//! [`RefusedPort`], which holds its port instead of releasing it.

use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out when the ephemeral range leaves room above it.
const FLOOR: u32 = 10_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range (32768 when unreadable).
pub fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A loopback port below the kernel's ephemeral range that nothing listens on
/// right now, for a server that must be told its port (etcd, redis-server).
/// Never the same port twice in one process. Panics when the range is used up.
pub fn server_port() -> u16 {
    let low = u32::from(ephemeral_low());
    let (floor, span) = if low > FLOOR + 2_000 {
        (FLOOR, low - FLOOR)
    } else {
        (1_025, low.saturating_sub(1_025).max(1))
    };
    // A multiplicative hash spreads neighbouring pids across the range.
    let offset = std::process::id().wrapping_mul(2_654_435_761) % span;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < span, "the {span} ports below {low} are used up");
        let port = (floor + (offset + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A loopback port that refuses every connection for as long as this value
/// lives, for a URL that must be dead (a backend that is down, a notify
/// target that is gone). It holds a socket bound to `127.0.0.1:0` that never
/// listens: the kernel answers connections to it with a reset, and while it
/// is bound (without `SO_REUSEADDR`) nothing else can bind or be handed that
/// port, so unlike a probed-and-released port it cannot come alive mid-test.
pub struct RefusedPort {
    /// The port (valid while this value lives).
    pub port: u16,
    _socket: tokio::net::TcpSocket,
}

impl RefusedPort {
    /// Bind a fresh socket to `127.0.0.1:0` and keep it (needs no runtime).
    pub fn new() -> RefusedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket.set_reuseaddr(false).expect("SO_REUSEADDR off");
        socket
            .bind(([127, 0, 0, 1], 0).into())
            .expect("bind 127.0.0.1:0");
        let port = socket.local_addr().expect("the bound address").port();
        RefusedPort {
            port,
            _socket: socket,
        }
    }

    /// `http://127.0.0.1:<port>` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Default for RefusedPort {
    fn default() -> Self {
        Self::new()
    }
}
