use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// FNV-1a 64 test vectors of the FNV specification (draft-eastlake-fnv).
#[test]
fn fnv1a64_matches_the_spec_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn two_shards_write_the_kep_example() {
    assert_eq!(
        shard_range(0, 2).selector(ShardField::Uid),
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    );
    assert_eq!(
        shard_range(1, 2).selector(ShardField::Namespace),
        "shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')"
    );
    assert_eq!(shard_range(0, 1).end_hex(), "0x10000000000000000");
    assert!(shard_range(1, 2).contains(u64::MAX) && !shard_range(0, 2).contains(1 << 63));
}

#[test]
fn for_every_n_up_to_64_the_ranges_cover_the_hash_space_once_and_parse_back() {
    for n in 1..=64 {
        let all = ranges(n);
        assert_eq!(all.len(), n);
        // Contiguous from 0 to 2^64, every range non-empty: no gap, no overlap.
        let mut at = 0u128;
        for r in &all {
            assert_eq!(r.start, at, "N={n}: a gap or an overlap at {at:#x}");
            assert!(r.end > r.start, "N={n}: an empty range at {at:#x}");
            at = r.end;
        }
        assert_eq!(at, HASH_SPACE, "N={n}: the ranges end at {at:#x}");
        // Each selector parses back to its range, and so do their joins.
        for (id, r) in all.iter().enumerate() {
            let text = r.selector(ShardField::Uid);
            assert_eq!(parse_selector(&text), Ok(vec![(ShardField::Uid, *r)]));
            assert_eq!(r.start_hex().len(), 18, "{text}");
            let lens = if id + 1 == n { 19 } else { 18 };
            assert_eq!(r.end_hex().len(), lens, "{text}");
        }
        let ids: Vec<usize> = (0..n).collect();
        let joined = member_selector(&ids, n, ShardField::Namespace);
        let back: Vec<ShardRange> = parse_selector(&joined)
            .expect("the joined selector parses")
            .into_iter()
            .map(|(field, r)| {
                assert_eq!(field, ShardField::Namespace);
                r
            })
            .collect();
        assert_eq!(back, all, "N={n}");
    }
}

#[test]
fn each_hash_falls_in_exactly_one_range() {
    let mut rng = StdRng::seed_from_u64(49);
    for n in [1, 3, 7, 16, 64, MAX_SHARDS] {
        let all = ranges(n);
        for _ in 0..200 {
            let h = fnv1a64(&rng.random::<[u8; 16]>());
            assert_eq!(all.iter().filter(|r| r.contains(h)).count(), 1);
        }
    }
}

#[test]
fn the_parser_refuses_what_the_grammar_does_not_allow() {
    let bad = [
        ("", "`shardRange`"),
        (
            "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
            "object.metadata.uid",
        ),
        (
            "shardRange(object.metadata.uid, '0x00', '0x8000000000000000')",
            "16 lowercase",
        ),
        (
            "shardRange(object.metadata.uid, '0x000000000000000A', '0x8000000000000000')",
            "16 lowercase",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x20000000000000000')",
            "16 lowercase",
        ),
        (
            "shardRange(object.metadata.uid, 0x0000000000000000, '0x8000000000000000')",
            "16 lowercase",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000'",
            "`)`",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') ||",
            "`shardRange`",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') &&",
            "`||`",
        ),
    ];
    for (text, expected) in bad {
        let err = parse_selector(text).expect_err(text).to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
        assert!(err.contains("hint:"), "{err}");
    }
    let empty = "shardRange(object.metadata.uid, '0x8000000000000000', '0x8000000000000000')";
    let err = parse_selector(empty).expect_err("an empty range");
    assert!(err.to_string().contains("is empty"), "{err}");
    // Whitespace between tokens is allowed.
    let spaced = " shardRange ( object.metadata.uid ,'0x0000000000000000','0x8000000000000000' )||shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000') ";
    assert_eq!(parse_selector(spaced).map(|v| v.len()), Ok(2));
}

fn names(k: usize) -> Vec<String> {
    (0..k).map(|i| format!("m{i}")).collect()
}

