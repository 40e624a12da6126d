//! Real network partitions: every node (a server, a sidecar) in its own
//! network namespace on one bridge, cut per pair and per direction by
//! nftables rules inside the namespaces, and healed.
//!
//! Names carry a unique prefix per harness (`lpart-<pid>-<n>-`, bridge
//! `lpb<pid hex><n hex>`), so parallel tests never meet. Everything a harness
//! makes is removed by its `Drop` (a failed test too), and a new harness first
//! sweeps what runs killed by a signal left behind (the prefix names the dead
//! process). A cut's rules live inside the namespaces, so deleting a
//! namespace deletes them with its veth. Needs root, `ip` (iproute2) and
//! `nft` (nftables); a machine that cannot make namespaces fails the test.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::require;

/// Prefix of every namespace this kit makes.
const NS_PREFIX: &str = "lpart-";
/// Prefix of every bridge this kit makes.
const BRIDGE_PREFIX: &str = "lpb";
/// The nftables table holding a node's cuts (one per namespace).
const TABLE: &str = "cuts";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One node: a namespace with one address on the harness's bridge.
#[derive(Clone, Debug)]
pub struct Node {
    /// The test's name for it (`etcd0`, `s1`…).
    pub name: String,
    /// The namespace (`ip netns exec <ns> …`).
    pub ns: String,
    /// Its address on the bridge.
    pub ip: Ipv4Addr,
}

/// A bridge and the namespaces on it; all removed on drop.
pub struct Net {
    bridge: String,
    prefix: String,
    subnet: [u8; 3],
    nodes: Mutex<Vec<Node>>,
}

