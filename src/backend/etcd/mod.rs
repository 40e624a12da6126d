//! The etcd backend: one key `<prefix><election>` bound to a lease.
//!
//! - **Campaign**: a lease granted ahead (or now), then one transaction: if
//!   the key's `create_revision == 0` put our identity with the lease, else
//!   read the key. The fencing token is the key's `mod_revision`: the
//!   revision of the write that began the term (strictly larger for every
//!   term; nobody else writes the key during a term, [`handover`]). A key
//!   whose holder we saw is taken only when its holder's release mark
//!   names its lease or, without one, once
//!   `LeaseTimeToLive` says the lease is gone: a key deleted by hand does not
//!   end the holder's term (DESIGN.md, "A follower takes over only when the
//!   previous term is over"); see [`claim`].
//! - **Renew**: one keep-alive on a stream we own (etcd-client leaves the
//!   cadence to the caller; an answer with `ttl <= 0` means the lease is gone),
//!   and in the same round trip a read of the key to prove it is still bound to
//!   our lease. Ownership is decided by lease id, never by identity.
//! - **Release**: one transaction deletes the key, marks the release and
//!   names the successor the Elector chose (if any; the backend never lists
//!   the registry here); then the lease is revoked ([`claim`]). With a next
//!   lease kept, it puts the key naming the successor instead: the
//!   handover by one write ([`handover`]); a successor of another TTL
//!   swaps the key onto a lease of its own ([`swap`]).
//! - **Operations**: the candidate registry (`registry`), the pause and
//!   the switchover request (`controls`); the campaign transaction
//!   honours the pause and the named successor ([`claim`]).
//! - **Watch**: a watch on the key from the revision after the last read.
//!
//! The client, the error classification and the lease life cycle live in
//! [`store`], shared with the coordination API.

mod ahead;
pub mod claim;
mod controls;
pub mod coord;
pub mod flags;
mod handover;
mod registry;
mod release;
mod roster;
pub mod shards;
pub mod store;
mod swap;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, EventType, WatchOptions};
use tokio::sync::Mutex;
use tracing::debug;

use self::store::{BACKEND, EtcdStore, lease_hex, revision_of};
use super::candidates::{Candidate, Listed};
use super::controls::Controls;
use super::{
    BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term, TermId,
};
use super::{CandidateRegistry, ControlStore};

/// How to reach etcd. Secrets are held in memory only and never logged.
#[derive(Clone, Default)]
pub struct EtcdOptions {
    /// Client URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// PEM of the CA that signed the servers' certificates (TLS).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key (mutual TLS).
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// User name and password (etcd auth).
    pub credentials: Option<(String, String)>,
    /// Deadline for establishing a connection.
    pub connect_timeout: Duration,
    /// Interval of HTTP/2 keep-alive pings, so a connection that silently stops
    /// answering fails its streams (watches) instead of hanging.
    pub keepalive_interval: Duration,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .finish()
    }
}

struct KeepAlive {
    lease: i64,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    /// Set while a keep-alive is outstanding. If the caller's timeout dropped
    /// that call, its late answer could be mistaken for the next one's, so a
    /// stream found in flight is replaced.
    in_flight: bool,
}

/// The etcd [`LeaseBackend`] for one election key.
pub struct EtcdBackend {
    key: Vec<u8>,
    store: Arc<EtcdStore>,
    keep_alive: Mutex<Option<KeepAlive>>,
    /// The lease and the value of this process's last write of each record
    /// it keeps (an unchanged record is renewed by one keep-alive).
    registry_lease: Mutex<std::collections::HashMap<String, (i64, Vec<u8>)>>,
    /// The revision of the last registry read or change reported.
    registry_rev: std::sync::Mutex<i64>,
    /// The successor key's `mod_revision` this candidate last found naming
    /// another, and when it first found it (its own clock).
    named_seen: std::sync::Mutex<Option<(i64, tokio::time::Instant)>>,
    /// A lease granted ahead by a campaign that did not win ([`claim`]).
    spare: std::sync::Mutex<Option<ahead::Spare>>,
    /// The failsafe roster this process's next campaign or renewal writes.
    staged: std::sync::Mutex<Option<crate::backend::roster::Roster>>,
    /// A roster was ever staged: failsafe is on (no handover by one write).
    failsafe: std::sync::atomic::AtomicBool,
    /// The leader's spare lease for its successor ([`handover`]).
    next_lease: Arc<std::sync::Mutex<Option<handover::NextLease>>>,
    /// The put of the key that ended the watched term ([`handover`]).
    handed: std::sync::Mutex<Option<handover::Handed>>,
    /// The put (lease, `mod_revision`) this process last adopted: a put
    /// starts one term ([`handover`]).
    adopted: std::sync::Mutex<Option<(i64, i64)>>,
}

