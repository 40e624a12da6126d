//! The candidate registry in `leader-elector status`: one row per record
//! (identity, priority, revision, ready, age), where the backend keeps a
//! registry (`backend::candidates`).

use std::time::Duration;

use serde::Serialize;

use crate::backend::LeaseBackend;
use crate::backend::candidates::Listed;

/// One candidate as `status` shows it.
#[derive(Serialize, Debug, PartialEq)]
pub struct CandidateRow {
    /// The candidate's identity.
    pub identity: String,
    /// Its priority (0: never leads).
    pub priority: u32,
    /// The revision it runs (empty when unknown).
    pub revision: String,
    /// Whether it may lead now.
    pub ready: bool,
    /// Seconds since its last renewal by this machine's wall clock.
    pub age_seconds: Option<u64>,
    /// `false` once the record outlived its TTL (its candidate is likely gone).
    pub alive: bool,
}

impl From<&Listed> for CandidateRow {
    fn from(l: &Listed) -> CandidateRow {
        CandidateRow {
            identity: l.candidate.identity.clone(),
            priority: l.candidate.priority,
            revision: l.candidate.revision.clone(),
            ready: l.candidate.ready,
            age_seconds: l.age.map(|a| a.as_secs()),
            alive: l.alive(),
        }
    }
}

/// The registry's records, sorted by identity; `None` when the backend
/// has none, or it could not be read within `limit` (a warning on stderr:
/// the leader is still reported).
pub async fn read(backend: &dyn LeaseBackend, limit: Duration) -> Option<Vec<CandidateRow>> {
    match tokio::time::timeout(limit, backend.candidates()).await {
        Ok(Ok(listed)) => {
            let mut rows: Vec<CandidateRow> = listed?.iter().map(CandidateRow::from).collect();
            rows.sort_by(|a, b| a.identity.cmp(&b.identity));
            Some(rows)
        }
        Ok(Err(e)) => {
            crate::say!("warning: cannot list the candidates: {}", e.report());
            None
        }
        Err(_) => {
            crate::say!("warning: listing the candidates timed out");
            None
        }
    }
}

/// The candidates as a table below the status table (empty without a registry).
pub fn table(rows: Option<&[CandidateRow]>) -> String {
    let Some(rows) = rows else {
        return String::new();
    };
    let mut out = format!("\n\nCANDIDATES ({})", rows.len());
    if !rows.is_empty() {
        out.push_str("\nIDENTITY  PRIORITY  REVISION  READY  AGE");
    }
    for r in rows {
        let age = r.age_seconds.map_or("-".to_owned(), |s| format!("{s}s"));
        let lapsed = if r.alive { "" } else { " (lapsed)" };
        let revision = if r.revision.is_empty() {
            "-"
        } else {
            &r.revision
        };
        out.push_str(&format!(
            "\n{}  {}  {}  {}  {age}{lapsed}",
            r.identity, r.priority, revision, r.ready
        ));
    }
    out
}
