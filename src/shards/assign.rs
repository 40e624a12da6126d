//! Which member owns which shard: balanced, and moving as few shards as a
//! balanced result allows.

use std::cmp::Reverse;

/// Each shard's owner, indexed by shard id (`None`: nobody owns it).
pub type OwnerMap = Vec<Option<String>>;

/// The owner map after a membership change, from `members` (the live, ready
/// members: order and repeats do not matter) and `current` (the map now,
/// one entry per shard; owners that are no longer members count as none).
///
/// With `m` members and `N = current.len()` shards, every member owns
/// `⌊N/m⌋` or `⌈N/m⌉` shards. The `N mod m` larger shares go to the members
/// that own the most shards now (ties: the smaller identity), each member
/// keeps its current shards up to its share (the lowest ids first), and the
/// shards left over go, lowest id first, to the members below their share
/// in identity order. That keeps the most shards in place a balanced map
/// can keep, so it moves the fewest; from a balanced map, one join or one
/// leave moves no shard between two members that both stay (the tests
/// check both over random sequences of joins and leaves).
///
/// Deterministic: every member that sees the same membership and the same
/// map computes the same result. No member: every shard owned by none.
pub fn assign(members: &[String], current: &[Option<String>]) -> OwnerMap {
    let mut members: Vec<&str> = members.iter().map(String::as_str).collect();
    members.sort_unstable();
    members.dedup();
    let n = current.len();
    if members.is_empty() {
        return vec![None; n];
    }
    let owned = |m: &str| -> Vec<usize> {
        (0..n)
            .filter(|&i| current[i].as_deref() == Some(m))
            .collect()
    };
    let held: Vec<Vec<usize>> = members.iter().map(|m| owned(m)).collect();
    let (q, r) = (n / members.len(), n % members.len());
    let mut by_count: Vec<usize> = (0..members.len()).collect();
    by_count.sort_by_key(|&k| (Reverse(held[k].len()), members[k]));
    let mut share = vec![q; members.len()];
    for &k in by_count.iter().take(r) {
        share[k] += 1;
    }
    let mut next: OwnerMap = vec![None; n];
    let mut count = vec![0; members.len()];
    for (k, ids) in held.iter().enumerate() {
        for &i in ids.iter().take(share[k]) {
            next[i] = Some(members[k].to_string());
            count[k] += 1;
        }
    }
    let mut free = (0..n)
        .filter(|&i| next[i].is_none())
        .collect::<Vec<_>>()
        .into_iter();
    for (k, m) in members.iter().enumerate() {
        while count[k] < share[k] {
            let i = free.next().expect("the shares add up to N");
            next[i] = Some((*m).to_string());
            count[k] += 1;
        }
    }
    next
}

/// The ids of the shards `member` owns in `map`, ascending.
pub fn owned_by(map: &[Option<String>], member: &str) -> Vec<usize> {
    (0..map.len())
        .filter(|&i| map[i].as_deref() == Some(member))
        .collect()
}

/// How many shards changed owner from `before` to `after` (a shard that
/// gains an owner or loses its owner counts as a move too).
pub fn moves(before: &[Option<String>], after: &[Option<String>]) -> usize {
    before.iter().zip(after).filter(|(b, a)| b != a).count()
}
