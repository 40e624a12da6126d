use super::*;

fn pending_task(name: &'static str, stop: Stop, limit: Duration) -> Task {
    Task::spawn(name, stop, limit, Span::none(), std::future::pending())
}

/// A race: the Elector ends cleanly right as shutdown is
/// requested. Before the fix, an unbiased `select!` picked the Elector's
/// branch about half the time and logged an ERROR.
#[tokio::test]
async fn a_clean_shutdown_is_not_an_unexpected_end() {
    for _ in 0..32 {
        let shutdown = CancellationToken::new();
        let mut tasks = Tasks::default();
        let elector = Task::spawn(
            "elector",
            Stop::Shutdown,
            Duration::ZERO,
            Span::none(),
            async { None },
        );
        tasks.push(elector.critical("the elector task ended unexpectedly"));
        tasks.push(pending_task("http", Stop::Http, Duration::ZERO));
        tokio::task::yield_now().await;
        shutdown.cancel();
        while !tasks.rows[0].handle.is_finished() {
            tokio::task::yield_now().await;
        }
        tasks.until_shutdown(&shutdown).await;
        // Woke by the token, not by the elector's end.
        assert!(tasks.rows[0].ended.is_none(), "the token is checked first");
        tasks.stop(&CancellationToken::new()).await;
    }
}

#[tokio::test]
async fn an_elector_that_ends_on_its_own_stops_the_app() {
    let shutdown = CancellationToken::new();
    let mut tasks = Tasks::default();
    tasks.push(pending_task("notify", Stop::Shutdown, Duration::ZERO));
    let elector = Task::spawn(
        "elector",
        Stop::Shutdown,
        Duration::ZERO,
        Span::none(),
        async { None },
    );
    tasks.push(elector.critical("the elector task ended unexpectedly"));
    tasks.until_shutdown(&shutdown).await;
    assert!(shutdown.is_cancelled());
    assert!(matches!(tasks.rows[1].ended, Some(Ok(None))));
}

#[tokio::test]
async fn a_task_that_may_end_on_its_own_does_not_stop_the_app() {
    let shutdown = CancellationToken::new();
    let mut tasks = Tasks::default();
    tasks.push(Task::spawn(
        "notify",
        Stop::Shutdown,
        Duration::ZERO,
        Span::none(),
        async { None },
    ));
    let woke = tokio::time::timeout(Duration::from_millis(50), tasks.until_shutdown(&shutdown));
    assert!(woke.await.is_err(), "still running");
    assert!(!shutdown.is_cancelled());
    assert!(matches!(tasks.rows[0].ended, Some(Ok(None))));
}

#[tokio::test]
async fn a_panic_is_reported_not_swallowed() {
    let shutdown = CancellationToken::new();
    let mut tasks = Tasks::default();
    let http = Task::spawn("http", Stop::Http, Duration::ZERO, Span::none(), async {
        panic!("boom")
    });
    tasks.push(http.critical("the HTTP server ended unexpectedly"));
    tasks.until_shutdown(&shutdown).await;
    assert!(
        shutdown.is_cancelled(),
        "a critical task's panic stops the app"
    );
    let ended = tasks.rows[0].ended.as_ref().expect("ended");
    assert!(ended.as_ref().is_err_and(JoinError::is_panic));
}

/// Rows stop in table order: the HTTP stop token is cancelled only when the
/// first HTTP row comes, after the rows before it have ended.
#[tokio::test(start_paused = true)]
async fn rows_stop_in_order_under_one_budget() {
    let shutdown = CancellationToken::new();
    let http_stop = CancellationToken::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Tasks::default();
    let (s, h, t) = (shutdown.clone(), http_stop.clone(), tx.clone());
    tasks.push(Task::spawn(
        "elector",
        Stop::Shutdown,
        Duration::from_secs(3),
        Span::none(),
        async move {
            s.cancelled().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            t.send(("elector", h.is_cancelled())).unwrap();
            None
        },
    ));
    let s = shutdown.clone();
    tasks.push(Task::spawn(
        "run",
        Stop::Shutdown,
        Duration::from_secs(2),
        Span::none(),
        async move {
            s.cancelled().await;
            Some(7)
        },
    ));
    // Overruns its limit: aborted, the others still stop.
    tasks.push(pending_task("labeler", Stop::Shutdown, Duration::from_secs(5)).late("late"));
    tasks.push(pending_task(
        "health",
        Stop::Abort,
        Duration::from_millis(100),
    ));
    let h = http_stop.clone();
    tasks.push(Task::spawn(
        "http",
        Stop::Http,
        Duration::from_secs(1),
        Span::none(),
        async move {
            h.cancelled().await;
            tx.send(("http", true)).unwrap();
            None
        },
    ));
    assert_eq!(tasks.budget(), Duration::from_millis(11_100));
    let start = Instant::now();
    shutdown.cancel();
    assert_eq!(tasks.stop(&http_stop).await, Some(7));
    assert_eq!(rx.recv().await, Some(("elector", false)));
    assert_eq!(rx.recv().await, Some(("http", true)));
    // 1 s of resigning + the labeler's 5 s overrun; the aborted row is quick.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_millis(6_200),
        "{took:?}"
    );
}
