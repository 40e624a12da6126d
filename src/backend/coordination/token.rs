//! Tokens of locks, permits and claims (`v1.<kind>.<lease hex>.<nonce>`),
//! and the checks of client-chosen names and owner labels.

use rand::Rng;

use super::Kind;

/// A random token: `prefix` + 32 hex digits.
pub fn random_token(prefix: &str) -> String {
    let bytes: [u8; 16] = rand::rng().random();
    let mut s = String::with_capacity(prefix.len() + 32);
    s.push_str(prefix);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// What a token was issued for: one letter in the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// A lock taken without queueing (`l`).
    Lock,
    /// A lock taken in arrival order (`f`).
    FairLock,
    /// A semaphore permit (`s`).
    Permit,
    /// A job claim (`j`).
    Job,
    /// A reader of a read-write lock (`r`).
    Reader,
    /// The writer of a read-write lock (`w`).
    Writer,
}

impl TokenKind {
    fn letter(self) -> char {
        match self {
            TokenKind::Lock => 'l',
            TokenKind::FairLock => 'f',
            TokenKind::Permit => 's',
            TokenKind::Job => 'j',
            TokenKind::Reader => 'r',
            TokenKind::Writer => 'w',
        }
    }

    /// Whether a token of this kind may renew or release an object of `kind`.
    pub fn serves(self, kind: Kind) -> bool {
        matches!(
            (self, kind),
            (TokenKind::Lock | TokenKind::FairLock, Kind::Lock)
                | (TokenKind::Permit, Kind::Semaphore)
                | (TokenKind::Reader | TokenKind::Writer, Kind::RwLock)
                | (TokenKind::Job, Kind::Job)
        )
    }
}

/// A parsed token, version 1: `v1.<kind>.<lease hex>.<32 hex random>`, where
/// `<lease hex>` is the etcd lease id (`0` on Redis, which has none).
///
/// Every field sits at a fixed position between dots, so no field is told
/// apart from another by its first character (a lease id may start with any
/// hex digit). Clients treat the whole string as opaque.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// What it was issued for.
    pub kind: TokenKind,
    /// The etcd lease id; 0 on Redis.
    pub lease: i64,
    /// The random part.
    pub nonce: String,
}

impl Token {
    /// A fresh token of `kind` bound to `lease` (0 when there is none).
    pub fn new(kind: TokenKind, lease: i64) -> Token {
        Token {
            kind,
            lease,
            nonce: random_token(""),
        }
    }

    /// Read a token; `None` when it is not a version-1 token.
    pub fn parse(text: &str) -> Option<Token> {
        let mut parts = text.split('.');
        let (Some("v1"), Some(kind), Some(lease), Some(nonce), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let kind = match kind {
            "l" => TokenKind::Lock,
            "f" => TokenKind::FairLock,
            "s" => TokenKind::Permit,
            "j" => TokenKind::Job,
            "r" => TokenKind::Reader,
            "w" => TokenKind::Writer,
            _ => return None,
        };
        if lease.is_empty() || lease.len() > 16 || nonce.len() != 32 {
            return None;
        }
        let lease = i64::from_str_radix(lease, 16).ok().filter(|l| *l >= 0)?;
        if !nonce.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        Some(Token {
            kind,
            lease,
            nonce: nonce.to_owned(),
        })
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "v1.{}.{:x}.{}",
            self.kind.letter(),
            self.lease,
            self.nonce
        )
    }
}

/// Check a client-chosen owner label: 1-253 printable characters, no `|`.
///
/// # Errors
/// A message naming the field and the rule.
pub fn check_owner(owner: &str) -> std::result::Result<(), String> {
    if owner.is_empty()
        || owner.len() > 253
        || owner.contains('|')
        || owner.chars().any(char::is_control)
    {
        return Err(
            "parameter 'owner' must be 1-253 characters without '|' or control characters".into(),
        );
    }
    Ok(())
}

/// Longest accepted name, in bytes.
pub const MAX_NAME: usize = 128;

/// Check a lock, semaphore, queue or job name: 1–128 characters of
/// `[A-Za-z0-9._-]`.
///
/// # Errors
/// A message naming `what` and the rule.
pub fn check_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{what} ({}) must be 1-{MAX_NAME} characters of letters, digits, '-', '_' and '.'",
            name.chars().take(MAX_NAME + 8).collect::<String>()
        ));
    }
    Ok(())
}
