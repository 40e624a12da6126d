//! The backend the sidecar was started on, connected: the election backend
//! and the coordination API over one connection.

use std::sync::Arc;

use crate::backend::LeaseBackend;
use crate::backend::registry::{Settings, unserved_message};
use crate::backend::roster::RosterStore;
use crate::coord::{Coordinator, Unserved};

use super::RunError;

/// The election backend, the coordination API and the failsafe roster
/// (`None` when the backend keeps none) over the same connection.
pub type Backends = (
    Arc<dyn LeaseBackend>,
    Box<dyn Coordinator>,
    Option<Arc<dyn RosterStore>>,
);

/// Connect the backend chosen at start-up. Never switched while running. A
/// backend without coordination gets [`Unserved`], which answers every call
/// with the backends that serve it.
///
/// # Errors
/// [`RunError::Backend`] when the backend settings cannot be used.
pub fn connect(settings: &dyn Settings) -> Result<Backends, RunError> {
    let connected = settings.connect().map_err(RunError::Backend)?;
    let name = connected.election.name();
    let coordination = connected
        .coordination
        .unwrap_or_else(|| Box::new(Unserved::new(name, unserved_message(name))));
    Ok((connected.election, coordination, connected.roster))
}
