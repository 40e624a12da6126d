use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::{Instant, advance};

use super::*;
use crate::backend::coordination::Kind;
use crate::backend::kubernetes::coord::state::{Target, lease_for};

const OBJ: &str = "le-lock-x-0";

fn holder(token: &str, at_ms: u64) -> Entry {
    Entry {
        token: token.into(),
        owner: format!("owner-{token}"),
        ttl_ms: 1000,
        at_ms,
    }
}

/// A version `rv` of the object with `state`.
fn version(rv: u64, state: &Stored) -> Lease {
    let t = Target {
        kind: Kind::Lock,
        name: "x",
        object: OBJ,
        election: "e",
    };
    let mut l = lease_for(None, &t, state, rv);
    l.metadata.resource_version = Some(rv.to_string());
    l
}

fn holding(tokens: &[(&str, u64)]) -> Stored {
    Stored {
        holders: tokens.iter().map(|(t, at)| holder(t, *at)).collect(),
        ..Stored::default()
    }
}

fn live(book: &Book) -> Vec<String> {
    let s = book.sight(OBJ, Instant::now());
    s.live.into_iter().map(|e| e.token).collect()
}

#[tokio::test(start_paused = true)]
async fn a_holder_lives_its_ttl_from_first_sight_and_a_renewal_starts_it_again() {
    let book = Book::default();
    book.seen(OBJ, &version(1, &holding(&[("a", 10)])));
    advance(Duration::from_millis(900)).await;
    assert_eq!(live(&book), ["a"]);
    // The same stamp again (a re-delivery) does not extend it.
    book.seen(OBJ, &version(2, &holding(&[("a", 10)])));
    advance(Duration::from_millis(100)).await;
    assert!(live(&book).is_empty());
    assert_eq!(book.sight(OBJ, Instant::now()).expired, ["a"]);
    // A renewal (a new stamp) is live for a TTL from its sight.
    book.seen(OBJ, &version(3, &holding(&[("a", 11)])));
    advance(Duration::from_millis(999)).await;
    assert_eq!(live(&book), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn a_holder_removed_by_someone_else_stays_live_until_its_ttl_but_a_release_ends_it() {
    let book = Book::default();
    book.seen(OBJ, &version(1, &holding(&[("a", 10), ("b", 10)])));
    advance(Duration::from_millis(500)).await;
    // `a` vanishes without a release (a hand edit); `b` is released.
    let mut next = Stored::default();
    next.holders.push(holder("b", 10));
    next.release("b");
    book.seen(OBJ, &version(2, &next));
    assert_eq!(live(&book), ["a"]);
    let s = book.sight(OBJ, Instant::now());
    assert_eq!(
        s.next_expiry,
        Some(Instant::now() + Duration::from_millis(500))
    );
    advance(Duration::from_millis(500)).await;
    assert!(live(&book).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_deleted_objects_holders_stay_live_until_their_ttl_and_its_counter_is_kept() {
    let book = Book::default();
    book.seen(OBJ, &version(7, &holding(&[("a", 10)])));
    book.gone(OBJ, Some("8"));
    let s = book.sight(OBJ, Instant::now());
    assert!(s.lease.is_none());
    assert_eq!((live(&book), s.top), (vec!["a".to_owned()], 7));
    advance(Duration::from_millis(1000)).await;
    assert!(live(&book).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_older_version_read_after_a_newer_one_is_ignored() {
    let book = Book::default();
    book.seen(OBJ, &version(5, &Stored::default()));
    book.seen(OBJ, &version(4, &holding(&[("a", 10)])));
    assert!(live(&book).is_empty());
    book.gone(OBJ, Some("3"));
    assert!(book.sight(OBJ, Instant::now()).lease.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_writer_intent_lives_its_ttl_from_first_sight_and_wakes_waiters_when_it_ends() {
    let book = Book::default();
    let state = Stored {
        intent: Some(Box::new(holder("i", 10))),
        ..Stored::default()
    };
    book.seen(OBJ, &version(1, &state));
    advance(Duration::from_millis(400)).await;
    let s = book.sight(OBJ, Instant::now());
    assert_eq!(s.intent.map(|i| i.token).as_deref(), Some("i"));
    assert_eq!(
        s.next_expiry,
        Some(Instant::now() + Duration::from_millis(600))
    );
    advance(Duration::from_millis(600)).await;
    assert!(book.sight(OBJ, Instant::now()).intent.is_none());
}
