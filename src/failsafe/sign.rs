//! Signatures of the peer channel: every heartbeat and every answer carries
//! an HMAC-SHA256, keyed by the shared secret, over what it says (method and
//! path, or status and the request's nonce; the body) and a wall-clock
//! timestamp and a random nonce. The secret itself never travels.
//!
//! A receiver refuses a message that is unsigned, signed with another key,
//! stamped more than one window (the lease duration) away from its own wall
//! clock, or whose nonce it has seen within the window. Two keys may verify
//! at once (a Secret being rotated); only the first signs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::peer::Secret;

/// The header carrying the sender's wall-clock time, in Unix milliseconds.
pub const TIMESTAMP: &str = "x-failsafe-timestamp";
/// The header carrying the message's nonce (32 hex digits).
pub const NONCE: &str = "x-failsafe-nonce";
/// The header carrying the HMAC-SHA256 (64 hex digits).
pub const SIGNATURE: &str = "x-failsafe-signature";

/// The most nonces one receiver remembers; past it, messages are refused
/// until the oldest leave the window (only a holder of the secret can
/// fill it: nonces are recorded after the signature is checked).
const MAX_NONCES: usize = 10_000;

/// The keys of the peer channel: the first signs, each verifies.
#[derive(Clone, Debug)]
pub struct Keys {
    sign: Secret,
    also: Option<Secret>,
}

/// What a signature covers besides the stamp and the body: the kind of
/// message and two fields (request: method, path; answer: status, the
/// request's nonce).
pub type Head<'a> = [&'a str; 3];

/// A message's stamp, as sent in the three headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The sender's wall clock, in Unix milliseconds.
    pub timestamp_ms: u64,
    /// 16 random bytes, in hex.
    pub nonce: String,
    /// The HMAC-SHA256, in hex.
    pub signature: String,
}

/// Why a message is not authentic (the receiver answers 401, or the leader
/// does not count the answer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unauthentic {
    /// A stamp header is missing or malformed.
    #[error("not signed (missing or malformed {0} header)")]
    Unsigned(&'static str),
    /// No configured key gives the signature.
    #[error("signed with another key (a forgery, or the members' --failsafe-secret-file differ)")]
    WrongKey,
    /// The timestamp is outside the window on the receiver's wall clock.
    #[error(
        "its timestamp is {skew_ms} ms away from this member's clock (window {window_ms} ms): a replay, or clocks apart"
    )]
    Stale {
        /// How far the timestamp is from the receiver's clock, in milliseconds.
        skew_ms: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// The nonce was seen within the window: a replay.
    #[error("its nonce was seen before within the window: a replay")]
    Replayed,
    /// The receiver remembers too many nonces to check one more.
    #[error("too many messages within the window ({MAX_NONCES})")]
    Crowded,
}

impl Unauthentic {
    /// The metric label of this reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unauthentic::Unsigned(_) => "unsigned",
            Unauthentic::WrongKey => "wrong_key",
            Unauthentic::Stale { .. } => "stale",
            Unauthentic::Replayed => "replayed",
            Unauthentic::Crowded => "crowded",
        }
    }
}

/// The reasons of [`Unauthentic::reason`], in order.
pub const REASONS: [&str; 5] = ["unsigned", "wrong_key", "stale", "replayed", "crowded"];

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

impl Keys {
    /// Keys that sign with `sign` and also accept `also` (the other secret
    /// while one is rotated).
    pub fn new(sign: Secret, also: Option<Secret>) -> Keys {
        Keys { sign, also }
    }

