//! Connections of one server that each carry one write at a time, for
//! `--redis-min-replicas`. `WAIT` blocks the connection it is sent on until
//! the replicas acknowledge or its timeout runs out; on the shared
//! multiplexed connection every other request of the sidecar (the election's
//! renewals, coordination calls, reads) would queue behind it. So a write
//! that must be acknowledged and its `WAIT` borrow a connection of their own.
//!
//! At most [`MAX_LENT`] are lent at once per server (a further writer waits,
//! within its request's deadline); up to [`KEEP_IDLE`] are kept for the next
//! write. A connection whose request failed is dropped, not kept, so a broken
//! one is never lent again.

use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

use super::conn::Conn;

/// Most connections lent at once per server.
pub const MAX_LENT: usize = 16;
/// Most idle connections kept per server.
pub const KEEP_IDLE: usize = 4;

/// The lendable connections of one server.
pub struct Exclusive {
    idle: Mutex<Vec<Conn>>,
    lent: Semaphore,
}

impl Default for Exclusive {
    fn default() -> Self {
        Exclusive {
            idle: Mutex::new(Vec::new()),
            lent: Semaphore::new(MAX_LENT),
        }
    }
}

/// A connection lent for one write; dropped with it unless [`Lent::keep`].
pub struct Lent<'a> {
    /// The connection, used by one request at a time.
    pub conn: Conn,
    home: &'a Exclusive,
    _permit: SemaphorePermit<'a>,
}

impl Exclusive {
    /// An idle connection, or a new one from `open`, once fewer than
    /// [`MAX_LENT`] are lent.
    ///
    /// # Errors
    /// What `open` returns.
    pub async fn lend<E, F>(&self, open: F) -> Result<Lent<'_>, E>
    where
        F: AsyncFnOnce() -> Result<Conn, E>,
    {
        let permit = self.lent.acquire().await.expect("never closed");
        let idle = self.idle.lock().expect("idle lock").pop();
        let conn = match idle {
            Some(c) => c,
            None => open().await?,
        };
        Ok(Lent {
            conn,
            home: self,
            _permit: permit,
        })
    }
}

impl Lent<'_> {
    /// Give the connection back for the next write (its request ended well).
    pub fn keep(self) {
        let mut idle = self.home.idle.lock().expect("idle lock");
        if idle.len() < KEEP_IDLE {
            idle.push(self.conn.clone());
        }
    }
}
