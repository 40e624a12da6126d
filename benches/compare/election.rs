//! The `handover` (SIGTERM the leader) and `failover` (SIGKILL it at a
//! random point of its renew cycle) sections.

use super::*;

/// What the handover section measured, tool by tool.
#[derive(Default)]
pub(super) struct Handovers {
    /// Milliseconds until another candidate knew it leads, per trial.
    pub(super) res: BTreeMap<Tool, Vec<f64>>,
    pub(super) errs: Vec<String>,
    /// Backend requests per handover, by method, as a table cell.
    pub(super) probes: BTreeMap<Tool, String>,
    /// etcd WAL fsyncs: mean ms and count.
    pub(super) fsync: BTreeMap<Tool, (f64, f64)>,
    /// Backend requests per handover, all methods.
    pub(super) probe_total: BTreeMap<Tool, f64>,
}

impl Handovers {
    /// Run the SIGTERM trials of `tool` on `srv` and keep what they measured.
    pub(super) async fn measure(&mut self, tool: Tool, srv: Arc<Server>, cfg: &Cfg) {
        let mut g = Group::new(tool, srv, &format!("handover-{}", tool.key()), cfg).await;
        if let Err(e) = g.start(3, Duration::from_secs(60)).await {
            self.errs.push(e);
            return;
        }
        g.probe = Some((BTreeMap::new(), 0));
        let f0 = g.srv.fsyncs().await;
        let (v, e) = g
            .trials(cfg.trials, Signal::SIGTERM, Duration::from_secs(30))
            .await;
        let f1 = g.srv.fsyncs().await;
        self.errs.extend(e);
        if let Some((sum, n)) = g.probe.take()
            && n > 0
        {
            let per: Vec<String> = sum
                .iter()
                .map(|(k, v)| format!("{k} {:.1}", v / n as f64))
                .collect();
            self.probes.insert(tool, per.join(", "));
            self.probe_total
                .insert(tool, sum.values().sum::<f64>() / n as f64);
        }
        if g.srv.kind == Kind::Etcd && f1.1 > f0.1 {
            self.fsync
                .insert(tool, ((f1.0 - f0.0) / (f1.1 - f0.1) * 1000.0, f1.1 - f0.1));
        }
        self.res.insert(tool, v);
    }

    /// The table of what a handover costs the backend.
    pub(super) fn cost_table(&self, md: &mut String) {
        md.push_str(
            "\nWhat a handover costs the backend: requests per handover, from just before the SIGTERM \
             to 100 ms after the new leader knows (etcd: gRPC messages by method; Redis: commands \
             executed, including those inside scripts), and etcd's WAL fsyncs over the whole section \
             (Raft writes wait for them):\n\n| tool | per handover | etcd WAL fsyncs |\n|---|---|---|\n",
        );
        for tool in TOOLS {
            if let Some(p) = self.probes.get(&tool) {
                let fs = self
                    .fsync
                    .get(&tool)
                    .map(|(ms, n)| format!("{n:.0}, mean {ms:.2} ms"))
                    .unwrap_or_else(|| "—".into());
                let _ = writeln!(md, "| {} | {p} | {fs} |", tool.label());
            }
        }
    }
}

pub(super) async fn sec_handover(cfg: &Cfg) -> Section {
    let etcd = Server::start(Kind::Etcd).await;
    let redis = Server::start(Kind::Redis).await;
    let mut h = Handovers::default();
    for tool in TOOLS {
        let srv = if tool.kind() == Kind::Etcd {
            etcd.clone()
        } else {
            redis.clone()
        };
        h.measure(tool, srv, cfg).await;
    }
    let mut md = String::new();
    md.push_str(
        "SIGTERM to the leader → the first instant another candidate knows it leads (ours: its \
         `/leader` long-poll answers 200; peers: their `LEADER` line or etcdctl's output is read). \
         Three candidates, TTL 5 s, one etcd and one Redis shared by the tools (one tool at a time); \
         a fresh candidate replaces the old leader after each trial.\n\n",
    );
    election_table(&mut md, &h.res, &BTreeMap::new());
    h.cost_table(&mut md);
    for e in &h.errs {
        let _ = writeln!(md, "\n- error: {e}");
    }
    let json = json!(
        h.res
            .iter()
            .map(|(t, v)| {
                let mut j = stats_json(v);
                j["probe_total"] = json!(h.probe_total.get(t));
                (t.key().to_owned(), j)
            })
            .collect::<serde_json::Map<_, _>>()
    );
    Section {
        title: "1. Graceful handover".into(),
        md,
        json,
    }
}

pub(super) async fn failover_one(
    tool: Tool,
    srv: Arc<Server>,
    cfg: &Cfg,
) -> (Tool, Vec<f64>, Vec<String>) {
    let n = if tool == Tool::Etcdctl {
        cfg.etcdctl_crash_trials
    } else {
        cfg.trials
    };
    if n == 0 {
        return (tool, Vec::new(), Vec::new());
    }
    let mut g = Group::new(tool, srv, &format!("failover-{}", tool.key()), cfg).await;
    if let Err(e) = g.start(3, Duration::from_secs(60)).await {
        return (tool, Vec::new(), vec![e]);
    }
    let (v, e) = g.trials(n, Signal::SIGKILL, Duration::from_secs(90)).await;
    (tool, v, e)
}

pub(super) async fn sec_failover(cfg: &Cfg) -> Section {
    let etcd = Server::start(Kind::Etcd).await;
    let redis = Server::start(Kind::Redis).await;
    let runs = join_all(TOOLS.iter().map(|&t| {
        let srv = if t.kind() == Kind::Etcd {
            etcd.clone()
        } else {
            redis.clone()
        };
        failover_one(t, srv, cfg)
    }))
    .await;
    let mut res = BTreeMap::new();
    let mut errs = Vec::new();
    for (t, v, e) in runs {
        errs.extend(e);
        if !v.is_empty() {
            res.insert(t, v);
        }
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "SIGKILL to the leader at a random point of its renew cycle (TTL/3 = {:.2} s; etcdctl: 20 s \
         of its 60 s session lease) → the first instant another candidate knows it leads. Three \
         candidates, TTL 5 s; the five groups run at the same time on one etcd and one Redis \
         (crash failover is bounded by the TTL, so the millisecond noise of sharing does not \
         matter). Bound to meet: TTL + 500 ms = 5.50 s.\n",
        cfg.ttl.as_secs_f64() / 3.0
    );
    let mut notes = BTreeMap::new();
    notes.insert(
        Tool::Etcdctl,
        format!(
            "— only {} trial(s): each waits out the fixed 60 s lease",
            cfg.etcdctl_crash_trials
        ),
    );
    if cfg.etcdctl_crash_trials == 0 {
        md.push_str("`etcdctl elect` skipped (COMPARE_ETCDCTL_CRASH_TRIALS=0); its session lease is fixed at 60 s, so it fails over in 40–60 s.\n\n");
    }
    election_table(&mut md, &res, &notes);
    for e in &errs {
        let _ = writeln!(md, "\n- error: {e}");
    }
    let json = json!(
        res.iter()
            .map(|(t, v)| (t.key().to_owned(), stats_json(v)))
            .collect::<serde_json::Map<_, _>>()
    );
    Section {
        title: "2. Crash failover".into(),
        md,
        json,
    }
}
