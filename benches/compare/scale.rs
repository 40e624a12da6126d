//! The `scale` (N candidates in one election) and `multi` (many elections
//! of 3 on one etcd) sections.

use super::*;

#[derive(Default, Clone)]
pub(super) struct ScaleRow {
    pub(super) rps: f64,
    pub(super) server_cpu: f64,
    pub(super) failover: Vec<f64>,
    pub(super) errors: Vec<String>,
}

pub(super) async fn scale_one(tool: Tool, n: usize, cfg: &Cfg) -> ScaleRow {
    let srv = Server::start(tool.kind()).await;
    let mut g = Group::new(tool, srv, &format!("scale{n}-{}", tool.key()), cfg).await;
    let mut row = ScaleRow::default();
    if let Err(e) = g.start(n, Duration::from_secs(240)).await {
        row.errors.push(e);
        return row;
    }
    sleep(Duration::from_secs(5)).await;
    let r = g.rest(cfg.scale_rest_secs).await;
    row.rps = r.total;
    row.server_cpu = r.server_cpu;
    let k = if tool == Tool::Etcdctl {
        0
    } else {
        cfg.scale_trials
    };
    let (v, e) = g.trials(k, Signal::SIGKILL, Duration::from_secs(60)).await;
    row.failover = v;
    row.errors = e;
    row
}

/// Every tool's [`ScaleRow`] for every N of `cfg.scale`.
pub(super) async fn scale_rows(cfg: &Cfg) -> BTreeMap<(usize, Tool), ScaleRow> {
    let mut rows: BTreeMap<(usize, Tool), ScaleRow> = BTreeMap::new();
    for &n in &cfg.scale {
        eprintln!("scale: {n} candidates");
        // Everything but the seed loop at once (separate servers), then the
        // seed loop alone: at 200 candidates it keeps both cores busy.
        let a = [
            Tool::OursEtcd,
            Tool::Etcdctl,
            Tool::OursRedis,
            Tool::RedisPy,
        ];
        let res = join_all(a.iter().map(|&t| scale_one(t, n, cfg))).await;
        for (t, r) in a.iter().zip(res) {
            rows.insert((n, *t), r);
        }
        rows.insert((n, Tool::Seed), scale_one(Tool::Seed, n, cfg).await);
    }
    rows
}

/// The scale section's crash failover table.
pub(super) fn scale_failover_table(
    md: &mut String,
    rows: &BTreeMap<(usize, Tool), ScaleRow>,
    cfg: &Cfg,
) {
    md.push_str("\n### Crash failover: median (min–max) over the trials\n\n| N | ");
    let ft = [Tool::OursEtcd, Tool::OursRedis, Tool::Seed, Tool::RedisPy];
    for t in ft {
        let _ = write!(md, "{} | ", t.label());
    }
    md.push_str("ours ÷ seed loop | ours ÷ redis-py |\n|---|---|---|---|---|---|---|\n");
    for &n in &cfg.scale {
        let _ = write!(md, "| {n} | ");
        for t in ft {
            let v = &rows[&(n, t)].failover;
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let (m, _, x) = stats(v);
            let _ = write!(md, "{} ({}–{}) | ", fmt_ms(m), fmt_ms(min), fmt_ms(x));
        }
        let m = |t: Tool| stats(&rows[&(n, t)].failover).0;
        let _ = writeln!(
            md,
            "{} | {} |",
            ratio(m(Tool::OursRedis), m(Tool::Seed)),
            ratio(m(Tool::OursRedis), m(Tool::RedisPy))
        );
    }
}

pub(super) async fn sec_scale(cfg: &Cfg) -> Section {
    let rows = scale_rows(cfg).await;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "N candidates in one election, TTL 5 s, each tool on its own fresh server. Per N, \
         leader-elector (etcd and Redis), `etcdctl elect` and redis-py run at the same time; the \
         seed loop runs alone afterwards (it polls 100×/s per follower). Backend load (as in \
         section 4: etcd gRPC messages, Redis commands sent by clients) over a {} s window at rest after 5 s of settling; crash failover over {} SIGKILL trial(s) at random \
         points of the renew cycle (`etcdctl elect` not: 60 s lease).\n",
        cfg.scale_rest_secs, cfg.scale_trials
    );
    md.push_str("### Backend requests per second at rest, whole election\n\n| N | ");
    for t in TOOLS {
        let _ = write!(md, "{} | ", t.label());
    }
    md.push_str("ours ÷ etcdctl | ours ÷ seed loop | ours ÷ redis-py |\n|---|---|---|---|---|---|---|---|---|\n");
    for &n in &cfg.scale {
        let _ = write!(md, "| {n} | ");
        for t in TOOLS {
            let r = &rows[&(n, t)];
            let _ = write!(
                md,
                "{} (server CPU {:.2} s/min) | ",
                fmt_rate(r.rps),
                r.server_cpu
            );
        }
        let g = |t: Tool| rows[&(n, t)].rps;
        let _ = writeln!(
            md,
            "{} | {} | {} |",
            ratio(g(Tool::OursEtcd), g(Tool::Etcdctl)),
            ratio(g(Tool::OursRedis), g(Tool::Seed)),
            ratio(g(Tool::OursRedis), g(Tool::RedisPy))
        );
    }
    scale_failover_table(&mut md, &rows, cfg);
    let mut json = json!({});
    for ((n, t), r) in &rows {
        for e in &r.errors {
            let _ = writeln!(md, "\n- error (N = {n}, {t:?}): {e}");
        }
        json[format!("{n}")][t.key()] =
            json!({"rps": r.rps, "server_cpu": r.server_cpu, "failover": stats_json(&r.failover)});
    }
    Section {
        title: "5. Scale: N candidates in one election".into(),
        md,
        json,
    }
}