/// The fewest moves a balanced map can make from `before`: N minus the
/// most shards it can keep, `Σ min(c, q)` plus one per larger share given
/// to a member holding more than `q` (at most `N mod m` of them).
fn fewest_moves(members: &[String], before: &[Option<String>]) -> usize {
    let n = before.len();
    if members.is_empty() {
        return before.iter().filter(|o| o.is_some()).count();
    }
    let (q, r) = (n / members.len(), n % members.len());
    let counts: Vec<usize> = members.iter().map(|m| owned_by(before, m).len()).collect();
    let kept: usize = counts.iter().map(|&c| c.min(q)).sum::<usize>()
        + counts.iter().filter(|&&c| c > q).count().min(r);
    n - kept
}

fn check_balanced(members: &[String], map: &[Option<String>]) {
    let n = map.len();
    let (lo, hi) = (n / members.len(), n.div_ceil(members.len()));
    for m in members {
        let c = owned_by(map, m).len();
        assert!(
            lo <= c && c <= hi,
            "{m} owns {c} of {n} ({lo}..={hi}): {map:?}"
        );
    }
    assert!(
        map.iter()
            .all(|o| o.as_ref().is_some_and(|o| members.contains(o)))
    );
}

#[test]
fn assignment_over_random_joins_and_leaves_is_balanced_minimal_and_stable() {
    let mut rng = StdRng::seed_from_u64(5866);
    let (mut total_moves, mut changes) = (0, 0);
    for _ in 0..200 {
        let n = rng.random_range(1..=64);
        let pool = names(8);
        let mut members = vec![pool[0].clone()];
        let mut map = assign(&members, &vec![None; n]);
        for _ in 0..30 {
            let before = members.clone();
            let join = members.len() == 1 || (members.len() < pool.len() && rng.random_bool(0.5));
            if join {
                let fresh: Vec<&String> = pool.iter().filter(|p| !members.contains(p)).collect();
                members.push(fresh[rng.random_range(0..fresh.len())].clone());
            } else {
                members.remove(rng.random_range(0..members.len()));
            }
            let next = assign(&members, &map);
            check_balanced(&members, &next);
            let moved = moves(&map, &next);
            assert_eq!(
                moved,
                fewest_moves(&members, &map),
                "N={n} {before:?} -> {members:?}"
            );
            for i in 0..n {
                let (was, is) = (&map[i], &next[i]);
                let stayed = |o: &Option<String>| {
                    o.as_ref()
                        .is_some_and(|o| before.contains(o) && members.contains(o))
                };
                assert!(
                    was == is || !(stayed(was) && stayed(is)),
                    "N={n}: shard {i} moved from {was:?} to {is:?}, both stay"
                );
            }
            assert_eq!(assign(&members, &next), next, "a settled map stays");
            total_moves += moved;
            changes += 1;
            map = next;
        }
    }
    println!("{changes} joins and leaves, {total_moves} shards moved, each change the fewest");
}

#[test]
fn assignment_is_deterministic_and_counts_the_moves() {
    let (a, b, c) = ("a".to_string(), "b".to_string(), "c".to_string());
    let two = assign(&[b.clone(), a.clone(), a.clone()], &vec![None; 16]);
    assert_eq!(owned_by(&two, "a").len(), 8);
    assert_eq!(assign(&[a.clone(), b.clone()], &vec![None; 16]), two);
    // A third member joins: 16 = 6 + 5 + 5, so five shards move, all to c.
    let three = assign(&[a.clone(), b.clone(), c.clone()], &two);
    assert_eq!(moves(&two, &three), 5);
    assert_eq!(owned_by(&three, "c").len(), 5);
    // b leaves: its five shards go to a and c, nothing else moves.
    let after = assign(&[a.clone(), c.clone()], &three);
    assert_eq!(moves(&three, &after), 5);
    assert_eq!(
        (owned_by(&after, "a").len(), owned_by(&after, "c").len()),
        (8, 8)
    );
    assert_eq!(assign(&[], &after), vec![None; 16]);
    assert_eq!(member_selector(&[], 16, ShardField::Uid), "");
}
