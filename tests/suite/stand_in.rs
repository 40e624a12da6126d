//! The Kubernetes API stand-in's generic REST semantics on the resources
//! beside Leases (Services, Endpoints, EndpointSlices), through kube-rs as
//! the sidecar calls them: what the real server's registry store does for
//! every resource (https://kubernetes.io/docs/reference/using-api/api-concepts/).

use crate::kubernetes::client_on;
use crate::support::kube_api::KubeApi;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;

const NS: &str = "standin";

/// The status code and reason of a refused call.
fn refused<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason),
        other => panic!("not refused: {other:?}"),
    }
}

fn slice(service: &str, ip: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"generateName": format!("{service}-"),
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "leader-elector"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap()
}

/// Services and EndpointSlices: validation (422), `generateName`, label
/// and field selectors (400 for a field the server cannot select on),
/// merge patch and delete preconditions (409) as for Leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_endpoint_slices_follow_the_generic_rules() {
    let api = KubeApi::start(NS);
    let client = client_on(&api, "conformance").await;
    let pp = PostParams::default();
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let no_ports: Service =
        serde_json::from_value(json!({"metadata": {"name": "db"}, "spec": {}})).unwrap();
    assert_eq!(refused(services.create(&pp, &no_ports).await).0, 422);
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "db"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
    .unwrap();
    let svc = services.create(&pp, &svc).await.unwrap();
    assert!(
        svc.spec.unwrap().cluster_ip.is_some(),
        "a cluster IP is assigned"
    );

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let a = slices.create(&pp, &slice("db", "10.0.0.1")).await.unwrap();
    slices
        .create(&pp, &slice("other", "10.0.0.2"))
        .await
        .unwrap();
    let name = a.metadata.name.clone().unwrap();
    assert!(name.starts_with("db-") && name.len() > 3, "{name}");
    let mine = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
        .await
        .unwrap();
    assert_eq!(mine.items.len(), 1);
    let set = ListParams::default()
        .labels("kubernetes.io/service-name in (db,other),endpointslice.kubernetes.io/managed-by");
    assert_eq!(slices.list(&set).await.unwrap().items.len(), 2);
    let bad_field = ListParams::default().fields("addressType=IPv4");
    assert_eq!(refused(slices.list(&bad_field).await).0, 400);
    assert_eq!(
        refused(slices.create(&pp, &slice("db", "not-an-ip")).await).0,
        422
    );

    // Merge patch with a stale resourceVersion: 409; with the current: applied.
    let stale =
        json!({"metadata": {"resourceVersion": "1"}, "endpoints": [{"addresses": ["10.0.0.9"]}]});
    let mp = PatchParams::default();
    assert_eq!(
        refused(slices.patch(&name, &mp, &Patch::Merge(&stale)).await).0,
        409
    );
    let rv = a.metadata.resource_version.clone().unwrap();
    let fresh =
        json!({"metadata": {"resourceVersion": rv}, "endpoints": [{"addresses": ["10.0.0.9"]}]});
    let b = slices
        .patch(&name, &mp, &Patch::Merge(&fresh))
        .await
        .unwrap();
    assert_eq!(b.endpoints[0].addresses, vec!["10.0.0.9".to_owned()]);
    let ipv6 = json!({"addressType": "IPv6", "endpoints": [{"addresses": ["::1"]}]});
    assert_eq!(
        refused(slices.patch(&name, &mp, &Patch::Merge(&ipv6)).await).0,
        422,
        "addressType is immutable"
    );

    // Delete with preconditions: a stale version 409, the current one deletes.
    let mut dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some(rv),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(refused(slices.delete(&name, &dp).await).0, 409);
    dp.preconditions.as_mut().unwrap().resource_version = b.metadata.resource_version.clone();
    slices.delete(&name, &dp).await.unwrap();
    assert_eq!(refused(slices.get(&name).await).0, 404);
}

/// A watch with a label selector delivers only the objects it selects,
/// and v1 Endpoints answers carry the deprecation warning of v1.33+.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_select_by_label_and_endpoints_warn() {
    let api = KubeApi::start(NS);
    let client = client_on(&api, "watcher").await;
    let pp = PostParams::default();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let wp = WatchParams::default()
        .labels("kubernetes.io/service-name=db")
        .timeout(10);
    let stream = slices.watch(&wp, "0").await.unwrap();
    futures_util::pin_mut!(stream);
    slices
        .create(&pp, &slice("other", "10.0.0.2"))
        .await
        .unwrap();
    let want = slices.create(&pp, &slice("db", "10.0.0.1")).await.unwrap();
    match stream.next().await {
        Some(Ok(WatchEvent::Added(s))) => assert_eq!(s.metadata.name, want.metadata.name),
        other => panic!("{other:?}"),
    }

    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), NS);
    let e: Endpoints = serde_json::from_value(json!({"metadata": {"name": "lock",
        "annotations": {"control-plane.alpha.kubernetes.io/leader": "{}"}}}))
    .unwrap();
    endpoints.create(&pp, &e).await.unwrap();
    let req = http::Request::get(format!("/api/v1/namespaces/{NS}/endpoints/lock"))
        .body(Vec::new())
        .unwrap();
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap();
    let warning = res
        .headers()
        .get("warning")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(warning.is_some_and(|w| w.contains("v1 Endpoints is deprecated")));
}
