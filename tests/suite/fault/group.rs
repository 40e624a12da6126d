//! A group of sidecars behind their fault proxies, the recorder polling
//! them, and the running totals over the scenarios of this process.

use super::*;

/// Sidecars (one per slot; a restarted sidecar takes a new slot), their
/// proxies, and the recorder polling them.
pub(super) struct Group {
    pub(super) kind: Kind,
    pub(super) election: String,
    pub(super) upstream: Vec<String>,
    pub(super) sidecars: Vec<Option<Sidecar>>,
    pub(super) proxies: Vec<Vec<Proxy>>,
    pub(super) rec: Recorder,
    pub(super) started: Instant,
}

impl Group {
    pub(super) async fn start(servers: &Servers, test: &str, ids: &[&str]) -> Group {
        let mut g = Group {
            kind: servers.kind(),
            election: election(test),
            upstream: servers.urls(),
            sidecars: Vec::new(),
            proxies: Vec::new(),
            rec: Recorder::new(TTL),
            started: Instant::now(),
        };
        for id in ids {
            g.spawn(id).await;
        }
        g
    }

    /// Start a sidecar `id` behind fresh proxies; returns its slot.
    pub(super) async fn spawn(&mut self, id: &str) -> usize {
        let mut proxies = Vec::new();
        for u in &self.upstream {
            proxies.push(
                within(
                    Duration::from_secs(5),
                    "starting a fault proxy",
                    Proxy::to_url(u),
                )
                .await,
            );
        }
        let urls: Vec<String> = proxies
            .iter()
            .zip(&self.upstream)
            .map(|(p, u)| p.url_for(u))
            .collect();
        let sidecar = match self.kind {
            Kind::Etcd => Sidecar::start(&urls.join(","), &self.election, id, FAST),
            Kind::Redis => {
                let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
                redis_sidecar(&refs, &self.election, id, FAST)
            }
        };
        let slot = self.rec.add(id, sidecar.port);
        assert_eq!(slot, self.sidecars.len());
        self.sidecars.push(Some(sidecar));
        self.proxies.push(proxies);
        slot
    }

    pub(super) fn id(&self, slot: usize) -> String {
        self.sidecars[slot]
            .as_ref()
            .map_or_else(|| format!("#{slot}"), |s| s.identity.clone())
    }

    /// Set the mode of every proxy of `slot`.
    pub(super) fn cut(&self, slot: usize, mode: Mode) {
        for p in &self.proxies[slot] {
            p.set(mode);
        }
    }

    /// Set the mode of every proxy.
    pub(super) fn cut_all(&self, mode: Mode) {
        for slot in 0..self.proxies.len() {
            self.cut(slot, mode);
        }
    }

    /// Slots whose process is running.
    pub(super) fn live(&self) -> Vec<usize> {
        (0..self.sidecars.len())
            .filter(|i| self.sidecars[*i].is_some())
            .collect()
    }

    /// Wait for one leader (every live sidecar answering, exactly one claiming).
    pub(super) async fn leader(&self, what: &str) -> (usize, u64) {
        within(
            Duration::from_secs(20),
            what,
            self.rec.wait_leader(Duration::from_secs(15)),
        )
        .await
        .unwrap_or_else(|| panic!("no single leader within 15 s: {what}"))
    }

    pub(super) fn signal(&self, slot: usize, sig: Signal) {
        self.sidecars[slot]
            .as_ref()
            .expect("a live sidecar")
            .signal(sig);
    }

    /// SIGKILL the sidecar in `slot` and stop polling it.
    pub(super) async fn kill(&mut self, slot: usize) {
        let mut s = self.sidecars[slot].take().expect("a live sidecar");
        s.signal(Signal::SIGKILL);
        within(
            Duration::from_secs(5),
            "a SIGKILLed sidecar to exit",
            s.wait_exit(Duration::from_secs(4)),
        )
        .await
        .expect("the sidecar exits after SIGKILL");
        self.rec.stop_polling(slot);
    }

