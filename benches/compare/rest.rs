//! The `rest` (footprint and backend load of idle groups) and `wrk`
//! (`/leader` throughput) sections.

use super::*;

/// Each tool's group at rest and its leader alone afterwards.
pub(super) type RestBy = BTreeMap<Tool, (Rest, Rest)>;

/// Requests/s of one follower of `t`: (group − leader alone) ÷ 2.
pub(super) fn per_follower(by: &RestBy, t: Tool) -> f64 {
    let (r, a) = &by[&t];
    ((r.total - a.total) / 2.0).max(0.0)
}

/// Start one group of 3 per tool, each on its own server, and measure them
/// at rest together, then their leaders alone. Returns the errors too.
pub(super) async fn rest_by_tool(cfg: &Cfg) -> (RestBy, Vec<String>) {
    let mut groups = Vec::new();
    let mut errs = Vec::new();
    for tool in TOOLS {
        let srv = Server::start(tool.kind()).await;
        groups.push(Group::new(tool, srv, &format!("rest-{}", tool.key()), cfg).await);
    }
    for (r, g) in join_all(
        groups
            .iter_mut()
            .map(|g| g.start(3, Duration::from_secs(60))),
    )
    .await
    .into_iter()
    .zip(TOOLS)
    {
        if let Err(e) = r {
            errs.push(format!("{g:?}: {e}"));
        }
    }
    sleep(Duration::from_secs(10)).await;
    let rest: Vec<Rest> = join_all(groups.iter_mut().map(|g| g.rest(cfg.rest_secs))).await;
    let alone: Vec<Rest> =
        join_all(groups.iter_mut().map(|g| g.leader_alone(cfg.alone_secs))).await;
    let by: RestBy = TOOLS
        .iter()
        .copied()
        .zip(rest.into_iter().zip(alone))
        .collect();
    (by, errs)
}

/// The "Footprint at rest" table.
pub(super) fn footprint_table(md: &mut String, by: &RestBy) {
    md.push_str("### Footprint at rest\n\n");
    md.push_str("| tool | RSS leader | RSS follower | CPU s/min leader | CPU s/min follower | ours ÷ this: RSS leader / follower | ours ÷ this: CPU leader / follower |\n");
    md.push_str("|---|---|---|---|---|---|---|\n");
    for t in TOOLS {
        let r = &by[&t].0;
        let ours = by[&t.ours_here()].0.clone();
        let (rr, rc) = if t.ours() {
            ("—".to_owned(), "—".to_owned())
        } else {
            (
                format!(
                    "{} / {}",
                    ratio(ours.rss_leader, r.rss_leader),
                    ratio(ours.rss_follower, r.rss_follower)
                ),
                format!(
                    "{} / {}",
                    ratio(ours.cpu_leader, r.cpu_leader),
                    ratio(ours.cpu_follower, r.cpu_follower)
                ),
            )
        };
        let _ = writeln!(
            md,
            "| {} | {:.1} MiB | {:.1} MiB | {:.4} | {:.4} | {rr} | {rc} |",
            t.label(),
            r.rss_leader,
            r.rss_follower,
            r.cpu_leader,
            r.cpu_follower
        );
    }
}

/// The "Backend load at rest" table.
pub(super) fn backend_load_table(md: &mut String, by: &RestBy) {
    md.push_str("### Backend load at rest\n\n");
    md.push_str("| tool | requests/s, group of 3 | leader alone | one follower | ours ÷ this (group) | by method (group, /s) | Redis: commands executed incl. inside scripts, group |\n");
    md.push_str("|---|---|---|---|---|---|---|\n");
    for t in TOOLS {
        let (r, a) = &by[&t];
        let ours = by[&t.ours_here()].0.clone();
        let rr = if t.ours() {
            "—".into()
        } else {
            ratio(ours.total, r.total)
        };
        let methods = r
            .methods
            .iter()
            .map(|(k, v)| format!("{k} {}", fmt_rate(*v)))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {rr} | {} | {} |",
            t.label(),
            fmt_rate(r.total),
            fmt_rate(a.total),
            fmt_rate(per_follower(by, t)),
            if methods.is_empty() {
                "—".into()
            } else {
                methods
            },
            if t.kind() == Kind::Redis {
                fmt_rate(r.executed)
            } else {
                "—".into()
            }
        );
    }
}

