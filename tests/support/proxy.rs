//! A TCP fault proxy on tokio, put between one sidecar and one backend server
//! (etcd member or redis-server) so a test can cut, reset or slow down exactly
//! the connections of that sidecar while the others keep talking.
//!
//! The sidecar is given [`Proxy::url`] instead of the server's URL. The mode is
//! switched at run time with [`Proxy::set`]; every connection task watches the
//! mode, so a switch takes effect at once on connections that are already open:
//!
//! - [`Mode::Pass`]: bytes are forwarded as they arrive.
//! - [`Mode::Blackhole`]: a network partition. Connections stay open and the
//!   proxy keeps reading both sides, but forwards nothing in either direction;
//!   new connections are accepted and read, never answered, never closed. When
//!   the partition heals, what was read meanwhile is delivered in order, as TCP
//!   retransmission would (so a request sent during the partition may reach the
//!   server late: that is part of the fault).
//! - [`Mode::Reset`]: every open connection is closed with a TCP reset
//!   (SO_LINGER 0), and new connections are accepted and reset at once.
//! - [`Mode::Delay`]: every chunk the *server* sends is delivered `D` after the
//!   proxy read it (requests are not delayed), so each answer comes at least
//!   `D` late; order is kept and delays do not add up.
//!
//! Dropping the [`Proxy`] closes its listener and all its connections.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};

/// What the proxy does with traffic right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything at once.
    Pass,
    /// Forward nothing, close nothing, answer nothing (a partition).
    Blackhole,
    /// Reset every connection, open or new.
    Reset,
    /// Deliver every chunk from the server this long after it was read.
    Delay(Duration),
}

/// A running proxy on a free loopback port.
pub struct Proxy {
    /// The loopback port the proxy listens on.
    pub port: u16,
    /// The server it forwards to.
    pub upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    target: watch::Sender<SocketAddr>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `upstream` (`127.0.0.1:<port>`).
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = timeout(Duration::from_secs(5), TcpListener::bind("127.0.0.1:0"))
            .await
            .expect("binding the proxy's loopback port hung")
            .expect("bind the proxy's loopback port");
        let port = listener.local_addr().unwrap().port();
        let (mode, rx) = watch::channel(Mode::Pass);
        let accepted = Arc::new(AtomicUsize::new(0));
        let (target, target_rx) = watch::channel(upstream);
        let task = tokio::spawn(accept_loop(listener, target_rx, rx, accepted.clone()));
        Proxy {
            port,
            upstream,
            mode,
            target,
            accepted,
            task,
        }
    }

    /// A proxy in front of the server at `url` (`http://127.0.0.1:P` or `redis://127.0.0.1:P`).
    pub async fn to_url(url: &str) -> Proxy {
        Self::start(addr_of(url)).await
    }

    /// `url` with its `host:port` replaced by this proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, _) = url.split_once("://").expect("a URL with a scheme");
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Switch the mode; open connections follow at once.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Send new connections to `upstream` from now on (a failover behind a
    /// fixed address); open connections are reset, as the old server's would be.
    pub async fn redirect(&self, upstream: SocketAddr) {
        let before = self.mode();
        self.target.send_replace(upstream);
        self.set(Mode::Reset);
        // Let every connection task see the reset before traffic flows again.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.set(before);
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the sender ends every connection task (they all watch it).
        self.task.abort();
    }
}

/// `127.0.0.1:P` out of `scheme://127.0.0.1:P[/…]`.
pub fn addr_of(url: &str) -> SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap();
    let hostport = hostport.rsplit('@').next().unwrap();
    hostport
        .parse()
        .unwrap_or_else(|e| panic!("{url}: not a loopback host:port ({e})"))
}

async fn accept_loop(
    listener: TcpListener,
    upstream: watch::Receiver<SocketAddr>,
    mode: watch::Receiver<Mode>,
    accepted: Arc<AtomicUsize>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let _ = client.set_nodelay(true);
        let to = *upstream.borrow();
        tokio::spawn(connection(client, to, mode.clone()));
    }
}

fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Wait for the next mode change; `false` when the proxy is gone.
async fn changed(mode: &mut watch::Receiver<Mode>) -> bool {
    mode.changed().await.is_ok()
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    let mut client = client;
    let Some((held, client_eof)) = hold_until_open(&mut client, &mut mode).await else {
        return;
    };
    let server = match timeout(Duration::from_secs(2), TcpStream::connect(upstream)).await {
        Ok(Ok(s)) => s,
        _ => return reset(&client),
    };
    let _ = server.set_nodelay(true);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let (to_server_tx, to_server_rx) = mpsc::unbounded_channel();
    for chunk in held {
        let _ = to_server_tx.send(Some(chunk));
    }
    if client_eof {
        let _ = to_server_tx.send(None);
    }
    let (to_client_tx, to_client_rx) = mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    if !client_eof {
        tasks.spawn(read_side(client_r, to_server_tx, mode.clone()));
    }
    tasks.spawn(read_side(server_r, to_client_tx, mode.clone()));
    let client_w = Arc::new(tokio::sync::Mutex::new(client_w));
    let server_w = Arc::new(tokio::sync::Mutex::new(server_w));
    tasks.spawn(write_side(
        server_w.clone(),
        to_server_rx,
        mode.clone(),
        false,
    ));
    tasks.spawn(write_side(
        client_w.clone(),
        to_client_rx,
        mode.clone(),
        true,
    ));
    supervise(tasks, mode, &client_w, &server_w).await;
}

