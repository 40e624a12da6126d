//! Failsafe wired into the Elector, on the in-memory backend with real
//! peer sockets (real time, short leases): the safety checks (never two
//! leaders, tokens only grow) with their liveness twins.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::backend::memory::MemoryBackend;
use crate::elector::{Elector, LeaderState};
use crate::failsafe::peer::Secret;
use crate::failsafe::{Failsafe, Member};

const TTL: Duration = Duration::from_millis(900);

struct Node {
    id: String,
    state: watch::Receiver<LeaderState>,
    link: MemoryBackend,
    handle: crate::elector::ElectorHandle,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Node {
    /// Gone at once: the peer listener closes its connections, every task ends.
    async fn kill(mut self) {
        self.stop.cancel();
        sleep(Duration::from_millis(20)).await;
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

async fn node(server: &MemoryBackend, id: &str, failsafe: bool, secret: &[u8]) -> Node {
    let link = server.handle();
    let (elector, state) = Elector::builder(Arc::new(link.clone()))
        .election("e")
        .identity(id)
        .lease_duration(TTL)
        .build()
        .unwrap();
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    let elector = if failsafe {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let me = Member {
            identity: id.into(),
            peer_addr: listener.local_addr().unwrap().to_string(),
        };
        let secret = Secret::new(secret).unwrap();
        let fs = Arc::new(Failsafe::new("e", me, secret, Arc::new(link.clone()), TTL));
        let (f, s) = (fs.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let _ = f.serve(listener, s).await;
        }));
        let (f, s) = (fs.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            f.keep_applying(TTL / 3, TTL / 4, s).await
        }));
        elector.with_failsafe(fs)
    } else {
        elector
    };
    tasks.push(tokio::spawn(elector.run(stop.clone())));
    Node {
        id: id.into(),
        state,
        link,
        handle,
        stop,
        tasks,
    }
}

const SECRET: &[u8] = b"0123456789abcdef";

async fn cluster(server: &MemoryBackend, n: usize, failsafe: bool) -> Vec<Node> {
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(node(server, &format!("n{i}"), failsafe, SECRET).await);
    }
    nodes
}

fn leaders(nodes: &[Node]) -> Vec<(String, u64)> {
    let now = Instant::now();
    nodes
        .iter()
        .filter_map(|n| {
            let s = n.state.borrow();
            s.is_leader(now)
                .then(|| (n.id.clone(), s.own_term.unwrap().fencing_token))
        })
        .collect()
}

/// Watch `nodes` for `d`, every 10 ms: never two leaders, tokens never
/// fall. Returns the leaders seen at each sample.
async fn watch_for(nodes: &[Node], d: Duration, max_token: &mut u64) -> Vec<Option<String>> {
    let end = Instant::now() + d;
    let mut seen = Vec::new();
    while Instant::now() < end {
        let l = leaders(nodes);
        assert!(l.len() <= 1, "two leaders: {l:?}");
        if let Some((_, t)) = l.first() {
            assert!(*t >= *max_token, "token fell: {t} < {max_token}");
            *max_token = *t;
        }
        seen.push(l.first().map(|(id, _)| id.clone()));
        sleep(Duration::from_millis(10)).await;
    }
    seen
}

async fn one_leader(nodes: &[Node], max_token: &mut u64) -> (String, u64) {
    for _ in 0..800 {
        watch_for(nodes, Duration::from_millis(10), max_token).await;
        if let Some(l) = leaders(nodes).pop() {
            return l;
        }
    }
    panic!("no leader within 8 s");
}

