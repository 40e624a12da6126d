//! Unit tests of the coordination service.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::backend::BackendError;
use crate::coord::{RwMode, Token, TokenKind, WriteIntent, check_owner};

/// One lock in memory; `changed` never reports anything, so only a
/// release through the [`Service`] can wake a waiter.
#[derive(Default)]
struct OneLock(Mutex<Option<String>>);

#[async_trait]
impl Coordinator for OneLock {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn acquire(&self, what: Acquire<'_>, _: &str, ttl: Duration) -> Result<Try> {
        let name = match what {
            Acquire::Lock(name) => name,
            Acquire::RwLock { .. } => return Err(self.unserved("read-write locks")),
            _ => return Err(CoordError::Unsupported("no".into())),
        };
        let mut held = self.0.lock().unwrap();
        if held.is_some() {
            return Ok(Try::Held("someone".into()));
        }
        let token = Token::new(TokenKind::Lock, 0).to_string();
        *held = Some(token.clone());
        Ok(Try::Acquired(Grant {
            name: name.into(),
            token,
            fencing_token: 1,
            ttl_ms: ttl.as_millis() as u64,
        }))
    }
    async fn changed(&self, _: Object<'_>, _: u64, until: Instant) -> Result<()> {
        tokio::time::sleep_until(until).await;
        Ok(())
    }
    async fn renew(&self, object: Object<'_>, _: &str, _: Duration) -> Result<Outcome> {
        match object {
            Object::Job { .. } => Err(self.unserved("renewing job claims")),
            _ => Ok(Outcome::Gone),
        }
    }
    async fn release(&self, _: Object<'_>, token: &str) -> Result<Outcome> {
        let mut held = self.0.lock().unwrap();
        if held.as_deref() == Some(token) {
            *held = None;
            return Ok(Outcome::Ok(None));
        }
        Ok(Outcome::Gone)
    }
    async fn complete(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Outcome> {
        Err(CoordError::Unsupported("no".into()))
    }
}

/// An acquisition of lock `name`, once or waiting.
fn lock(name: &str) -> Acquire<'_> {
    Acquire::Lock(name)
}

fn service(cap: usize) -> Arc<Service> {
    Arc::new(Service::new(Box::new(OneLock::default()), None, "me".into()).with_max_waiters(cap))
}

fn token(t: Try) -> String {
    match t {
        Try::Acquired(g) => g.token,
        other => panic!("not granted: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_beyond_the_cap_are_refused_and_those_within_it_are_served() {
    let s = service(2);
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(60);
    let mut holder = token(
        s.acquire(lock("l"), "me", ttl, Duration::ZERO)
            .await
            .unwrap(),
    );
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let s = s.clone();
        waiters.push(tokio::spawn(async move {
            s.acquire(lock("l"), "w", ttl, wait).await
        }));
    }
    while s.waiting() < 2 {
        tokio::task::yield_now().await;
    }
    // The third waiter is refused at once, with the cap in the message.
    match s.acquire(lock("l"), "w3", ttl, wait).await {
        Err(e @ CoordError::TooManyWaiters { cap: 2, .. }) => {
            assert!(e.to_string().contains("cap is 2"), "{e}")
        }
        other => panic!("expected TooManyWaiters, got {other:?}"),
    }
    // Liveness twin: both waiters within the cap are granted, one per
    // release, woken by the release itself (the backend never reports).
    let started = Instant::now();
    for _ in 0..2 {
        assert_eq!(
            s.release(Object::Lock("l"), &holder).await.unwrap(),
            Outcome::Ok(None)
        );
        let mut next = None;
        while next.is_none() {
            tokio::task::yield_now().await;
            for w in waiters.iter_mut() {
                if w.is_finished() {
                    next = Some(token(w.await.unwrap().unwrap()));
                    break;
                }
            }
            waiters.retain(|w| !w.is_finished());
        }
        holder = next.unwrap();
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a waiter slept instead of being woken"
    );
    assert_eq!(s.waiting(), 0);
    // A repeated release says so.
    s.release(Object::Lock("l"), &holder).await.unwrap();
    assert_eq!(
        s.release(Object::Lock("l"), &holder).await.unwrap(),
        Outcome::AlreadyReleased
    );
}

#[test]
fn owners_with_control_characters_are_refused() {
    assert!(check_owner("worker-1").is_ok());
    for bad in ["", "a|b", "a\nb", "a\u{7f}b", &"x".repeat(254)] {
        assert!(check_owner(bad).is_err(), "{bad:?}");
    }
}

/// A read-write lock `name` in `mode` (the service adds the intent).
fn rw_lock(name: &str, mode: RwMode) -> Acquire<'_> {
    Acquire::RwLock {
        name,
        mode,
        intent: None,
    }
}