pub(super) async fn sec_rest(cfg: &Cfg) -> Section {
    let (by, errs) = rest_by_tool(cfg).await;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "One leader and two followers per tool, each tool on its own fresh server (same binary and \
         flags) so that the counts are its own; all five groups at rest at the same time, {} s \
         window after 10 s of settling. Then the followers get SIGTERM and the leader alone is \
         measured for {} s: requests of one follower = (group − leader alone) ÷ 2. etcd counts \
         `grpc_server_msg_received_total` (every message on every gRPC method, including stream \
         messages such as LeaseKeepAlive and Watch); Redis counts the commands clients send, read \
         with MONITOR (a script call is one command); the commands those scripts run inside Redis \
         are shown apart (`INFO commandstats` counts both).\n",
        cfg.rest_secs, cfg.alone_secs
    );
    footprint_table(&mut md, &by);
    md.push_str("\nCPU is user + system time from `/proc/<pid>/stat` (10 ms ticks): 0.0000 means no tick in the window.\n\n");
    backend_load_table(&mut md, &by);
    for e in &errs {
        let _ = writeln!(md, "\n- error: {e}");
    }
    let json = json!(
        by.iter()
            .map(|(t, (r, a))| {
                (
                    t.key().to_owned(),
                    json!({
                        "rss_leader": r.rss_leader, "rss_follower": r.rss_follower,
                        "cpu_leader": r.cpu_leader, "cpu_follower": r.cpu_follower,
                        "group_rps": r.total, "alone_rps": a.total,
                        "follower_rps": per_follower(&by, *t), "methods": r.methods,
                        "executed_rps": r.executed,
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
    );
    Section {
        title: "3–4. Footprint and backend load at rest".into(),
        md,
        json,
    }
}

/// Requests/s, p50 ms, p99 ms and non-2xx count from `wrk --latency` output.
pub(super) fn parse_wrk(out: &str) -> (f64, f64, f64, u64) {
    let lat = |s: &str| -> f64 {
        let s = s.trim();
        let (num, mul) = if let Some(v) = s.strip_suffix("us") {
            (v, 0.001)
        } else if let Some(v) = s.strip_suffix("ms") {
            (v, 1.0)
        } else if let Some(v) = s.strip_suffix('s') {
            (v, 1000.0)
        } else {
            (s, f64::NAN)
        };
        num.parse::<f64>().map(|v| v * mul).unwrap_or(f64::NAN)
    };
    let mut rps = f64::NAN;
    let (mut p50, mut p99) = (f64::NAN, f64::NAN);
    let mut non2xx = 0;
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["Requests/sec:", v] => rps = v.parse().unwrap_or(f64::NAN),
            ["50%", v] => p50 = lat(v),
            ["99%", v] => p99 = lat(v),
            ["Non-2xx", "or", "3xx", "responses:", v] => non2xx = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    (rps, p50, p99, non2xx)
}

pub(super) async fn sec_wrk(cfg: &Cfg) -> Section {
    require("wrk", "wrk");
    require("taskset", "util-linux");
    let srv = Server::start(Kind::Etcd).await;
    let mut g = Group::new(Tool::OursEtcd, srv, "wrk", cfg).await;
    let mut md = String::new();
    let mut json = json!({});
    if let Err(e) = g.start(3, Duration::from_secs(60)).await {
        let _ = writeln!(md, "- error: {e}");
        return Section {
            title: "6. `/leader` throughput and latency".into(),
            md,
            json,
        };
    }
    sleep(Duration::from_secs(1)).await;
    g.drain();
    let leader = g.index_of(g.leader.unwrap());
    let follower = (0..g.cands.len()).find(|i| *i != leader).unwrap();
    let _ = writeln!(
        md,
        "`wrk -t1 -c8 -d{}s --latency` pinned to core 1 (`taskset -c 1`) against one sidecar pinned \
         to core 0 (`taskset -a -cp 0 <pid>`, all its threads), on loopback; etcd and the other \
         sidecars idle (not pinned). No peer has an HTTP endpoint: the targets are the reference.\n",
        cfg.wrk_secs
    );
    md.push_str("| sidecar asked | answer | requests/s | p50 | p99 | target (≥ 20,000/s, p99 < 2 ms) |\n|---|---|---|---|---|---|\n");
    for (role, idx) in [("leader", leader), ("follower", follower)] {
        let (port, pid) = match &g.cands[idx].proc_ {
            Proc::Ours(s) => (s.port, s.pid()),
            Proc::Peer(_) => unreachable!(),
        };
        let pin = tokio::process::Command::new("taskset")
            .args(["-a", "-cp", "0", &pid.to_string()])
            .stdout(Stdio::null())
            .status()
            .await;
        assert!(pin.is_ok_and(|s| s.success()), "taskset the sidecar");
        let out = tokio::process::Command::new("taskset")
            .args(["-c", "1", "wrk", "-t1", "-c8"])
            .arg(format!("-d{}s", cfg.wrk_secs))
            .arg("--latency")
            .arg(format!("http://127.0.0.1:{port}/leader"))
            .output()
            .await
            .expect("run wrk");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("wrk {role}:\n{text}");
        let (rps, p50, p99, non2xx) = parse_wrk(&text);
        let ok = rps >= 20_000.0 && p99 < 2.0;
        let answer = if role == "leader" {
            "200".to_owned()
        } else {
            format!("503 ({non2xx} non-2xx)")
        };
        let _ = writeln!(
            md,
            "| {role} | {answer} | {rps:.0} | {p50:.3} ms | {p99:.3} ms | {} |",
            if ok { "met" } else { "missed" }
        );
        json[role] = json!({"rps": rps, "p50_ms": p50, "p99_ms": p99, "non2xx": non2xx});
    }
    Section {
        title: "6. `/leader` throughput and latency".into(),
        md,
        json,
    }
}
