//! What these credentials may do: SelfSubjectAccessReviews, remembered per
//! verb.
//!
//! A verb found allowed is not asked again (a later revocation shows as a
//! 403 on the call itself). A verb found missing is asked again only after
//! [`DENIED_FOR`], so a part that retries its start while a permission is
//! missing sends at most one review per verb per minute, not one per retry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::Api;
use tokio::time::Instant;

/// One permission asked for: API group (`""` for the core group),
/// resource (plural) and verb.
pub type Ask = (&'static str, &'static str, &'static str);

/// How long a "not allowed" answer stands before the verb is reviewed
/// again: 60 s.
pub const DENIED_FOR: Duration = Duration::from_secs(60);

/// The remembered answers of one client's reviews.
#[derive(Debug, Default)]
pub struct Reviews {
    answers: Mutex<HashMap<(String, Ask), (bool, Instant)>>,
}

impl Reviews {
    /// Whether these credentials may do `ask` in `namespace`: a remembered
    /// answer when there is one that still stands, else a review.
    ///
    /// # Errors
    /// The review could not be made (the API answered an error); nothing
    /// is remembered then.
    pub async fn may(
        &self,
        client: &Client,
        namespace: &str,
        ask: Ask,
    ) -> Result<bool, kube::Error> {
        let key = (namespace.to_owned(), ask);
        if let Some(&(allowed, at)) = self.lock().get(&key)
            && (allowed || at.elapsed() < DENIED_FOR)
        {
            return Ok(allowed);
        }
        let (group, resource, verb) = ask;
        let allowed = may(client, namespace, group, resource, verb).await?;
        self.lock().insert(key, (allowed, Instant::now()));
        Ok(allowed)
    }

    /// The asks of `asks` that are not allowed, in their order, each review
    /// bounded by `limit`.
    ///
    /// # Errors
    /// A review could not be made or took longer than `limit`: what
    /// happened, in words (the caller checks nothing then).
    pub async fn missing(
        &self,
        client: &Client,
        namespace: &str,
        asks: &[Ask],
        limit: Duration,
    ) -> Result<Vec<Ask>, String> {
        let mut missing = Vec::new();
        for &ask in asks {
            match tokio::time::timeout(limit, self.may(client, namespace, ask)).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => missing.push(ask),
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err(format!("the review took longer than {limit:?}")),
            }
        }
        Ok(missing)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Ask), (bool, Instant)>> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether these credentials may `verb` `resource` of `group` in
/// `namespace`: one SelfSubjectAccessReview, not remembered (see
/// [`Reviews::may`] for the remembered one).
///
/// # Errors
/// The review could not be made (the API answered an error).
pub async fn may(
    client: &Client,
    namespace: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api
        .create(&kube::api::PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::kube_client::mock::{Responder, mock};

    /// A server that allows every verb but `update`.
    fn all_but_update() -> Responder<Value> {
        Arc::new(|seen| {
            let verb = seen.body["spec"]["resourceAttributes"]["verb"]
                .as_str()
                .unwrap_or("");
            let allowed = verb != "update";
            (
                201,
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                         "spec": {}, "status": {"allowed": allowed}}),
            )
        })
    }

    const ASKS: [Ask; 3] = [
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
        ("coordination.k8s.io", "leases", "list"),
    ];

    #[tokio::test(start_paused = true)]
    async fn a_missing_verb_is_reviewed_again_at_most_once_a_minute() {
        let (client, seen) = mock(all_but_update());
        let reviews = Reviews::default();
        let limit = Duration::from_secs(5);
        for _ in 0..10 {
            let missing = reviews.missing(&client, "ns", &ASKS, limit).await;
            assert_eq!(missing.unwrap(), vec![ASKS[1]]);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // Ten retries within a minute: one review per verb.
        assert_eq!(seen.lock().unwrap().len(), 3);
        tokio::time::advance(DENIED_FOR).await;
        let missing = reviews.missing(&client, "ns", &ASKS, limit).await;
        assert_eq!(missing.unwrap(), vec![ASKS[1]]);
        // After a minute only the missing verb is asked again.
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[3].body["spec"]["resourceAttributes"]["verb"], "update");
    }

    #[tokio::test]
    async fn a_review_that_cannot_be_made_is_an_error_and_not_remembered() {
        let (client, seen) = mock::<Value>(Arc::new(|_| {
            (
                500,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "boom", "code": 500}),
            )
        }));
        let reviews = Reviews::default();
        let err = reviews
            .missing(&client, "ns", &ASKS, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(err.contains("boom"), "{err}");
        let _ = reviews
            .missing(&client, "ns", &ASKS, Duration::from_secs(5))
            .await;
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
