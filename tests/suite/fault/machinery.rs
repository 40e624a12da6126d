//! Self-tests of the test machinery: the fault proxy's modes and the
//! checker telling overlaps from polling artifacts.

use super::*;

// ------------------------------------------- self-tests of the test machinery

/// The proxy does what each mode promises, against a loopback echo server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_modes_behave_as_documented() {
    let upstream = echo_server().await;
    let proxy = within(
        Duration::from_secs(5),
        "starting the proxy",
        Proxy::start(upstream),
    )
    .await;
    let mut c = connect_proxy(&proxy).await;
    assert_eq!(
        ask(&mut c, b"pass", Duration::from_secs(1))
            .await
            .as_deref(),
        Some(&b"pass"[..])
    );
    proxy_delays(&proxy, &mut c).await;
    proxy_blackholes(&proxy, &mut c).await;
    proxy_resets(&proxy, &mut c).await;
    proxy.set(Mode::Pass);
    let mut again = connect_proxy(&proxy).await;
    assert_eq!(
        ask(&mut again, b"back", Duration::from_secs(1))
            .await
            .as_deref(),
        Some(&b"back"[..])
    );
}

/// A loopback server that echoes every byte back; returns its address.
pub(super) async fn echo_server() -> std::net::SocketAddr {
    let echo = within(
        Duration::from_secs(2),
        "binding the echo server",
        tokio::net::TcpListener::bind("127.0.0.1:0"),
    )
    .await
    .unwrap();
    let upstream = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    upstream
}

/// A new connection to `proxy`.
pub(super) async fn connect_proxy(proxy: &Proxy) -> tokio::net::TcpStream {
    within(
        Duration::from_secs(2),
        "connecting to the proxy",
        tokio::net::TcpStream::connect(("127.0.0.1", proxy.port)),
    )
    .await
    .unwrap()
}

/// Send `msg` and read as many bytes back, each within `wait`; `None` when
/// either did not happen in time or failed.
pub(super) async fn ask(
    s: &mut tokio::net::TcpStream,
    msg: &[u8],
    wait: Duration,
) -> Option<Vec<u8>> {
    timeout(wait, s.write_all(msg)).await.ok()?.ok()?;
    let mut buf = vec![0u8; msg.len()];
    match timeout(wait, s.read_exact(&mut buf)).await {
        Ok(Ok(_)) => Some(buf),
        _ => None,
    }
}

/// `Mode::Delay` holds answers for about the delay.
pub(super) async fn proxy_delays(proxy: &Proxy, c: &mut tokio::net::TcpStream) {
    proxy.set(Mode::Delay(Duration::from_millis(200)));
    let t = Instant::now();
    assert!(ask(c, b"slow", Duration::from_secs(1)).await.is_some());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(600),
        "delay: {took:?}"
    );
}

/// `Mode::Blackhole` answers nothing, on `c` or a new connection, and
/// delivers what it held once the proxy passes again.
pub(super) async fn proxy_blackholes(proxy: &Proxy, c: &mut tokio::net::TcpStream) {
    proxy.set(Mode::Blackhole);
    assert_eq!(
        ask(c, b"held", Duration::from_millis(300)).await,
        None,
        "blackhole answered"
    );
    let mut fresh = connect_proxy(proxy).await;
    assert_eq!(
        ask(&mut fresh, b"new!", Duration::from_millis(300)).await,
        None,
        "blackhole answered a new connection"
    );
    proxy.set(Mode::Pass);
    // What was held is delivered when the partition heals.
    let mut buf = [0u8; 4];
    within(
        Duration::from_secs(1),
        "held bytes after the heal",
        c.read_exact(&mut buf),
    )
    .await
    .unwrap();
    assert_eq!(&buf, b"held");
    within(
        Duration::from_secs(1),
        "held bytes of a new connection",
        fresh.read_exact(&mut buf),
    )
    .await
    .unwrap();
    assert_eq!(&buf, b"new!");
}

/// `Mode::Reset` ends `c` and resets new connections at once.
pub(super) async fn proxy_resets(proxy: &Proxy, c: &mut tokio::net::TcpStream) {
    let mut buf = [0u8; 4];
    proxy.set(Mode::Reset);
    let r = within(
        Duration::from_secs(1),
        "a reset connection to end",
        c.read(&mut buf),
    )
    .await;
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "reset left the connection open: {r:?}"
    );
    // A new connection is reset at once: connect fails, or the first read does.
    let conn = within(
        Duration::from_secs(2),
        "connecting to the proxy in reset mode",
        tokio::net::TcpStream::connect(("127.0.0.1", proxy.port)),
    )
    .await;
    if let Ok(mut refused) = conn {
        let r = within(
            Duration::from_secs(1),
            "a new connection to be reset",
            refused.read(&mut buf),
        )
        .await;
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "reset accepted a connection: {r:?}"
        );
    }
}

/// The checker catches a real overlap and a stale claim, and does not call a
/// clean handover an overlap even when the polls straddle it.
#[test]
fn checker_tells_overlaps_from_polling_artifacts() {
    let s = Synthetic { t0: Instant::now() };
    s.handover_is_no_overlap_but_overlap_is();
    s.cut_off_claims_are_stale();
    s.only_the_paused_term_is_stale();
    // A later term with a smaller token.
    let slots = vec![
        ("a".to_owned(), s.series(0, 100, true, 5, 2000)),
        ("b".to_owned(), s.series(200, 300, true, 4, 2000)),
    ];
    let r = check("fencing", s.t0, TTL, &slots, &[]);
    assert_eq!(r.token_regressions.len(), 1, "{}", r.summary());
}

