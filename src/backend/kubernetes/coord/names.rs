//! Object names of coordination Leases: a client's name (1–128 characters
//! of `[A-Za-z0-9._-]`, case-sensitive) mapped to a DNS-1123 subdomain name
//! (lowercase `[a-z0-9-.]`, starting and ending alphanumeric, at most 253).
//!
//! `le-<kind>-<readable>-<hash>`: `<readable>` is the name lowercased with
//! `.` and `_` turned into `-` (for `kubectl get leases`), `<hash>` the 16
//! hex digits of the 64-bit FNV-1a hash of `<kind>/<exact name>`, so
//! `Foo` and `foo`, or `a.b` and `a_b`, get different objects. The exact
//! name is also written in the annotation [`NAME_ANNOTATION`] and checked on
//! every read: two names whose hashes collide are refused
//! ([`CoordError::Corrupt`](crate::backend::coordination::CoordError)),
//! never merged.

use std::hash::Hasher;

use crate::backend::coordination::Kind;

/// Annotation holding the exact coordination name an object stands for.
pub const NAME_ANNOTATION: &str = "leader-elector.io/name";

/// Every coordination object's name starts with this.
pub const PREFIX: &str = "le-";

/// The `leader-elector.io/kind` label of a coordination object of `kind`.
pub fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "lock",
        Kind::Semaphore => "semaphore",
        Kind::Job => "job",
        // Its readers or writer, and a waiting writer's intent.
        Kind::RwLock => "rwlock",
    }
}

/// The kind part of an object's name (`le-<short>-…`).
fn short(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "lock",
        Kind::Semaphore => "sem",
        Kind::Job => "job",
        Kind::RwLock => "rw",
    }
}

/// The object name of coordination name `name` of `kind` (see the module
/// docs); at most 3 + 5 + 128 + 1 + 16 = 153 characters.
pub fn object_name(kind: Kind, name: &str) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(kind_label(kind).as_bytes());
    h.write(b"/");
    h.write(name.as_bytes());
    let readable: String = name
        .chars()
        .take(128)
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' => c,
            _ => '-',
        })
        .collect();
    format!("{PREFIX}{}-{readable}-{:016x}", short(kind), h.finish())
}

/// A label value for `value` (at most 63 characters of `[A-Za-z0-9._-]`,
/// alphanumeric at both ends): `value` itself when it is one, else its
/// alphanumeric-trimmed first 63 characters.
pub fn label_value(value: &str) -> String {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let cut: String = value.chars().filter(|c| ok(*c)).take(63).collect();
    cut.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    }

    #[test]
    fn names_map_to_valid_object_names_without_collisions() {
        let long = "A".repeat(128);
        let names = [
            "Foo", "foo", "a.b", "a_b", "a-b", "-", ".", "_", &long, "q/j1",
        ];
        let mut seen = std::collections::HashSet::new();
        for kind in [Kind::Lock, Kind::Semaphore, Kind::Job, Kind::RwLock] {
            for n in names {
                let o = object_name(kind, n);
                assert!(dns_subdomain(&o), "{n} -> {o}");
                assert!(seen.insert(o.clone()), "{n} -> {o} collides");
            }
        }
        assert!(object_name(Kind::Lock, "My.Lock").starts_with("le-lock-my-lock-"));
        assert!(object_name(Kind::RwLock, "My.Doc").starts_with("le-rw-my-doc-"));
        // Stable across versions: the hash is FNV-1a, not std's.
        assert_eq!(object_name(Kind::Lock, "x"), object_name(Kind::Lock, "x"));
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("my-election"), "my-election");
        assert_eq!(label_value(&"a".repeat(70)).len(), 63);
        assert_eq!(label_value("-x-"), "x");
    }
}
