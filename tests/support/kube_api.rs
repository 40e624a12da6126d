//! A Kubernetes API stand-in for tests: an HTTPS server on loopback (a CA
//! and a server certificate generated per stand-in, bearer-token
//! authentication) that serves what the sidecar uses — Leases (get, list, create, update, delete,
//! watch), Pods (get, list, merge patch) and Events (create) — with the API
//! server's documented semantics where the sidecar depends on them
//! (https://kubernetes.io/docs/reference/using-api/api-concepts/):
//! - one global `resourceVersion` counter that changes on every write (like
//!   etcd's revision behind a real API server);
//! - `PUT` with a `metadata.resourceVersion` that is not the current one →
//!   409 `Conflict`; `PUT` without one is an unconditional update (kubectl
//!   replace/edit); `POST` of an existing name → 409 `AlreadyExists`; `POST`
//!   into an unknown namespace → 404; `PUT`/`DELETE` of a missing object → 404;
//! - watch: `?watch=true&resourceVersion=N` replays every change after N,
//!   then streams live ones as newline-delimited `{"type","object"}` JSON;
//!   without a version it starts with synthetic `ADDED` events of the current
//!   state; a version older than the kept history → an `ERROR` event with a
//!   410 `Expired` Status; `allowWatchBookmarks=true` adds `BOOKMARK` events
//!   (every [`KubeApi::set_bookmark_every`]); `timeoutSeconds` ends the
//!   stream; `fieldSelector=metadata.name=X` filters.
//!
//! - TLS with a generated CA (`certificate-authority` in the KUBECONFIG, or
//!   `ca.crt` for the in-cluster path) and a bearer token: a request without
//!   the token answers 401, as the real server's authenticator does;
//! - RBAC per verb and resource ([`KubeApi::deny`]): a denied verb answers
//!   403 with the real server's wording, and `SelfSubjectAccessReview`
//!   answers the same question up front;
//! - a watch from a version that compaction passed answers 410 `Expired`,
//!   also when it is an unchanged object's own version: [`KubeApi::compact`]
//!   stands for the cluster's other writes too, so the compaction point
//!   passes every object's own version, as on a real cluster;
//! - per request, the `User-Agent` and the `fieldManager` of writes are
//!   recorded ([`Endpoint::log`]), like the audit log and `managedFields`;
//! - [`Endpoint::reset_watches`] breaks one client's open watches mid-stream
//!   (a reset connection), so a third party can write while it is blind.
//!
//! Every client gets its own listener ([`KubeApi::endpoint`]) with its own
//! fault switches ([`Fault`]: latency, an error status, a hang), so a test can
//! blackhole the API for one sidecar only. A KUBECONFIG file per endpoint
//! points the sidecar at it.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::broadcast;

/// Faults of one endpoint (or of all, see [`KubeApi::set_fault_all`]).
#[derive(Clone, Debug, Default)]
pub struct Fault {
    /// Delay before every answer.
    pub latency: Duration,
    /// Answer every request (of the kinds below) with this status: 403, 409,
    /// 429, 500…
    pub status: Option<u16>,
    /// Apply `status` only to writes (POST, PUT, PATCH, DELETE).
    pub writes_only: bool,
    /// Never answer (requests hang; open watches stop delivering events).
    pub hang: bool,
    /// Delay before each watch event reaches this client (a slow watch
    /// cache or a congested connection).
    pub event_latency: Duration,
    /// The `Retry-After` header of an injected 429, in seconds; `None`:
    /// no header.
    pub retry_after: Option<u32>,
}

impl Fault {
    /// Every request refused as API Priority and Fairness refuses one when
    /// its priority level is full: 429, `Retry-After: secs`, and the
    /// plain-text body of Go's `http.Error` (the real server's
    /// `tooManyRequests` in `apiserver/pkg/server/filters`; not a
    /// `Status`).
    pub fn throttled(secs: u32) -> Fault {
        Fault {
            status: Some(429),
            retry_after: Some(secs),
            ..Fault::default()
        }
    }
}

#[derive(Debug)]
struct Change {
    rv: u64,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    leases: BTreeMap<(String, String), Value>,
    pods: BTreeMap<(String, String), Value>,
    events: Vec<Value>,
    history: Vec<Change>,
    /// Changes at or below this version are forgotten (compaction).
    compacted: u64,
    namespaces: Vec<String>,
}

