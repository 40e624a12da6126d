//! The lease a campaign claims under, sent beside its transaction so a
//! campaign is one round trip: the spare of an earlier campaign while at
//! least half its TTL certainly remains (refreshed by a keep-alive beside
//! the claim), else a new lease whose id we choose, granted beside the
//! claim (etcd accepts a client-chosen id; the grant is on the wire first,
//! and when etcd applied the claim first anyway the claim finds no lease
//! and is sent again, costing the round trip a grant before the claim
//! costs always). Terms usually outlive half a TTL, so a handover's
//! campaign nearly always takes the second way.

use std::time::Duration;

use etcd_client::{
    LeaseClient, LeaseGrantOptions, LeaseGrantResponse, LeaseKeepAliveStream, LeaseKeeper,
};
use tokio::time::Instant;

use super::EtcdBackend;
use super::store::{Lease, ttl_secs};

/// What a claim sends beside its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ahead {
    /// The spare's keep-alive (it is refreshed as the claim is sent).
    Refresh,
    /// The grant of a new lease with our id.
    Grant,
    /// Nothing: the lease exists and is fresh.
    Ready,
}

/// The answer to what went beside a claim.
pub(super) enum Beside {
    /// The keep-alive stream opened.
    Kept(std::result::Result<(LeaseKeeper, LeaseKeepAliveStream), etcd_client::Error>),
    /// The grant's answer.
    Granted(std::result::Result<LeaseGrantResponse, etcd_client::Error>),
    /// Nothing was sent.
    Nothing,
}

/// A new lease id of our choosing (etcd accepts any positive id not in
/// use; 62 random bits make a clash negligible, and a clash fails the grant,
/// never the safety), asking for `ttl`.
pub(super) fn new_lease(ttl: Duration) -> Lease {
    Lease {
        id: (rand::random::<u64>() >> 2) as i64 + 1,
        ttl,
    }
}

/// A lease granted ahead for the next campaign.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spare {
    /// The lease.
    pub(super) lease: Lease,
    /// The send instant of its grant or last refresh.
    pub(super) at: Instant,
}

impl Spare {
    /// Whether it is certainly alive now: at least half its TTL remains.
    fn usable(&self, ttl: Duration) -> bool {
        self.lease.ttl >= ttl && self.at.elapsed() < self.lease.ttl / 2
    }
}

/// Send what `ahead` asks beside a claim under `lease`.
pub(super) async fn send_beside(mut leases: LeaseClient, lease: Lease, ahead: Ahead) -> Beside {
    match ahead {
        Ahead::Refresh => Beside::Kept(leases.keep_alive(lease.id).await),
        Ahead::Grant => {
            let opts = LeaseGrantOptions::new().with_id(lease.id);
            Beside::Granted(leases.grant(ttl_secs(lease.ttl), Some(opts)).await)
        }
        Ahead::Ready => Beside::Nothing,
    }
}

impl EtcdBackend {
    /// The spare lease while usable (refreshed beside the claim:
    /// [`Ahead::Refresh`]), else a lease id of our choosing to be granted
    /// beside the claim ([`Ahead::Grant`]); with the send instant of its
    /// grant or last refresh (for a new id: now, before its grant is sent).
    pub(super) fn lease_ahead(&self, ttl: Duration) -> (Lease, Instant, Ahead) {
        let spare = self.spare.lock().expect("spare lease").take();
        if let Some(s) = spare.filter(|s| s.usable(ttl)) {
            return (s.lease, s.at, Ahead::Refresh);
        }
        (new_lease(ttl), Instant::now(), Ahead::Grant)
    }
}