/// Runs `ip`/`nft`/`tc` with `args`; panics with the command and its
/// stderr when it fails (a harness that cannot cut must not pretend it did).
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{program}`: {e}"));
    assert!(
        out.status.success(),
        "`{program} {}` failed ({}): {}\nthe partition tests need root and a kernel with network namespaces, veth, bridges and nf_tables",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs `program args`, ignoring failure (cleanup of things that may be gone).
fn try_run(program: &str, args: &[&str]) {
    let _ = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Runs `nft -f -` inside `ns` with `script` on stdin; panics on failure.
fn nft(ns: &str, script: &str) {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft in {ns} refused:\n{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether process `pid` is alive.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Kills every process still inside namespace `ns` (servers a killed run
/// left behind keep its namespace alive).
fn kill_inside(ns: &str) {
    let pids = Command::new("ip").args(["netns", "pids", ns]).output();
    for pid in
        String::from_utf8_lossy(&pids.map(|o| o.stdout).unwrap_or_default()).split_whitespace()
    {
        try_run("kill", &["-9", pid]);
    }
}

/// Removes namespaces and bridges left by runs of dead processes.
fn sweep() {
    let list = Command::new("ip").args(["netns", "list"]).output();
    for line in list
        .map(|o| o.stdout)
        .unwrap_or_default()
        .split(|b| *b == b'\n')
    {
        let line = String::from_utf8_lossy(line);
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let pid = name
            .strip_prefix(NS_PREFIX)
            .and_then(|r| r.split('-').next());
        if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok())
            && !alive(pid)
        {
            kill_inside(name);
            try_run("ip", &["netns", "del", name]);
        }
    }
    let links = Command::new("ip").args(["-o", "link", "show"]).output();
    for line in String::from_utf8_lossy(&links.map(|o| o.stdout).unwrap_or_default()).lines() {
        let Some(name) = line.split(": ").nth(1).and_then(|n| n.split('@').next()) else {
            continue;
        };
        // A bridge is `lpb<pid hex><n hex>`; its veths (`…v<k>`) go with
        // their namespaces and are never swept here (a live run's would be).
        let Some(hex) = name
            .strip_prefix(BRIDGE_PREFIX)
            .filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
        else {
            continue;
        };
        let pid = hex
            .get(..hex.len().saturating_sub(2))
            .map(|p| u32::from_str_radix(p, 16));
        if let Some(Ok(pid)) = pid
            && !alive(pid)
        {
            try_run("ip", &["link", "del", name]);
        }
    }
}

impl Net {
    /// A new bridge with a private /24 on the host (the host samples every
    /// node through it and is never cut). Panics, saying what is missing,
    /// when the machine cannot make it.
    pub fn new() -> Net {
        require("ip", "iproute2");
        require("nft", "nftables");
        sweep();
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % 256;
        let bridge = format!("{BRIDGE_PREFIX}{pid:x}{n:02x}");
        let subnet = [10, 200 + (pid % 50) as u8, n as u8];
        let net = Net {
            prefix: format!("{NS_PREFIX}{pid}-{n}-"),
            bridge,
            subnet,
            nodes: Mutex::new(Vec::new()),
        };
        run("ip", &["link", "add", &net.bridge, "type", "bridge"]);
        let host = format!("{}.{}.{}.1/24", subnet[0], subnet[1], subnet[2]);
        run("ip", &["addr", "add", &host, "dev", &net.bridge]);
        run("ip", &["link", "set", &net.bridge, "up"]);
        net
    }

    /// Add a node called `name`: a namespace, a veth into the bridge, an
    /// address, loopback up, and an empty nftables table for its cuts.
    /// Returns its index.
    pub fn add(&self, name: &str) -> usize {
        let k = self.nodes().len();
        let ns = format!("{}{k}", self.prefix);
        let ip = Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], k as u8 + 2);
        let veth = format!("{}v{k}", self.bridge);
        run("ip", &["netns", "add", &ns]);
        run(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        );
        run("ip", &["link", "set", &veth, "master", &self.bridge, "up"]);
        run(
            "ip",
            &["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
        );
        run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
        run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        nft(
            &ns,
            &format!(
                "table inet {TABLE} {{\n chain out {{ type filter hook output priority 0; policy accept; }}\n chain inp {{ type filter hook input priority 0; policy accept; }}\n}}\n"
            ),
        );
        self.nodes.lock().unwrap().push(Node {
            name: name.to_owned(),
            ns,
            ip,
        });
        k
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> Node {
        self.nodes()[i].clone()
    }

    /// Every node so far (a copy: no lock is held while a command runs, so a
    /// failed command never poisons the list the cleanup needs).
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Node `i`'s address.
    pub fn ip(&self, i: usize) -> IpAddr {
        IpAddr::V4(self.node(i).ip)
    }

    /// A one-way cut: packets from `from` no longer reach `to` (dropped as
    /// they leave `from` and, should one slip out, as they enter `to`);
    /// packets from `to` to `from` still arrive.
    pub fn cut(&self, from: usize, to: usize) {
        let (a, b) = (self.node(from), self.node(to));
        nft(
            &a.ns,
            &format!("add rule inet {TABLE} out ip daddr {} drop\n", b.ip),
        );
        nft(
            &b.ns,
            &format!("add rule inet {TABLE} inp ip saddr {} drop\n", a.ip),
        );
    }

    /// The host's address on the bridge (never cut: it samples every node).
    pub fn host_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(
            self.subnet[0],
            self.subnet[1],
            self.subnet[2],
            1,
        ))
    }

    /// Cut node `i` from TCP port `port` of the host, both ways (a server
    /// that runs in the test process, such as the Kubernetes API stand-in,
    /// listening on [`Net::host_ip`]); the host's other ports stay reachable.
    pub fn cut_host_port(&self, i: usize, port: u16) {
        let (n, host) = (self.node(i), self.host_ip());
        nft(
            &n.ns,
            &format!(
                "add rule inet {TABLE} out ip daddr {host} tcp dport {port} drop\nadd rule inet {TABLE} inp ip saddr {host} tcp sport {port} drop\n"
            ),
        );
    }

    /// A symmetric cut between `a` and `b`.
    pub fn cut_both(&self, a: usize, b: usize) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Cut every node of `side` from every node of `others`, both ways.
    pub fn split(&self, side: &[usize], others: &[usize]) {
        for &a in side {
            for &b in others {
                self.cut_both(a, b);
            }
        }
    }

    /// Every node drops `percent` % of the packets it sends to other nodes,
    /// at random (not those to the host: the sampling stays exact).
    pub fn loss(&self, percent: u8) {
        let host = Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], 1);
        for n in &self.nodes() {
            nft(
                &n.ns,
                &format!(
                    "add rule inet {TABLE} out ip daddr != {host} numgen random mod 100 < {percent} drop\n"
                ),
            );
        }
    }

    /// `tc netem` on every node's link: `delay_ms` ± `jitter_ms`, `loss` %.
    /// Panics naming the missing kernel module when the kernel has no netem.
    pub fn netem(&self, delay_ms: u32, jitter_ms: u32, loss: u8) {
        for n in &self.nodes() {
            let (d, j, l) = (
                format!("{delay_ms}ms"),
                format!("{jitter_ms}ms"),
                format!("{loss}%"),
            );
            let args = ["-n", &n.ns, "qdisc", "add", "dev", "eth0", "root", "netem"];
            let out = Command::new("tc")
                .args(args)
                .args(["delay", &d, &j, "loss", &l])
                .output()
                .expect("run tc (iproute2)");
            assert!(
                out.status.success(),
                "tc netem on {}: {} (this kernel has no sch_netem module: delay and reordering cannot be made here; loss can, with Net::loss)",
                n.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }

    /// Remove every cut and every impairment: the network is whole again.
    pub fn heal(&self) {
        for n in &self.nodes() {
            nft(
                &n.ns,
                &format!("flush chain inet {TABLE} out\nflush chain inet {TABLE} inp\n"),
            );
            try_run("tc", &["-n", &n.ns, "qdisc", "del", "dev", "eth0", "root"]);
        }
    }

    /// Start `program args` inside node `i`, stderr and stdout to `log`;
    /// killed on drop.
    pub fn spawn(&self, i: usize, program: &str, args: &[String], log: &Path) -> NsProcess {
        let ns = self.node(i).ns;
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, program])
            .args(args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program} in {ns}: {e}"));
        NsProcess {
            child,
            log: log.to_owned(),
        }
    }

    /// The wrapper that runs a command inside node `i`
    /// (for `Sidecar::start_wrapped`).
    pub fn wrapper(&self, i: usize) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.node(i).ns]
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in &self.nodes() {
            kill_inside(&n.ns);
            try_run("ip", &["netns", "del", &n.ns]);
        }
        try_run("ip", &["link", "del", &self.bridge]);
    }
}

/// A process started inside a namespace (`ip netns exec` execs it, so the
/// child is the process itself); killed on drop.
pub struct NsProcess {
    child: Child,
    log: std::path::PathBuf,
}

impl NsProcess {
    /// What the process wrote.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
