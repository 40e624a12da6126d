//! Unit tests of the coordination service.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::coord::{Token, TokenKind, check_owner};

/// One lock in memory; `changed` never reports anything, so only a
/// release through the [`Service`] can wake a waiter.
#[derive(Default)]
struct OneLock(Mutex<Option<String>>);

#[async_trait]
impl Coordinator for OneLock {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn lock(&self, name: &str, _: &str, ttl: Duration) -> Result<Try> {
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
    async fn lock_fair(&self, _: &str, _: &str, _: Duration, _: Duration) -> Result<Try> {
        Err(CoordError::Unsupported("no".into()))
    }
    async fn semaphore(&self, _: &str, _: &str, _: u32, _: Duration) -> Result<Try> {
        Err(CoordError::Unsupported("no".into()))
    }
    async fn changed(&self, _: Kind, _: &str, _: u64, until: Instant) -> Result<()> {
        tokio::time::sleep_until(until).await;
        Ok(())
    }
    async fn renew(&self, _: Kind, _: &str, _: &str, _: Duration) -> Result<Outcome> {
        Ok(Outcome::Gone)
    }
    async fn release(&self, _: Kind, _: &str, token: &str) -> Result<Outcome> {
        let mut held = self.0.lock().unwrap();
        if held.as_deref() == Some(token) {
            *held = None;
            return Ok(Outcome::Ok(None));
        }
        Ok(Outcome::Gone)
    }
    async fn claim(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Claim> {
        Err(CoordError::Unsupported("no".into()))
    }
    async fn complete(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Outcome> {
        Err(CoordError::Unsupported("no".into()))
    }
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
    let mut holder = token(s.lock("l", "me", ttl, Duration::ZERO, false).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let s = s.clone();
        waiters.push(tokio::spawn(async move {
            s.lock("l", "w", ttl, wait, false).await
        }));
    }
    while s.waiting() < 2 {
        tokio::task::yield_now().await;
    }
    // The third waiter is refused at once, with the cap in the message.
    match s.lock("l", "w3", ttl, wait, false).await {
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
            s.release(Kind::Lock, "l", &holder).await.unwrap(),
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
    s.release(Kind::Lock, "l", &holder).await.unwrap();
    assert_eq!(
        s.release(Kind::Lock, "l", &holder).await.unwrap(),
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
