//! Read-write locks on etcd, under `…/rw/<name>/`:
//! - each reader is a key `r/<lease hex>.<nonce>` and the writer a key
//!   `w/<lease hex>.<nonce>`, each bound to its own lease, value
//!   `<token>|<owner>` (the whole token is in the key's name, as a lock's);
//! - a waiting writer's intent is the one key `intent`, value `<id>|<owner>`,
//!   bound to a lease of the intent's TTL.
//!
//! Leases of released holds go to the pool of released lock leases
//! (`super::pool`) for the next acquisition of the same TTL.
//!
//! A reader is put only if no writer key and no intent exist; the writer
//! only if no reader key, no writer key exist and the intent is as the
//! writer read it (absent, or its own), and its put deletes the intent in
//! the same txn. Both compares run in the txn that puts the key, so a
//! reader and a writer never both succeed: whichever txn etcd applies second
//! sees the other's key. The fencing token is the revision of the put, so a
//! writer's is greater than every earlier grant's, readers' included.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdCoord, grant, holds, oldest, owner_of};
use crate::backend::coordination::{Outcome, Result, RwMode, Token, TokenKind, Try, WriteIntent};
use crate::backend::etcd::store::revision_of;

/// What one look at a read-write lock found: owners, and the intent's id,
/// `mod_revision` and lease.
#[derive(Default)]
struct Seen {
    writer: Option<String>,
    reader: Option<String>,
    intent: Option<(String, String, i64, i64)>,
}

impl Seen {
    fn of(ops: &[TxnOpResponse]) -> Seen {
        let first = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
            _ => None,
        };
        let intent = first(2).map(|kv| {
            let v = String::from_utf8_lossy(kv.value()).into_owned();
            let (id, owner) = v.split_once('|').unwrap_or((v.as_str(), ""));
            (
                id.to_owned(),
                owner.to_owned(),
                kv.mod_revision(),
                kv.lease(),
            )
        });
        Seen {
            writer: first(0).map(|kv| owner_of(kv.value())),
            reader: first(1).map(|kv| owner_of(kv.value())),
            intent,
        }
    }
}

impl EtcdCoord {
    pub(super) fn rw_prefix(&self, name: &str) -> String {
        format!("{}rw/{name}/", self.prefix)
    }

    /// The key of a reader's or writer's token (`None` for another kind).
    fn rw_key(&self, name: &str, t: &Token) -> Option<String> {
        let part = match t.kind {
            TokenKind::Reader => "r",
            TokenKind::Writer => "w",
            _ => return None,
        };
        Some(format!(
            "{}{part}/{:x}.{}",
            self.rw_prefix(name),
            t.lease,
            t.nonce
        ))
    }

    /// The three gets of a look: the oldest writer, the oldest reader, the intent.
    fn rw_look(p: &str) -> [TxnOp; 3] {
        [
            TxnOp::get(format!("{p}w/"), Some(oldest())),
            TxnOp::get(format!("{p}r/"), Some(oldest())),
            TxnOp::get(format!("{p}intent"), None),
        ]
    }

    /// Try once to take read-write lock `name` in `mode`
    /// ([`Acquire::RwLock`](crate::backend::coordination::Acquire::RwLock)):
    /// one read when it is busy, else a lease and a compare-and-put.
    pub(super) async fn rw_acquire(
        &self,
        name: &str,
        owner: &str,
        mode: RwMode,
        ttl: Duration,
        intent: Option<&WriteIntent>,
    ) -> Result<Try> {
        let mut client = self.client().await?;
        let p = self.rw_prefix(name);
        let peek = Txn::new().and_then(Self::rw_look(&p));
        let seen = Seen::of(&self.call("txn", client.txn(peek)).await?.op_responses());
        let ours = |s: &Seen| match (&s.intent, intent) {
            (Some((id, ..)), Some(i)) => *id == i.id,
            _ => false,
        };
        if let Some(busy) = self
            .rw_busy(&mut client, &p, mode, owner, &seen, intent)
            .await?
        {
            return Ok(busy);
        }
        let kind = match mode {
            RwMode::Read => TokenKind::Reader,
            RwMode::Write => TokenKind::Writer,
        };
        // A lease of a released lock or read-write hold is reused, as for
        // locks ([`super::pool`]): every verb of its old token names its
        // old, deleted key.
        let (lease, at) = self.lock_lease(&mut client, ttl).await?;
        let token = Token::new(kind, lease.id);
        let intent_rev = seen.intent.as_ref().map_or(0, |i| i.2);
        let txn = self.rw_txn(name, mode, &token, owner, lease.id, intent_rev);
        let created = self.put_under(&mut client, lease, txn).await?;
        if created.resp.succeeded() {
            self.holding(lease, ttl, at);
            if ours(&seen)
                && let Some((.., lease)) = seen.intent
            {
                self.revoke_later(client, lease);
            }
            let rev = revision_of(created.resp.header());
            return Ok(Try::Acquired(grant(name, &token, rev, created.lease.ttl)));
        }
        let seen = Seen::of(&created.resp.op_responses());
        let busy = self
            .rw_busy(&mut client, &p, mode, owner, &seen, intent)
            .await?;
        Ok(busy.unwrap_or_else(|| Try::Held(String::new())))
    }