struct Shared {
    store: Mutex<Store>,
    changes: broadcast::Sender<(u64, &'static str, Value)>,
    global: Mutex<Fault>,
    bookmark_every: Mutex<Duration>,
    /// `(verb, resource)` pairs RBAC denies (`("update", "leases")`).
    denied: Mutex<BTreeSet<(String, String)>>,
    /// The bearer token every request must carry.
    token: String,
    /// The user that token authenticates as.
    user: String,
}

/// One request as the audit log would show it.
#[derive(Clone, Debug)]
pub struct Logged {
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`).
    pub verb: &'static str,
    /// The resource (`leases`, `pods`, `events`, `selfsubjectaccessreviews`).
    pub resource: String,
    /// The `User-Agent` header (empty when none was sent).
    pub user_agent: String,
    /// The `fieldManager` query parameter of a write (empty when none).
    pub field_manager: String,
    /// The status code answered (0 for a watch still streaming).
    pub code: u16,
}

/// One client's listener: its fault switch and request counters.
pub struct Endpoint {
    /// Name given by the test.
    pub name: String,
    /// Loopback port.
    pub port: u16,
    fault: Mutex<Fault>,
    shared: Arc<Shared>,
    /// Requests answered or held, by `METHOD kind` (`GET lease`, `PUT lease`, `WATCH lease`…).
    counts: Mutex<BTreeMap<String, u64>>,
    total: AtomicU64,
    kubeconfig: PathBuf,
    log: Mutex<Vec<Logged>>,
    /// Bumped by [`Endpoint::reset_watches`]: open watches break.
    resets: tokio::sync::watch::Sender<u64>,
}

/// The stand-in server. Dropping it stops every listener.
pub struct KubeApi {
    shared: Arc<Shared>,
    endpoints: Mutex<Vec<Arc<Endpoint>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    dir: TempDir,
    certs: super::Certs,
    tls: tokio_rustls::TlsAcceptor,
    /// The namespace tests use.
    pub namespace: String,
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    });
    (
        StatusCode::from_u16(code).unwrap(),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

fn json_ok(code: u16, v: &Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn query_map(q: Option<&str>) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(decode(k), decode(v));
    }
    m
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(h, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `metadata.name=X` from a field selector.
fn name_selector(q: &HashMap<String, String>) -> Option<String> {
    q.get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name=").map(str::to_owned))
}

fn merge_patch(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl Store {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
    fn record(
        &mut self,
        shared_tx: &broadcast::Sender<(u64, &'static str, Value)>,
        kind: &'static str,
        object: Value,
    ) {
        let rv = self.rv;
        self.history.push(Change {
            rv,
            kind,
            object: object.clone(),
        });
        let _ = shared_tx.send((rv, kind, object));
    }
}

impl KubeApi {
    /// A stand-in with namespace `ns` (and `default`) and no objects.
    pub fn start(ns: &str) -> KubeApi {
        let (changes, _) = broadcast::channel(4096);
        let store = Store {
            rv: 1000,
            namespaces: vec![ns.to_owned(), "default".to_owned()],
            ..Store::default()
        };
        let certs = super::Certs::generate();
        let dir = TempDir::new().unwrap();
        let token = format!("standin-{:016x}", rand::random::<u64>());
        std::fs::write(dir.path().join("token"), &token).unwrap();
        std::fs::write(dir.path().join("namespace"), ns).unwrap();
        std::fs::copy(&certs.ca, dir.path().join("ca.crt")).unwrap();
        KubeApi {
            shared: Arc::new(Shared {
                store: Mutex::new(store),
                changes,
                global: Mutex::new(Fault::default()),
                bookmark_every: Mutex::new(Duration::from_secs(1)),
                denied: Mutex::new(BTreeSet::new()),
                token,
                user: format!("system:serviceaccount:{ns}:leader-elector"),
            }),
            endpoints: Mutex::new(Vec::new()),
            tasks: Mutex::new(Vec::new()),
            tls: tls_acceptor(&certs),
            certs,
            dir,
            namespace: ns.to_owned(),
        }
    }

    /// The directory holding `token`, `ca.crt` and `namespace`: what a Pod
    /// has mounted at `/var/run/secrets/kubernetes.io/serviceaccount`.
    pub fn service_account_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The CA certificate (PEM) the server's certificate chains to.
    pub fn ca_path(&self) -> &std::path::Path {
        &self.certs.ca
    }

    /// RBAC: deny `verb` (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`) on `resource` (`leases`, `pods`, `events`).
    pub fn deny(&self, verb: &str, resource: &str) {
        self.shared
            .denied
            .lock()
            .unwrap()
            .insert((verb.to_owned(), resource.to_owned()));
    }

