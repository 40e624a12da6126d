//! A failed API call in words, the same for every reader of the API (the
//! Pod labeler, the EndpointSlice writer): the kind of failure, for logs
//! and metrics, and a sentence that names what was attempted, where, and
//! the caller's fix.

/// What a failed call was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    /// `forbidden` (403), `not_found` (404), `api_error` (any other answer)
    /// or `unreachable` (no answer).
    pub kind: &'static str,
    /// The sentence for a log line or an error.
    pub why: String,
}

/// What the caller was doing and how to fix what may go wrong.
#[derive(Debug, Clone, Copy)]
pub struct Doing<'a> {
    /// The verb and resource, e.g. `patch pods`.
    pub what: &'a str,
    /// The namespace the call was made in.
    pub namespace: &'a str,
    /// The fix for a 403: which Role to bind, with which verbs.
    pub forbidden_fix: &'a str,
}

/// Explain `err` of a call doing `doing`; `not_found` is the sentence for a
/// 404 (`None`: a 404 is told as any other answer).
pub fn explain(err: &kube::Error, doing: Doing<'_>, not_found: Option<String>) -> Explained {
    match err {
        kube::Error::Api(s) if s.code == 403 => Explained {
            kind: "forbidden",
            why: format!(
                "forbidden: these credentials may not {} in namespace {} ({}); {}",
                doing.what, doing.namespace, s.message, doing.forbidden_fix
            ),
        },
        kube::Error::Api(s) if s.code == 404 && not_found.is_some() => Explained {
            kind: "not_found",
            why: not_found.unwrap_or_default(),
        },
        kube::Error::Api(s) => Explained {
            kind: "api_error",
            why: format!("the API server answered {}: {}", s.code, s.message),
        },
        other => Explained {
            kind: "unreachable",
            why: format!("the API server is unreachable: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("no", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    const DOING: Doing<'static> = Doing {
        what: "patch pods",
        namespace: "ns",
        forbidden_fix: "bind the Role",
    };

    #[test]
    fn each_kind_names_what_was_done_and_the_fix() {
        let e = explain(&api(403), DOING, None);
        assert_eq!(e.kind, "forbidden");
        assert_eq!(
            e.why,
            "forbidden: these credentials may not patch pods in namespace ns (no); bind the Role"
        );
        assert_eq!(explain(&api(404), DOING, Some("gone".into())).why, "gone");
        assert_eq!(explain(&api(404), DOING, None).kind, "api_error");
        assert_eq!(
            explain(&api(500), DOING, None).why,
            "the API server answered 500: no"
        );
    }
}
