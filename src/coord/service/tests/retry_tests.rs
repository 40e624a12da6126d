//! The rule of every request that waits (`through_hold_off`): transient
//! backend errors are retried within the `wait`, per request kind.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{lock, rw_lock};
use crate::backend::BackendError;
use crate::coord::{
    Acquire, CoordError, Coordinator, Grant, Object, Outcome, Result, RwMode, Service, Token,
    TokenKind, Try,
};

/// A backend that answers its first `fails` acquisitions with `error()`,
/// then grants whatever is asked; it records the `wait` each fair
/// acquisition was given. `queues`: it queues fair locks (as etcd does).
struct Flaky {
    fails: Mutex<u32>,
    error: fn() -> BackendError,
    queues: bool,
    calls: Mutex<u32>,
}

/// A transient error: a broken connection.
fn unreachable() -> BackendError {
    BackendError::Unreachable {
        backend: crate::backend::memory::ABOUT,
        endpoints: "the server".into(),
        source: "connection reset".into(),
    }
}

/// An error no retry mends: refused credentials.
fn refused() -> BackendError {
    BackendError::Auth {
        backend: crate::backend::memory::ABOUT,
        source: "permission denied".into(),
    }
}

#[async_trait]
impl Coordinator for Arc<Flaky> {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn queues(&self) -> bool {
        self.queues
    }
    async fn acquire(&self, what: Acquire<'_>, _: &str, ttl: Duration) -> Result<Try> {
        *self.calls.lock().unwrap() += 1;
        {
            let mut fails = self.fails.lock().unwrap();
            if *fails > 0 {
                *fails -= 1;
                return Err(CoordError::Backend((self.error)()));
            }
        }
        Ok(Try::Acquired(Grant {
            name: what.object().name().into(),
            token: Token::new(TokenKind::Lock, 0).to_string(),
            fencing_token: 1,
            ttl_ms: ttl.as_millis() as u64,
        }))
    }
    async fn renew(&self, _: Object<'_>, _: &str, _: Duration) -> Result<Outcome> {
        Ok(Outcome::Gone)
    }
    async fn release(&self, _: Object<'_>, _: &str) -> Result<Outcome> {
        Ok(Outcome::Gone)
    }
    async fn complete(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Outcome> {
        Err(CoordError::Unsupported("no".into()))
    }
}

/// A service over a [`Flaky`] backend, and the backend.
fn flaky(fails: u32, error: fn() -> BackendError, queues: bool) -> (Service, Arc<Flaky>) {
    let f = Arc::new(Flaky {
        fails: Mutex::new(fails),
        error,
        queues,
        calls: Mutex::new(0),
    });
    (Service::new(Box::new(f.clone()), None, "me".into()), f)
}

/// The rule of every request that waits, for `what` on a backend that
/// queues fair locks or not: five transient errors (pauses 50, 100, 200,
/// 400, 800 ms) and then a grant are granted after 1.55 s of a 5 s wait;
/// an error no retry mends is the answer at once, wait or not; with a
/// 1 s wait the pauses outlast it and the error is the answer, within it.
async fn waits_through_transient_errors(what: Acquire<'_>, queues: bool) {
    let ttl = Duration::from_secs(30);
    let (s, f) = flaky(5, unreachable, queues);
    let start = Instant::now();
    let r = s.acquire(what, "a", ttl, Duration::from_secs(5)).await;
    assert!(matches!(r, Ok(Try::Acquired(_))), "{what:?}: {r:?}");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1550) && took < Duration::from_millis(1600),
        "{what:?}: granted after {took:?}"
    );
    assert_eq!(*f.calls.lock().unwrap(), 6, "{what:?}");

    let (s, f) = flaky(1, refused, queues);
    let start = Instant::now();
    let r = s.acquire(what, "a", ttl, Duration::from_secs(5)).await;
    assert!(
        matches!(r, Err(CoordError::Backend(BackendError::Auth { .. }))),
        "{what:?}: {r:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "{what:?}: retried");
    assert_eq!(*f.calls.lock().unwrap(), 1, "{what:?}");

    let (s, f) = flaky(5, unreachable, queues);
    let start = Instant::now();
    let r = s.acquire(what, "a", ttl, Duration::from_secs(1)).await;
    assert!(
        matches!(
            r,
            Err(CoordError::Backend(BackendError::Unreachable { .. }))
        ),
        "{what:?}: {r:?}"
    );
    assert!(
        start.elapsed() <= Duration::from_secs(1),
        "{what:?}: answered after {:?}, past its wait",
        start.elapsed()
    );
    assert_eq!(
        *f.calls.lock().unwrap(),
        5,
        "{what:?}: retried until 750 ms"
    );
}

/// A plain lock on a backend without a queue (Redis, Leases) retries
/// within its wait.
#[tokio::test(start_paused = true)]
async fn a_waiting_lock_retries_transient_errors_within_its_budget() {
    waits_through_transient_errors(lock("L"), false).await;
}

/// A fair lock (and a plain lock that may wait, on a backend that queues:
/// etcd) answers its first transient error, wait or not: a retry would
/// queue behind its own entry, which an outage may leave until its TTL.
#[tokio::test(start_paused = true)]
async fn a_waiting_fair_lock_answers_its_first_transient_error() {
    let wait = Duration::from_secs(5);
    let fair = Acquire::FairLock { name: "L", wait };
    for what in [fair, lock("L")] {
        let (s, f) = flaky(1, unreachable, true);
        let start = Instant::now();
        let r = s.acquire(what, "a", Duration::from_secs(30), wait).await;
        assert!(
            matches!(
                r,
                Err(CoordError::Backend(BackendError::Unreachable { .. }))
            ),
            "{what:?}: {r:?}"
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "{what:?}: retried");
        assert_eq!(*f.calls.lock().unwrap(), 1, "{what:?}");
    }
}

/// A semaphore permit retries within its wait.
#[tokio::test(start_paused = true)]
async fn a_waiting_semaphore_retries_transient_errors_within_its_budget() {
    let sem = Acquire::Semaphore {
        name: "S",
        permits: 2,
    };
    waits_through_transient_errors(sem, false).await;
}

/// A reader and a writer of a read-write lock retry within their wait.
#[tokio::test(start_paused = true)]
async fn a_waiting_read_write_lock_retries_transient_errors_within_its_budget() {
    for mode in [RwMode::Read, RwMode::Write] {
        waits_through_transient_errors(rw_lock("D", mode), false).await;
    }
}