    /// A new listener for one client, with its KUBECONFIG file.
    pub async fn endpoint(&self, name: &str) -> Arc<Endpoint> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let kubeconfig = self.dir.path().join(format!("kubeconfig-{name}-{port}"));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: {ns}\ncurrent-context: standin\nusers:\n- name: standin\n  user:\n    token: {token}\n",
                ns = self.namespace,
                ca = self.certs.ca.display(),
                token = self.shared.token,
            ),
        )
        .unwrap();
        let ep = Arc::new(Endpoint {
            name: name.to_owned(),
            port,
            fault: Mutex::new(Fault::default()),
            shared: self.shared.clone(),
            counts: Mutex::new(BTreeMap::new()),
            total: AtomicU64::new(0),
            kubeconfig,
            log: Mutex::new(Vec::new()),
            resets: tokio::sync::watch::channel(0).0,
        });
        let app = axum::Router::new().fallback(handle).with_state(ep.clone());
        let task = tokio::spawn(serve_tls(listener, self.tls.clone(), app));
        self.tasks.lock().unwrap().push(task);
        self.endpoints.lock().unwrap().push(ep.clone());
        ep
    }

    /// Faults for every endpoint (combined with each endpoint's own).
    pub fn set_fault_all(&self, f: Fault) {
        *self.shared.global.lock().unwrap() = f;
    }

    /// How often open watches with `allowWatchBookmarks` get a BOOKMARK.
    pub fn set_bookmark_every(&self, d: Duration) {
        *self.shared.bookmark_every.lock().unwrap() = d;
    }

    /// Forget history up to the current version (later watches from an
    /// older version get 410 Expired). The version first moves on, as the
    /// rest of a real cluster writes all the time: the compaction point then
    /// passes every object's own version, so a watch from an unchanged
    /// object's version is refused too; only the version of a LIST made
    /// after the compaction is accepted.
    pub fn compact(&self) {
        let mut s = self.shared.store.lock().unwrap();
        s.bump();
        s.compacted = s.rv;
        s.history.clear();
    }

    /// The Lease as stored.
    pub fn lease(&self, name: &str) -> Option<Value> {
        let s = self.shared.store.lock().unwrap();
        s.leases
            .get(&(self.namespace.clone(), name.to_owned()))
            .cloned()
    }

    /// Edit a Lease by hand (an unconditional update, like `kubectl edit`
    /// after a fresh read): `f` changes the stored object.
    pub fn edit_lease(&self, name: &str, f: impl FnOnce(&mut Value)) -> bool {
        let shared = self.shared.clone();
        let mut s = shared.store.lock().unwrap();
        let key = (self.namespace.clone(), name.to_owned());
        let Some(mut l) = s.leases.get(&key).cloned() else {
            return false;
        };
        f(&mut l);
        let rv = s.bump();
        l["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.leases.insert(key, l.clone());
        s.record(&shared.changes, "MODIFIED", l);
        true
    }

    /// Delete a Lease by hand (`kubectl delete lease`).
    pub fn delete_lease(&self, name: &str) -> bool {
        let shared = self.shared.clone();
        let mut s = shared.store.lock().unwrap();
        let key = (self.namespace.clone(), name.to_owned());
        let Some(mut l) = s.leases.remove(&key) else {
            return false;
        };
        let rv = s.bump();
        l["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.record(&shared.changes, "DELETED", l);
        true
    }

    /// Add a Pod (for the labeler).
    pub fn add_pod(&self, name: &str) {
        let mut s = self.shared.store.lock().unwrap();
        let rv = s.bump();
        let ns = self.namespace.clone();
        s.pods.insert(
            (ns.clone(), name.to_owned()),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                                "resourceVersion": rv.to_string(), "labels": {}}}),
        );
    }

    /// A Pod's label value.
    pub fn pod_label(&self, pod: &str, key: &str) -> Option<String> {
        let s = self.shared.store.lock().unwrap();
        s.pods
            .get(&(self.namespace.clone(), pod.to_owned()))
            .and_then(|p| p["metadata"]["labels"][key].as_str().map(str::to_owned))
    }

    /// Set a Pod's label by hand (`kubectl label --overwrite`).
    pub fn set_pod_label(&self, pod: &str, key: &str, value: &str) {
        let mut s = self.shared.store.lock().unwrap();
        let rv = s.bump();
        let p = s
            .pods
            .get_mut(&(self.namespace.clone(), pod.to_owned()))
            .expect("no such Pod");
        p["metadata"]["labels"][key] = json!(value);
        p["metadata"]["resourceVersion"] = json!(rv.to_string());
    }

    /// Events created so far.
    pub fn events(&self) -> Vec<Value> {
        self.shared.store.lock().unwrap().events.clone()
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Endpoint {
    /// Set this endpoint's faults.
    pub fn set_fault(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }

    /// The KUBECONFIG file that points at this endpoint.
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    /// Requests so far, in all.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Requests so far by `METHOD kind`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().unwrap().clone()
    }

    fn effective(&self) -> Fault {
        let own = self.fault.lock().unwrap().clone();
        let all = self.shared.global.lock().unwrap().clone();
        Fault {
            latency: own.latency.max(all.latency),
            status: own.status.or(all.status),
            writes_only: if own.status.is_some() {
                own.writes_only
            } else {
                all.writes_only
            },
            hang: own.hang || all.hang,
            event_latency: own.event_latency.max(all.event_latency),
            retry_after: if own.status.is_some() {
                own.retry_after
            } else {
                all.retry_after
            },
        }
    }

    fn count(&self, key: String) {
        self.total.fetch_add(1, Ordering::Relaxed);
        *self.counts.lock().unwrap().entry(key).or_default() += 1;
    }

    /// Every request so far, as an audit log would show it.
    pub fn log(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    /// Break this client's open watches mid-stream, as a reset connection
    /// does (the client sees a transport error, not a clean end).
    pub fn reset_watches(&self) {
        self.resets.send_modify(|n| *n += 1);
    }
}

/// A TLS acceptor for the stand-in's server certificate.
fn tls_acceptor(certs: &super::Certs) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(&certs.server_cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&certs.server_key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// Accept TLS connections on `listener` and serve `app` on each (HTTP/1.1,
/// as the API server answers clients that offer no ALPN).
async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    app: axum::Router,
) {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let (tls, app) = (tls.clone(), app.clone());
        // A connection the server drops (a reset watch) ends with a TCP
        // reset, as a broken connection does, not with a clean close.
        #[allow(deprecated)]
        let _ = tcp.set_linger(Some(Duration::ZERO));
        // As the real API server (Go sets TCP_NODELAY on every socket):
        // without it, a response written in two TLS records waits for the
        // client's delayed ACK (40 ms).
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            let service = TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(State(ep): State<Arc<Endpoint>>, req: Request) -> Response {
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == ep.shared.token);
    let r = ApiRequest::read(req).await;
    let kind = r.kind();
    ep.count(format!("{} {kind}", r.verb()));
    let response = handle_request(&ep, &r, kind, authorized).await;
    ep.log.lock().unwrap().push(Logged {
        verb: r.k8s_verb(),
        resource: r.resource().to_owned(),
        user_agent,
        field_manager: r.q.get("fieldManager").cloned().unwrap_or_default(),
        code: response.status().as_u16(),
    });
    response
}

/// Authentication, faults, RBAC, then the route's answer.
async fn handle_request(
    ep: &Arc<Endpoint>,
    r: &ApiRequest,
    kind: &str,
    authorized: bool,
) -> Response {
    if !authorized {
        return status(401, "Unauthorized", "Unauthorized");
    }

    let fault = ep.effective();
    if !fault.latency.is_zero() {
        tokio::time::sleep(fault.latency).await;
    }
    if fault.hang {
        std::future::pending::<()>().await;
    }
    if let Some(injected) = r.injected(&fault, kind) {
        return injected;
    }
    if r.resource() == "selfsubjectaccessreviews" {
        return access_review(&ep.shared, &r.body);
    }
    let denied = ep
        .shared
        .denied
        .lock()
        .unwrap()
        .contains(&(r.k8s_verb().to_owned(), r.resource().to_owned()));
    if denied {
        return status(403, "Forbidden", &r.forbidden(kind, &ep.shared.user));
    }
    r.answer(ep).await
}

/// A `SelfSubjectAccessReview`: allowed unless RBAC denies the verb on the
/// resource (every verb is denied or allowed namespace-wide here).
fn access_review(shared: &Shared, body: &Value) -> Response {
    let attrs = &body["spec"]["resourceAttributes"];
    let verb = attrs["verb"].as_str().unwrap_or("").to_owned();
    let resource = attrs["resource"].as_str().unwrap_or("").to_owned();
    let allowed = !shared.denied.lock().unwrap().contains(&(verb, resource));
    let mut review = body.clone();
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    review["status"] = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding"})
    } else {
        json!({"allowed": false})
    };
    json_ok(201, &review)
}

