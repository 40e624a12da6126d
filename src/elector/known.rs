//! What the Elector knows of its election's operations, in one place: the
//! controls as the controls follower last read them and the candidate
//! registry as the leader last listed it. Written by those two followers,
//! read by the precedence decisions ([`super::precedence`]): a release
//! names its successor from the registry already known (no extra read on
//! the release path), and the lead loop and the waits wake when it changes.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use super::precedence::Rules;
use crate::backend::candidates::Listed;
use crate::backend::controls::Controls;

/// The controls and the registry as last read (see the module docs).
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    /// The controls as last read (default: none set, or no controls).
    pub(super) controls: Controls,
    /// The registry as this leader last listed it during its current term;
    /// `None` before the first list of a term (or without a registry).
    pub(super) registry: Option<Arc<Vec<Listed>>>,
}

impl Known {
    /// The precedence rules for `me` now.
    pub(super) fn rules<'a>(&'a self, me: &'a str) -> Rules<'a> {
        Rules {
            me,
            paused: self.controls.paused,
            pinned: self.controls.pinned(),
            now: SystemTime::now(),
        }
    }
}

/// The shared, watched [`Known`].
pub(super) type Shared = Arc<watch::Sender<Known>>;

/// A new shared [`Known`].
pub(super) fn shared() -> Shared {
    Arc::new(watch::channel(Known::default()).0)
}

/// Whether an unhealthy app may end `me`'s term now (not while paused),
/// marking the controls seen.
pub(super) fn may_step_down(rx: &mut watch::Receiver<Known>, me: &str) -> bool {
    rx.borrow_and_update().rules(me).may_step_down()
}
