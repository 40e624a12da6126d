//! The API calls of the coordination Leases (read, compare-and-swap write,
//! conditional delete), each within the call deadline cut to the request's
//! budget, their errors classified, and the one loop every verb runs:
//! look, decide, write by compare-and-swap, look again after a conflict.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use tokio::time::Instant;

use super::LeaseCoord;
use super::book::Sight;
use super::state::{Stored, Target, Unusable, fencing_of, lease_for, stored_of};
use crate::backend::BackendError;
use crate::backend::coordination::{CoordError, Result};
use crate::backend::kubernetes::{ABOUT, Conn, FIELD_MANAGER, KubeLeaseError, unix_millis};
use crate::kube_client::throttle::DEFAULT_RETRY_AFTER;

/// Looks and writes of one verb before it gives up on a contended object
/// (each within the request's budget).
const TRIES: usize = 32;

/// Longest pause after a lost race: a random pause, doubling up to this,
/// spreads the writers of a contended object (a fair lock's waiters).
const MAX_PAUSE: Duration = Duration::from_millis(40);

/// What a verb makes of an object as seen.
pub enum Decision<T> {
    /// The answer, with nothing written.
    Answer(T),
    /// The sight came from the watch and may be behind: read and decide again
    /// (a refusal is only ever answered from a fresh read).
    Confirm,
    /// Write this state (with the next fencing token when `bump`), then
    /// answer.
    Write {
        /// The new state.
        state: Stored,
        /// Whether the write issues the next fencing token.
        bump: bool,
        /// The answer once written.
        answer: T,
    },
}

/// An object as a verb sees it.
pub struct View {
    /// The sight of it.
    pub sight: Sight,
    /// Its state (empty when absent).
    pub stored: Stored,
    /// The fencing token a write with `bump` issues: one above the highest
    /// seen, or, creating the object, also at least the wall clock in
    /// milliseconds (so tokens grow across a deletion).
    pub next_fencing: u64,
    /// Whether the sight comes from a read of this verb's own.
    pub fresh: bool,
}