/// One request, read whole: what the routes need of it.
struct ApiRequest {
    method: Method,
    path: String,
    q: HashMap<String, String>,
    /// The JSON body (`Null` when there is none or it is not JSON).
    body: Value,
    /// `?watch=true` (or `1`).
    watching: bool,
}

/// What a request's path names (by its segments).
enum Route<'a> {
    Leases { ns: &'a str },
    Lease { ns: &'a str, name: &'a str },
    Pods { ns: &'a str },
    Pod { ns: &'a str, name: &'a str },
    Events,
    Other,
}

impl ApiRequest {
    /// Read the method, path, query and body of `req`.
    async fn read(req: Request) -> ApiRequest {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let q = query_map(req.uri().query());
        let body = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let watching = q.get("watch").is_some_and(|v| v == "true" || v == "1");
        ApiRequest {
            method,
            path,
            q,
            body,
            watching,
        }
    }

    /// The path's segments.
    fn seg(&self) -> Vec<&str> {
        self.path.trim_matches('/').split('/').collect()
    }

    /// The kind of object the path is about, for the counters and the 403
    /// message (any path under a collection counts, even a 404).
    fn kind(&self) -> &'static str {
        match self.seg().as_slice() {
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                _,
                "leases",
                ..,
            ] => "lease",
            ["api", "v1", "namespaces", _, "pods", ..] => "pod",
            ["api", "v1", "namespaces", _, "events", ..] => "event",
            _ => "other",
        }
    }

    /// `WATCH` for a watch, else the HTTP method.
    fn verb(&self) -> String {
        if self.watching {
            "WATCH".to_owned()
        } else {
            self.method.to_string()
        }
    }

    /// The answer of an injected error status, if `fault` has one for this
    /// request (429 as API Priority and Fairness answers it, see
    /// [`Fault::throttled`]; 403 worded like RBAC's).
    fn injected(&self, fault: &Fault, kind: &str) -> Option<Response> {
        let write = !matches!(self.method, Method::GET);
        let code = fault.status.filter(|_| write || !fault.writes_only)?;
        if code == 429 {
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                "Too many requests, please try again later.\n",
            )
                .into_response();
            if let Some(secs) = fault.retry_after {
                r.headers_mut().insert(header::RETRY_AFTER, secs.into());
            }
            return Some(r);
        }
        let msg = if code == 403 {
            self.forbidden(kind, "system:serviceaccount:ns:leader-elector")
        } else {
            format!("injected {code}")
        };
        Some(status(code, reason_of(code), &msg))
    }

    /// The Kubernetes verb of this request (RBAC's word for it).
    fn k8s_verb(&self) -> &'static str {
        let named = matches!(self.route(), Route::Lease { .. } | Route::Pod { .. });
        match (&self.method, self.watching) {
            (_, true) => "watch",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, _) => "delete",
            _ if named => "get",
            _ if self.resource() == "other" => "get",
            _ => "list",
        }
    }

    /// The resource the path names (plural, as RBAC has it).
    fn resource(&self) -> &str {
        match self.seg().as_slice() {
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ] => "selfsubjectaccessreviews",
            _ => match self.kind() {
                "lease" => "leases",
                "pod" => "pods",
                "event" => "events",
                _ => "other",
            },
        }
    }

    /// The message of an RBAC refusal of this request, worded as the real
    /// server words it.
    fn forbidden(&self, kind: &str, user: &str) -> String {
        let group = if kind == "lease" {
            "coordination.k8s.io"
        } else {
            ""
        };
        let what = match self.route() {
            Route::Lease { name, .. } | Route::Pod { name, .. } => {
                format!(
                    "{kind}s{dot}{group} \"{name}\"",
                    dot = if group.is_empty() { "" } else { "." }
                )
            }
            _ => format!(
                "{kind}s{dot}{group}",
                dot = if group.is_empty() { "" } else { "." }
            ),
        };
        format!(
            "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{kind}s\" in API group \"{group}\" in the namespace \"{ns}\"",
            verb = self.k8s_verb(),
            ns = self
                .seg()
                .windows(2)
                .find(|w| w[0] == "namespaces")
                .map_or("", |w| w[1]),
        )
    }

    /// Which object or collection the path names.
    fn route(&self) -> Route<'_> {
        match self.seg().as_slice() {
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
            ] => Route::Leases { ns },
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
                name,
            ] => Route::Lease { ns, name },
            ["api", "v1", "namespaces", ns, "pods"] => Route::Pods { ns },
            ["api", "v1", "namespaces", ns, "pods", name] => Route::Pod { ns, name },
            ["api", "v1", "namespaces", _ns, "events"] => Route::Events,
            _ => Route::Other,
        }
    }

    /// The answer of the route the request names (no fault applied).
    async fn answer(&self, ep: &Arc<Endpoint>) -> Response {
        let shared = &ep.shared;
        match (self.route(), &self.method) {
            (Route::Leases { ns }, &Method::GET) if self.watching => {
                watch(ep.clone(), ns.to_string(), self.q.clone()).await
            }
            (Route::Leases { ns }, &Method::GET) => list_leases(shared, ns, &self.q),
            (Route::Leases { ns }, &Method::POST) => create_lease(shared, ns, &self.body),
            (Route::Lease { ns, name }, m) => lease(shared, ns, name, m, &self.body),
            (Route::Pods { ns }, &Method::GET) => list_pods(shared, ns, &self.q),
            (Route::Pod { ns, name }, m) => pod(shared, ns, name, m, &self.body),
            (Route::Events, &Method::POST) => {
                let mut s = shared.store.lock().unwrap();
                let rv = s.bump();
                let mut e = self.body.clone();
                e["metadata"]["resourceVersion"] = json!(rv.to_string());
                s.events.push(e.clone());
                json_ok(201, &e)
            }
            _ => status(
                404,
                "NotFound",
                &format!("the server could not find {}", self.path),
            ),
        }
    }
}

