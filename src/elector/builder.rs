//! [`ElectorBuilder`]: an [`Elector`] over a backend with the sidecar's
//! defaults, validated once at [`ElectorBuilder::build`] so that a program
//! that embeds the library meets the same timing rules as the command line
//! (client-go's: the renew interval, plus any fixed drift margin, is
//! shorter than the lease duration).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Elector, ElectorConfig, ElectorConfigError, LeaderState, Observer};
use crate::backend::registry::Connected;
use crate::backend::{CandidateRegistry, ControlStore, LeaseBackend};

/// The lease duration when none is set: 15 s, as the sidecar's
/// `--lease-duration`.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// Builds an [`Elector`]; start with [`Elector::builder`].
///
/// Defaults (the sidecar's): lease duration 15 s, renew interval a third of
/// the lease duration, retry period 2 s, automatic drift margin, health
/// grace equal to the lease duration, no drain, identity `$POD_NAME` or else
/// the host name. The election name has no default.
pub struct ElectorBuilder {
    backend: Arc<dyn LeaseBackend>,
    cfg: ElectorConfig,
    renew_interval: Option<Duration>,
    health_grace: Option<Duration>,
    registry: Option<Arc<dyn CandidateRegistry>>,
    controls: Option<Arc<dyn ControlStore>>,
    observer: Option<Arc<dyn Observer>>,
}

impl std::fmt::Debug for ElectorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorBuilder")
            .field("backend", &self.backend.name())
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// `$POD_NAME` (the Downward API's), else the host name, else empty.
fn default_identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| gethostname::gethostname().into_string().ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl Elector {
    /// A builder of an Elector that campaigns on `backend` (one election
    /// key: the backend is made for one election, e.g.
    /// [`KubeLeaseBackend::new`](crate::backends::KubeLeaseBackend::new) names the Lease).
    pub fn builder(backend: Arc<dyn LeaseBackend>) -> ElectorBuilder {
        ElectorBuilder {
            backend,
            cfg: ElectorConfig::new("", default_identity(), DEFAULT_LEASE_DURATION),
            renew_interval: None,
            health_grace: None,
            registry: None,
            controls: None,
            observer: None,
        }
    }

    /// An Elector over a connected backend: its election, and its
    /// candidate registry and operator controls where it keeps them (see
    /// [`Elector::new`]).
    pub fn connected(
        cfg: ElectorConfig,
        backend: &Connected,
        observer: Option<Arc<dyn Observer>>,
    ) -> (Elector, watch::Receiver<LeaderState>) {
        let (mut elector, rx) = Elector::new(cfg, backend.election.clone(), observer);
        elector.registry = backend.registry.clone();
        elector.controls = backend.controls.clone();
        (elector, rx)
    }
}

impl ElectorBuilder {
    /// The election's name, for logs, the state and events (required; the
    /// backend names the key itself).
    pub fn election(mut self, name: impl Into<String>) -> Self {
        self.cfg.election = name.into();
        self
    }

    /// This candidate's holder identity, unique among the candidates
    /// (default: `$POD_NAME`, else the host name).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.cfg.identity = identity.into();
        self
    }

    /// The lease TTL to ask for (default 15 s): how long the backend keeps
    /// the key without a renewal, so the longest failover after a crash.
    /// The backend may grant more (etcd: whole seconds, at least its minimum).
    pub fn lease_duration(mut self, ttl: Duration) -> Self {
        self.cfg.lease_duration = ttl;
        self
    }

    /// How often the leader renews (default: a third of the lease
    /// duration); must be shorter than the lease duration. Each backend call
    /// gets two thirds of it as its deadline.
    pub fn renew_interval(mut self, every: Duration) -> Self {
        self.renew_interval = Some(every);
        self
    }

    /// Upper bound of the backoff between failed attempts (default 2 s).
    pub fn retry_period(mut self, cap: Duration) -> Self {
        self.cfg.retry_period = cap;
        self
    }

    /// A fixed drift margin subtracted from each granted TTL (default:
    /// the largest of 1 % of the TTL, two renewal round trips and 50 ms).
    pub fn drift_margin(mut self, margin: Duration) -> Self {
        self.cfg.drift_margin = Some(margin);
        self
    }

    /// How long the gate of [`Elector::with_candidacy`] may stay closed
    /// while leading before this candidate resigns (default: the lease
    /// duration).
    pub fn health_grace(mut self, grace: Duration) -> Self {
        self.health_grace = Some(grace);
        self
    }

    /// On shutdown while leading, stop claiming at once but keep the lease
    /// until [`ElectorHandle::release`](super::ElectorHandle::release) or
    /// this much time passes (default: release at once).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.drain_timeout = Some(timeout).filter(|d| !d.is_zero());
        self
    }

    /// This candidate's priority, revision and preemption wait (default:
    /// priority 1, no revision, 10 s; see [`Standing`](super::Standing)).
    pub fn standing(mut self, standing: super::Standing) -> Self {
        self.cfg.standing = standing;
        self
    }

    /// The candidate registry to keep this candidate's record in and to
    /// choose successors from (default: none; the Elector then names no
    /// successor). Give the backend's own
    /// ([`Connected::registry`](crate::backend::registry::Connected::registry)).
    pub fn registry(mut self, registry: Arc<dyn CandidateRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// The operator controls to follow (default: none; never paused by an
    /// operator). Give the backend's own
    /// ([`Connected::controls`](crate::backend::registry::Connected::controls)).
    pub fn controls(mut self, controls: Arc<dyn ControlStore>) -> Self {
        self.controls = Some(controls);
        self
    }

    /// An [`Observer`] told of every campaign, renewal, backend error and
    /// transition (metrics). It is called on the Elector's task: it must not block.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The configuration as it stands, defaults filled in (not validated).
    pub fn config(&self) -> ElectorConfig {
        let mut cfg = self.cfg.clone();
        cfg.renew_interval = self.renew_interval.unwrap_or(cfg.lease_duration / 3);
        cfg.health_grace = self.health_grace.unwrap_or(cfg.lease_duration);
        cfg
    }

    /// Validate and build: the Elector (drive it with
    /// [`Elector::run`] on a task) and the receiver of the state it
    /// publishes.
    ///
    /// # Errors
    /// [`ElectorConfigError`] naming the field at fault: an empty election
    /// or identity, a renew interval (plus drift margin) not shorter than
    /// the lease duration, a zero retry period.
    pub fn build(self) -> Result<(Elector, watch::Receiver<LeaderState>), ElectorConfigError> {
        let cfg = self.config();
        cfg.validate()?;
        let (mut elector, rx) = Elector::new(cfg, self.backend, self.observer);
        elector.registry = self.registry;
        elector.controls = self.controls;
        Ok((elector, rx))
    }
}
