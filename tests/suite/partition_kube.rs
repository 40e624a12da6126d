//! The Kubernetes Lease backend under a real partition. The API stand-in
//! runs in the test process (it is not a separate program), so it stays on
//! the host: a forwarder on the bridge's host address carries each
//! sidecar's connections to it, and the cut is an nftables rule in the
//! leader's namespace on the forwarder's port. Followers reach the API, the
//! leader does not. Runs with `LEADER_ELECTOR_PARTITIONS=all`.

use std::sync::Arc;

use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::partition::{BOUND, Servers, Store, World, all};
use crate::support::backends::NAMESPACE;
use crate::support::kube_api::{Endpoint, KubeApi};
use crate::support::netns::Net;
use crate::support::recorder::Expect;

/// The stand-in and its forwarder on the bridge; both stop on drop.
pub struct KubeHost {
    _api: KubeApi,
    /// The forwarder's port on [`Net::host_ip`].
    pub port: u16,
    _endpoint: Arc<Endpoint>,
    forwarder: JoinHandle<()>,
}

impl Drop for KubeHost {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// The stand-in, a forwarder from the bridge to it, and a kubeconfig that
/// names the forwarder (the certificate is for `localhost`: `tls-server-name`).
pub async fn start(net: &Net, dir: &TempDir) -> Servers {
    let api = KubeApi::start(NAMESPACE);
    let endpoint = api.endpoint("partition").await;
    let upstream = endpoint.port;
    let listener = TcpListener::bind((net.host_ip(), 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let forwarder = tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    return;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    let token = std::fs::read_to_string(api.service_account_dir().join("token")).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: https://{host}:{port}\n    certificate-authority: {ca}\n    tls-server-name: localhost\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: {NAMESPACE}\ncurrent-context: standin\nusers:\n- name: standin\n  user:\n    token: {token}\n",
            host = net.host_ip(),
            ca = api.ca_path().display(),
        ),
    )
    .unwrap();
    let flags = vec!["--backend".to_owned(), "kubernetes".to_owned()];
    Servers {
        back: Vec::new(),
        procs: Vec::new(),
        flags: vec![flags; 3],
        env: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
        kube: Some(KubeHost {
            _api: api,
            port,
            _endpoint: endpoint,
            forwarder,
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_api_reachable_by_followers_not_the_leader() {
    if !all() {
        return;
    }
    let name = "p-kube";
    let w = World::start(Store::Kube, name).await;
    let (fault, slot) = w
        .fault_on_leader("API cut from the leader", Expect::CutOff, BOUND)
        .await;
    let port = w.kube.as_ref().expect("the stand-in").port;
    w.net.cut_host_port(w.side[slot], port);
    w.rec.in_effect(fault);
    super::partition_scenarios::hold_for_new_leader(&w, slot).await;
    w.heal("API cut", Some(fault));
    w.judge(name, super::partition::TTL * 2).await;
}
