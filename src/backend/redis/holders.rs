//! The holders an election's servers show: one server's stored value
//! `<token>|<fencing>|<identity>` with its `PTTL`, and the holder a quorum of
//! servers agrees on (Redlock), with the leader's token for the term.

use std::time::Duration;

use super::lua::Stored;
use crate::backend::Holder;

/// A parsed holder value `<token>|<fencing>|<identity>` with its `PTTL`.
pub(super) fn parse_value(value: &str, pttl_ms: i64) -> Holder {
    let s = Stored::parse(value);
    Holder {
        identity: s.owner,
        fencing_token: s.fencing,
        term_id: crate::backend::TermId::new(s.token),
        revision: None,
        // PTTL -1: a key without expiry (written by someone else); -2: gone.
        // Neither says when to look again: the Elector caps this by its
        // retry period instead of retrying at once.
        expires_in: Some(if pttl_ms < 0 {
            NO_EXPIRY_HINT
        } else {
            Duration::from_millis(pttl_ms as u64)
        }),
    }
}

/// Stand-in expiry for a key without a TTL; the Elector waits at most its
/// retry period.
const NO_EXPIRY_HINT: Duration = Duration::from_secs(3600);

/// The holder of the term seen on at least `quorum` of `held`, with the
/// largest fencing token among those copies (the leader's token: Redlock
/// writes it into every copy it can, and any quorum of copies includes one)
/// and the earliest expiry. `None` when no term has a quorum.
pub(super) fn quorum_holder(held: &[Holder], quorum: usize) -> Option<Holder> {
    for h in held {
        let same: Vec<&Holder> = held.iter().filter(|o| o.term_id == h.term_id).collect();
        if same.len() >= quorum {
            let mut holder = h.clone();
            holder.fencing_token = same.iter().map(|o| o.fencing_token).max().unwrap_or(0);
            holder.expires_in = same.iter().filter_map(|o| o.expires_in).min();
            return Some(holder);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_with_pipes_in_the_identity() {
        let h = parse_value("abc|42|pod|x", 1500);
        assert_eq!(h.term_id, "abc");
        assert_eq!(h.fencing_token, 42);
        assert_eq!(h.identity, "pod|x");
        assert_eq!(h.expires_in, Some(Duration::from_millis(1500)));
    }
}