    fn mac(key: &Secret, head: Head<'_>, ts: u64, nonce: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.bytes())
            .expect("HMAC takes a key of any length");
        mac.update(b"leader-elector failsafe v1\n");
        for part in head {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        mac.update(format!("{ts}\n{nonce}\n").as_bytes());
        mac.update(body);
        mac
    }

    /// The stamp of a message with `head` and `body`, sent now.
    pub fn sign(&self, head: Head<'_>, body: &[u8]) -> Stamp {
        self.sign_at(head, body, now_ms())
    }

    /// The stamp of a message with `head` and `body` as if sent at
    /// `timestamp_ms` (Unix milliseconds; tests send old ones).
    pub fn sign_at(&self, head: Head<'_>, body: &[u8], timestamp_ms: u64) -> Stamp {
        let nonce = hex(&rand::random::<[u8; 16]>());
        let mac = Keys::mac(&self.sign, head, timestamp_ms, &nonce, body);
        Stamp {
            signature: hex(&mac.finalize().into_bytes()),
            timestamp_ms,
            nonce,
        }
    }

    /// Check the stamp in `headers` of a message with `head` and `body`
    /// against these keys and `seen`; returns its nonce.
    ///
    /// # Errors
    /// [`Unauthentic`]: why the message is refused (nothing is recorded).
    pub fn verify(
        &self,
        head: Head<'_>,
        headers: &HeaderMap,
        body: &[u8],
        seen: &Nonces,
    ) -> Result<String, Unauthentic> {
        let get = |name: &'static str| {
            let v = headers.get(name).and_then(|v| v.to_str().ok());
            v.ok_or(Unauthentic::Unsigned(name))
        };
        let ts: u64 = get(TIMESTAMP)?
            .parse()
            .map_err(|_| Unauthentic::Unsigned(TIMESTAMP))?;
        let nonce = get(NONCE)?;
        if nonce.len() != 32 || unhex(nonce).is_none() {
            return Err(Unauthentic::Unsigned(NONCE));
        }
        let sig = unhex(get(SIGNATURE)?).ok_or(Unauthentic::Unsigned(SIGNATURE))?;
        let matches = |key: &Secret| {
            let mac = Keys::mac(key, head, ts, nonce, body);
            mac.verify_slice(&sig).is_ok()
        };
        if !matches(&self.sign) && !self.also.as_ref().is_some_and(matches) {
            return Err(Unauthentic::WrongKey);
        }
        seen.admit(ts, nonce, now_ms())?;
        Ok(nonce.to_owned())
    }
}

