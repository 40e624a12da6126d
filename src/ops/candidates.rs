//! The candidate registry in `leader-elector status`: one row per record
//! (identity, priority, revision, ready, age), where the backend keeps a
//! registry (`backend::candidates`).

use std::time::Duration;

use serde::Serialize;

use crate::backend::CandidateRegistry;
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
    /// Until when it is frozen (RFC 3339), while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_until: Option<String>,
    /// Seconds since its last renewal by this machine's wall clock (etcd:
    /// since the record's last write; a renewal by keep-alive does not
    /// rewrite it).
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
            frozen_until: l
                .candidate
                .frozen_until
                .filter(|t| *t > std::time::SystemTime::now())
                .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            age_seconds: l.age.or(l.written_ago).map(|a| a.as_secs()),
            alive: l.alive(),
        }
    }
}

/// The registry's records, sorted by identity; `None` when the backend
/// has none, or it could not be read within `limit` (a warning on stderr:
/// the leader is still reported).
pub async fn read(
    registry: Option<&dyn CandidateRegistry>,
    limit: Duration,
) -> Option<Vec<CandidateRow>> {
    match tokio::time::timeout(limit, registry?.candidates()).await {
        Ok(Ok(listed)) => {
            let mut rows: Vec<CandidateRow> = listed.iter().map(CandidateRow::from).collect();
            rows.sort_by(|a, b| a.identity.cmp(&b.identity));
            Some(rows)
        }
        Ok(Err(e)) => {
            crate::say!("warning: cannot list the candidates: {}", e.report_once());
            None
        }
        Err(_) => {
            crate::say!("warning: listing the candidates timed out");
            None
        }
    }
}

/// The candidates as a table below the status table (empty without a
/// registry), each column as wide as its widest cell.
pub fn table(rows: Option<&[CandidateRow]>) -> String {
    let Some(rows) = rows else {
        return String::new();
    };
    let mut out = format!("\n\nCANDIDATES ({})", rows.len());
    if rows.is_empty() {
        return out;
    }
    let cells: Vec<[String; 5]> = rows.iter().map(cells).collect();
    let head = ["IDENTITY", "PRIORITY", "REVISION", "READY", "AGE"].map(str::to_owned);
    let mut widths = head.clone().map(|h| h.len());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for row in std::iter::once(&head).chain(&cells) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push('\n');
        out.push_str(line.join("  ").trim_end());
    }
    out
}

/// One row's cells, in the header's order.
fn cells(r: &CandidateRow) -> [String; 5] {
    let age = r.age_seconds.map_or("-".to_owned(), |s| format!("{s}s"));
    let lapsed = if r.alive { "" } else { " (lapsed)" };
    let revision = if r.revision.is_empty() {
        "-"
    } else {
        &r.revision
    };
    let ready = match &r.frozen_until {
        Some(t) => format!("{} (frozen until {t})", r.ready),
        None => r.ready.to_string(),
    };
    [
        r.identity.clone(),
        r.priority.to_string(),
        revision.to_owned(),
        ready,
        format!("{age}{lapsed}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, priority: u32, frozen: Option<&str>, age: Option<u64>) -> CandidateRow {
        CandidateRow {
            identity: id.into(),
            priority,
            revision: String::new(),
            ready: frozen.is_none(),
            frozen_until: frozen.map(str::to_owned),
            age_seconds: age,
            alive: true,
        }
    }

    #[test]
    fn candidate_rows_are_aligned_with_their_header() {
        let rows = [
            row("pod-a-long-name", 5, None, Some(3)),
            row("b", 10, Some("2026-12-03T14:00:00Z"), None),
        ];
        let text = table(Some(&rows));
        let lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("CANDIDATES"))
            .skip(1)
            .collect();
        let frozen = "false (frozen until 2026-12-03T14:00:00Z)";
        let w = frozen.len();
        assert_eq!(
            lines,
            [
                format!("IDENTITY         PRIORITY  REVISION  {:<w$}  AGE", "READY"),
                format!("pod-a-long-name  5         -         {:<w$}  3s", "true"),
                format!("b                10        -         {frozen}  -"),
            ]
        );
    }
}
