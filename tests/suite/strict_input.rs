//! Strict input through a real sidecar on etcd: the hostile-input table
//! (`leader_elector::query::hostile`) over real HTTP on both listeners.
//! Every request gets a 4xx JSON answer naming the field, and nothing is
//! acted on: the same term still leads, and every lock, semaphore,
//! read-write lock and job claim the table abused is free afterwards.

use std::time::Duration;

use leader_elector::query::hostile::requests;

use crate::coord::{call, sidecar};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_on_every_route_of_a_real_sidecar_is_refused_and_acts_on_nothing() {
    let (_etcd, s, control) = sidecar("etcd", "strict-input").await;
    wait_for(Duration::from_secs(30), "the sidecar leads", || async {
        s.is_leader().await
    })
    .await;
    let (_, before) = s.leader().await.expect("/leader answers");
    for h in requests() {
        let port = if h.route.control { control } else { s.port };
        let (status, body) = http_json(
            port,
            h.route.method,
            &h.uri,
            h.body.as_deref(),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|e| panic!("{} {}: {e}\n{}", h.route.method, h.uri, s.log()));
        let what = format!("{} {} ({}) {:?}", h.route.method, h.uri, h.case, h.body);
        assert!((400..500).contains(&status), "{what}: {status} {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(h.field),
            "{what}: names no {}: {body}",
            h.field
        );
    }
    let (status, after) = s.leader().await.expect("/leader answers");
    assert_eq!(status, 200, "the sidecar no longer leads: {after}");
    for field in ["fencing_token", "transitions"] {
        assert_eq!(before[field], after[field], "{field} changed: {after}");
    }
    assert!(after.get("waiting").is_none(), "frozen: {after}");
    // Nothing was taken: each abused name is free to a well-formed request.
    for path in [
        "/locks/x?ttl=5s".to_owned(),
        "/semaphores/x?permits=1&ttl=5s".to_owned(),
        "/rwlocks/x?mode=write&ttl=5s".to_owned(),
        "/jobs/q/j/claim?ttl=5s".to_owned(),
    ] {
        let (status, body) = call(control, "POST", &path, None).await;
        assert_eq!(status, 200, "POST {path}: {body}");
    }
}