/// Until the proxy lets traffic through, read (and keep) what the client
/// sends, answer nothing; the caller connects upstream only when the path is
/// open. Returns the chunks read and whether the client ended its stream, or
/// `None` when the connection is over (reset, or the proxy gone).
async fn hold_until_open(
    client: &mut TcpStream,
    mode: &mut watch::Receiver<Mode>,
) -> Option<(Vec<(Instant, Vec<u8>)>, bool)> {
    let mut held: Vec<(Instant, Vec<u8>)> = Vec::new();
    let mut client_eof = false;
    loop {
        let m = *mode.borrow_and_update();
        match m {
            Mode::Reset => {
                reset(client);
                return None;
            }
            Mode::Pass | Mode::Delay(_) => return Some((held, client_eof)),
            Mode::Blackhole => {
                let mut buf = vec![0u8; 16 * 1024];
                tokio::select! {
                    alive = changed(mode) => if !alive { return None },
                    n = client.read(&mut buf), if !client_eof => match n {
                        Ok(0) => client_eof = true,
                        Ok(n) => { buf.truncate(n); held.push((Instant::now(), buf)); }
                        Err(_) => return None,
                    },
                }
            }
        }
    }
}

/// Until both writers are done (each ends at its reader's end of stream) or
/// the mode turns to Reset, which resets both sides.
async fn supervise(
    mut tasks: tokio::task::JoinSet<Flow>,
    mut mode: watch::Receiver<Mode>,
    client_w: &tokio::sync::Mutex<OwnedWriteHalf>,
    server_w: &tokio::sync::Mutex<OwnedWriteHalf>,
) {
    let mut finished = 0;
    loop {
        tokio::select! {
            alive = changed(&mut mode) => {
                if !alive || *mode.borrow() == Mode::Reset {
                    tasks.abort_all();
                    reset(client_w.lock().await.as_ref());
                    reset(server_w.lock().await.as_ref());
                    return;
                }
            }
            done = tasks.join_next() => match done {
                None => return,
                Some(Ok(Flow::Broken)) => {
                    // One side failed: tear the whole connection down, as a
                    // middlebox would.
                    tasks.abort_all();
                    reset(client_w.lock().await.as_ref());
                    reset(server_w.lock().await.as_ref());
                    return;
                }
                Some(_) => {
                    finished += 1;
                    if finished == 4 {
                        return;
                    }
                }
            },
        }
    }
}

/// How one direction ended.
enum Flow {
    /// End of stream passed on (or the reader finished normally).
    Done,
    /// A read or write failed, or the proxy went away.
    Broken,
}

/// Read one side into `out` until its end of stream (`None` is sent then).
async fn read_side(
    mut r: OwnedReadHalf,
    out: mpsc::UnboundedSender<Option<(Instant, Vec<u8>)>>,
    mut mode: watch::Receiver<Mode>,
) -> Flow {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            alive = changed(&mut mode) => if !alive { return Flow::Broken },
            n = r.read(&mut buf) => match n {
                Ok(0) => { let _ = out.send(None); return Flow::Done }
                Ok(n) => {
                    if out.send(Some((Instant::now(), buf[..n].to_vec()))).is_err() {
                        return Flow::Broken;
                    }
                }
                Err(_) => return Flow::Broken,
            },
        }
    }
}

/// Deliver chunks from `input` to `w` as the mode allows.
async fn write_side(
    w: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    mut input: mpsc::UnboundedReceiver<Option<(Instant, Vec<u8>)>>,
    mut mode: watch::Receiver<Mode>,
    to_client: bool,
) -> Flow {
    while let Some(item) = input.recv().await {
        let Some((read_at, chunk)) = item else {
            let _ = w.lock().await.shutdown().await;
            return Flow::Done;
        };
        loop {
            let m = *mode.borrow_and_update();
            match m {
                Mode::Pass => break,
                Mode::Delay(_) if !to_client => break,
                Mode::Delay(d) => {
                    let due = read_at + d;
                    if Instant::now() >= due {
                        break;
                    }
                    tokio::select! {
                        _ = sleep_until(due) => break,
                        alive = changed(&mut mode) => if !alive { return Flow::Broken },
                    }
                }
                Mode::Blackhole | Mode::Reset => {
                    if !changed(&mut mode).await {
                        return Flow::Broken;
                    }
                }
            }
        }
        if w.lock().await.write_all(&chunk).await.is_err() {
            return Flow::Broken;
        }
    }
    Flow::Done
}
