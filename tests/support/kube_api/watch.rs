//! Watches: a replay of the kept history (or the current state), then live
//! changes, bookmarks, timeouts, and the faults of the watching client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::Endpoint;
use std::sync::atomic::Ordering;

use super::store::{Change, Resource, Selector, Store};

/// A watch of `r` through `sel` (the query's selectors), from the
/// query's `resourceVersion`.
pub async fn watch(
    ep: Arc<Endpoint>,
    r: Resource,
    sel: Selector,
    q: HashMap<String, String>,
) -> Response {
    let shared = ep.shared.clone();
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let from: Option<u64> = q
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
        .and_then(|v| v.parse().ok());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(256);
    // Under the lock: replay and subscribe, so no change falls in between.
    let (initial, live, start_rv) = {
        let s = shared.store.lock().unwrap();
        let live = shared.changes.subscribe();
        (replay(&s, from, &sel), live, s.rv)
    };
    let every = *shared.bookmark_every.lock().unwrap();
    let resets = ep.resets.subscribe();
    let feed = WatchFeed {
        resets,
        ep,
        tx,
        live,
        sel,
        resource: r,
        last_rv: start_rv,
        bookmarks,
        every,
        timeout,
    };
    feed.ep.open_watches.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let ep = feed.ep.clone();
        feed.run(initial).await;
        ep.open_watches.fetch_sub(1, Ordering::SeqCst);
    });
    let stream = tokio_stream_from(rx);
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// The events a watch from version `from` starts with: an `ERROR` 410 when
/// `from` is older than the kept history, the changes after it, or (no
/// version) synthetic `ADDED` events of the current state.
fn replay(s: &Store, from: Option<u64>, sel: &Selector) -> Vec<Value> {
    let mut initial = Vec::new();
    match from {
        Some(v) if v < s.compacted => {
            initial.push(json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {v} ({})", s.compacted + 1),
                "reason": "Expired", "code": 410}}));
        }
        Some(v) => {
            for c in s
                .history
                .iter()
                .filter(|c| c.rv > v && sel.matches(c.resource, &c.object))
            {
                initial.push(json!({"type": c.kind, "object": c.object}));
            }
        }
        None => {
            for ((p, _, _), o) in &s.objects {
                if sel.matches(p, o) {
                    initial.push(json!({"type": "ADDED", "object": o}));
                }
            }
        }
    }
    initial
}

/// The task that feeds one open watch's stream.
struct WatchFeed {
    ep: Arc<Endpoint>,
    /// Changes when the test resets this client's watches.
    resets: tokio::sync::watch::Receiver<u64>,
    tx: tokio::sync::mpsc::Sender<Result<String, std::io::Error>>,
    live: broadcast::Receiver<Change>,
    sel: Selector,
    resource: Resource,
    /// The newest version seen (what a BOOKMARK carries).
    last_rv: u64,
    bookmarks: bool,
    every: Duration,
    timeout: Duration,
}

impl WatchFeed {
    /// Send the `initial` events, then live changes and bookmarks until the
    /// timeout, the client's leaving, or a lag (the client then re-watches).
    async fn run(mut self, initial: Vec<Value>) {
        let expired = initial.first().is_some_and(|e| e["type"] == json!("ERROR"));
        for e in initial {
            if self.tx.send(Ok(format!("{e}\n"))).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let end = tokio::time::Instant::now() + self.timeout;
        let mut tick = tokio::time::interval(self.every);
        tick.tick().await;
        loop {
            let delivered = tokio::select! {
                _ = tokio::time::sleep_until(end) => return,
                _ = self.tx.closed() => return,
                _ = self.resets.changed() => {
                    // An error in the body aborts the connection mid-stream.
                    let _ = self.tx.send(Err(std::io::Error::other("connection reset"))).await;
                    return;
                }
                _ = tick.tick(), if self.bookmarks => self.bookmark().await,
                c = self.live.recv() => match c {
                    Ok(c) => self.deliver(c).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            };
            if !delivered {
                return;
            }
        }
    }

    /// Send a BOOKMARK at the newest version seen (none while the client is
    /// blackholed); false when the client has gone.
    async fn bookmark(&self) -> bool {
        if self.ep.effective().hang {
            return true;
        }
        let b = json!({"type": "BOOKMARK", "object": {"kind": self.resource.kind, "apiVersion": self.resource.api_version(),
            "metadata": {"resourceVersion": self.last_rv.to_string()}}});
        self.tx.send(Ok(format!("{b}\n"))).await.is_ok()
    }

    /// Send one change if the watch selects it; false when the client has
    /// gone.
    async fn deliver(&mut self, c: Change) -> bool {
        self.last_rv = self.last_rv.max(c.rv);
        if !self.sel.matches(c.resource, &c.object) {
            return true;
        }
        let lag = self.ep.effective().event_latency;
        if !lag.is_zero() {
            tokio::time::sleep(lag).await;
        }
        // A blackholed client gets nothing until it heals.
        while self.ep.effective().hang {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.tx.is_closed() {
                return false;
            }
        }
        let e = json!({"type": c.kind, "object": c.object});
        self.tx.send(Ok(format!("{e}\n"))).await.is_ok()
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<String, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