/// A backend without read-write locks answers their verbs with
/// `Unsupported` (HTTP 400) naming itself ([`Coordinator::unserved`]).
#[tokio::test]
async fn a_backend_without_read_write_locks_answers_unsupported() {
    let s = service(1);
    let ttl = Duration::from_secs(30);
    match s
        .acquire(rw_lock("d", RwMode::Read), "me", ttl, Duration::ZERO)
        .await
    {
        Err(CoordError::Unsupported(m)) => assert!(m.contains("memory"), "{m}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(matches!(
        s.renew(
            Object::Job {
                queue: "q",
                job: "j"
            },
            "t",
            ttl
        )
        .await,
        Err(CoordError::Unsupported(_))
    ));
}

/// One read-write lock in memory: readers, a writer, one intent; it keeps
/// the intents it was sent and the ones given up.
#[derive(Default)]
struct OneRw {
    state: Mutex<(u32, bool, Option<String>)>,
    sent: Mutex<Vec<WriteIntent>>,
    given_up: Mutex<Vec<String>>,
}

#[async_trait]
impl Coordinator for OneRw {
    fn backend(&self) -> &'static str {
        "memory"
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
    async fn acquire(&self, what: Acquire<'_>, _: &str, ttl: Duration) -> Result<Try> {
        let Acquire::RwLock { name, mode, intent } = what else {
            return Err(CoordError::Unsupported("no".into()));
        };
        let mut st = self.state.lock().unwrap();
        if let Some(i) = intent {
            self.sent.lock().unwrap().push(i.clone());
        }
        let (readers, writer, pending) = &mut *st;
        let free = match mode {
            RwMode::Read => !*writer && pending.is_none(),
            RwMode::Write => !*writer && *readers == 0,
        };
        if !free {
            if let (RwMode::Write, None, Some(i)) = (mode, &pending, intent) {
                *pending = Some(i.id.clone());
            }
            return Ok(Try::Held("someone".into()));
        }
        match mode {
            RwMode::Read => *readers += 1,
            RwMode::Write => *writer = true,
        }
        Ok(Try::Acquired(Grant {
            name: name.into(),
            token: Token::new(TokenKind::Reader, 0).to_string(),
            fencing_token: 1,
            ttl_ms: ttl.as_millis() as u64,
        }))
    }
    async fn give_up(&self, _: &str, id: &str) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.2.as_deref() == Some(id) {
            st.2 = None;
        }
        self.given_up.lock().unwrap().push(id.to_owned());
        Ok(())
    }
}

/// A writer that waits sends one intent id on every attempt, with a TTL of
/// at most the wait left plus a second, and gives it up when its wait ends
/// unserved: a reader kept out meanwhile enters right after. Liveness
/// twin: a writer with nothing held is granted at once and gives nothing up.
#[tokio::test(start_paused = true)]
async fn a_writer_that_waits_sends_one_intent_and_gives_it_up_when_unserved() {
    let rw = Arc::new(OneRw::default());
    let s = Service::new(Box::new(ArcRw(rw.clone())), None, "me".into());
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(2);
    assert!(matches!(
        s.acquire(rw_lock("d", RwMode::Read), "r", ttl, Duration::ZERO)
            .await,
        Ok(Try::Acquired(_))
    ));
    let w = s
        .acquire(rw_lock("d", RwMode::Write), "w", ttl, wait)
        .await
        .unwrap();
    assert_eq!(w, Try::Held("someone".into()));
    let sent = rw.sent.lock().unwrap().clone();
    assert!(sent.len() >= 2, "retried within its wait: {sent:?}");
    assert!(sent.iter().all(|i| i.id == sent[0].id), "{sent:?}");
    assert!(sent.iter().all(|i| i.ttl <= wait + Duration::from_secs(1)));
    assert_eq!(*rw.given_up.lock().unwrap(), vec![sent[0].id.clone()]);
    assert!(matches!(
        s.acquire(rw_lock("d", RwMode::Read), "r2", ttl, Duration::ZERO)
            .await,
        Ok(Try::Acquired(_))
    ));
    let other = Arc::new(OneRw::default());
    let s = Service::new(Box::new(ArcRw(other.clone())), None, "me".into());
    let w = s
        .acquire(rw_lock("d", RwMode::Write), "w", ttl, wait)
        .await
        .unwrap();
    assert!(matches!(w, Try::Acquired(_)), "{w:?}");
    assert!(other.given_up.lock().unwrap().is_empty());
}

