//! One watch of a lock's queue per sidecar, shared by all its waiters on
//! that lock. A watch of the queue's prefix per waiter would make every
//! release send one event to every waiter over its own gRPC stream, and
//! every acquisition open and close a stream: with 20 waiters, most of
//! etcd's work per handoff. Shared, etcd sends each
//! delete once per sidecar; whichever waiter holds the stream reads it and
//! passes the deletes on in process ([`Hub::next`]). No task is spawned:
//! the stream lives while a waiter holds the hub, and goes with the last.
//!
//! Completeness: a waiter subscribes before it makes sure the watch is
//! created, and joins the queue only after that, so every delete after its
//! join read reaches it, or it is told [`Seen::Ended`] and looks again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream};
use tokio::sync::broadcast;

use super::EtcdCoord;
use crate::backend::BackendError;
use crate::backend::coordination::{CoordError, Result};

/// Deletes a waiter may fall behind by before it is told to look again.
const BACKLOG: usize = 4096;

/// What a waiter learns from its hub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// This key under the prefix was deleted.
    Deleted(Vec<u8>),
    /// The watch ended or this waiter fell behind: deletes may have been
    /// missed, so it must look at the queue itself.
    Ended,
}

/// The hubs of one coordinator, by prefix; a hub lives while a waiter holds it.
#[derive(Default)]
pub(super) struct Hubs(Mutex<HashMap<String, Weak<Hub>>>);

impl Hubs {
    /// The hub of `prefix`, made when no waiter holds one.
    pub(super) fn of(&self, prefix: &str) -> Arc<Hub> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hub) = map.get(prefix).and_then(Weak::upgrade) {
            return hub;
        }
        map.retain(|_, hub| hub.strong_count() > 0);
        let hub = Arc::new(Hub {
            prefix: prefix.to_owned(),
            opening: tokio::sync::Mutex::new(()),
            live: AtomicBool::new(false),
            stream: tokio::sync::Mutex::new(None),
            events: broadcast::channel(BACKLOG).0,
        });
        map.insert(prefix.to_owned(), Arc::downgrade(&hub));
        hub
    }
}

/// One shared watch of the deletes under a prefix.
pub(super) struct Hub {
    prefix: String,
    /// Held while the watch is being created (one creation at a time).
    opening: tokio::sync::Mutex<()>,
    /// Whether `stream` holds a created watch. Changed only under the
    /// `stream` lock; read without it, since a reader may hold that lock
    /// for as long as the queue is quiet.
    live: AtomicBool,
    /// The watch (`None` before it is created and after it ended); the
    /// waiter holding this lock reads it for everyone.
    stream: tokio::sync::Mutex<Option<WatchStream>>,
    events: broadcast::Sender<Seen>,
}

/// One waiter's view of a hub: what it has been sent since it subscribed.
pub(super) struct Subscription {
    hub: Arc<Hub>,
    rx: broadcast::Receiver<Seen>,
}

impl Hub {
    /// Subscribe, then make sure the watch is created (it is then certain
    /// to report every delete that comes after this call returns).
    ///
    /// # Errors
    /// The watch could not be created: etcd's error, under the deadline.
    pub(super) async fn subscribe(
        self: Arc<Self>,
        coord: &EtcdCoord,
        client: &Client,
    ) -> Result<Subscription> {
        let rx = self.events.subscribe();
        if !self.live.load(Ordering::SeqCst) {
            let _opening = self.opening.lock().await;
            if !self.live.load(Ordering::SeqCst) {
                let w = coord.deletes_under(client, &self.prefix).await?;
                // Nobody reads while the watch is not live, so this lock
                // is free at once.
                *self.stream.lock().await = Some(w);
                self.live.store(true, Ordering::SeqCst);
            }
        }
        Ok(Subscription { hub: self, rx })
    }
}

impl Subscription {
    /// The next thing seen under the prefix: read from the hub's stream when
    /// nobody else is reading it, else from whoever is.
    pub(super) async fn next(&mut self, coord: &EtcdCoord) -> Seen {
        loop {
            tokio::select! {
                biased;
                seen = self.rx.recv() => {
                    return seen.unwrap_or(Seen::Ended);
                }
                mut stream = self.hub.stream.lock() => {
                    // Read one message for everyone; its deletes come back
                    // to us through `rx` like to every other waiter.
                    if !self.hub.read_one(&mut stream, coord).await {
                        return Seen::Ended;
                    }
                }
            }
        }
    }
}

impl Hub {
    /// Read one message of the watch and pass its deletes on; `false` when
    /// the watch is gone (then every waiter is told [`Seen::Ended`]).
    async fn read_one(&self, stream: &mut Option<WatchStream>, coord: &EtcdCoord) -> bool {
        let Some(w) = stream.as_mut() else {
            return false;
        };
        let msg = match w.message().await {
            Ok(Some(msg)) if !msg.canceled() => msg,
            other => {
                if let Err(e) = other {
                    tracing::debug!(prefix = %self.prefix, error = %coord.store_err(e), "the shared watch of a lock's queue ended");
                }
                *stream = None;
                self.live.store(false, Ordering::SeqCst);
                let _ = self.events.send(Seen::Ended);
                return false;
            }
        };
        for e in msg.events() {
            if e.event_type() == EventType::Delete
                && let Some(kv) = e.kv()
            {
                let _ = self.events.send(Seen::Deleted(kv.key().to_vec()));
            }
        }
        true
    }
}

impl EtcdCoord {
    /// A watch of the deletes under `prefix` (puts filtered out, so waiters
    /// joining wake nobody), created: its events are those after now.
    pub(super) async fn deletes_under(&self, client: &Client, prefix: &str) -> Result<WatchStream> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let mut w = self
            .call("watch", client.clone().watch(prefix, Some(opts)))
            .await?;
        match self.call("watch", w.message()).await? {
            Some(m) if m.created() && !m.canceled() => Ok(w),
            _ => Err(CoordError::Backend(BackendError::WatchEnded {
                backend: crate::backend::etcd::store::BACKEND,
                reason: "the watch of the lock's queue was not created".into(),
            })),
        }
    }
}
