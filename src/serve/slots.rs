//! Connection slots of one tier of a listener (the router's, or the overflow
//! answer's), with the longest-idle connection given up to admit a new one
//! when the tier is full: a kubelet probe must never be refused because
//! idle connections hold every slot.
//!
//! Invariant: at most `cap` connections hold a slot at once. A connection is
//! *idle* from its accept, and again from the end of each response, until the
//! next request reaches the service; only idle connections are ever evicted,
//! so a request in flight (a long-poll, a lock wait) is never cut.
//! Evicting removes the victim's slot at once and cancels its token; its task
//! then drops the connection (closing the socket) at its next poll.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The slots of one tier.
pub struct Slots {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    conns: HashMap<u64, Conn>,
    /// Idle connections by the instant they became idle, oldest first.
    idle: BTreeSet<(Instant, u64)>,
}

struct Conn {
    /// Requests in flight (HTTP/1.1: 0 or 1).
    busy: u32,
    /// When it became idle (meaningful while `busy == 0`).
    idle_since: Instant,
    evict: CancellationToken,
}

/// How a connection got its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A slot was free.
    Free,
    /// The longest-idle connection was closed to make room.
    Evicted,
}

impl Slots {
    /// Slots for at most `cap` connections at once.
    pub fn new(cap: usize) -> Arc<Slots> {
        Arc::new(Slots {
            cap,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent maps behind (every
        // update is a few inserts and removes): keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection: a free one, else the longest-idle
    /// connection's (that connection is told to close); `None` when the tier
    /// is full of connections with a request in flight.
    pub fn admit(self: &Arc<Self>) -> Option<(Slot, Admission)> {
        let mut inner = self.lock();
        let admission = if inner.conns.len() < self.cap {
            Admission::Free
        } else {
            let (_, victim) = inner.idle.pop_first()?;
            if let Some(c) = inner.conns.remove(&victim) {
                c.evict.cancel();
            }
            Admission::Evicted
        };
        let id = inner.next_id;
        inner.next_id += 1;
        let now = Instant::now();
        let evict = CancellationToken::new();
        inner.conns.insert(
            id,
            Conn {
                busy: 0,
                idle_since: now,
                evict: evict.clone(),
            },
        );
        inner.idle.insert((now, id));
        drop(inner);
        let slot = Slot {
            slots: self.clone(),
            id,
            evict,
        };
        Some((slot, admission))
    }

    /// Connections holding a slot now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().conns.len()
    }
}

/// One connection's slot; given back on drop.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    evict: CancellationToken,
}

impl Slot {
    /// Completes when this connection was chosen to make room: drop it.
    pub async fn evicted(&self) {
        self.evict.cancelled().await
    }

    /// Mark a request in flight until the returned guard drops (keep it in
    /// the response body, so the connection counts as busy until the
    /// response is written).
    pub fn busy(&self) -> Busy {
        let mut inner = self.slots.lock();
        if let Some(c) = inner.conns.get_mut(&self.id) {
            if c.busy == 0 {
                let key = (c.idle_since, self.id);
                c.busy = 1;
                inner.idle.remove(&key);
            } else {
                c.busy += 1;
            }
        }
        Busy {
            slots: self.slots.clone(),
            id: self.id,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.slots.lock();
        if let Some(c) = inner.conns.remove(&self.id)
            && c.busy == 0
        {
            inner.idle.remove(&(c.idle_since, self.id));
        }
    }
}

/// A request in flight on a connection; the connection is idle again from
/// the moment the last one drops.
pub struct Busy {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut inner = self.slots.lock();
        let now = Instant::now();
        let Some(c) = inner.conns.get_mut(&self.id) else {
            return;
        };
        c.busy = c.busy.saturating_sub(1);
        if c.busy == 0 {
            c.idle_since = now;
            inner.idle.insert((now, self.id));
        }
    }
}

/// A response body that keeps its connection busy until it is written
/// (hyper drops the body once its last frame is sent).
pub struct BusyBody<B> {
    inner: B,
    _busy: Busy,
}

impl<B> BusyBody<B> {
    /// `inner`, holding `busy` until it is dropped.
    pub fn new(inner: B, busy: Busy) -> Self {
        BusyBody { inner, _busy: busy }
    }
}

impl<B: Body + Unpin> Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_tier_evicts_the_longest_idle_and_never_a_busy_connection() {
        let tick = || tokio::time::advance(std::time::Duration::from_millis(1));
        let slots = Slots::new(3);
        let (a, _) = slots.admit().unwrap();
        tick().await;
        let (b, _) = slots.admit().unwrap();
        tick().await;
        let (c, _) = slots.admit().unwrap();
        // a has a request in flight (a long-poll): b is the longest idle.
        let busy = a.busy();
        tick().await;
        let (d, how) = slots.admit().unwrap();
        assert_eq!(how, Admission::Evicted);
        assert!(b.evict.is_cancelled() && !a.evict.is_cancelled());
        drop(b);
        assert_eq!(slots.len(), 3, "an evicted slot is not counted twice");
        tick().await;
        let (e, _) = slots.admit().unwrap();
        assert!(c.evict.is_cancelled() && !a.evict.is_cancelled());
        tick().await;
        let (_f, _) = slots.admit().unwrap();
        assert!(d.evict.is_cancelled() && !a.evict.is_cancelled());
        // a's request ends: it is idle from now, newer than e.
        tick().await;
        drop(busy);
        let (_g, _) = slots.admit().unwrap();
        assert!(e.evict.is_cancelled() && !a.evict.is_cancelled());
        assert_eq!(slots.len(), 3);
    }

    #[tokio::test]
    async fn a_tier_full_of_busy_connections_admits_nobody() {
        let slots = Slots::new(2);
        let (a, _) = slots.admit().unwrap();
        let (b, _) = slots.admit().unwrap();
        let _x = a.busy();
        let y = b.busy();
        assert!(slots.admit().is_none());
        drop(y);
        assert_eq!(slots.admit().map(|s| s.1), Some(Admission::Evicted));
    }
}