/// [`OneRw`] shared with the test.
struct ArcRw(Arc<OneRw>);

#[async_trait]
impl Coordinator for ArcRw {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn acquire(&self, what: Acquire<'_>, o: &str, t: Duration) -> Result<Try> {
        self.0.acquire(what, o, t).await
    }
    async fn renew(&self, object: Object<'_>, t: &str, d: Duration) -> Result<Outcome> {
        self.0.renew(object, t, d).await
    }
    async fn release(&self, object: Object<'_>, t: &str) -> Result<Outcome> {
        self.0.release(object, t).await
    }
    async fn complete(&self, q: &str, j: &str, t: &str, r: Duration) -> Result<Outcome> {
        self.0.complete(q, j, t, r).await
    }
    async fn give_up(&self, n: &str, id: &str) -> Result<()> {
        self.0.give_up(n, id).await
    }
}

/// A lock whose backend holds grants off until `until` (a promoted Redis
/// primary), then grants.
struct HeldOff(Instant);

#[async_trait]
impl Coordinator for HeldOff {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn acquire(&self, what: Acquire<'_>, owner: &str, ttl: Duration) -> Result<Try> {
        let now = Instant::now();
        if now < self.0 {
            return Err(CoordError::HoldOff {
                retry_after: self.0 - now,
            });
        }
        OneLock::default().acquire(what, owner, ttl).await
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

/// A request that may wait past a promotion hold-off is granted once it
/// ends; one that may not gets the hold-off (503 with Retry-After).
#[tokio::test(start_paused = true)]
async fn a_promotion_hold_off_is_waited_out_within_the_wait_and_answered_beyond_it() {
    let start = Instant::now();
    let until = start + Duration::from_secs(5);
    let s = Service::new(Box::new(HeldOff(until)), None, "me".into());
    let ttl = Duration::from_secs(30);
    let short = s.acquire(lock("L"), "a", ttl, Duration::from_secs(1)).await;
    assert!(
        matches!(short, Err(CoordError::HoldOff { .. })),
        "{short:?}"
    );
    let long = s
        .acquire(lock("L"), "a", ttl, Duration::from_secs(10))
        .await;
    assert!(matches!(long, Ok(Try::Acquired(_))), "{long:?}");
    assert!(Instant::now() >= until);
}

/// A lock whose backend cannot be reached until `down`, then holds grants
/// off until `held` (a killed Redis primary, its replica promoted), then
/// grants.
struct Failover {
    down: Instant,
    held: Instant,
}

#[async_trait]
impl Coordinator for Failover {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn acquire(&self, what: Acquire<'_>, owner: &str, ttl: Duration) -> Result<Try> {
        if Instant::now() < self.down {
            return Err(CoordError::Backend(BackendError::Unreachable {
                backend: crate::backend::memory::ABOUT,
                endpoints: "the primary".into(),
                source: "broken pipe".into(),
            }));
        }
        HeldOff(self.held).acquire(what, owner, ttl).await
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

/// A request with a `wait` waits out transient backend errors and then the
/// promotion hold-off within it (it answered the first error at once: 503
/// after 27 ms on a Sentinel failover); one without a wait, or whose wait
/// ends first, gets the error.
#[tokio::test(start_paused = true)]
async fn a_wait_outlasts_transient_backend_errors_and_the_hold_off_within_its_budget() {
    let start = Instant::now();
    let (down, held) = (
        start + Duration::from_secs(2),
        start + Duration::from_secs(5),
    );
    let s = Service::new(Box::new(Failover { down, held }), None, "me".into());
    let ttl = Duration::from_secs(4);
    let now = s.acquire(lock("L"), "a", ttl, Duration::ZERO).await;
    assert!(matches!(now, Err(CoordError::Backend(_))), "{now:?}");
    assert_eq!(Instant::now(), start, "a request without a wait waited");
    let short = s.acquire(lock("L"), "a", ttl, Duration::from_secs(1)).await;
    assert!(matches!(short, Err(CoordError::Backend(_))), "{short:?}");
    assert!(
        Instant::now() <= start + Duration::from_secs(1),
        "past its wait"
    );
    let long = s
        .acquire(lock("L"), "a", ttl, Duration::from_secs(30))
        .await;
    assert!(matches!(long, Ok(Try::Acquired(_))), "{long:?}");
    assert!(Instant::now() >= held);
    assert!(
        Instant::now() <= held + Duration::from_millis(10),
        "granted {:?} after the hold-off ended",
        Instant::now() - held
    );
}

mod retry_tests;
