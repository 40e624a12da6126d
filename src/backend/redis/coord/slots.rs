//! Semaphores on Redis: the size check shared by one server and a Redlock
//! group (one name is one semaphore), and the Redlock semaphore of N slots
//! (see the parent module).

use std::time::Duration;

use rand::Rng;
use redis::Value;

use super::{Ask, Got, RedisCoord};
use crate::backend::coordination::{CoordError, Result, Token, TokenKind, Try};
use crate::backend::redis::group::{Round, unexpected};
use crate::backend::redis::lua::{Lua, ms};
use crate::backend::redis::server::uint_of;

impl RedisCoord {
    /// A Redlock semaphore: find the slots free on a quorum, then take one
    /// as a lock (in an order starting at random, so askers spread). Live
    /// permits of another size on a quorum refuse the request at once; each
    /// slot's script refuses it too on a server where they live.
    pub(super) async fn slot_semaphore(
        &self,
        name: &str,
        owner: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Try> {
        let key = self.key("sem", name);
        let fkey = format!("{key}:fencing");
        let skey = format!("{key}:size");
        let scan = self.scan_slots(&key, &skey, permits).await?;
        let quorum = self.group.quorum();
        if let Some(established) = scan.other_size(quorum) {
            return Err(mismatch(name, established, permits));
        }
        let open: Vec<usize> = (0..scan.free.len())
            .filter(|i| scan.free[*i] >= quorum)
            .collect();
        let live = permits as u64 - open.len() as u64;
        let offset = rand::rng().random_range(0..open.len().max(1));
        for slot in open.iter().cycle().skip(offset).take(open.len().min(3)) {
            let keys = [
                format!("{key}:slot:{slot}"),
                fkey.clone(),
                skey.clone(),
                key.clone(),
            ];
            let ask = Ask {
                lua: Lua::SlotLock,
                keys: &keys,
                owner,
                args: vec![ms(ttl), permits.to_string()],
                name,
                token: Token::new(TokenKind::Permit, *slot as i64),
                ttl,
            };
            match self.attempt(ask).await? {
                Got::Granted(g) => return Ok(Try::Acquired(g)),
                Got::Refused(round) => {
                    if let Some(established) = other_size(&round) {
                        return Err(mismatch(name, established, permits));
                    }
                }
            }
        }
        Ok(Try::Full(live.max(1)))
    }

    /// Every server's view of a Redlock semaphore's first `permits` slots.
    async fn scan_slots(&self, key: &str, skey: &str, permits: u32) -> Result<SlotScan> {
        let answers = self
            .group
            .eval_all(Lua::Slots, &[key, skey], &[&permits.to_string()])
            .await;
        let mut scan = SlotScan {
            free: vec![0usize; permits as usize],
            sizes: Vec::new(),
        };
        let mut answered = 0;
        let mut error = None;
        for a in answers {
            match a {
                Ok(Value::Array(parts)) if parts.len() == 2 => {
                    let (Some(size), Value::Array(taken)) = (uint_of(&parts[0]), &parts[1]) else {
                        error.get_or_insert(unexpected(&Value::Array(parts)));
                        continue;
                    };
                    answered += 1;
                    if size > 0 {
                        scan.sizes.push(size);
                    }
                    scan.free.iter_mut().for_each(|f| *f += 1);
                    for i in taken.iter().filter_map(uint_of) {
                        if let Some(f) = scan.free.get_mut(i as usize) {
                            *f -= 1;
                        }
                    }
                }
                Ok(other) => {
                    error.get_or_insert(unexpected(&other));
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        self.group
            .enough(answered, error, "answered")
            .map_err(|e| super::failed(e, &[key]))?;
        Ok(scan)
    }
}

/// What the servers said of a Redlock semaphore's slots.
struct SlotScan {
    /// Per slot: on how many servers it is free.
    free: Vec<usize>,
    /// Per server that has live permits of another size: that size.
    sizes: Vec<u64>,
}

impl SlotScan {
    /// The other size that live permits have on at least `quorum` servers.
    fn other_size(&self, quorum: usize) -> Option<u64> {
        self.sizes
            .iter()
            .copied()
            .find(|s| self.sizes.iter().filter(|x| *x == s).count() >= quorum)
    }
}

/// The refusal of a semaphore request of `asked` permits by live permits
/// of size `established`.
pub(super) fn mismatch(name: &str, established: u64, asked: u32) -> CoordError {
    CoordError::PermitsMismatch {
        name: name.to_owned(),
        established,
        asked,
    }
}

/// The size of live permits of another size that refused an acquisition
/// (`{-3, size}` answers), if any server did.
pub(super) fn other_size(round: &Round) -> Option<u64> {
    round.refusals().find_map(|r| match r.as_slice() {
        [Value::Int(-3), size] => uint_of(size),
        _ => None,
    })
}