/// Start `cfg.elections` elections of 3 of our sidecars on `srv`, in
/// batches of `batch`; stops early when more than a fifth of a batch fails.
pub(super) async fn start_elections(
    srv: &Arc<Server>,
    cfg: &Cfg,
    batch: usize,
    errs: &mut Vec<String>,
) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    while groups.len() < cfg.elections {
        let from = groups.len();
        let to = (from + batch).min(cfg.elections);
        for i in from..to {
            let mut g = Group::new(Tool::OursEtcd, srv.clone(), &format!("multi{i}"), cfg).await;
            for _ in 0..3 {
                g.spawn();
            }
            groups.push(g);
        }
        let res = join_all(
            groups[from..to]
                .iter_mut()
                .map(|g| g.wait_ready(Duration::from_secs(120))),
        )
        .await;
        let failed: Vec<String> = res.into_iter().filter_map(|r| r.err()).collect();
        eprintln!(
            "multi: {to} elections started, {} failed in this batch",
            failed.len()
        );
        if !failed.is_empty() {
            errs.push(format!(
                "{} of elections {from}..{to} did not get ready: {}",
                failed.len(),
                failed[0]
            ));
            if failed.len() * 5 > to - from {
                // More than a fifth failed: the machine is at its limit.
                break;
            }
        }
    }
    groups
}

/// The many elections at rest over one window.
pub(super) struct MultiRest {
    /// Window length, seconds.
    pub(super) el: f64,
    /// etcd requests per second by method, and in all.
    pub(super) methods: BTreeMap<String, f64>,
    pub(super) total: f64,
    /// etcd CPU seconds per minute, and its RSS (MiB).
    pub(super) etcd_cpu: f64,
    pub(super) srss: f64,
    /// The sidecars' CPU seconds per minute, RSS and PSS sums (MiB).
    pub(super) cpu: f64,
    pub(super) rss: f64,
    pub(super) pss: f64,
}

/// Measure etcd and the sidecars `pids` over a window at rest.
pub(super) async fn multi_rest(srv: &Server, pids: &[u32], cfg: &Cfg) -> MultiRest {
    let cpu0: f64 = pids.iter().map(|p| proc_stat(*p).2).sum();
    let (_, _, scpu0) = proc_stat(srv.pid());
    let m0 = srv.counts().await;
    let t0 = Instant::now();
    sleep(Duration::from_secs(cfg.scale_rest_secs.max(30))).await;
    let m1 = srv.counts().await;
    let el = t0.elapsed().as_secs_f64();
    let (srss, _, scpu1) = proc_stat(srv.pid());
    let mut rss = 0.0;
    let mut pss = 0.0;
    let mut cpu1 = 0.0;
    for p in pids {
        let (r, s, c) = proc_stat(*p);
        rss += r;
        pss += s;
        cpu1 += c;
    }
    let methods: BTreeMap<String, f64> = delta(&m0, &m1)
        .into_iter()
        .map(|(k, v)| (k, v / el))
        .collect();
    let total: f64 = methods.values().sum();
    MultiRest {
        el,
        methods,
        total,
        etcd_cpu: (scpu1 - scpu0) * 60.0 / el,
        srss,
        cpu: (cpu1 - cpu0) * 60.0 / el,
        rss,
        pss,
    }
}