impl EtcdBackend {
    /// The election key, e.g. `/leader-elector/billing`.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// A backend for the key `key` (`<prefix><election>`). Does not connect:
    /// the first call does, so an etcd that is down at start-up is not fatal.
    pub fn new(key: impl Into<Vec<u8>>, options: EtcdOptions) -> Arc<Self> {
        Arc::new(EtcdBackend {
            key: key.into(),
            store: Arc::new(EtcdStore::new(options)),
            keep_alive: Mutex::new(None),
            registry_lease: Mutex::default(),
            registry_rev: std::sync::Mutex::new(0),
            named_seen: std::sync::Mutex::new(None),
            spare: std::sync::Mutex::new(None),
            staged: std::sync::Mutex::new(None),
            failsafe: std::sync::atomic::AtomicBool::new(false),
            next_lease: Arc::default(),
            handed: std::sync::Mutex::new(None),
            adopted: std::sync::Mutex::new(None),
        })
    }

    /// The store (client, classification, lease life cycle) this backend
    /// shares with the coordination API.
    pub fn store(&self) -> Arc<EtcdStore> {
        self.store.clone()
    }

    /// The shared etcd client (connecting on first use).
    ///
    /// # Errors
    /// A classified [`BackendError`] when etcd cannot be reached or rejects us.
    pub async fn client(&self) -> Result<Client> {
        self.store.client().await
    }

    /// Classify an etcd-client error (by gRPC code and error type); see
    /// [`EtcdStore::classify`].
    pub fn classify(&self, err: etcd_client::Error, authenticating: bool) -> BackendError {
        self.store.classify(err, authenticating)
    }

    /// What a renewal of `term` whose keep-alive answered `ttl` seconds
    /// found the key to be (`kv`, read in the same round trip); after a
    /// renewal, the staged roster and the next lease ([`handover`]).
    async fn renewal(
        &self,
        kv: Option<&etcd_client::KeyValue>,
        term: &Term,
        ttl: i64,
        client: &Client,
    ) -> Result<Renewal> {
        let lease = term.holder.term_id.number().unwrap_or(0);
        match kv {
            None => Ok(Renewal::Lost(LostReason::KeyDeleted)),
            Some(kv) if kv.lease() != lease => Ok(Renewal::Lost(LostReason::KeyOverwritten)),
            // Written by someone else during the term, even under our lease.
            Some(kv) if kv.mod_revision().max(0) as u64 != term.holder.fencing_token => {
                Ok(Renewal::Lost(LostReason::KeyOverwritten))
            }
            Some(_) if !self.write_staged_roster(lease).await? => {
                Ok(Renewal::Lost(LostReason::KeyOverwritten))
            }
            Some(_) => {
                self.keep_next_lease(client, term.granted);
                Ok(Renewal::Renewed {
                    ttl: Duration::from_secs(ttl as u64),
                    servers: None,
                })
            }
        }
    }

    fn holder_from(&self, kv: &etcd_client::KeyValue, revision: i64) -> Holder {
        Holder {
            identity: String::from_utf8_lossy(kv.value()).into_owned(),
            // The revision of the write that began the term ([`handover`]).
            fencing_token: kv.mod_revision().max(0) as u64,
            term_id: TermId::numbered(kv.lease(), lease_hex(kv.lease())),
            revision: Some(revision),
            expires_in: None,
        }
    }

    /// Drop the keep-alive stream of `lease` (its term is ending).
    async fn forget_keep_alive(&self, lease: i64) {
        let mut guard = self.keep_alive.lock().await;
        if matches!(guard.as_ref(), Some(k) if k.lease == lease) {
            *guard = None;
        }
    }

    /// The key's holder now, with the revision of the read.
    async fn read_key(&self, client: &mut Client) -> Result<(Option<Holder>, i64)> {
        let resp = self
            .store
            .call(None, "get", client.get(self.key.clone(), None))
            .await?;
        let revision = revision_of(resp.header());
        let holder = resp.kvs().first().map(|kv| self.holder_from(kv, revision));
        Ok((holder, revision))
    }

    /// One watch of the key from revision `from`: `Ok(None)` when the key
    /// changed term, `Ok(Some(compacted))` when etcd compacted the history.
    async fn watch_from(
        &self,
        client: &mut Client,
        from: i64,
        seen_lease: i64,
    ) -> Result<Option<i64>> {
        let opts = WatchOptions::new().with_start_revision(from);
        let mut stream = self
            .store
            .call(None, "watch", client.watch(self.key.clone(), Some(opts)))
            .await?;
        loop {
            let msg = stream
                .message()
                .await
                .map_err(|e| self.classify(e, false))?;
            let Some(msg) = msg else {
                return Err(BackendError::WatchEnded {
                    backend: BACKEND,
                    reason: "stream closed".into(),
                });
            };
            if msg.canceled() {
                if msg.compact_revision() > 0 {
                    return Ok(Some(msg.compact_revision()));
                }
                return Err(BackendError::WatchEnded {
                    backend: BACKEND,
                    reason: format!("cancelled: {}", msg.cancel_reason()),
                });
            }
            let revision = msg.header().map_or(0, |h| h.revision());
            for event in msg.events() {
                match event.event_type() {
                    EventType::Delete => {
                        self.saw_put(None, revision, seen_lease);
                        return Ok(None);
                    }
                    EventType::Put => {
                        let lease = event.kv().map_or(0, |kv| kv.lease());
                        if lease != seen_lease || seen_lease == 0 {
                            self.saw_put(event.kv(), revision, seen_lease);
                            return Ok(None);
                        }
                    }
                }
            }
        }
    }
}

