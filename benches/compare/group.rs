//! One election of one tool: start its candidates, hand over or crash the
//! leader trial by trial, and measure the group at rest.

use super::*;

/// The candidates of one election of one tool, and what they reported.
pub(super) struct Group {
    pub(super) tool: Tool,
    pub(super) srv: Arc<Server>,
    pub(super) election: String,
    pub(super) ttl: Duration,
    pub(super) python: PathBuf,
    pub(super) cands: Vec<Cand>,
    pub(super) tx: mpsc::UnboundedSender<Ev>,
    pub(super) rx: mpsc::UnboundedReceiver<Ev>,
    pub(super) next_id: u64,
    pub(super) leader: Option<u64>,
    pub(super) ready: HashSet<u64>,
    pub(super) logs: TempDir,
    pub(super) etcd: Option<etcd_client::Client>,
    /// When set, each trial adds the backend requests from just before the
    /// signal to 100 ms after the new leader knows (summed over trials).
    pub(super) probe: Option<(BTreeMap<String, f64>, usize)>,
    /// Candidates replaced because another process took their HTTP port.
    pub(super) port_retries: usize,
}

/// What a group did at rest over a window.
#[derive(Default, Clone)]
pub(super) struct Rest {
    pub(super) rss_leader: f64,
    pub(super) rss_follower: f64,
    pub(super) cpu_leader: f64,
    pub(super) cpu_follower: f64,
    /// Requests per second the group's clients sent, by method (etcd: gRPC
    /// messages; Redis: top-level commands seen by MONITOR, a script = 1).
    pub(super) methods: BTreeMap<String, f64>,
    pub(super) total: f64,
    /// Redis only: every command executed per second, including the ones
    /// scripts run inside the server (`INFO commandstats`).
    pub(super) executed: f64,
    pub(super) server_cpu: f64,
}

impl Group {
    pub(super) async fn new(tool: Tool, srv: Arc<Server>, election: &str, cfg: &Cfg) -> Group {
        let (tx, rx) = mpsc::unbounded_channel();
        let etcd = if tool == Tool::Etcdctl {
            Some(
                etcd_client::Client::connect([srv.url.clone()], None)
                    .await
                    .expect("connect to etcd"),
            )
        } else {
            None
        };
        Group {
            tool,
            srv,
            election: format!("{election}-{}", std::process::id()),
            ttl: cfg.ttl,
            python: cfg.python.clone(),
            cands: Vec::new(),
            tx,
            rx,
            next_id: 0,
            leader: None,
            ready: HashSet::new(),
            logs: TempDir::new().unwrap(),
            etcd,
            probe: None,
            port_retries: 0,
        }
    }

    /// The renew cycle a crash lands in: TTL/3 for all, etcdctl's session
    /// keeps its 60 s lease alive every 20 s.
    pub(super) fn cycle(&self) -> Duration {
        match self.tool {
            Tool::Etcdctl => Duration::from_secs(20),
            _ => self.ttl / 3,
        }
    }