/// GET of the Leases of `ns` (a `fieldSelector` on the name filters).
fn list_leases(shared: &Shared, ns: &str, q: &HashMap<String, String>) -> Response {
    let s = shared.store.lock().unwrap();
    let want = name_selector(q);
    let items: Vec<Value> = s
        .leases
        .iter()
        .filter(|((n, name), _)| n == ns && want.as_ref().is_none_or(|w| w == name))
        .map(|(_, v)| v.clone())
        .collect();
    json_ok(
        200,
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
    )
}

/// POST of a Lease into `ns`: 404 for an unknown namespace, 400 with a
/// version, 422 when invalid, 409 when the name exists.
fn create_lease(shared: &Shared, ns: &str, body: &Value) -> Response {
    let mut s = shared.store.lock().unwrap();
    if !s.namespaces.iter().any(|n| n == ns) {
        return status(404, "NotFound", &format!("namespaces \"{ns}\" not found"));
    }
    let Some(name) = body["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name: Required value");
    };
    if body["metadata"]
        .get("resourceVersion")
        .is_some_and(|v| !v.is_null())
    {
        return status(
            400,
            "BadRequest",
            "resourceVersion should not be set on objects to be created",
        );
    }
    if let Some(e) = validate_lease(body) {
        return status(422, "Invalid", &e);
    }
    let key = (ns.to_string(), name.clone());
    if s.leases.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    let rv = s.bump();
    let mut l = body.clone();
    l["apiVersion"] = json!("coordination.k8s.io/v1");
    l["kind"] = json!("Lease");
    l["metadata"]["namespace"] = json!(ns);
    l["metadata"]["resourceVersion"] = json!(rv.to_string());
    l["metadata"]["uid"] = json!(format!("uid-{rv}"));
    s.leases.insert(key, l.clone());
    s.record(&shared.changes, "ADDED", l.clone());
    json_ok(201, &l)
}