impl Stamp {
    /// The three headers, as (name, value).
    pub fn headers(&self) -> [(&'static str, String); 3] {
        [
            (TIMESTAMP, self.timestamp_ms.to_string()),
            (NONCE, self.nonce.clone()),
            (SIGNATURE, self.signature.clone()),
        ]
    }
}

/// The nonces one receiver has seen within the window (bounded memory).
#[derive(Debug)]
pub struct Nonces {
    window: Duration,
    seen: Mutex<HashMap<String, u64>>,
}

impl Nonces {
    /// Nonces remembered for `window` (the lease duration): older stamps
    /// are refused by their timestamp.
    pub fn new(window: Duration) -> Nonces {
        Nonces {
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Admit a message stamped `ts` with `nonce`, received at `now`
    /// (both in Unix milliseconds).
    fn admit(&self, ts: u64, nonce: &str, now: u64) -> Result<(), Unauthentic> {
        let window_ms = self.window.as_millis() as u64;
        let skew_ms = ts.abs_diff(now);
        if skew_ms > window_ms {
            return Err(Unauthentic::Stale { skew_ms, window_ms });
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains_key(nonce) {
            return Err(Unauthentic::Replayed);
        }
        if seen.len() >= MAX_NONCES {
            seen.retain(|_, t| t.abs_diff(now) <= window_ms);
            if seen.len() >= MAX_NONCES {
                return Err(Unauthentic::Crowded);
            }
        }
        seen.insert(nonce.to_owned(), ts);
        Ok(())
    }

    /// How many nonces are remembered now.
    pub fn len(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Head<'static> = ["request", "POST", "/failsafe/heartbeat"];

    fn keys(a: &[u8], b: Option<&[u8]>) -> Keys {
        Keys::new(Secret::new(a).unwrap(), b.map(|b| Secret::new(b).unwrap()))
    }

    fn headers(s: &Stamp) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in s.headers() {
            h.insert(n, v.parse().unwrap());
        }
        h
    }

    const A: &[u8] = b"aaaaaaaaaaaaaaaa";
    const B: &[u8] = b"bbbbbbbbbbbbbbbb";

    /// The layout the book's Failsafe page gives (checked there with
    /// `openssl dgst -sha256 -hmac`): a change here is a wire change.
    #[test]
    fn the_signed_bytes_are_the_books_layout() {
        let key = Secret::new(b"0123456789abcdef").unwrap();
        let body = br#"{"election":"e","leader":"a","fencing_token":7,"promise_ms":2000}"#;
        let nonce = "00112233445566778899aabbccddeeff";
        let mac = Keys::mac(&key, HEAD, 1_700_000_000_000, nonce, body);
        assert_eq!(
            hex(&mac.finalize().into_bytes()),
            "2992b6ad3b2b94a282261a5d34521acdfadb3a754381aed0535ea1e42e02ee61"
        );
    }

    #[test]
    fn a_signed_message_passes_once_and_its_replay_is_refused() {
        let (k, seen) = (keys(A, None), Nonces::new(Duration::from_secs(2)));
        let s = k.sign(HEAD, b"{}");
        assert!(k.verify(HEAD, &headers(&s), b"{}", &seen).is_ok());
        let again = k.verify(HEAD, &headers(&s), b"{}", &seen);
        assert_eq!(again, Err(Unauthentic::Replayed));
    }

    #[test]
    fn another_key_body_head_or_a_missing_stamp_is_refused() {
        let seen = Nonces::new(Duration::from_secs(2));
        let s = keys(B, None).sign(HEAD, b"{}");
        let k = keys(A, None);
        assert_eq!(
            k.verify(HEAD, &headers(&s), b"{}", &seen),
            Err(Unauthentic::WrongKey)
        );
        let s = k.sign(HEAD, b"{}");
        let other = ["request", "POST", "/elsewhere"];
        assert_eq!(
            k.verify(other, &headers(&s), b"{}", &seen),
            Err(Unauthentic::WrongKey)
        );
        assert_eq!(
            k.verify(HEAD, &headers(&s), b"{\"x\":1}", &seen),
            Err(Unauthentic::WrongKey)
        );
        let mut h = headers(&s);
        h.remove(SIGNATURE);
        assert_eq!(
            k.verify(HEAD, &h, b"{}", &seen),
            Err(Unauthentic::Unsigned(SIGNATURE))
        );
        assert!(seen.is_empty(), "nothing recorded for a refusal");
    }

    #[test]
    fn an_old_or_future_timestamp_is_refused_even_when_signed() {
        let (k, seen) = (keys(A, None), Nonces::new(Duration::from_secs(2)));
        for shift in [-3_000i64, 3_000] {
            let ts = (now_ms() as i64 + shift) as u64;
            let nonce = hex(&[7; 16]);
            let mac = Keys::mac(&k.sign, HEAD, ts, &nonce, b"{}");
            let s = Stamp {
                timestamp_ms: ts,
                nonce,
                signature: hex(&mac.finalize().into_bytes()),
            };
            let r = k.verify(HEAD, &headers(&s), b"{}", &seen);
            assert!(matches!(r, Err(Unauthentic::Stale { .. })), "{r:?}");
        }
    }

    #[test]
    fn both_keys_verify_while_only_the_first_signs() {
        let seen = Nonces::new(Duration::from_secs(2));
        let (new_old, old_new) = (keys(B, Some(A)), keys(A, Some(B)));
        let s = new_old.sign(HEAD, b"{}");
        assert!(old_new.verify(HEAD, &headers(&s), b"{}", &seen).is_ok());
        let s = old_new.sign(HEAD, b"{}");
        assert!(new_old.verify(HEAD, &headers(&s), b"{}", &seen).is_ok());
        let s = keys(A, None).sign(HEAD, b"{}");
        let r = keys(B, None).verify(HEAD, &headers(&s), b"{}", &seen);
        assert_eq!(
            r,
            Err(Unauthentic::WrongKey),
            "the old key alone is refused"
        );
    }

    #[test]
    fn the_nonce_memory_is_bounded() {
        let seen = Nonces::new(Duration::from_secs(2));
        let now = now_ms();
        for i in 0..MAX_NONCES {
            seen.admit(now, &format!("{i:032x}"), now).unwrap();
        }
        assert_eq!(seen.admit(now, "x", now), Err(Unauthentic::Crowded));
        // Past the window the old ones are dropped.
        assert!(seen.admit(now + 2_500, "y", now + 2_500).is_ok());
        assert_eq!(seen.len(), 1);
    }
}