    pub(super) fn spawn(&mut self) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let ident = format!("c{id}");
        let ttl_s = format!("{}s", self.ttl.as_secs());
        let ttl_ms = self.ttl.as_millis().to_string();
        let tx = self.tx.clone();
        let url = self.srv.url.clone();
        let cand = match self.tool {
            Tool::OursEtcd | Tool::OursRedis => {
                let flags = ["--lease-duration", ttl_s.as_str(), "--log-level", "warn"];
                let s = if self.tool == Tool::OursEtcd {
                    Sidecar::start(&url, &self.election, &ident, &flags)
                } else {
                    redis_sidecar(&[&url], &self.election, &ident, &flags)
                };
                let task = tokio::spawn(watch_ours(id, s.port, ident.clone(), tx));
                Cand {
                    id,
                    pid: s.pid(),
                    proc_: Proc::Ours(s),
                    task: Some(task),
                }
            }
            tool => {
                let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
                let mut cmd = match tool {
                    Tool::Etcdctl => {
                        let mut c = tokio::process::Command::new("etcdctl");
                        c.args(["--endpoints", &url, "elect", &self.election, &ident]);
                        c
                    }
                    _ => {
                        let script = if tool == Tool::Seed {
                            "seed_loop.py"
                        } else {
                            "redispy_lock.py"
                        };
                        let mut c = tokio::process::Command::new(&self.python);
                        c.arg(bench.join(script))
                            .args(["--url", &url, "--ttl-ms", &ttl_ms])
                            .args(["--key", &format!("{}:{}", tool.key(), self.election)]);
                        c
                    }
                };
                let log =
                    std::fs::File::create(self.logs.path().join(format!("{ident}.log"))).unwrap();
                let mut child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(log)
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap_or_else(|e| panic!("start {tool:?}: {e}"));
                let out = child.stdout.take().unwrap();
                let task = tokio::spawn(read_peer(id, out, tool == Tool::Etcdctl, tx));
                Cand {
                    id,
                    pid: child.id().unwrap_or(0),
                    proc_: Proc::Peer(child),
                    task: Some(task),
                }
            }
        };
        self.cands.push(cand);
        id
    }

    pub(super) fn absorb(&mut self, ev: Ev) {
        if !self.cands.iter().any(|c| c.id == ev.id) {
            return;
        }
        match ev.kind {
            EvKind::Ready => {
                self.ready.insert(ev.id);
            }
            EvKind::Leader => {
                self.leader = Some(ev.id);
                self.ready.insert(ev.id);
            }
            EvKind::Follower => {
                if self.leader == Some(ev.id) {
                    self.leader = None;
                }
            }
        }
    }

    pub(super) fn drain(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            self.absorb(ev);
        }
    }

    pub(super) async fn all_ready(&mut self) -> bool {
        if self.leader.is_none() {
            return false;
        }
        match &mut self.etcd {
            // etcdctl prints nothing while it waits: count its keys instead.
            Some(c) => {
                let opts = etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only();
                let prefix = format!("{}/", self.election);
                match c.get(prefix, Some(opts)).await {
                    Ok(r) => r.count() as usize == self.cands.len(),
                    Err(_) => false,
                }
            }
            None => self.cands.iter().all(|c| self.ready.contains(&c.id)),
        }
    }

    /// Wait until a leader is known and every candidate campaigns.
    pub(super) async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let end = Instant::now() + limit;
        loop {
            self.drain();
            if self.all_ready().await {
                return Ok(());
            }
            let mut dead = None;
            for (i, c) in self.cands.iter_mut().enumerate() {
                if c.dead() {
                    dead = Some((i, c.log(self.logs.path())));
                    break;
                }
            }
            if let Some((i, log)) = dead {
                // Sidecars bind port 0, so this should not happen any more;
                // a candidate that still lost its port is the harness's
                // fault, not the candidate's: replace it.
                if log.contains("Address already in use") && self.port_retries < 5 {
                    self.port_retries += 1;
                    let c = self.cands.remove(i);
                    eprintln!(
                        "{:?}: c{} lost its port to another process; replacing it",
                        self.tool, c.id
                    );
                    drop(c);
                    self.spawn();
                    continue;
                }
                return Err(format!(
                    "{:?}: candidate c{} exited: {}",
                    self.tool,
                    self.cands[i].id,
                    log.lines().last().unwrap_or("")
                ));
            }
            if Instant::now() > end {
                return Err(format!(
                    "{:?}: not ready within {limit:?} ({} of {} ready, leader {:?})",
                    self.tool,
                    self.ready.len(),
                    self.cands.len(),
                    self.leader
                ));
            }
            if let Ok(Some(ev)) = timeout(Duration::from_millis(20), self.rx.recv()).await {
                self.absorb(ev);
            }
        }
    }

    pub(super) async fn start(&mut self, n: usize, limit: Duration) -> Result<(), String> {
        for _ in 0..n {
            self.spawn();
        }
        self.wait_ready(limit).await
    }

    pub(super) fn index_of(&self, id: u64) -> usize {
        self.cands.iter().position(|c| c.id == id).unwrap()
    }

    /// Signal the leader; return the ms until another candidate knows it leads.
    /// Then replace the old leader with a fresh candidate.
    pub(super) async fn trial(
        &mut self,
        sig: Signal,
        random_phase: bool,
        limit: Duration,
    ) -> Result<f64, String> {
        let old = self.leader.ok_or("no leader before the trial")?;
        // Let followers settle into their watches / polls; for a crash, also
        // land at a random point of the leader's renew cycle.
        sleep(Duration::from_millis(300)).await;
        if random_phase {
            sleep(self.cycle().mul_f64(rand::random::<f64>())).await;
        }
        self.drain();
        if self.leader != Some(old) {
            return Err(format!("{:?}: leader changed while idle", self.tool));
        }
        let before = match self.probe {
            Some(_) => Some(self.srv.counts().await),
            None => None,
        };
        let t0 = Instant::now();
        self.cands[self.index_of(old)].signal(sig);
        let end = t0 + limit;
        let dt = loop {
            let ev = match timeout_at(end, self.rx.recv()).await {
                Ok(Some(ev)) => ev,
                _ => {
                    return Err(format!(
                        "{:?}: no new leader within {limit:?} after {sig}",
                        self.tool
                    ));
                }
            };
            let hit = ev.kind == EvKind::Leader && ev.id != old && ev.at >= t0;
            let at = ev.at;
            self.absorb(ev);
            if hit {
                break at - t0;
            }
        };
        if let Some(before) = before {
            sleep(Duration::from_millis(100)).await;
            let after = self.srv.counts().await;
            if let Some((sum, n)) = &mut self.probe {
                for (k, v) in delta(&before, &after) {
                    *sum.entry(k).or_insert(0.0) += v;
                }
                *n += 1;
            }
        }
        let i = self.index_of(old);
        let mut c = self.cands.remove(i);
        if sig == Signal::SIGTERM && !c.wait_exit(Duration::from_secs(10)).await {
            eprintln!(
                "{:?}: c{} did not exit within 10 s of SIGTERM",
                self.tool, c.id
            );
        }
        drop(c);
        self.spawn();
        self.wait_ready(Duration::from_secs(60)).await?;
        Ok(dt.as_secs_f64() * 1000.0)
    }

    pub(super) async fn trials(
        &mut self,
        n: usize,
        sig: Signal,
        limit: Duration,
    ) -> (Vec<f64>, Vec<String>) {
        let mut v = Vec::new();
        let mut errs = Vec::new();
        for k in 0..n {
            match self.trial(sig, sig == Signal::SIGKILL, limit).await {
                Ok(ms) => {
                    eprintln!("{:?} {sig} trial {}: {ms:.2} ms", self.tool, k + 1);
                    v.push(ms);
                }
                Err(e) => {
                    eprintln!("{e}");
                    errs.push(e);
                    if self.wait_ready(Duration::from_secs(90)).await.is_err() {
                        break;
                    }
                }
            }
        }
        (v, errs)
    }

    /// Footprint and backend requests over `secs` seconds at rest.
    pub(super) async fn rest(&mut self, secs: u64) -> Rest {
        self.drain();
        let leader = self.leader.map(|id| self.index_of(id)).unwrap_or(0);
        let follower = (0..self.cands.len()).find(|i| *i != leader);
        let lp = self.cands[leader].pid;
        let fp = follower.map(|i| self.cands[i].pid).unwrap_or(0);
        let sp = self.srv.pid();
        let (_, _, cl0) = proc_stat(lp);
        let (_, _, cf0) = proc_stat(fp);
        let (_, _, cs0) = proc_stat(sp);
        let window = Duration::from_secs(secs);
        let monitor = (self.srv.kind == Kind::Redis)
            .then(|| tokio::spawn(redis_monitor(self.srv.port, window)));
        let m0 = self.srv.counts().await;
        let t0 = Instant::now();
        sleep(window).await;
        let m1 = self.srv.counts().await;
        let el = t0.elapsed().as_secs_f64();
        let (rl, _, cl1) = proc_stat(lp);
        let (rf, _, cf1) = proc_stat(fp);
        let (_, _, cs1) = proc_stat(sp);
        let executed: BTreeMap<String, f64> = delta(&m0, &m1)
            .into_iter()
            .map(|(k, v)| (k, v / el))
            .collect();
        let methods = match monitor {
            Some(m) => {
                let (top, secs) = m.await.expect("MONITOR task");
                top.into_iter().map(|(k, v)| (k, v / secs)).collect()
            }
            None => executed.clone(),
        };
        let per_min = 60.0 / el;
        Rest {
            rss_leader: rl,
            rss_follower: rf,
            cpu_leader: (cl1 - cl0) * per_min,
            cpu_follower: (cf1 - cf0) * per_min,
            total: methods.values().sum(),
            methods,
            executed: executed.values().sum(),
            server_cpu: (cs1 - cs0) * per_min,
        }
    }

    /// SIGTERM every follower, then measure the leader alone at rest.
    pub(super) async fn leader_alone(&mut self, secs: u64) -> Rest {
        self.drain();
        let Some(leader) = self.leader else {
            return Rest::default();
        };
        let mut others: Vec<Cand> = Vec::new();
        while let Some(i) = self.cands.iter().position(|c| c.id != leader) {
            others.push(self.cands.remove(i));
        }
        for c in &others {
            c.signal(Signal::SIGTERM);
        }
        for c in &mut others {
            c.wait_exit(Duration::from_secs(10)).await;
        }
        drop(others);
        sleep(Duration::from_secs(2)).await;
        self.rest(secs).await
    }
}
