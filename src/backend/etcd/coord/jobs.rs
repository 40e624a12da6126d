//! Job claims on etcd: a job is claimed by creating `…/jobs/<queue>/<job>/claim`
//! bound to the claim's lease, and completed by replacing the claim with
//! `…/done` under a lease of the retention time, in one txn that checks the
//! claim is still the one the token names.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdCoord, grant, holds, owner_of};
use crate::backend::coordination::{Outcome, Result, Token, TokenKind, Try};
use crate::backend::etcd::store::revision_of;

impl EtcdCoord {
    /// Claim a job ([`Acquire::Job`](crate::backend::coordination::Acquire::Job)):
    /// one read when it is claimed or completed, else a create bound to a
    /// lease of `ttl` unless a done or claim key exists.
    pub(super) async fn claim_job(
        &self,
        queue: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Try> {
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let done = self.job_key(queue, job, "done");
        // Cheap look first: a claimed or completed job costs one read.
        let peek = Txn::new().and_then(Self::job_state(&done, &claim));
        let peek = self.call("txn", client.txn(peek)).await?;
        if let Some(state) = job_claimed(peek.op_responses().as_slice()) {
            return Ok(state);
        }
        let mut token = Token::new(TokenKind::Job, 0);
        let txn = |lease| {
            token = Token::new(TokenKind::Job, lease);
            Txn::new()
                .when([
                    Compare::create_revision(done.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(claim.clone(), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::put(
                    claim.clone(),
                    format!("{token}|{owner}"),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else(Self::job_state(&done, &claim))
        };
        let created = self.create(&mut client, ttl, txn).await?;
        if created.resp.succeeded() {
            let rev = revision_of(created.resp.header());
            let name = format!("{queue}/{job}");
            return Ok(Try::Acquired(grant(&name, &token, rev, created.lease.ttl)));
        }
        let state = job_claimed(created.resp.op_responses().as_slice());
        Ok(state.unwrap_or_else(|| Try::Held(String::new())))
    }

    /// Complete a claimed job ([`Coordinator::complete`](crate::backend::coordination::Coordinator::complete)):
    /// its done key, under a lease of `retention`, replaces the claim.
    pub(super) async fn complete_job(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        let Some(t) = job_token(token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let done = self.job_key(queue, job, "done");
        let current = self.call("get", client.get(claim.clone(), None)).await?;
        let Some(kv) = current.kvs().first() else {
            // Completed by us already (a retry)? Then it is done.
            let d = self.call("get", client.get(done.clone(), None)).await?;
            return Ok(match d.kvs().first() {
                Some(kv) if holds(kv.value(), token) => Outcome::Ok(None),
                Some(_) => Outcome::NotYours,
                None => Outcome::Gone,
            });
        };
        if !holds(kv.value(), token) {
            return Ok(Outcome::NotYours);
        }
        // The done key lives under a lease of the retention time.
        let txn = |keep| {
            Txn::new()
                .when([Compare::mod_revision(
                    claim.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([
                    TxnOp::put(
                        done.clone(),
                        kv.value().to_vec(),
                        Some(PutOptions::new().with_lease(keep)),
                    ),
                    TxnOp::delete(claim.clone(), None),
                ])
        };
        let created = self.create(&mut client, retention, txn).await?;
        if !created.resp.succeeded() {
            return Ok(Outcome::NotYours);
        }
        self.drop_lease(&mut client, t.lease).await;
        Ok(Outcome::Ok(None))
    }

    /// Renew the claim `token` holds
    /// ([`Coordinator::renew`](crate::backend::coordination::Coordinator::renew) of a job):
    /// one keep-alive of its lease once the claim key is seen to be the token's.
    pub(super) async fn renew_job(&self, queue: &str, job: &str, token: &str) -> Result<Outcome> {
        let Some(t) = job_token(token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        self.renew_key(&mut client, &claim, token, t.lease).await
    }

    /// Give back the claim `token` holds
    /// ([`Coordinator::release`](crate::backend::coordination::Coordinator::release) of a job):
    /// its claim key is deleted if it is still the token's (a done key is
    /// never touched), then its lease is revoked off the answer path.
    pub(super) async fn release_job(&self, queue: &str, job: &str, token: &str) -> Result<Outcome> {
        let Some(t) = job_token(token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let current = self.call("get", client.get(claim.clone(), None)).await?;
        let Some(kv) = current.kvs().first() else {
            return Ok(Outcome::Gone);
        };
        if !holds(kv.value(), token) {
            return Ok(Outcome::NotYours);
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                claim.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(claim, None)]);
        if !self.call("txn", client.txn(txn)).await?.succeeded() {
            return Ok(Outcome::NotYours);
        }
        self.revoke_later(client, t.lease);
        Ok(Outcome::Ok(None))
    }

    /// A job's done and claim keys, as two gets of one txn.
    fn job_state(done: &str, claim: &str) -> [TxnOp; 2] {
        [TxnOp::get(done, None), TxnOp::get(claim, None)]
    }
}

/// The parts of a job claim's token issued on etcd.
fn job_token(token: &str) -> Option<Token> {
    Token::parse(token).filter(|t| t.kind == TokenKind::Job && t.lease > 0)
}

/// A job's state from the answers of [`EtcdCoord::job_state`]: `None` when
/// it is neither completed nor claimed.
fn job_claimed(ops: &[TxnOpResponse]) -> Option<Try> {
    if matches!(ops.first(), Some(TxnOpResponse::Get(g)) if !g.kvs().is_empty()) {
        return Some(Try::Completed);
    }
    match ops.get(1) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| Try::Held(owner_of(kv.value()))),
        _ => None,
    }
}