async fn stop_all(nodes: Vec<Node>) {
    for n in &nodes {
        n.stop.cancel();
    }
    sleep(Duration::from_millis(100)).await;
    for n in nodes {
        n.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_leads_through_a_backend_outage_while_every_member_confirms() {
    let server = MemoryBackend::new();
    let nodes = cluster(&server, 3, true).await;
    let mut max = 0;
    let (leader, token) = one_leader(&nodes, &mut max).await;
    // Every member admitted before the outage.
    sleep(TTL).await;
    assert_eq!(server.written_roster().unwrap().members.len(), 3);
    server.stop(true);
    let seen = watch_for(&nodes, TTL * 6, &mut max).await;
    assert!(
        seen.iter().all(|l| l.as_deref() == Some(leader.as_str())),
        "{seen:?}"
    );
    let l = nodes.iter().find(|n| n.id == leader).unwrap();
    let view = l.state.borrow().failsafe.unwrap();
    assert!(view.active && view.members_confirmed == 2, "{view:?}");
    let body = crate::http::LeaderBody::at(&l.state.borrow(), Instant::now());
    let shown = body.failsafe.unwrap();
    assert!(
        body.is_leader && shown.active && shown.until.is_some(),
        "{shown:?}"
    );
    // A follower names the leader it promised while the backend is silent.
    let f = nodes.iter().find(|n| n.id != leader).unwrap();
    let fb = crate::http::LeaderBody::at(&f.state.borrow(), Instant::now());
    assert_eq!(fb.leader.as_deref(), Some(leader.as_str()));
    // A freeze asked of a follower in the outage is answered now (a new
    // user's try found it held until the backend returned, then applied).
    let freeze = f.handle.resign(Duration::from_secs(30));
    let answered = tokio::time::timeout(Duration::from_millis(500), freeze).await;
    assert_eq!(answered.ok(), Some(false), "answered at once, not leading");
    server.stop(false);
    watch_for(&nodes, TTL * 2, &mut max).await;
    assert_eq!(leaders(&nodes), [(leader, token)], "same term after");
    assert!(!l.state.borrow().failsafe.unwrap().active);
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_failsafe_the_leader_steps_down_at_its_deadline() {
    let server = MemoryBackend::new();
    let nodes = cluster(&server, 3, false).await;
    let mut max = 0;
    one_leader(&nodes, &mut max).await;
    server.stop(true);
    let seen = watch_for(&nodes, TTL * 3, &mut max).await;
    assert_eq!(seen.last().unwrap(), &None, "nobody leads in the outage");
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_in_the_outage_ends_the_term_by_the_bound() {
    let server = MemoryBackend::new();
    let mut nodes = cluster(&server, 3, true).await;
    let mut max = 0;
    let (leader, _) = one_leader(&nodes, &mut max).await;
    sleep(TTL).await;
    server.stop(true);
    watch_for(&nodes, TTL * 2, &mut max).await;
    let i = nodes.iter().position(|n| n.id != leader).unwrap();
    nodes.remove(i).kill().await;
    let killed = Instant::now();
    let seen = watch_for(&nodes, TTL * 3, &mut max).await;
    assert_eq!(seen.last().unwrap(), &None, "stepped down");
    let led_for = seen.iter().take_while(|l| l.is_some()).count() as u32 * 10;
    assert!(
        Duration::from_millis(led_for.into()) <= TTL + TTL / 3,
        "{led_for} ms after {killed:?}"
    );
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_leads_while_the_member_confirms_and_it_takes_over_only_after() {
    let server = MemoryBackend::new();
    let nodes = cluster(&server, 2, true).await;
    let mut max = 0;
    let (leader, token) = one_leader(&nodes, &mut max).await;
    sleep(TTL).await;
    let l = nodes.iter().find(|n| n.id == leader).unwrap();
    l.link.cut(true);
    // The member reaches the backend and sees the key expire, but keeps
    // its promise: the leader leads on.
    let seen = watch_for(&nodes, TTL * 4, &mut max).await;
    assert!(
        seen.iter().all(|x| x.as_deref() == Some(leader.as_str())),
        "{seen:?}"
    );
    // The member stops confirming (its peer listener stops): the leader
    // steps down by its bound, and the member leads only after that.
    let m = nodes.iter().find(|n| n.id != leader).unwrap();
    m.stop.cancel();
    let seen = watch_for(&nodes, TTL * 3, &mut max).await;
    assert!(seen.iter().any(|x| x.is_none()));
    assert!(max >= token);
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_in_the_outage_never_campaigns_and_is_admitted_after() {
    let server = MemoryBackend::new();
    let mut nodes = cluster(&server, 2, true).await;
    let mut max = 0;
    let (leader, token) = one_leader(&nodes, &mut max).await;
    sleep(TTL).await;
    server.stop(true);
    nodes.push(node(&server, "late", true, SECRET).await);
    let seen = watch_for(&nodes, TTL * 4, &mut max).await;
    assert!(seen.iter().all(|x| x.as_deref() == Some(leader.as_str())));
    server.stop(false);
    sleep(TTL * 2).await;
    assert!(
        server.written_roster().unwrap().contains("late"),
        "admitted"
    );
    assert_eq!(leaders(&nodes), [(leader, token)]);
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_wrong_secret_does_not_confirm_and_the_leader_steps_down() {
    let server = MemoryBackend::new();
    let mut nodes = cluster(&server, 2, true).await;
    nodes.push(node(&server, "n9", true, b"another-secret-of-16").await);
    let mut max = 0;
    one_leader(&nodes, &mut max).await;
    sleep(TTL * 2).await;
    server.stop(true);
    let seen = watch_for(&nodes, TTL * 3, &mut max).await;
    assert_eq!(seen.last().unwrap(), &None, "one member refused (401)");
    stop_all(nodes).await;
}
