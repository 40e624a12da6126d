//! The hostile-input table: every route of both listeners, each with six
//! kinds of bad input (an unknown parameter, a repeated one, the token
//! twice, an empty value, an overlong value, a value of the wrong type).
//! Each request must get a 4xx JSON answer whose `error` names the field,
//! and act on nothing. Shared by the in-process router test
//! (src/control_hostile_tests.rs) and the pass against a real sidecar
//! (tests/suite/strict_input.rs).

/// One route and a parameter to abuse.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// On the control listener (else the read-only one).
    pub control: bool,
    /// HTTP method.
    pub method: &'static str,
    /// Path, with sample names filled in.
    pub path: &'static str,
    /// The rest of a valid query (may be empty).
    pub query: &'static str,
    /// A parameter of the route (or, for a route without any, a name it
    /// does not know).
    pub param: &'static str,
    /// A valid value of `param`.
    pub good: &'static str,
    /// A value of `param` of the wrong type (`None`: the body's token).
    pub wrong: Option<&'static str>,
    /// Whether the route takes a token (query or body).
    pub token: bool,
}

const fn route(
    control: bool,
    method: &'static str,
    path: &'static str,
    query: &'static str,
    (param, good, wrong): (&'static str, &'static str, Option<&'static str>),
    token: bool,
) -> Route {
    Route {
        control,
        method,
        path,
        query,
        param,
        good,
        wrong,
        token,
    }
}

const NONE: (&str, &str, Option<&str>) = ("verbose", "1", Some("yes"));
const TTL: (&str, &str, Option<&str>) = ("ttl", "5s", Some("soon"));
/// A string of a token's form (`v1.<kind>.<lease>.<nonce>`) that no
/// backend issued: a string of another form is refused as malformed first.
const WELL_FORMED: &str = "v1.l.0.0123456789abcdef0123456789abcdef";
const TOKEN: (&str, &str, Option<&str>) = ("token", WELL_FORMED, None);

/// Every route of both listeners.
pub const ROUTES: &[Route] = &[
    route(
        false,
        "GET",
        "/leader",
        "",
        ("index", "1", Some("x")),
        false,
    ),
    route(false, "GET", "/", "", NONE, false),
    route(false, "GET", "/isLeader", "", NONE, false),
    route(false, "GET", "/healthz", "", NONE, false),
    route(false, "GET", "/readyz", "", NONE, false),
    route(false, "GET", "/metrics", "", NONE, false),
    route(
        true,
        "POST",
        "/resign",
        "",
        ("freeze", "60s", Some("soon")),
        false,
    ),
    route(
        true,
        "POST",
        "/switchover",
        "",
        ("to", "b", Some("")),
        false,
    ),
    route(true, "POST", "/release", "", NONE, false),
    route(
        true,
        "POST",
        "/locks/x",
        "",
        ("fair", "true", Some("maybe")),
        false,
    ),
    route(true, "POST", "/locks/x/renew", "", TTL, true),
    route(true, "DELETE", "/locks/x", "", TOKEN, true),
    route(
        true,
        "POST",
        "/semaphores/x",
        "",
        ("permits", "2", Some("many")),
        false,
    ),
    route(true, "POST", "/semaphores/x/renew", "", TTL, true),
    route(true, "DELETE", "/semaphores/x", "", TOKEN, true),
    route(
        true,
        "POST",
        "/rwlocks/x",
        "",
        ("mode", "read", Some("both")),
        false,
    ),
    route(true, "POST", "/rwlocks/x/renew", "", TTL, true),
    route(true, "DELETE", "/rwlocks/x", "", TOKEN, true),
    route(true, "POST", "/jobs/q/j/claim", "", TTL, false),
    route(true, "DELETE", "/jobs/q/j/claim", "", TOKEN, true),
    route(true, "POST", "/jobs/q/j/complete", "", TOKEN, true),
    route(true, "POST", "/jobs/q/j/renew", "", TTL, true),
    route(
        true,
        "POST",
        "/jobs/n/periods/2026-01-01T00:00:00Z/claim",
        "",
        ("every", "5m", Some("soon")),
        false,
    ),
    route(
        true,
        "POST",
        "/jobs/n/periods/2026-01-01T00:00:00Z/complete",
        "every=5m",
        TOKEN,
        true,
    ),
];

/// One hostile request.
#[derive(Debug, Clone)]
pub struct Hostile {
    /// The route it abuses.
    pub route: Route,
    /// Which kind of bad input.
    pub case: &'static str,
    /// Path and query.
    pub uri: String,
    /// The body, if any.
    pub body: Option<String>,
    /// What the answer's `error` must name.
    pub field: &'static str,
}

/// The six hostile requests of every route.
pub fn requests() -> Vec<Hostile> {
    ROUTES.iter().flat_map(|r| for_route(*r)).collect()
}

fn for_route(r: Route) -> Vec<Hostile> {
    let p = r.param;
    let body_token = (r.token && p != "token").then(|| format!(r#"{{"token": "{WELL_FORMED}"}}"#));
    let one = |case, extra: String, body: Option<String>, field| Hostile {
        route: r,
        case,
        uri: match (r.query, extra.as_str()) {
            ("", e) | (e, "") => format!("{}?{e}", r.path),
            (q, e) => format!("{}?{q}&{e}", r.path),
        },
        body,
        field,
    };
    let long = "a".repeat(super::MAX_VALUE + 44);
    let unknown = if p == NONE.0 {
        one("unknown", "bogus=1".into(), None, "bogus")
    } else {
        one(
            "unknown",
            format!("{p}={}&bogus=1", r.good),
            body_token.clone(),
            "bogus",
        )
    };
    let mut out = vec![
        unknown,
        one(
            "repeated",
            format!("{p}={0}&{p}={0}", r.good),
            body_token.clone(),
            p,
        ),
        one("empty", format!("{p}="), body_token.clone(), p),
        one("overlong", format!("{p}={long}"), body_token.clone(), p),
    ];
    out.push(if r.token {
        one(
            "token twice",
            "token=abc".into(),
            Some(r#"{"token": "abc"}"#.into()),
            "token",
        )
    } else {
        one("token twice", "token=abc&token=abc".into(), None, "token")
    });
    out.push(match r.wrong {
        Some(w) => one("wrong type", format!("{p}={w}"), body_token, p),
        None => one(
            "wrong type",
            String::new(),
            Some(r#"{"token": 5}"#.into()),
            "token",
        ),
    });
    out
}
