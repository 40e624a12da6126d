//! The in-memory backend's failsafe roster: a record without a TTL,
//! written by a campaign or a renewal in the same step as the term, and
//! the members' applications with a TTL on the tokio clock.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::BackendError;
use crate::backend::roster::{Member, Roster, RosterStore};

/// The roster, what each identity's next write carries, and the applications.
#[derive(Default)]
pub(super) struct Rosters {
    roster: Option<Roster>,
    staged: HashMap<String, Roster>,
    applications: Vec<(Member, Instant)>,
}

impl Rosters {
    /// A write of `identity`'s term succeeded: the roster it staged is
    /// written with it.
    pub(super) fn write_staged(&mut self, identity: &str) {
        if let Some(r) = self.staged.remove(identity) {
            self.roster = Some(r);
        }
    }
}

impl MemoryBackend {
    /// The roster as written (for tests; no fault applies).
    pub fn written_roster(&self) -> Option<Roster> {
        self.inner.lock().unwrap().roster.roster.clone()
    }
}

#[async_trait]
impl RosterStore for MemoryBackend {
    async fn roster(&self) -> Result<Option<Roster>, BackendError> {
        Ok(self.check()?.roster.roster.clone())
    }

    async fn apply(&self, member: &Member, ttl: Duration) -> Result<(), BackendError> {
        let mut inner = self.check()?;
        let apps = &mut inner.roster.applications;
        apps.retain(|(m, _)| m.identity != member.identity);
        apps.push((member.clone(), Instant::now() + ttl));
        Ok(())
    }

    async fn withdraw(&self, identity: &str) -> Result<(), BackendError> {
        let mut inner = self.check()?;
        inner
            .roster
            .applications
            .retain(|(m, _)| m.identity != identity);
        Ok(())
    }

    async fn applicants(&self) -> Result<Vec<Member>, BackendError> {
        let inner = self.check()?;
        let now = Instant::now();
        let alive = inner
            .roster
            .applications
            .iter()
            .filter(|(_, until)| *until > now);
        Ok(alive.map(|(m, _)| m.clone()).collect())
    }

    fn stage(&self, identity: &str, roster: Roster) {
        let mut inner = self.inner.lock().unwrap();
        inner.roster.staged.insert(identity.to_owned(), roster);
    }
}