/// Made-up recordings for the checker's self-test, on a clock starting at
/// `t0`.
pub(super) struct Synthetic {
    t0: Instant,
}

impl Synthetic {
    /// The instant `ms` milliseconds after `t0`.
    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// An answer claiming (or not) leadership with `token`.
    fn answer(&self, leader: bool, token: u64, valid_for_ms: u64) -> Answer {
        Answer {
            status: if leader { 200 } else { 503 },
            is_leader: leader,
            leader: None,
            fencing_token: Some(token),
            valid_for_ms,
            transitions: 1,
            backend_healthy: true,
            error: None,
        }
    }

    /// Polls every 5 ms from `from` to `to`, each answered 3 ms after it was
    /// sent, valid until `deadline`.
    fn series(&self, from: u64, to: u64, leader: bool, token: u64, deadline: u64) -> Vec<Sample> {
        (from..to)
            .step_by(5)
            .map(|ms| Sample {
                send: self.at(ms),
                recv: self.at(ms + 3),
                answer: Some(self.answer(leader, token, deadline.saturating_sub(ms))),
            })
            .collect()
    }

    /// Polls that straddle a clean handover are no overlap; a second leader
    /// claiming for ~100 ms while the first still claims is one.
    fn handover_is_no_overlap_but_overlap_is(&self) {
        // a leads until ~100 ms; b from ~101 ms. a's last true poll (sent 95,
        // answered 98) and b's first true poll (sent 100, answered 103) straddle
        // the handover: not an overlap.
        let mut a = self.series(0, 100, true, 1, 2000);
        a.extend(self.series(100, 300, false, 1, 0));
        let mut b = self.series(0, 100, false, 0, 0);
        b.extend(self.series(100, 300, true, 2, 2000));
        let slots = vec![("a".to_owned(), a.clone()), ("b".to_owned(), b.clone())];
        let r = check("handover", self.t0, TTL, &slots, &[]);
        assert!(r.overlaps.is_empty(), "{}", r.summary());
        assert!(r.problems.is_empty(), "{}", r.summary());

        // b starts claiming while a still claims (a until 200 ms): caught.
        let mut a2 = self.series(0, 200, true, 1, 2000);
        a2.extend(self.series(200, 300, false, 1, 0));
        let slots = vec![("a".to_owned(), a2), ("b".to_owned(), b.clone())];
        let r = check("overlap", self.t0, TTL, &slots, &[]);
        assert_eq!(r.overlaps.len(), 1, "{}", r.summary());
        assert!(
            r.overlaps[0].at_least >= Duration::from_millis(90),
            "{}",
            r.summary()
        );
    }

    /// A cut-off leader that reported valid_until ≈ 150 ms keeps claiming
    /// until 250 ms: a stale claim.
    fn cut_off_claims_are_stale(&self) {
        let mut c = self.series(0, 250, true, 3, 150);
        for s in &mut c {
            let ms = (s.send - self.t0).as_millis() as u64;
            s.answer = Some(self.answer(true, 3, 150u64.saturating_sub(ms)));
        }
        let fault = Fault::new("cut", Some(0), Expect::CutOff, FAILOVER_BOUND);
        let fault = Fault {
            start: self.at(0),
            recover_from: self.at(0),
            end: Some(self.at(400)),
            ..fault
        };
        let r = check("stale", self.t0, TTL, &[("c".to_owned(), c)], &[fault]);
        assert!(r.worst_stale_ms.is_some_and(|v| v > 0), "{}", r.summary());
    }

    /// A paused leader's answers after SIGCONT, ending in claims under
    /// `new_token` from 3.6 s on.
    fn paused(&self, new_token: u64) -> Vec<Sample> {
        let mut v = self.series(0, 100, true, 8, 2000);
        v.push(Sample {
            send: self.at(100),
            recv: self.at(2600),
            answer: Some(self.answer(false, 8, 0)),
        });
        v.extend(self.series(2605, 3600, false, 8, 0));
        v.extend(self.series(3600, 3700, true, new_token, 5600));
        v
    }

    /// A leader paused at 100 ms for 2.5 s that wins a new term (token 9)
    /// 1 s after SIGCONT: its old term is not claimed after SIGCONT, so
    /// nothing is stale; the same answers under the old token would be.
    fn only_the_paused_term_is_stale(&self) {
        let fault = Fault::new("pause", Some(0), Expect::Paused, FAILOVER_BOUND);
        let fault = Fault {
            start: self.at(100),
            recover_from: self.at(100),
            end: Some(self.at(2600)),
            ..fault
        };
        let r = check(
            "new term after pause",
            self.t0,
            TTL,
            &[("p".to_owned(), self.paused(9))],
            std::slice::from_ref(&fault),
        );
        assert!(r.worst_stale_ms.is_some_and(|v| v <= 0), "{}", r.summary());
        let r = check(
            "old term after pause",
            self.t0,
            TTL,
            &[("p".to_owned(), self.paused(8))],
            &[fault],
        );
        assert!(r.worst_stale_ms.is_some_and(|v| v > 0), "{}", r.summary());
    }
}