/// GET, PUT or DELETE of the Lease `name` in `ns`.
fn lease(shared: &Shared, ns: &str, name: &str, m: &Method, body: &Value) -> Response {
    let key = (ns.to_string(), name.to_string());
    let mut s = shared.store.lock().unwrap();
    let not_found = || {
        status(
            404,
            "NotFound",
            &format!("leases.coordination.k8s.io \"{name}\" not found"),
        )
    };
    match *m {
        Method::GET => match s.leases.get(&key) {
            Some(l) => json_ok(200, l),
            None => not_found(),
        },
        Method::PUT => match s.leases.get(&key) {
            Some(cur) => {
                let uid = cur["metadata"]["uid"].clone();
                if let Some(refusal) = refuse_replace(cur, name, body) {
                    return refusal;
                }
                let rv = s.bump();
                let mut l = body.clone();
                l["apiVersion"] = json!("coordination.k8s.io/v1");
                l["kind"] = json!("Lease");
                l["metadata"]["namespace"] = json!(ns);
                l["metadata"]["uid"] = uid;
                l["metadata"]["resourceVersion"] = json!(rv.to_string());
                s.leases.insert(key, l.clone());
                s.record(&shared.changes, "MODIFIED", l.clone());
                json_ok(200, &l)
            }
            None => not_found(),
        },
        Method::DELETE if precondition_fails(s.leases.get(&key), body) => status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the ResourceVersion in the precondition does not match the ResourceVersion in record. The object might have been modified"
            ),
        ),
        Method::DELETE => match s.leases.remove(&key) {
            Some(mut l) => {
                let rv = s.bump();
                l["metadata"]["resourceVersion"] = json!(rv.to_string());
                s.record(&shared.changes, "DELETED", l.clone());
                json_ok(200, &l)
            }
            None => not_found(),
        },
        _ => status(405, "MethodNotAllowed", "method not allowed"),
    }
}

