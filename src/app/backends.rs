//! The backend the sidecar was started on, connected: the election backend
//! and the coordination API over one connection.

use crate::backend::registry::{Connected, Settings, unserved_message};
use crate::coord::{Coordinator, Unserved};

use super::RunError;

/// The election backend (with its registry and controls, its
/// `coordination` taken out) and the coordination API over the same
/// connection.
pub type Backends = (Connected, Box<dyn Coordinator>);

/// Connect the backend chosen at start-up. Never switched while running. A
/// backend without coordination gets [`Unserved`], which answers every call
/// with the backends that serve it.
///
/// # Errors
/// [`RunError::Backend`] when the backend settings cannot be used.
pub fn connect(settings: &dyn Settings) -> Result<Backends, RunError> {
    let mut connected = settings.connect().map_err(RunError::Backend)?;
    let name = connected.election.name();
    let coordination = connected
        .coordination
        .take()
        .unwrap_or_else(|| Box::new(Unserved::new(name, unserved_message(name))));
    Ok((connected, coordination))
}
