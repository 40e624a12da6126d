//! A campaign round's answers: one server's, read from the campaign
//! script's reply ([`RedisBackend::answer`]), and the round's decision
//! over all of them ([`RedisBackend::decide`]): elected by the grant rule,
//! following the holder a quorum shows, or waiting (a split, a fresh
//! server, a pause, a named successor).

use std::time::Duration;

use rand::Rng;
use redis::Value;
use tokio::time::Instant;

use super::group::{Acquisition, Granting, unexpected};
use super::holders::quorum_holder;
use super::server::{Server, uint_of};
use super::{BACKEND, BadCounter, RedisBackend, UNREPLICATED, Unreplicated, drift};
use crate::backend::{BackendError, Campaign, Holder, Result, Term, WaitReason};

/// How soon a candidate kept out by a pause looks again (the Elector waits
/// at most its retry period).
pub const PAUSED_RETRY: Duration = Duration::from_millis(500);

/// What one server answered to the campaign script.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Acquired(u64),
    Held(String, i64),
    /// The server is younger than one TTL plus a second, or restarted while we
    /// watched (maybe without persistence); try again after this many milliseconds.
    Fresh(i64),
    /// The election is paused on this server.
    Paused,
    /// The key is left to the named successor for this many milliseconds.
    Yielding(i64),
}

pub(super) fn random_retry() -> Duration {
    Duration::from_millis(rand::rng().random_range(10..=200))
}

/// What a campaign round found, summed over the servers.
#[derive(Default)]
pub(super) struct Found {
    pub(super) acquired: Vec<(usize, u64)>,
    /// Servers that granted but whose replicas did not acknowledge it.
    pub(super) unacked: Vec<usize>,
    pub(super) held: Vec<Holder>,
    pub(super) fresh: Option<Duration>,
    /// Servers that refused because the election is paused.
    pub(super) paused: usize,
    /// The shortest wait left to a named successor, over the servers that said so.
    pub(super) yielding: Option<Duration>,
    pub(super) error: Option<BackendError>,
}

impl Found {
    /// Servers that hold our key: granted, acknowledged or not.
    pub(super) fn taken(&self) -> Vec<usize> {
        let granted = self.acquired.iter().map(|(i, _)| *i);
        granted.chain(self.unacked.iter().copied()).collect()
    }
}

impl RedisBackend {
    /// Read `server`'s campaign answer `v` (an array ending with its
    /// `run_id`), given our hold-off on it.
    pub(super) fn answer(
        &self,
        server: &Server,
        v: &Value,
        hold_until: Option<Instant>,
    ) -> Result<Answer> {
        let Value::Array(items) = v else {
            return Err(unexpected(v));
        };
        match items.as_slice() {
            [Value::Int(1), f, _] => uint_of(f)
                .map(Answer::Acquired)
                .ok_or_else(|| unexpected(v)),
            [Value::Int(0), Value::BulkString(value), Value::Int(pttl), _] => Ok(Answer::Held(
                String::from_utf8_lossy(value).into_owned(),
                *pttl,
            )),
            [Value::Int(3), Value::Int(wait), _] => {
                let own = hold_until.map_or(0, |t| {
                    t.saturating_duration_since(Instant::now()).as_millis() as i64
                });
                // Our own hold-off, if any, else the server's uptime wait.
                Ok(Answer::Fresh(if own > 0 { own } else { *wait }))
            }
            [Value::Int(6), _] => Ok(Answer::Paused),
            [Value::Int(7), _, Value::Int(left), _] => Ok(Answer::Yielding(*left)),
            [Value::Int(5), Value::Int(live), _] => Err(BackendError::Rejected {
                backend: BACKEND,
                code: UNREPLICATED,
                source: Box::new(Unreplicated {
                    server: server.label().to_owned(),
                    acked: (*live).max(0) as u64,
                    wanted: server.min_replicas(),
                    waited_ms: None,
                }),
            }),
            [Value::Int(4), Value::BulkString(value), _] => Err(BackendError::Rejected {
                backend: BACKEND,
                code: "fencing_counter",
                source: Box::new(BadCounter {
                    key: self.counter_key.clone(),
                    value: String::from_utf8_lossy(value).into_owned(),
                }),
            }),
            _ => Err(unexpected(v)),
        }
    }

    /// The grant rule's decision on a campaign round: the term, a wait when
    /// too few servers confirmed its fencing token, or what the round found.
    pub(super) fn decide(
        &self,
        granting: Granting,
        found: Found,
        ask: &Acquisition<'_>,
    ) -> Result<Campaign> {
        let n = self.servers();
        match granting {
            Granting::Granted { fencing, by, .. } => Ok(Campaign::Elected(Term {
                holder: Holder {
                    identity: ask.owner.to_owned(),
                    fencing_token: fencing,
                    term_id: crate::backend::TermId::new(ask.token),
                    revision: None,
                    expires_in: None,
                },
                ttl: ask.ttl.saturating_sub(drift(ask.ttl)),
                granted: ask.ttl,
                servers: (n > 1).then_some((by, n)),
            })),
            Granting::Unconfirmed { .. } => Ok(Campaign::Waiting {
                previous: None,
                retry_after: random_retry(),
                why: WaitReason::QuorumUnconfirmed,
            }),
            Granting::Refused => self.lose(found),
        }
    }

    /// No quorum: follow the holder seen on a quorum, or wait out a split.
    fn lose(&self, found: Found) -> Result<Campaign> {
        let refused = found.paused + usize::from(found.yielding.is_some());
        let answered = found.acquired.len() + found.held.len() + refused;
        if self.group.short_of_quorum(answered)
            && let Some(e) = found.error
        {
            return Err(e);
        }
        if let Some(holder) = quorum_holder(&found.held, self.quorum()) {
            return Ok(Campaign::Following(holder));
        }
        if found.paused > 0 {
            return Ok(Campaign::Waiting {
                previous: None,
                retry_after: PAUSED_RETRY,
                why: WaitReason::Paused,
            });
        }
        if let Some(left) = found.yielding {
            return Ok(Campaign::Waiting {
                previous: None,
                retry_after: left,
                why: WaitReason::SuccessorHeadStart,
            });
        }
        // A split: retry after a random delay (Redlock spec), or when the
        // minority keys expire; a server younger than one TTL sets the wait.
        let random = found.fresh.unwrap_or_else(random_retry);
        let retry_after = found
            .held
            .iter()
            .filter_map(|h| h.expires_in)
            .min()
            .map_or(random, |e| e.min(random));
        let why = if found.fresh.is_some() {
            WaitReason::ServerRestarted
        } else {
            WaitReason::Split
        };
        Ok(Campaign::Waiting {
            previous: found.held.into_iter().next(),
            retry_after,
            why,
        })
    }
}