    /// The compare-and-put of a reader or writer `token` on `lease`: a
    /// reader when no writer and no intent exist; a writer when no writer
    /// and no reader exist and the intent's `mod_revision` is `intent_rev`
    /// (0: absent), deleting the intent. Else the look.
    fn rw_txn(
        &self,
        name: &str,
        mode: RwMode,
        token: &Token,
        owner: &str,
        lease: i64,
        intent_rev: i64,
    ) -> Txn {
        let p = self.rw_prefix(name);
        let intent_key = format!("{p}intent");
        let put = TxnOp::put(
            self.rw_key(name, token).unwrap_or_default(),
            format!("{token}|{owner}"),
            Some(PutOptions::new().with_lease(lease)),
        );
        let none = |part: &str| {
            Compare::create_revision(format!("{p}{part}"), CompareOp::Equal, 0).with_prefix()
        };
        let (when, then) = match mode {
            RwMode::Read => (
                vec![
                    none("w/"),
                    Compare::create_revision(intent_key, CompareOp::Equal, 0),
                ],
                vec![put],
            ),
            RwMode::Write => (
                vec![
                    none("w/"),
                    none("r/"),
                    Compare::mod_revision(intent_key.clone(), CompareOp::Equal, intent_rev),
                ],
                vec![put, TxnOp::delete(intent_key, None)],
            ),
        };
        Txn::new()
            .when(when)
            .and_then(then)
            .or_else(Self::rw_look(&p))
    }

    /// Whether `seen` keeps this request out, and the answer: the writer, a
    /// waiting writer's intent (for readers, and writers whose intent it is
    /// not), or a reader (for writers). A writer kept out records `intent`
    /// when none is live.
    async fn rw_busy(
        &self,
        client: &mut Client,
        p: &str,
        mode: RwMode,
        owner: &str,
        seen: &Seen,
        intent: Option<&WriteIntent>,
    ) -> Result<Option<Try>> {
        let other_intent = seen
            .intent
            .as_ref()
            .filter(|(id, ..)| intent.is_none_or(|i| i.id != *id));
        let holder = match mode {
            RwMode::Read => seen
                .writer
                .clone()
                .or_else(|| other_intent.map(|i| i.1.clone())),
            RwMode::Write => seen
                .writer
                .clone()
                .or_else(|| other_intent.map(|i| i.1.clone()))
                .or_else(|| seen.reader.clone()),
        };
        let Some(holder) = holder else {
            return Ok(None);
        };
        if mode == RwMode::Write
            && seen.intent.is_none()
            && let Some(i) = intent
        {
            self.set_intent(client, p, owner, i).await?;
        }
        Ok(Some(Try::Held(holder)))
    }

    /// Record the writer intent `i` unless one exists (its own lease).
    async fn set_intent(
        &self,
        client: &mut Client,
        p: &str,
        owner: &str,
        i: &WriteIntent,
    ) -> Result<()> {
        let key = format!("{p}intent");
        let txn = |lease| {
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    format!("{}|{owner}", i.id),
                    Some(PutOptions::new().with_lease(lease)),
                )])
        };
        self.create(client, i.ttl, txn).await?;
        Ok(())
    }

    /// Remove the writer intent `id` of `name` if it is still there.
    pub(super) async fn rw_drop_intent(&self, name: &str, id: &str) -> Result<()> {
        let mut client = self.client().await?;
        let key = format!("{}intent", self.rw_prefix(name));
        let r = self.call("get", client.get(key.clone(), None)).await?;
        let Some(kv) = r.kvs().first() else {
            return Ok(());
        };
        if !kv.value().starts_with(format!("{id}|").as_bytes()) {
            return Ok(());
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(key, None)]);
        let lease = kv.lease();
        if self.call("txn", client.txn(txn)).await?.succeeded() && lease > 0 {
            self.revoke_later(client, lease);
        }
        Ok(())
    }

    /// A reader's or writer's token issued on etcd, and its key.
    pub(super) fn rw_parts(&self, name: &str, token: &str) -> Option<(Token, String)> {
        let t = Token::parse(token).filter(|t| t.lease > 0)?;
        let key = self.rw_key(name, &t)?;
        Some((t, key))
    }

    /// Renew the hold of `key` by `token` on `lease`: a read proving the key
    /// is still the token's, then one keep-alive (an expired lease answers
    /// TTL 0 and is never re-created).
    pub(super) async fn renew_key(
        &self,
        client: &mut Client,
        key: &str,
        token: &str,
        lease: i64,
    ) -> Result<Outcome> {
        let current = self.call("get", client.get(key, None)).await?;
        match current.kvs().first() {
            None => return Ok(Outcome::Gone),
            Some(kv) if !holds(kv.value(), token) => return Ok(Outcome::NotYours),
            Some(_) => {}
        }
        let sent = tokio::time::Instant::now();
        let left = self.keep_alive_once(client, lease).await?;
        if left <= 0 {
            return Ok(Outcome::Gone);
        }
        self.pool.refreshed(lease, sent);
        Ok(Outcome::Ok(Some(Duration::from_secs(left as u64))))
    }
}