#[async_trait]
impl LeaseBackend for EtcdBackend {
    fn about(&self) -> &'static crate::backend::About {
        BACKEND
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        // A put the watch saw: a handover to us, or another holder.
        if let Some(answer) = self.after_put(identity, ttl, previous).await? {
            return Ok(answer);
        }
        match self.campaign_after(identity, ttl, previous).await? {
            // The key names us under a lease not ours: a handover whose
            // put the watch did not deliver (we were waiting), or an
            // earlier process of ours (then the adoption refuses).
            Campaign::Following(h) if h.identity == identity => {
                let lease = h.term_id.number().unwrap_or(0);
                let rev = h.fencing_token as i64;
                Ok(self
                    .adopt(identity, ttl, lease, rev)
                    .await?
                    .unwrap_or(Campaign::Following(h)))
            }
            other => Ok(other),
        }
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let mut client = self.client().await?;
        Ok(self.read_key(&mut client).await?.0)
    }

    async fn inspect(&self) -> Result<Option<Holder>> {
        let Some(mut holder) = self.read().await? else {
            return Ok(None);
        };
        let lease = holder.term_id.number().unwrap_or(0);
        if lease != 0 {
            let client = self.client().await?;
            let left = self.store.time_to_live(&client, lease, None).await?;
            // etcd counts whole seconds; <= 0: the lease is gone, the key with it.
            holder.expires_in = Some(Duration::from_secs(left.max(0) as u64));
        }
        Ok(Some(holder))
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let client = self.client().await?;
        let lease = term.holder.term_id.number().unwrap_or(0);
        let mut guard = self.keep_alive.lock().await;
        let reuse = matches!(guard.as_ref(), Some(k) if k.lease == lease && !k.in_flight);
        if !reuse {
            *guard = None;
            let (keeper, stream) = client
                .lease_client()
                .keep_alive(lease)
                .await
                .map_err(|e| self.classify(e, false))?;
            *guard = Some(KeepAlive {
                lease,
                keeper,
                stream,
                in_flight: false,
            });
        }
        let ka = guard.as_mut().expect("keep-alive stream was just set");
        ka.in_flight = true;
        let keep_alive = async {
            ka.keeper.keep_alive().await?;
            ka.stream.message().await
        };
        let mut kv = client.kv_client();
        let read = kv.get(self.key.clone(), None);
        let (answer, read) = tokio::join!(keep_alive, read);
        let answer = match answer {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                *guard = None;
                return Err(self
                    .store
                    .unreachable("keep-alive stream closed by the server".into()));
            }
            Err(e) => {
                *guard = None;
                return Err(self.store.failed(e).await);
            }
        };
        ka.in_flight = false;
        if answer.ttl() <= 0 {
            *guard = None;
            return Ok(Renewal::Lost(LostReason::LeaseExpired));
        }
        let read = read.map_err(|e| self.classify(e, false))?;
        drop(guard);
        self.renewal(read.kvs().first(), term, answer.ttl(), &client)
            .await
    }

    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        self.release_to(term, successor).await
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        let mut client = self.client().await?;
        let seen_lease = seen.term_id.number().unwrap_or(0);
        let mut from = seen.revision.unwrap_or(0) + 1;
        loop {
            let Some(compacted) = self.watch_from(&mut client, from, seen_lease).await? else {
                return Ok(());
            };
            // etcd compacted the history we asked for (a long term outlives
            // the compaction window). The events we missed no longer exist;
            // what matters is whether the key still belongs to the same term.
            // Read it, and watch again from the revision of that read, which
            // etcd still has.
            match self.read_key(&mut client).await? {
                (Some(h), revision)
                    if seen_lease != 0 && h.term_id.number().unwrap_or(0) == seen_lease =>
                {
                    debug!(
                        compacted,
                        revision,
                        "watch history compacted; watching again from the current revision"
                    );
                    from = revision + 1;
                }
                _ => return Ok(()),
            }
        }
    }
}

#[async_trait]
impl CandidateRegistry for EtcdBackend {
    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.publish(candidate, ttl).await
    }

    async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
        self.withdraw(identity).await
    }

    async fn candidates(&self) -> Result<Vec<Listed>> {
        self.list().await
    }

    async fn watch_candidates(&self) -> Result<()> {
        self.watch_registry().await
    }

    /// The record is bound to a lease: etcd deletes it at its TTL, so a
    /// leader keeps renewing it (each renewal writes it again).
    fn deletes_lapsed(&self) -> bool {
        true
    }
}

#[async_trait]
impl ControlStore for EtcdBackend {
    async fn controls(&self) -> Result<Controls> {
        Ok(self.read_controls().await?.0)
    }

    async fn watch_controls(&self, seen: &Controls) -> Result<Controls> {
        self.watch_controls_from(seen).await
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        self.pause(paused).await
    }

    async fn request_switchover(&self, to: Option<&str>) -> Result<()> {
        self.switchover(to).await
    }
}
