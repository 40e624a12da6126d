//! Waiting for a change of a lock or semaphore on one Redis server: the
//! release scripts `PUBLISH` on the key's own channel; one pattern
//! subscription per sidecar is read by whichever waiter holds it (and
//! dropped when nobody waits), or the holder's expiry comes first; at most
//! [`MAX_NAP`] passes without a look.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSub;
use tokio::sync::{Mutex, MutexGuard, Notify};
use tokio::time::Instant;

use crate::backend::coordination::{CoordError, Kind, Result};
use crate::backend::redis::lua::Lua;
use crate::backend::redis::server::Server;

/// Longest a Redis waiter sleeps without looking (covers a notice lost while
/// the subscription was being set up).
pub const MAX_NAP: Duration = Duration::from_secs(1);
/// Longest nap once the subscription is known to be active.
pub const MAX_NAP_SUBSCRIBED: Duration = Duration::from_secs(30);

/// The waiters of one sidecar on one server.
#[derive(Default)]
pub struct Waiters {
    /// The pattern subscription; its holder reads and dispatches notices.
    pubsub: Mutex<Option<PubSub>>,
    /// Waiters per channel (= key).
    notices: std::sync::Mutex<HashMap<String, Arc<Notify>>>,
    /// Waiters in [`Waiters::changed`] now.
    waiting: AtomicUsize,
    /// Whether the pattern subscription is confirmed and open.
    subscribed: AtomicBool,
}

/// Leaves the count of waiters on drop.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The pattern matching every lock and semaphore channel (glob-escaped prefix).
fn pattern(prefix: &str) -> String {
    let mut p = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push_str("{*");
    p
}

/// Milliseconds from the local clock's now until the server-clock instant
/// `at` (ms since the Unix epoch), at least 1.
fn until_ms(at: f64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as f64;
    Duration::from_millis((at - now).max(1.0) as u64)
}

/// When the next change of read-write lock `base` is due without a notice:
/// the first expiry of its writer, intent or readers; `None` when none is
/// there (it changed already).
async fn rw_due(server: &Server, base: &str) -> Result<Option<Duration>> {
    let (writer, intent, next): (i64, i64, Vec<(String, f64)>) = server
        .query(
            "read",
            redis::pipe()
                .cmd("PTTL")
                .arg(base)
                .cmd("PTTL")
                .arg(format!("{base}:intent"))
                .cmd("ZRANGE")
                .arg(format!("{base}:readers"))
                .arg(0)
                .arg(0)
                .arg("WITHSCORES"),
        )
        .await?;
    let ms = |pttl: i64| (pttl > 0).then(|| Duration::from_millis(pttl as u64));
    let reader = next.first().map(|(_, at)| until_ms(*at));
    Ok([ms(writer), ms(intent), reader].into_iter().flatten().min())
}

