use std::time::Duration;

use super::*;
use crate::backend::redis::RedisOptions;
use crate::backend::redis::election::renewal;
use crate::backend::redis::verdict::Verdict;
use crate::backend::{Holder, LeaseBackend, LostReason, Renewal, TermId};
use crate::elector::is_outage;

fn roster(ids: &[&str]) -> Option<String> {
    let members = ids.iter().map(|id| Member {
        identity: (*id).to_owned(),
        peer_addr: format!("{id}:4042"),
    });
    Some(Roster::new(members).to_json())
}

fn ids(r: &Option<Roster>) -> Vec<String> {
    let members = r.iter().flat_map(|r| r.members.iter());
    members.map(|m| m.identity.clone()).collect()
}

/// Safety: a candidate never admitted by the roster a quorum holds is kept
/// out, however the others disagree; a roster edited into garbage, or
/// rosters that share no member, let nobody campaign. Liveness twin: the
/// roster a quorum agrees on is read as it is, an agreed absence lets
/// anyone campaign, and disagreeing rosters still let their common
/// members campaign (no deadlock after a split).
#[test]
fn a_roster_is_read_from_a_quorum_agreeing_else_their_common_members() {
    let ab = roster(&["a", "b"]);
    let abx = roster(&["a", "b", "x"]);
    let got = roster_of(&[ab.clone(), abx.clone(), ab.clone()], 2).unwrap();
    assert_eq!(ids(&got), ["a", "b"]);
    assert!(
        !got.unwrap().may_campaign("x"),
        "x: only a minority admits it"
    );
    assert_eq!(roster_of(&[None, None, ab.clone()], 2).unwrap(), None);
    let split = roster_of(&[ab.clone(), abx.clone(), roster(&["b", "x"])], 2).unwrap();
    assert_eq!(ids(&split), ["b"]);
    let two = roster_of(&[None, abx.clone()], 2).unwrap();
    assert_eq!(ids(&two), ["a", "b", "x"], "an absent roster admits all");
    assert!(roster_of(&[roster(&["a"]), roster(&["b"])], 2).is_err());
    assert!(roster_of(&[Some("{oops".into())], 1).is_err());
    assert_eq!(ids(&roster_of(&[ab], 1).unwrap()), ["a", "b"]);
}

fn backend(url: &str) -> std::sync::Arc<RedisBackend> {
    let options = RedisOptions {
        urls: vec![url.to_owned()],
        per_server_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    RedisBackend::new("t:", "e", options).unwrap()
}

fn term() -> Term {
    Term {
        holder: Holder {
            identity: "a".into(),
            fencing_token: 42,
            term_id: TermId::new("tok"),
            revision: None,
            expires_in: None,
        },
        ttl: Duration::from_secs(2),
        granted: Duration::from_secs(2),
        servers: None,
    }
}

/// Without failsafe the renewal is today's (no keys beyond the key and the
/// controls, no put-back on one
/// server); with it, a renewal after one that did not succeed puts the key
/// back only while the counter holds the term's token, and every renewal
/// writes the roster.
#[test]
fn only_a_renewal_after_an_unsure_one_may_put_the_key_back() {
    let b = backend("redis://127.0.0.1:1");
    let (keys, args) = b.renew_call(&term(), String::new());
    assert_eq!(
        (keys.len(), args),
        (0, vec!["tok".into(), "2000".into(), String::new()])
    );
    b.stage("a", Roster::new([]));
    let (keys, first) = b.renew_call(&term(), String::new());
    // After the key and the two control keys: KEYS[4] and KEYS[5].
    assert_eq!(keys[0], "t:{e}:fencing");
    assert_eq!(keys[1], "t:{e}:failsafe:roster");
    assert_eq!((&first[2], &first[3]), (&String::new(), &String::new()));
    let (_, unsure) = b.renew_call(&term(), String::new());
    assert_eq!(unsure[2], "tok|42|a", "put back after an unsure renewal");
    assert_eq!(unsure[3], "42", "guarded by the counter");
    assert_eq!(unsure[4], r#"{"members":[]}"#);
    b.failsafe_renewed();
    let (_, after) = b.renew_call(&term(), String::new());
    assert_eq!(after[3], "", "a renewed term renews, never puts back");
}

/// Failsafe starts on an unreachable Redis: a refused connection and a
/// server that never answers (a timeout) are outages.
#[tokio::test]
async fn a_refused_connection_and_a_timeout_are_outages() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let e = backend(&format!("redis://127.0.0.1:{port}"))
        .renew(&term())
        .await
        .unwrap_err();
    assert!(is_outage(&e), "refused: {}", e.report());
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let e = backend(&url).renew(&term()).await.unwrap_err();
    assert!(is_outage(&e), "silent: {}", e.report());
    hold.abort();
}

/// Refusals stay refusals: a key of another type, a refused password or
/// command, a script that escaped its reload, a server without persistence,
/// and a lost term or a foreign edit (answers, not errors) never start
/// failsafe.
#[test]
fn refused_writes_and_lost_terms_are_not_outages() {
    let b = backend("redis://127.0.0.1:1");
    let server = &b.group.servers()[0];
    for (code, detail) in [
        (
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value",
        ),
        ("NOAUTH", "Authentication required."),
        (
            "NOPERM",
            "this user has no permissions to run the 'evalsha' command",
        ),
        ("NOSCRIPT", "No matching script. Please use EVAL."),
    ] {
        let err = redis::make_extension_error(code.into(), Some(detail.into()));
        let e = server.classify(err);
        assert!(!is_outage(&e), "{code}: {}", e.report());
    }
    let answer = redis::Value::Array(vec![redis::Value::Int(0), redis::Value::Nil]);
    let e = b.read_roster_answer(0, answer).unwrap_err();
    assert!(!is_outage(&e), "{}", e.report());
    assert!(e.report().contains("appendonly"), "{}", e.report());
    for (v, why) in [
        (Verdict::Taken, LostReason::KeyOverwritten),
        (Verdict::Gone, LostReason::KeyDeleted),
    ] {
        let lost = renewal(v, &term(), 1).unwrap();
        assert!(matches!(lost, Renewal::Lost(r) if r == why));
    }
}