/// `error` of a call to `verb` on `object`, classified.
fn classify(conn: &Conn, verb: &'static str, object: &str, error: kube::Error) -> BackendError {
    let kube::Error::Api(s) = error else {
        return BackendError::Unreachable {
            backend: ABOUT,
            endpoints: conn.server.clone(),
            source: Box::new(error),
        };
    };
    let status = || {
        Box::new(KubeLeaseError::Status {
            verb,
            namespace: conn.namespace.clone(),
            name: object.to_owned(),
            code: s.code,
            reason: s.reason.clone(),
            message: s.message.clone(),
        })
    };
    match s.code {
        403 => BackendError::Auth {
            backend: ABOUT,
            source: Box::new(KubeLeaseError::Forbidden {
                verb,
                credentials: conn.credentials.clone(),
                namespace: conn.namespace.clone(),
                message: s.message.clone(),
            }),
        },
        401 => BackendError::Auth {
            backend: ABOUT,
            source: status(),
        },
        429 => BackendError::Throttled {
            backend: ABOUT,
            retry_after: conn.throttle.left().unwrap_or(DEFAULT_RETRY_AFTER),
            source: status(),
        },
        400 | 422 => BackendError::Rejected {
            backend: ABOUT,
            code: "invalid",
            source: status(),
        },
        _ => BackendError::Server {
            backend: ABOUT,
            source: status(),
        },
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl LeaseCoord {
    /// Run one API call under the deadline (cut to the request's budget).
    async fn call<T>(
        &self,
        verb: &'static str,
        f: impl Future<Output = kube::Result<T>>,
    ) -> std::result::Result<kube::Result<T>, BackendError> {
        let limit = crate::budget::limit(self.deadline);
        tokio::time::timeout(limit, f)
            .await
            .map_err(|_| BackendError::Timeout {
                backend: ABOUT,
                call: verb,
                timeout_ms: limit.as_millis() as u64,
            })
    }

    /// GET `object` and record what it shows.
    pub(super) async fn read(&self, conn: &Conn, object: &str) -> Result<()> {
        match self.call("get", conn.api.get_opt(object)).await? {
            Ok(Some(l)) => self.book.seen(object, &l),
            Ok(None) => self.book.gone(object, None),
            Err(e) => return Err(classify(conn, "get", object, e).into()),
        }
        Ok(())
    }

    /// Write `lease` (create when `create`, else replace at its version);
    /// `false` when another write came first (409).
    async fn write(&self, conn: &Conn, object: &str, lease: &Lease, create: bool) -> Result<bool> {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let (verb, r) = if create {
            (
                "create",
                self.call("create", conn.api.create(&pp, lease)).await?,
            )
        } else {
            let put = conn.api.replace(object, &pp, lease);
            ("update", self.call("update", put).await?)
        };
        match r {
            Ok(l) => {
                self.book.seen(object, &l);
                Ok(true)
            }
            Err(e) if conflict(&e) || (!create && not_found(&e)) => Ok(false),
            Err(e) => Err(classify(conn, verb, object, e).into()),
        }
    }

    /// What this sidecar knows of object `t` now (`fresh`: from a read of
    /// the verb's own).
    fn view(&self, t: &Target<'_>, fresh: bool) -> Result<View> {
        let sight = self.book.sight(t.object, Instant::now());
        let (stored, next_fencing) = match &sight.lease {
            Some(l) => {
                let st = stored_of(l, t.name).map_err(|u| corrupt(t.object, u))?;
                (st, fencing_of(l).max(sight.top) + 1)
            }
            None => (Stored::default(), (sight.top + 1).max(unix_millis())),
        };
        Ok(View {
            sight,
            stored,
            next_fencing,
            fresh,
        })
    }

    /// The loop of every verb on object `t`: look (the watch's sight when
    /// it follows the objects, else a read), `decide`, write by
    /// compare-and-swap; after a lost race or a [`Decision::Confirm`], read
    /// and decide again.
    ///
    /// # Errors
    /// Backend errors; [`CoordError::Corrupt`] for an object of another
    /// name or state; a backend error when [`TRIES`] races were all lost.
    pub(super) async fn update<T>(
        &self,
        t: &Target<'_>,
        mut decide: impl FnMut(&View) -> Result<Decision<T>>,
    ) -> Result<T> {
        let conn = self.conn().await?;
        let mut fresh = !self.following();
        let mut lost = 0u32;
        for _ in 0..TRIES {
            if fresh {
                self.read(conn, t.object).await?;
            }
            let view = self.view(t, fresh)?;
            let (state, bump, answer) = match decide(&view)? {
                Decision::Answer(a) => return Ok(a),
                Decision::Confirm => {
                    fresh = true;
                    continue;
                }
                Decision::Write {
                    state,
                    bump,
                    answer,
                } => (state, bump, answer),
            };
            let base = view.sight.lease.as_ref();
            let fencing = if bump {
                view.next_fencing
            } else {
                base.map_or(view.next_fencing, fencing_of)
            };
            let lease = lease_for(base, t, &state, fencing);
            if self.write(conn, t.object, &lease, base.is_none()).await? {
                return Ok(answer);
            }
            fresh = true;
            lost += 1;
            pause(lost).await;
        }
        Err(CoordError::Backend(BackendError::Server {
            backend: ABOUT,
            source: Box::new(KubeLeaseError::Contended {
                namespace: conn.namespace.clone(),
                name: t.object.to_owned(),
                tries: TRIES,
            }),
        }))
    }
}

/// A random pause after the `lost`-th lost race: up to 2^`lost` ms, at
/// most [`MAX_PAUSE`].
async fn pause(lost: u32) {
    let most = Duration::from_millis(1 << lost.min(6)).min(MAX_PAUSE);
    tokio::time::sleep(most.mul_f64(rand::random::<f64>())).await;
}

/// The refusal of an object that is not usable as `object`.
fn corrupt(object: &str, u: Unusable) -> CoordError {
    let found = match u {
        Unusable::OtherName(n) => format!(
            "the coordination object of the name {n:?} (two names share an object name; use another name)"
        ),
        Unusable::BadState(s) => format!("a coordination state that is not ours: {s}"),
    };
    CoordError::Corrupt {
        key: object.to_owned(),
        found,
    }
}

/// Milliseconds of `d`, for TTLs in the state.
pub fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}