/// When the next change of `key` is due without a notice: `None` when it
/// changed already (fewer than `seen` holders), else the next expiry.
async fn due(server: &Server, kind: Kind, key: &str, seen: u64) -> Result<Option<Duration>> {
    match kind {
        // A read-write lock: its writer, intent and readers.
        Kind::RwLock => rw_due(server, key).await,
        // Nobody waits on a job claim: look again at once.
        Kind::Job => Ok(None),
        Kind::Lock => {
            let (pttl,): (i64,) = server
                .query("read", redis::pipe().cmd("PTTL").arg(key))
                .await?;
            Ok((pttl > 0).then(|| Duration::from_millis(pttl as u64)))
        }
        Kind::Semaphore => {
            // One round trip: the live count and the next expiry.
            let (live, next): (u64, Vec<(String, f64)>) = server
                .query(
                    "read",
                    redis::pipe()
                        .cmd("EVAL")
                        .arg(Lua::SemLive.source())
                        .arg(1)
                        .arg(key)
                        .cmd("ZRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(0)
                        .arg("WITHSCORES"),
                )
                .await?;
            if live < seen {
                return Ok(None);
            }
            Ok(Some(next.first().map_or(MAX_NAP, |(_, at)| until_ms(*at))))
        }
    }
}

impl Waiters {
    fn notice(&self, channel: &str) -> Arc<Notify> {
        let mut n = self.notices.lock().unwrap_or_else(|e| e.into_inner());
        if n.len() > 10_000 {
            n.retain(|_, v| Arc::strong_count(v) > 1);
        }
        n.entry(channel.to_owned())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    fn dispatch(&self, channel: &str) {
        let n = self
            .notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(channel)
            .cloned();
        if let Some(n) = n {
            n.notify_one();
        }
    }

    /// Subscribe to the pattern when nobody did (the guard, if we hold it).
    async fn subscribe(
        &self,
        server: &Server,
        prefix: &str,
    ) -> Result<Option<MutexGuard<'_, Option<PubSub>>>> {
        let mut reader = self.pubsub.try_lock().ok();
        if let Some(guard) = reader.as_mut()
            && guard.is_none()
        {
            let mut ps = server.pubsub().await?;
            match tokio::time::timeout(server.timeout(), ps.psubscribe(&pattern(prefix))).await {
                Ok(Ok(())) => {
                    **guard = Some(ps);
                    self.subscribed.store(true, Ordering::SeqCst);
                }
                Ok(Err(e)) => return Err(CoordError::Backend(server.classify(e))),
                Err(_) => {}
            }
        }
        Ok(reader)
    }

    /// Read notices as the subscription's holder until ours comes, `wake`,
    /// or the connection breaks; close it when nobody else waits.
    async fn read(
        &self,
        mut guard: MutexGuard<'_, Option<PubSub>>,
        notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        wake: Instant,
    ) {
        let mut notified = notified;
        let Some(ps) = guard.as_mut() else {
            // No subscription (it failed): wait for the expiry.
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
            return;
        };
        let mut broken = false;
        {
            let mut stream = ps.on_message();
            loop {
                tokio::select! {
                    biased;
                    _ = &mut notified => break,
                    _ = tokio::time::sleep_until(wake) => break,
                    msg = stream.next() => match msg {
                        Some(m) => self.dispatch(m.get_channel_name()),
                        None => { broken = true; break; }
                    },
                }
            }
        }
        if broken || self.waiting.load(Ordering::SeqCst) <= 1 {
            self.subscribed.store(false, Ordering::SeqCst);
            *guard = None;
        }
    }

    /// Wait until `key` may have changed or until `until` (see the module docs).
    ///
    /// # Errors
    /// A [`CoordError::Backend`] when the server cannot be asked.
    pub async fn changed(
        &self,
        server: &Server,
        prefix: &str,
        kind: Kind,
        key: &str,
        seen: u64,
        until: Instant,
    ) -> Result<()> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _leave = Leave(&self.waiting);
        let notice = self.notice(key);
        let notified = notice.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Subscribe first (when nobody did), then look: a release after the
        // look is a notice, one before it shows in the look. Unless the
        // subscription was confirmed before the look, nap at most MAX_NAP.
        let sure = self.subscribed.load(Ordering::SeqCst);
        let mut reader = self.subscribe(server, prefix).await?;
        let Some(due) = due(server, kind, key, seen).await? else {
            return Ok(());
        };
        let sure = sure || reader.as_ref().is_some_and(|g| g.is_some());
        let nap = if sure { MAX_NAP_SUBSCRIBED } else { MAX_NAP };
        let wake = until.min(Instant::now() + due.min(nap));
        loop {
            if let Some(guard) = reader.take() {
                self.read(guard, notified.as_mut(), wake).await;
                return Ok(());
            }
            tokio::select! {
                _ = &mut notified => return Ok(()),
                _ = tokio::time::sleep_until(wake) => return Ok(()),
                guard = self.pubsub.lock() => {
                    if guard.is_none() {
                        // The reader left and closed it: look again.
                        return Ok(());
                    }
                    reader = Some(guard);
                }
            }
        }
    }
}
