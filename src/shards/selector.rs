//! A parser of KEP-5866 shard selectors, to its grammar:
//!
//! ```text
//! selector = range *( "||" range )
//! range    = "shardRange" "(" field "," bound "," bound ")"
//! field    = "object.metadata.uid" / "object.metadata.namespace"
//! bound    = "'0x" 16lowerhex "'" / "'0x10000000000000000'"
//! ```
//!
//! with optional whitespace between tokens, and `start < end` in each
//! range. Used to check what we write and what a server echoes back in a
//! list's `shardInfo.selector`.

use thiserror::Error;

use super::range::{HASH_SPACE, ShardField, ShardRange};

/// Why a selector does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SelectorError {
    /// Something else than the grammar allows at byte `at`.
    #[error(
        "shard selector: expected {expected} at byte {at}, found {found:?}\n\
         hint: write shardRange(object.metadata.uid, '0x<16 hex digits>', '0x<16 hex digits>'), joined with ||"
    )]
    Unexpected {
        /// The byte offset in the selector.
        at: usize,
        /// What the grammar allows there.
        expected: &'static str,
        /// The rest of the selector from there (at most 24 characters).
        found: String,
    },
    /// A range whose start is not below its end.
    #[error(
        "shard selector: the range at byte {at} is empty (start {start} is not below end {end})\n\
         hint: a range is [start, end): start must be smaller"
    )]
    EmptyRange {
        /// The byte offset of the range.
        at: usize,
        /// Its start, as written.
        start: String,
        /// Its end, as written.
        end: String,
    },
}

/// The ranges of `selector` with their field, in the order written.
///
/// # Errors
/// [`SelectorError`] naming the byte offset and what the grammar expects
/// there, or an empty range.
pub fn parse_selector(selector: &str) -> Result<Vec<(ShardField, ShardRange)>, SelectorError> {
    let mut p = Cursor { s: selector, at: 0 };
    let mut out = vec![p.range()?];
    while !p.end() {
        p.token("||", "`||` or the end")?;
        out.push(p.range()?);
    }
    Ok(out)
}

struct Cursor<'a> {
    s: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn skip_space(&mut self) {
        let rest = &self.s[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn end(&mut self) -> bool {
        self.skip_space();
        self.at == self.s.len()
    }

    fn unexpected(&self, expected: &'static str) -> SelectorError {
        SelectorError::Unexpected {
            at: self.at,
            expected,
            found: self.s[self.at..].chars().take(24).collect(),
        }
    }

    /// Skips whitespace, then `word`, else an error expecting `what`.
    fn token(&mut self, word: &str, what: &'static str) -> Result<(), SelectorError> {
        self.skip_space();
        if !self.s[self.at..].starts_with(word) {
            return Err(self.unexpected(what));
        }
        self.at += word.len();
        Ok(())
    }

    fn range(&mut self) -> Result<(ShardField, ShardRange), SelectorError> {
        self.skip_space();
        let at = self.at;
        self.token("shardRange", "`shardRange`")?;
        self.token("(", "`(`")?;
        let field = self.field()?;
        self.token(",", "`,`")?;
        let (start, start_text) = self.bound()?;
        self.token(",", "`,`")?;
        let (end, end_text) = self.bound()?;
        self.token(")", "`)`")?;
        if start >= end {
            return Err(SelectorError::EmptyRange {
                at,
                start: start_text,
                end: end_text,
            });
        }
        Ok((field, ShardRange { start, end }))
    }

    fn field(&mut self) -> Result<ShardField, SelectorError> {
        self.skip_space();
        for field in [ShardField::Uid, ShardField::Namespace] {
            let rest = &self.s[self.at..];
            let next = rest[field.path().len().min(rest.len())..].chars().next();
            let ends = next.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'));
            if rest.starts_with(field.path()) && ends {
                self.at += field.path().len();
                return Ok(field);
            }
        }
        Err(self.unexpected("object.metadata.uid or object.metadata.namespace"))
    }

    /// A quoted bound: `'0x` and 16 lowercase hex digits `'`, or 2^64.
    fn bound(&mut self) -> Result<(u128, String), SelectorError> {
        const WHAT: &str = "a bound '0x' + 16 lowercase hex digits, or '0x10000000000000000'";
        self.skip_space();
        let rest = &self.s[self.at..];
        let Some(body) = rest.strip_prefix("'0x") else {
            return Err(self.unexpected(WHAT));
        };
        let digits = body
            .bytes()
            .take_while(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            .count();
        let text = &body[..digits];
        let value = match digits {
            16 => u128::from_str_radix(text, 16).ok(),
            17 if text == "10000000000000000" => Some(HASH_SPACE),
            _ => None,
        };
        match (value, body[digits..].starts_with('\'')) {
            (Some(v), true) => {
                self.at += 3 + digits + 1;
                Ok((v, format!("0x{text}")))
            }
            _ => Err(self.unexpected(WHAT)),
        }
    }
}
