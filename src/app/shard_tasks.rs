//! The shard keeper's row (`--shards N`): it stops with the Elector's
//! shutdown (stop claiming, then close the session, whose records go with
//! it), and the state `/shards` reads.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::none;
use super::tasks::{Stop, Task};
use crate::backend::shards::ShardStore;
use crate::config::Config;
use crate::shards::http::ShardsState;
use crate::shards::keeper::{Keeper, KeeperConfig};

/// The keeper's row (`None` without `--shards`) and `/shards`' state.
/// `gate` is the candidacy gate (`None`: always open).
pub fn spawn_keeper(
    cfg: &Config,
    store: Option<Arc<dyn ShardStore>>,
    gate: Option<watch::Receiver<bool>>,
    shutdown: &CancellationToken,
) -> (Option<Task>, ShardsState) {
    let e = &cfg.elector;
    let mut state = ShardsState {
        election: e.election.clone(),
        identity: e.identity.clone(),
        shards: cfg.shards.unwrap_or(0),
        view: None,
    };
    let (Some(shards), Some(store)) = (cfg.shards, store) else {
        return (None, state);
    };
    let margin = e
        .drift_margin
        .unwrap_or_else(|| (e.lease_duration / 100).max(Duration::from_millis(50)));
    let keeper_cfg = KeeperConfig {
        identity: e.identity.clone(),
        shards,
        ttl: e.lease_duration,
        renew_interval: e.renew_interval,
        margin,
        call_timeout: e.call_timeout(),
    };
    let (keeper, view) = Keeper::new(keeper_cfg, store);
    state.view = Some(view);
    let gate = gate.unwrap_or_else(|| watch::channel(true).1);
    let fut = keeper.run(gate, shutdown.clone());
    let span = tracing::info_span!("shards", election = %e.election);
    let task = Task::spawn("shards", Stop::Shutdown, e.call_timeout() + Duration::from_secs(1), span, none(fut))
        .late("the shard keeper did not close its session in time; its shards move when the session's TTL runs out");
    (Some(task), state)
}
