use super::*;
use crate::config::Cli;
use clap::Parser;

fn config(args: &[&str]) -> Config {
    let mut full = vec![
        "leader-elector",
        "--election",
        "a",
        "--identity",
        "me",
        "--etcd-endpoints=http://127.0.0.1:1",
    ];
    full.extend_from_slice(args);
    Config::from_cli(Cli::try_parse_from(full).unwrap()).unwrap()
}

/// `App::build` binds and connects, spawns nothing, and tells the
/// addresses the kernel chose for a port of 0.
#[tokio::test]
async fn build_binds_port_zero_and_reports_the_bound_addresses() {
    let cfg = config(&["--http-addr=127.0.0.1:0", "--control-addr=127.0.0.1:0"]);
    let app = App::build(cfg).await.unwrap();
    let http = app.http_addr();
    let control = app.control_addr().expect("control API on");
    assert_eq!(http.ip().to_string(), "127.0.0.1");
    assert_ne!(http.port(), 0);
    assert_ne!(control.port(), 0);
    assert_ne!(http, control);
    // Bound: a second bind of the same address fails, naming the flag.
    let again = config(&[&format!("--http-addr={http}"), "--control-addr=127.0.0.1:0"]);
    match App::build(again).await {
        Err(RunError::Bind { flag, addr, .. }) => {
            assert_eq!(flag, "--http-addr");
            assert_eq!(addr, http);
        }
        other => panic!("expected a bind error, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn build_without_control_api() {
    let cfg = config(&["--http-addr=127.0.0.1:0", "--control-addr="]);
    let app = App::build(cfg).await.unwrap();
    assert_eq!(app.control_addr(), None);
}

/// The whole app runs and stops cleanly when the caller cancels, within
/// the budget, though etcd is unreachable.
#[tokio::test]
async fn a_built_app_runs_and_stops_on_cancel() {
    let cfg = config(&["--http-addr=127.0.0.1:0", "--control-addr=127.0.0.1:0"]);
    let app = App::build(cfg).await.unwrap();
    let http = app.http_addr();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(app.run(shutdown.clone()));
    // It answers on the bound address.
    let mut answered = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(http).await.is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered, "the read API listens on {http}");
    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(20), running).await;
    assert!(matches!(ended, Ok(Ok(Ok(None)))), "{ended:?}");
}
