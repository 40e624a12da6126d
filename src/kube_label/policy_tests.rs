//! The chart's admission policy for Pod labels (`podLabelPolicy.enabled`,
//! `charts/leader-elector/files/pod-label-policy.json`), evaluated with a
//! CEL implementation on admission requests shaped as the API server sends
//! them for a Pod-bound ServiceAccount token: what it must allow (the
//! sidecar's own label, clearing a dead leader's) and what it must deny.

use serde_json::{Value, json};

const USER: &str = "system:serviceaccount:billing:billing-leader-elector";
const KEY: &str = "leader-elector/leader";

/// The policy's match conditions and validations, with the chart's
/// placeholders filled in as the chart fills them.
fn policy() -> (Vec<String>, Vec<String>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/leader-elector/files/pod-label-policy.json"
    );
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("SERVICE_ACCOUNT_USER", USER)
        .replace("LEADER_LABEL_KEY", KEY);
    let doc: Value = serde_json::from_str(&text).unwrap();
    let exprs = |field: &str| {
        doc[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["expression"].as_str().unwrap().to_owned())
            .collect()
    };
    (exprs("matchConditions"), exprs("validations"))
}

fn pod(name: &str, labels: Value, annotations: Option<Value>, image: &str) -> Value {
    let mut metadata = json!({"name": name, "namespace": "billing", "uid": format!("uid-{name}"), "labels": labels});
    if let Some(a) = annotations {
        metadata["annotations"] = a;
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": image}], "serviceAccountName": "billing-leader-elector"},
    })
}

/// An UPDATE of a Pod by `user`, whose token is bound to Pod `bound_to`
/// (`None`: a legacy Secret token, no Pod claims).
fn request(user: &str, bound_to: Option<&str>) -> Value {
    let mut extra = json!({});
    if let Some(p) = bound_to {
        extra = json!({
            "authentication.kubernetes.io/pod-name": [p],
            "authentication.kubernetes.io/pod-uid": [format!("uid-{p}")],
            "authentication.kubernetes.io/node-name": ["node-1"],
            "authentication.kubernetes.io/credential-id": ["JTI=1f2e"],
        });
    }
    json!({
        "operation": "UPDATE",
        "namespace": "billing",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": {
            "username": user,
            "uid": "8c0f",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:billing", "system:authenticated"],
            "extra": extra,
        },
    })
}

/// `Some(allowed)` when the policy applies, `None` when its match
/// conditions leave the request to others.
fn admit(req: &Value, old: &Value, new: &Value) -> Option<bool> {
    let (conditions, validations) = policy();
    let mut ctx = cel::Context::default();
    ctx.add_variable("request", req.clone()).unwrap();
    ctx.add_variable("oldObject", old.clone()).unwrap();
    ctx.add_variable("object", new.clone()).unwrap();
    let eval = |expr: &String| match cel::Program::compile(expr).unwrap().execute(&ctx) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{expr}: {other:?}"),
    };
    if !conditions.iter().all(eval) {
        return None;
    }
    Some(validations.iter().all(eval))
}

fn labels(leader: &str) -> Value {
    json!({"app": "billing", KEY: leader})
}

#[test]
fn the_sidecar_may_set_its_own_pods_leader_label() {
    let own = request(USER, Some("p1"));
    let (f, t) = (
        pod("p1", labels("false"), None, "a:1"),
        pod("p1", labels("true"), None, "a:1"),
    );
    assert_eq!(admit(&own, &f, &t), Some(true), "false -> true");
    assert_eq!(admit(&own, &t, &f), Some(true), "true -> false");
    let unlabelled = pod("p1", json!({"app": "billing"}), None, "a:1");
    assert_eq!(admit(&own, &unlabelled, &t), Some(true), "first label");
}

#[test]
fn a_leader_may_clear_a_dead_leaders_label_and_nothing_more() {
    let own = request(USER, Some("p1"));
    let (t, f) = (
        pod("p2", labels("true"), None, "a:1"),
        pod("p2", labels("false"), None, "a:1"),
    );
    assert_eq!(
        admit(&own, &t, &f),
        Some(true),
        "another Pod's true -> false"
    );
    assert_eq!(
        admit(&own, &f, &t),
        Some(false),
        "another Pod's false -> true"
    );
    let other_label = pod("p2", json!({"app": "x", KEY: "false"}), None, "a:1");
    assert_eq!(
        admit(&own, &f, &other_label),
        Some(false),
        "another Pod's other label"
    );
}

#[test]
fn another_label_a_spec_change_or_an_annotation_is_denied_on_its_own_pod() {
    let own = request(USER, Some("p1"));
    let before = pod("p1", labels("false"), None, "a:1");
    let relabelled = pod("p1", json!({"app": "stolen", KEY: "false"}), None, "a:1");
    assert_eq!(
        admit(&own, &before, &relabelled),
        Some(false),
        "another label"
    );
    let removed = pod("p1", json!({KEY: "true"}), None, "a:1");
    assert_eq!(
        admit(&own, &before, &removed),
        Some(false),
        "a label removed"
    );
    let reimaged = pod("p1", labels("true"), None, "evil:1");
    assert_eq!(admit(&own, &before, &reimaged), Some(false), "spec change");
    let annotated = pod("p1", labels("true"), Some(json!({"a": "b"})), "a:1");
    assert_eq!(
        admit(&own, &before, &annotated),
        Some(false),
        "annotation added"
    );
}

#[test]
fn a_token_not_bound_to_the_pod_may_only_lower_the_label() {
    let legacy = request(USER, None);
    let (f, t) = (
        pod("p1", labels("false"), None, "a:1"),
        pod("p1", labels("true"), None, "a:1"),
    );
    assert_eq!(
        admit(&legacy, &f, &t),
        Some(false),
        "a legacy token cannot promote"
    );
    assert_eq!(admit(&legacy, &t, &f), Some(true), "but may lower");
    let other = request(USER, Some("p9"));
    assert_eq!(
        admit(&other, &f, &t),
        Some(false),
        "a token bound to another Pod"
    );
}

#[test]
fn other_users_are_left_to_their_own_rbac() {
    let admin = request("kubernetes-admin", None);
    let before = pod("p1", labels("false"), None, "a:1");
    let after = pod("p1", json!({"app": "other"}), None, "b:2");
    assert_eq!(admit(&admin, &before, &after), None);
}
