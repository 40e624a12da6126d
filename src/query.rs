//! Strict query strings for every route of both listeners: a request's query
//! is parsed once into the route's typed parameters (a serde struct with
//! `deny_unknown_fields`), and an unknown, repeated, empty or overlong
//! parameter is a 400 naming it, so a misspelt `freez=` never acts with a
//! default.
//!
//! The known names come from the struct's own serde field list, so a route
//! that gains a parameter (a field) lists it in its errors by itself.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

pub mod hostile;

/// Longest accepted value of one query parameter, in bytes (after
/// percent-decoding). Tokens are at most 128, owners 253.
pub const MAX_VALUE: usize = 256;

/// Longest part of an unknown name quoted back in an error.
const MAX_QUOTED: usize = 64;

/// The query parameters of a route, parsed strictly into `T` (see the
/// module's documentation); a rejection is a JSON 400 naming the parameter.
#[derive(Debug, Clone)]
pub struct Strict<T>(pub T);

/// A route that takes no query parameters.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Strict<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        parse(parts.uri.query().unwrap_or(""))
            .map(Strict)
            .map_err(|msg| {
                // As `crate::http::error_response` (this leaf module names none).
                let body = axum::Json(serde_json::json!({ "error": msg }));
                let mut resp = (StatusCode::BAD_REQUEST, body).into_response();
                resp.headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                resp
            })
    }
}

/// Parse `query` (without the `?`) into `T`.
///
/// # Errors
/// A message naming the parameter that is unknown (with the known ones),
/// repeated, empty or longer than [`MAX_VALUE`], or whose value `T` refuses.
pub fn parse<T: DeserializeOwned>(query: &str) -> Result<T, String> {
    let known = field_names::<T>();
    let mut seen: Vec<String> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if !known.contains(&name.as_ref()) {
            return Err(unknown("parameter", &name, known));
        }
        if seen.iter().any(|s| *s == name) {
            return Err(format!("repeated parameter '{name}': give it once"));
        }
        if value.is_empty() {
            return Err(format!(
                "parameter '{name}' is empty: give it a value or leave it out"
            ));
        }
        if value.len() > MAX_VALUE {
            return Err(format!(
                "parameter '{name}' is longer than {MAX_VALUE} bytes ({}): give a shorter value",
                value.len()
            ));
        }
        seen.push(name.into_owned());
    }
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        format!("parameter '{field}': {}", e.inner())
    })
}

/// The error for a name that is not one of `known` (`what`: "parameter",
/// "body field").
pub fn unknown(what: &str, name: &str, known: &[&str]) -> String {
    let mut quoted: String = name.chars().take(MAX_QUOTED).collect();
    if quoted.len() < name.len() {
        quoted.push('…');
    }
    let quoted = quoted.escape_debug();
    if known.is_empty() {
        format!("unknown {what} '{quoted}' (this route takes none)")
    } else {
        format!("unknown {what} '{quoted}' (known: {})", known.join(", "))
    }
}

/// The field names of the struct `T` deserializes as (its serde names).
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// A deserializer that only records the field list serde passes to
/// `deserialize_struct`, then stops.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("field names only"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Resign {
        freeze: Option<String>,
        cooldown: Option<String>,
    }

    #[test]
    fn known_names_come_from_the_struct() {
        assert_eq!(field_names::<Resign>(), ["freeze", "cooldown"]);
        assert!(field_names::<NoParams>().is_empty());
    }

    #[test]
    fn a_good_query_parses() {
        let r: Resign = parse("freeze=60s").unwrap();
        assert_eq!(r.freeze.as_deref(), Some("60s"));
        assert_eq!(parse::<Resign>("").unwrap().freeze, None);
    }

    #[test]
    fn bad_queries_name_the_parameter() {
        let cases = [
            (
                "freez=60s",
                "unknown parameter 'freez' (known: freeze, cooldown)",
            ),
            ("freeze=1s&freeze=2s", "repeated parameter 'freeze'"),
            ("freeze=", "parameter 'freeze' is empty"),
            ("freeze", "parameter 'freeze' is empty"),
            ("x=1", "unknown parameter 'x'"),
        ];
        for (q, want) in cases {
            let err = parse::<Resign>(q).unwrap_err();
            assert!(err.starts_with(want), "{q}: {err}");
        }
        let long = format!("freeze={}", "9".repeat(MAX_VALUE + 1));
        assert!(parse::<Resign>(&long).unwrap_err().contains("longer than"));
        let err = parse::<NoParams>("a=1").unwrap_err();
        assert_eq!(err, "unknown parameter 'a' (this route takes none)");
        let err = parse::<NoParams>(&format!("{}=1", "k".repeat(500))).unwrap_err();
        assert!(err.len() < 120, "{err}");
    }
}
