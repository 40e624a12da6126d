//! The backends the sidecar can be started on: from the checked backend
//! settings to the election backend and the coordination API over one
//! connection.

use std::sync::Arc;

use crate::backend::LeaseBackend;
use crate::backend::etcd::EtcdBackend;
use crate::backend::kubernetes::KubeLeaseBackend;
use crate::backend::redis::RedisBackend;
use crate::config::BackendConfig;
use crate::coord::Coordinator;
use crate::coord::etcd::EtcdCoord;
use crate::coord::kubernetes::KubeCoord;
use crate::coord::redis::RedisCoord;

use super::RunError;

/// The election backend and the coordination API over the same connection.
pub type Backends = (Arc<dyn LeaseBackend>, Box<dyn Coordinator>);

/// Build the backend chosen at start-up. Never switched while running.
///
/// # Errors
/// [`RunError::Backend`] when the backend settings cannot be used.
/// Also returns the coordination API over the same connection.
pub fn connect(cfg: &BackendConfig) -> Result<Backends, RunError> {
    Ok(match cfg {
        BackendConfig::Etcd {
            key,
            prefix,
            options,
        } => {
            let backend = EtcdBackend::new(key.clone(), options.clone());
            // Coordination calls are not on the election's renew path: the
            // election's call timeout, but at least the coordination default.
            let coord = Box::new(
                EtcdCoord::new(backend.clone(), prefix).with_deadline(
                    options
                        .connect_timeout
                        .max(crate::coord::etcd::DEFAULT_DEADLINE),
                ),
            );
            (backend, coord)
        }
        BackendConfig::Redis {
            prefix,
            election,
            options,
        } => {
            let backend =
                RedisBackend::new(prefix, election, options.clone()).map_err(RunError::Backend)?;
            let coord = Box::new(RedisCoord::new(backend.clone()));
            (backend, coord)
        }
        BackendConfig::Kubernetes { name, options } => (
            KubeLeaseBackend::new(name.clone(), options.clone()),
            Box::new(KubeCoord),
        ),
    })
}