    /// Check the recording, print the summary, add it to the totals, and
    /// fail on any problem not matched by `tolerated`.
    pub(super) async fn finish_with(mut self, scenario: &str, tolerated: &[&str]) -> Report {
        let mut report = self.rec.check(scenario);
        // e. No sidecar exited because of a backend fault.
        for (slot, s) in self.sidecars.iter_mut().enumerate() {
            if let Some(s) = s
                && let Some(status) = s.exited()
            {
                report.problems.push(format!(
                    "EXIT: {}#{slot} exited with {status} during the faults",
                    s.identity
                ));
            }
        }
        report.scenario = format!("{scenario} ({:.0} s)", self.started.elapsed().as_secs_f64());
        eprintln!("{}", report.summary());
        add_to_totals(&report);
        let unexpected: Vec<&String> = report
            .problems
            .iter()
            .filter(|p| !tolerated.iter().any(|t| p.contains(t)))
            .collect();
        if !unexpected.is_empty() {
            for slot in self.live() {
                eprintln!(
                    "--- log of {} ---\n{}",
                    self.id(slot),
                    tail(&self.sidecars[slot].as_ref().unwrap().log(), 80)
                );
            }
            for s in &mut self.sidecars {
                // Logs were printed above; keep Drop from printing them again.
                drop(s.take());
            }
            panic!(
                "{scenario}: {} problem(s):\n{}",
                unexpected.len(),
                report.summary()
            );
        }
        report
    }

    pub(super) async fn finish(self, scenario: &str) -> Report {
        self.finish_with(scenario, &[]).await
    }
}

pub(super) fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Running totals over the scenarios of this process.
pub(super) static TOTALS: Mutex<Vec<Report>> = Mutex::new(Vec::new());

pub(super) fn add_to_totals(r: &Report) {
    let mut all = TOTALS.lock().unwrap();
    all.push(r.clone());
    let faults: usize = all.iter().map(|r| r.faults).sum();
    let transitions: usize = all.iter().map(|r| r.transitions).sum();
    let overlaps: usize = all.iter().map(|r| r.overlaps.len()).sum();
    let gap = all.iter().max_by_key(|r| r.longest_gap).unwrap();
    let stale = all.iter().filter_map(|r| r.worst_stale_ms).max();
    let slow = all
        .iter()
        .filter_map(|r| {
            r.slowest_recovery
                .as_ref()
                .map(|s| (s.0, &r.scenario, &s.2))
        })
        .max_by_key(|s| s.0);
    eprintln!(
        "== running total after {} scenario(s): faults {faults}, transitions {transitions}, overlaps {overlaps}, longest leaderless gap {} ms ({}), worst stale claim {}, slowest recovery {}",
        all.len(),
        gap.longest_gap.as_millis(),
        gap.scenario,
        stale.map_or("n/a".into(), |v| format!("{v} ms")),
        slow.map_or("n/a".into(), |(d, sc, f)| format!(
            "{} ms ({sc}: {f})",
            d.as_millis()
        )),
    );
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fault-summary.tsv");
    static FIRST: std::sync::Once = std::sync::Once::new();
    FIRST.call_once(|| {
        let _ = std::fs::write(
            &path,
            "scenario\ttransitions\tfaults\toverlaps\tlongest_gap_ms\tworst_stale_ms\tslowest_recovery_ms\tproblems\n",
        );
    });
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&path) {
        let _ = writeln!(f, "{}", r.line());
    }
}

/// The receive instant of the last claim of the term (`slot`, `token`).
pub(super) fn last_claim(rec: &Recorder, slot: usize, token: u64) -> Option<Instant> {
    rec.snapshot()[slot]
        .1
        .iter()
        .filter(|s| s.is_true() && s.answer.as_ref().unwrap().fencing_token == Some(token))
        .map(|s| s.recv)
        .next_back()
}

/// Claims by anybody whose request was sent in `[from, to]`.
pub(super) fn claims_between(rec: &Recorder, from: Instant, to: Instant) -> Vec<(String, Sample)> {
    rec.snapshot()
        .into_iter()
        .flat_map(|(label, s)| s.into_iter().map(move |s| (label.clone(), s)))
        .filter(|(_, s)| s.is_true() && s.send >= from && s.send <= to)
        .collect()
}

pub(super) const ABC: &[&str] = &["a", "b", "c"];