/// SIGKILL the leaders of up to 20 of the elections `ok` at once; returns
/// the failover times (ms).
pub(super) async fn multi_failover(
    groups: &mut [Group],
    ok: &[usize],
    errs: &mut Vec<String>,
) -> Vec<f64> {
    // Crash failover in 20 elections at once (each at its own random point).
    let k = 20.min(ok.len());
    let picked: HashSet<usize> = ok.iter().copied().take(k).collect();
    let res = join_all(
        groups
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| picked.contains(i))
            .map(|(_, g)| g.trial(Signal::SIGKILL, true, Duration::from_secs(60))),
    )
    .await;
    let mut fo = Vec::new();
    for r in res {
        match r {
            Ok(ms) => fo.push(ms),
            Err(e) => errs.push(e),
        }
    }
    fo
}

/// The multi section's table of measures (`n` sidecar processes, memory
/// used, load average at the end of the window, failover times `fo`).
pub(super) fn multi_table(
    md: &mut String,
    r: &MultiRest,
    elections: usize,
    n: usize,
    mem: f64,
    load: f64,
    fo: &[f64],
) {
    let (fm, fp, fx) = stats(fo);
    let fmin = fo.iter().copied().fold(f64::INFINITY, f64::min);
    md.push_str("| measure | value |\n|---|---|\n");
    let _ = writeln!(
        md,
        "| etcd requests/s, all elections | {} |",
        fmt_rate(r.total)
    );
    let _ = writeln!(
        md,
        "| per election | {} |",
        fmt_rate(r.total / elections.max(1) as f64)
    );
    let _ = writeln!(
        md,
        "| by method | {} |",
        r.methods
            .iter()
            .map(|(k, v)| format!("{k} {}", fmt_rate(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        md,
        "| etcd CPU s/min, RSS | {:.2}, {:.0} MiB |",
        r.etcd_cpu, r.srss
    );
    let _ = writeln!(md, "| sidecars' CPU s/min, all {n} | {:.2} |", r.cpu);
    let _ = writeln!(
        md,
        "| sidecars' RSS sum / PSS sum (shared pages counted once) | {:.0} MiB / {:.0} MiB ({:.1} / {:.1} MiB each) |",
        r.rss,
        r.pss,
        r.rss / n.max(1) as f64,
        r.pss / n.max(1) as f64
    );
    let _ = writeln!(
        md,
        "| machine memory used by the run (MemAvailable drop) | {:.0} MiB |",
        mem / 1024.0
    );
    let _ = writeln!(
        md,
        "| 1-min load average at the end of the window | {load:.2} |"
    );
    let _ = writeln!(
        md,
        "| crash failover, {} elections at once: median / p90 / max (min) | {} / {} / {} ({}) |",
        fo.len(),
        fmt_ms(fm),
        fmt_ms(fp),
        fmt_ms(fx),
        fmt_ms(fmin)
    );
}

pub(super) async fn sec_multi(cfg: &Cfg) -> Section {
    let srv = Server::start(Kind::Etcd).await;
    let mem0 = meminfo("MemAvailable:");
    let mut errs = Vec::new();
    let batch = 50;
    let t_start = Instant::now();
    let mut groups = start_elections(&srv, cfg, batch, &mut errs).await;
    let started = groups.len();
    let ok: Vec<usize> = (0..groups.len())
        .filter(|i| groups[*i].leader.is_some())
        .collect();
    let start_secs = t_start.elapsed().as_secs_f64();
    sleep(Duration::from_secs(10)).await;
    let pids: Vec<u32> = groups
        .iter()
        .flat_map(|g| g.cands.iter().map(|c| c.pid))
        .collect();
    let r = multi_rest(&srv, &pids, cfg).await;
    let mem1 = meminfo("MemAvailable:");
    let load = loadavg();
    let fo = multi_failover(&mut groups, &ok, &mut errs).await;
    let n = pids.len();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{} elections × 3 leader-elector sidecars (TTL 5 s) on one etcd, started in batches of {batch} \
         elections; {} of {} requested started with a leader ({n} processes) in {start_secs:.1} s. \
         Window at rest {:.0} s after 10 s of settling. Peers not run here: 1,500 `etcdctl` \
         processes (about 17 MiB each) or Python interpreters would not fit next to them; their \
         per-election load is the 3-candidate row of section 4.\n",
        cfg.elections,
        ok.len(),
        cfg.elections,
        r.el
    );
    multi_table(&mut md, &r, ok.len(), n, mem0 - mem1, load, &fo);
    for e in &errs {
        let _ = writeln!(md, "\n- error: {e}");
    }
    let json = json!({
        "elections": ok.len(), "requested": cfg.elections, "started": started, "processes": n,
        "rps": r.total, "methods": r.methods, "etcd_cpu": r.etcd_cpu, "etcd_rss": r.srss,
        "rss_sum": r.rss, "pss_sum": r.pss, "failover": stats_json(&fo),
    });
    drop(groups);
    Section {
        title: format!(
            "5b. Scale: {} elections × 3 candidates on one etcd",
            cfg.elections
        ),
        md,
        json,
    }
}