/// Whether a DELETE's `preconditions.resourceVersion` names another
/// version than the stored one's.
fn precondition_fails(cur: Option<&Value>, body: &Value) -> bool {
    let want = &body["preconditions"]["resourceVersion"];
    cur.is_some_and(|c| want.is_string() && c["metadata"]["resourceVersion"] != *want)
}

/// Why a PUT of `body` over the stored Lease `cur` is refused, if it is: 409
/// for a version that is not the current one (none sent: unconditional),
/// 422 when invalid.
fn refuse_replace(cur: &Value, name: &str, body: &Value) -> Option<Response> {
    let sent_rv = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
    if !sent_rv.is_empty() && cur["metadata"]["resourceVersion"] != json!(sent_rv) {
        return Some(status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        ));
    }
    validate_lease(body).map(|e| status(422, "Invalid", &e))
}

/// GET of the Pods of `ns` (a `labelSelector` of `k=v` and `k` terms filters).
fn list_pods(shared: &Shared, ns: &str, q: &HashMap<String, String>) -> Response {
    let s = shared.store.lock().unwrap();
    let sel = q.get("labelSelector").cloned().unwrap_or_default();
    let items: Vec<Value> = s
        .pods
        .iter()
        .filter(|((n, _), _)| n == ns)
        .filter(|(_, p)| {
            sel.split(',')
                .filter(|c| !c.is_empty())
                .all(|c| match c.split_once('=') {
                    Some((k, v)) => p["metadata"]["labels"][k.trim_end_matches('=')] == json!(v),
                    None => !p["metadata"]["labels"][c].is_null(),
                })
        })
        .map(|(_, v)| v.clone())
        .collect();
    json_ok(
        200,
        &json!({"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
    )
}

/// GET or merge PATCH of the Pod `name` in `ns`.
fn pod(shared: &Shared, ns: &str, name: &str, m: &Method, body: &Value) -> Response {
    let key = (ns.to_string(), name.to_string());
    let mut s = shared.store.lock().unwrap();
    if !s.pods.contains_key(&key) {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    }
    match *m {
        Method::GET => json_ok(200, &s.pods[&key]),
        Method::PATCH => {
            let rv = s.bump();
            let p = s.pods.get_mut(&key).unwrap();
            merge_patch(p, body);
            p["metadata"]["resourceVersion"] = json!(rv.to_string());
            let p = p.clone();
            json_ok(200, &p)
        }
        _ => status(405, "MethodNotAllowed", "method not allowed"),
    }
}

/// What the API server's validation rejects in a Lease that we might send.
fn validate_lease(l: &Value) -> Option<String> {
    let d = &l["spec"]["leaseDurationSeconds"];
    if let Some(n) = d.as_i64()
        && n <= 0
    {
        return Some("spec.leaseDurationSeconds: Invalid value: must be greater than 0".into());
    }
    let name = l["metadata"]["name"].as_str().unwrap_or("");
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    {
        return Some(format!("metadata.name: Invalid value: \"{name}\""));
    }
    None
}

async fn watch(ep: Arc<Endpoint>, ns: String, q: HashMap<String, String>) -> Response {
    let shared = ep.shared.clone();
    let sel = Selector {
        ns,
        want: name_selector(&q),
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let from: Option<u64> = q
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
        .and_then(|v| v.parse().ok());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(256);
    // Under the lock: replay and subscribe, so no change falls in between.
    let (initial, live, start_rv) = {
        let s = shared.store.lock().unwrap();
        let live = shared.changes.subscribe();
        (replay(&s, from, &sel), live, s.rv)
    };
    let every = *shared.bookmark_every.lock().unwrap();
    let resets = ep.resets.subscribe();
    let feed = WatchFeed {
        resets,
        ep,
        tx,
        live,
        sel,
        last_rv: start_rv,
        bookmarks,
        every,
        timeout,
    };
    tokio::spawn(feed.run(initial));
    let stream = tokio_stream_from(rx);
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// The events a watch from version `from` starts with: an `ERROR` 410 when
/// `from` is older than the kept history, the changes after it, or (no
/// version) synthetic `ADDED` events of the current state.
fn replay(s: &Store, from: Option<u64>, sel: &Selector) -> Vec<Value> {
    let mut initial = Vec::new();
    match from {
        Some(v) if v < s.compacted => {
            initial.push(json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {v} ({})", s.compacted + 1),
                "reason": "Expired", "code": 410}}));
        }
        Some(v) => {
            for c in s
                .history
                .iter()
                .filter(|c| c.rv > v && sel.matches(&c.object))
            {
                initial.push(json!({"type": c.kind, "object": c.object}));
            }
        }
        None => {
            for l in s.leases.values().filter(|l| sel.matches(l)) {
                initial.push(json!({"type": "ADDED", "object": l}));
            }
        }
    }
    initial
}

/// Which objects a watch delivers: those of its namespace, and of one name
/// with a `fieldSelector`.
struct Selector {
    ns: String,
    want: Option<String>,
}

impl Selector {
    /// Whether the watch delivers changes of `obj`.
    fn matches(&self, obj: &Value) -> bool {
        obj["metadata"]["namespace"] == json!(self.ns)
            && self
                .want
                .as_ref()
                .is_none_or(|w| obj["metadata"]["name"] == json!(w))
    }
}

/// The task that feeds one open watch's stream.
struct WatchFeed {
    ep: Arc<Endpoint>,
    /// Changes when the test resets this client's watches.
    resets: tokio::sync::watch::Receiver<u64>,
    tx: tokio::sync::mpsc::Sender<Result<String, std::io::Error>>,
    live: broadcast::Receiver<(u64, &'static str, Value)>,
    sel: Selector,
    /// The newest version seen (what a BOOKMARK carries).
    last_rv: u64,
    bookmarks: bool,
    every: Duration,
    timeout: Duration,
}

impl WatchFeed {
    /// Send the `initial` events, then live changes and bookmarks until the
    /// timeout, the client's leaving, or a lag (the client then re-watches).
    async fn run(mut self, initial: Vec<Value>) {
        let expired = initial.first().is_some_and(|e| e["type"] == json!("ERROR"));
        for e in initial {
            if self.tx.send(Ok(format!("{e}\n"))).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let end = tokio::time::Instant::now() + self.timeout;
        let mut tick = tokio::time::interval(self.every);
        tick.tick().await;
        loop {
            let delivered = tokio::select! {
                _ = tokio::time::sleep_until(end) => return,
                _ = self.tx.closed() => return,
                _ = self.resets.changed() => {
                    // An error in the body aborts the connection mid-stream.
                    let _ = self.tx.send(Err(std::io::Error::other("connection reset"))).await;
                    return;
                }
                _ = tick.tick(), if self.bookmarks => self.bookmark().await,
                c = self.live.recv() => match c {
                    Ok((rv, kind, obj)) => self.deliver(rv, kind, obj).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            };
            if !delivered {
                return;
            }
        }
    }

    /// Send a BOOKMARK at the newest version seen (none while the client is
    /// blackholed); false when the client has gone.
    async fn bookmark(&self) -> bool {
        if self.ep.effective().hang {
            return true;
        }
        let b = json!({"type": "BOOKMARK", "object": {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"resourceVersion": self.last_rv.to_string()}}});
        self.tx.send(Ok(format!("{b}\n"))).await.is_ok()
    }

    /// Send one change if the watch selects it; false when the client has
    /// gone.
    async fn deliver(&mut self, rv: u64, kind: &'static str, obj: Value) -> bool {
        self.last_rv = self.last_rv.max(rv);
        if !self.sel.matches(&obj) {
            return true;
        }
        let lag = self.ep.effective().event_latency;
        if !lag.is_zero() {
            tokio::time::sleep(lag).await;
        }
        // A blackholed client gets nothing until it heals.
        while self.ep.effective().hang {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.tx.is_closed() {
                return false;
            }
        }
        let e = json!({"type": kind, "object": obj});
        self.tx.send(Ok(format!("{e}\n"))).await.is_ok()
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<String, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
