//! Following the coordination Leases: one LIST, then one watch of the
//! namespace's Leases (names starting with [`PREFIX`] are kept), resumed
//! from the last version; a broken or expired watch lists again. Every
//! version it delivers goes into the [`Book`], which wakes that object's
//! waiters: waiting is never polling. A second task deletes completed jobs
//! once their retention has ended by this sidecar's sight (a delete with
//! the version as precondition, so a job claimed again is never deleted).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, Preconditions, WatchEvent, WatchParams};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::book::Book;
use super::names::PREFIX;
use crate::backend::kubernetes::WATCH_TIMEOUT_SECS;

/// Longest pause before listing again after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How often completed jobs are looked for (in the book, not the API).
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

fn ours(l: &Lease) -> Option<&str> {
    l.metadata.name.as_deref().filter(|n| n.starts_with(PREFIX))
}

/// List, then watch, forever; `following` is true while a watch is open
/// on a complete list.
pub async fn follow(api: Api<Lease>, book: Arc<Book>, following: Arc<AtomicBool>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        following.store(false, Ordering::SeqCst);
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                let mut present = HashSet::new();
                for l in &list.items {
                    if let Some(n) = ours(l) {
                        present.insert(n.to_owned());
                        book.seen(n, l);
                    }
                }
                book.keep_only(&present);
                let rv = list.metadata.resource_version.unwrap_or_default();
                if watch_from(&api, &book, &following, rv).await {
                    backoff = Duration::from_millis(50);
                }
            }
            Err(e) => debug!(error = %e, "listing coordination Leases failed"),
        }
        following.store(false, Ordering::SeqCst);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Watch from `rv` until the watch fails; `true` when it delivered anything.
async fn watch_from(api: &Api<Lease>, book: &Book, following: &AtomicBool, mut rv: String) -> bool {
    let mut delivered = false;
    loop {
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        let stream = match api.watch(&params, &rv).await {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "watching coordination Leases failed");
                return delivered;
            }
        };
        following.store(true, Ordering::SeqCst);
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            delivered = true;
            match ev {
                Ok(WatchEvent::Added(l) | WatchEvent::Modified(l)) => {
                    rv = l.metadata.resource_version.clone().unwrap_or(rv);
                    if let Some(n) = ours(&l) {
                        book.seen(n, &l);
                    }
                }
                Ok(WatchEvent::Deleted(l)) => {
                    rv = l.metadata.resource_version.clone().unwrap_or(rv);
                    if let Some(n) = ours(&l) {
                        book.gone(n, Some(&rv));
                    }
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(s)) => {
                    debug!(code = s.code, message = %s.message, "coordination watch ended");
                    return delivered;
                }
                Err(e) => {
                    debug!(error = %e, "coordination watch broke");
                    return delivered;
                }
            }
        }
        // The server's timeout: resume from the last version.
    }
}

/// Delete completed jobs whose retention has ended, every [`SWEEP_EVERY`];
/// each delete carries the version seen as its precondition and gets
/// `deadline`.
pub async fn sweep(api: Api<Lease>, book: Arc<Book>, deadline: Duration) {
    let mut warned = false;
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        for (object, rv) in book.done_expired(Instant::now()) {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match tokio::time::timeout(deadline, api.delete(&object, &dp)).await {
                Ok(Ok(_)) => book.gone(&object, None),
                Ok(Err(kube::Error::Api(s))) if s.code == 403 && !warned => {
                    warned = true;
                    warn!(lease = %object, message = %s.message,
                        "may not delete leases.coordination.k8s.io: completed jobs' Leases stay (they are claimed afresh after the retention); grant delete on leases");
                }
                _ => {}
            }
        }
    }
}
