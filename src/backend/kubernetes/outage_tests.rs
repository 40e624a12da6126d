//! Which Lease errors are outages (failsafe may start) and which are
//! answers (a refused write keeps today's rules): issue 38's "refusals stay
//! refusals", one test per side, against kube-rs's mock service.

use std::sync::{Arc, Mutex};

use super::tests::{elected, status, store};
use super::*;
use crate::elector::is_outage;
use crate::kube_client::mock::{Seen, mock};

type Responder = crate::kube_client::mock::Responder<String>;

/// A backend elected on a mock store whose PUTs answer `code` (with the
/// Lease still ours) once the returned switch is set.
async fn elected_then(code: u16) -> (Arc<KubeLeaseBackend>, Term, Arc<Mutex<bool>>) {
    let (inner, _) = store(None);
    let failing = Arc::new(Mutex::new(false));
    let f = failing.clone();
    let respond: Responder = Arc::new(move |s: &Seen| {
        if *f.lock().unwrap() && s.method == "PUT" {
            let reason = match code {
                409 => "Conflict",
                429 => "TooManyRequests",
                c if c >= 500 => "InternalError",
                _ => "Refused",
            };
            return (code, status(code, reason, "answered"));
        }
        inner(s)
    });
    let (client, _) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let term = elected(&b, "pod-0", Duration::from_secs(2)).await;
    (b, term, failing)
}

/// What a renewal answered `code` comes to: `Some(error)`, or `None` when
/// the renewal reported a lost term instead.
async fn renewal_answered(code: u16) -> Option<BackendError> {
    let (b, term, failing) = elected_then(code).await;
    *failing.lock().unwrap() = true;
    match b.renew(&term).await {
        Ok(Renewal::Lost(_)) => None,
        Ok(other) => panic!("{code}: renewed? {other:?}"),
        Err(e) => Some(e),
    }
}

#[tokio::test]
async fn a_refused_write_is_never_an_outage() {
    // 409 three times in a row while the Lease stays ours: contended.
    for code in [400, 401, 403, 404, 405, 409, 422] {
        match renewal_answered(code).await {
            None => assert_eq!(code, 404, "only a vanished Lease is a lost term"),
            Some(e) => {
                assert!(!is_outage(&e), "{code} is an answer, not an outage: {e:?}");
                if code == 409 {
                    assert_eq!(e.reason(), "contended", "{}", e.report());
                }
            }
        }
    }
}

#[tokio::test]
async fn an_api_server_that_cannot_serve_is_an_outage() {
    for code in [429, 500, 503, 504] {
        let e = renewal_answered(code).await.expect("an error");
        assert!(is_outage(&e), "{code} is an outage: {e:?}");
    }
    // Connection refused: nothing listens on the address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let e = b.read().await.unwrap_err();
    assert!(is_outage(&e), "connection refused is an outage: {e:?}");
    // A hung API server: the Elector's deadline gives a timeout.
    let e = BackendError::Timeout {
        backend: ABOUT,
        call: "renew",
        timeout_ms: 1,
    };
    assert!(is_outage(&e));
}
