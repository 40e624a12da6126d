//! Semaphores on etcd: each permit is a key under `…/sem/<name>/` bound to
//! its own lease, whose value records the size it was taken with, so that
//! one name is one semaphore.

use std::time::Duration;

use etcd_client::{GetOptions, PutOptions, SortOrder, SortTarget};

use super::{EtcdCoord, grant};
use crate::backend::coordination::{CoordError, Result, Token, TokenKind, Try};
use crate::backend::etcd::store::revision_of;

impl EtcdCoord {
    /// Try once to take one of `permits` permits of semaphore `name`
    /// ([`Acquire::Semaphore`](crate::backend::coordination::Acquire::Semaphore)).
    pub(super) async fn permit(
        &self,
        name: &str,
        owner: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Try> {
        let mut client = self.client().await?;
        let lease = self.store.grant(&mut client, ttl, self.limit()).await?;
        let token = Token::new(TokenKind::Permit, lease.id);
        let key = self.key_of(&self.sem_prefix(name), &token);
        let put = PutOptions::new().with_lease(lease.id);
        let value = permit_value(&token, owner, permits);
        let put = self.call("put", client.put(key, value, Some(put))).await;
        let put = self.or_abandon(&mut client, lease.id, put).await?;
        let my_rev = revision_of(put.header());
        // Live permits created before ours, oldest first: ours counts only if
        // fewer than N, and only if none was taken with another size. Every
        // later acquirer sees ours too, so live holders never exceed N and
        // never differ in size. Count the keys returned: etcd computes a
        // range's `count` before the `max_create_revision` filter, so `count`
        // would include ours. N keys are enough to decide (etcd filters and
        // sorts before it applies the limit).
        let before = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(i64::from(permits))
            .with_max_create_revision(my_rev - 1);
        let before = self
            .call("get", client.get(self.sem_prefix(name), Some(before)))
            .await;
        let before = self.or_abandon(&mut client, lease.id, before).await?;
        let other = before
            .kvs()
            .iter()
            .filter_map(|kv| size_of_permit(kv.value()))
            .find(|size| *size != permits);
        if let Some(established) = other {
            self.drop_lease(&mut client, lease.id).await;
            return Err(CoordError::PermitsMismatch {
                name: name.to_owned(),
                established: u64::from(established),
                asked: permits,
            });
        }
        let before = before.kvs().len() as u64;
        if before < u64::from(permits) {
            return Ok(Try::Acquired(grant(name, &token, my_rev, lease.ttl)));
        }
        self.drop_lease(&mut client, lease.id).await;
        Ok(Try::Full(before))
    }
}

/// A permit's value: `<token>|<owner>|<permits>` (the semaphore's size, so
/// that one name is one semaphore; owners hold no `|`).
fn permit_value(token: &Token, owner: &str, permits: u32) -> String {
    format!("{token}|{owner}|{permits}")
}

/// The size a permit was taken with; `None` for a value without one (written
/// by an older sidecar: `<token>|<owner>`).
fn size_of_permit(value: &[u8]) -> Option<u32> {
    let v = std::str::from_utf8(value).ok()?;
    let mut parts = v.split('|');
    let (_token, _owner, size) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    size.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::etcd::coord::holds;

    #[test]
    fn a_permit_records_its_size_and_an_old_permit_has_none() {
        let t = Token::new(TokenKind::Permit, 0x1234);
        let v = permit_value(&t, "worker-7", 3);
        assert_eq!(size_of_permit(v.as_bytes()), Some(3));
        assert!(holds(v.as_bytes(), &t.to_string()));
        assert_eq!(size_of_permit(format!("{t}|3").as_bytes()), None);
        assert_eq!(size_of_permit(b"x|y|z|w"), None);
    }
}
