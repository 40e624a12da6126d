//! A Kubernetes API stand-in for tests: an HTTPS server on loopback (a CA
//! and a server certificate generated per stand-in, bearer-token
//! authentication) that serves the namespaced resources the sidecar and
//! its tests use — Leases, Pods, Events, Services, Endpoints and
//! EndpointSlices ([`store::RESOURCES`]) — with the API server's documented
//! semantics where the sidecar depends on them
//! (https://kubernetes.io/docs/reference/using-api/api-concepts/), the same
//! for every resource (the real server's generic registry store):
//! - one global `resourceVersion` counter that changes on every write (like
//!   etcd's revision behind a real API server);
//! - `PUT` or merge `PATCH` with a `metadata.resourceVersion` that is not
//!   the current one → 409 `Conflict` (none: unconditional, like kubectl
//!   replace/edit); another object's `metadata.uid` → 409; `DELETE` with
//!   `preconditions` (`uid`, `resourceVersion`) not met → 409; `POST` of an
//!   existing name → 409 `AlreadyExists`, with `generateName` a fresh name;
//!   `POST` into an unknown namespace → 404; `PUT`/`PATCH`/`DELETE` of a
//!   missing object → 404; invalid names (RFC 1123 subdomains) and the
//!   per-kind checks in [`store::validate`] → 422;
//! - list and watch take `fieldSelector` (`metadata.name`,
//!   `metadata.namespace`; another field → 400 as on the real server) and
//!   `labelSelector` (equality and set-based terms);
//! - watch: `?watch=true&resourceVersion=N` replays every change after N,
//!   then streams live ones as newline-delimited `{"type","object"}` JSON;
//!   without a version it starts with synthetic `ADDED` events of the current
//!   state; a version older than the kept history → an `ERROR` event with a
//!   410 `Expired` Status; `allowWatchBookmarks=true` adds `BOOKMARK` events
//!   (every [`KubeApi::set_bookmark_every`]); `timeoutSeconds` ends the
//!   stream;
//! - every answer about v1 Endpoints carries the deprecation `Warning`
//!   header of v1.33+ servers;
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

mod store;
mod watch;

use store::{Change, Selector, Store, by_plural};
pub use store::{RESOURCES, Resource};

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

struct Shared {
    store: Mutex<Store>,
    changes: broadcast::Sender<Change>,
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
    /// The object named: the path's name, or a create's `metadata.name`
    /// (empty for a list, a watch, or a create by `generateName`).
    pub name: String,
    /// The status code answered (a watch: the code it started streaming
    /// with; see [`Endpoint::open_watches`] for those still open).
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
    /// Watches of this client streaming now.
    open_watches: std::sync::atomic::AtomicUsize,
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
            open_watches: Default::default(),
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

    /// The object `name` of `plural` (`leases`, `services`…) in the test
    /// namespace, as stored.
    pub fn object(&self, plural: &str, name: &str) -> Option<Value> {
        let s = self.shared.store.lock().unwrap();
        s.get(by_plural(plural), &self.namespace, name).cloned()
    }

    /// Every object of `plural` in the test namespace.
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        let s = self.shared.store.lock().unwrap();
        let r = by_plural(plural);
        s.objects
            .iter()
            .filter(|((p, ns, _), _)| *p == r.plural && *ns == self.namespace)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Create or replace an object by hand (`kubectl apply`): `obj` needs
    /// `metadata.name`; the kind, version and namespace are filled in.
    pub fn put(&self, plural: &str, mut obj: Value) -> Value {
        let r = by_plural(plural);
        let mut s = self.shared.store.lock().unwrap();
        obj["apiVersion"] = json!(r.api_version());
        obj["kind"] = json!(r.kind);
        obj["metadata"]["namespace"] = json!(self.namespace);
        let name = obj["metadata"]["name"].as_str().expect("a name").to_owned();
        let kind = match s.get(r, &self.namespace, &name) {
            Some(cur) => {
                obj["metadata"]["uid"] = cur["metadata"]["uid"].clone();
                "MODIFIED"
            }
            None => {
                if obj["metadata"]["uid"].is_null() {
                    obj["metadata"]["uid"] = json!(format!("uid-{}-{name}", r.key));
                }
                "ADDED"
            }
        };
        s.write(&self.shared.changes, r, kind, obj)
    }

    /// Edit an object by hand (an unconditional update, like `kubectl edit`
    /// after a fresh read): `f` changes the stored object.
    pub fn edit(&self, plural: &str, name: &str, f: impl FnOnce(&mut Value)) -> bool {
        let r = by_plural(plural);
        let mut s = self.shared.store.lock().unwrap();
        let Some(mut obj) = s.get(r, &self.namespace, name).cloned() else {
            return false;
        };
        f(&mut obj);
        s.write(&self.shared.changes, r, "MODIFIED", obj);
        true
    }

    /// Delete an object by hand (`kubectl delete`).
    pub fn delete(&self, plural: &str, name: &str) -> bool {
        let r = by_plural(plural);
        let mut s = self.shared.store.lock().unwrap();
        let Some(obj) = s.get(r, &self.namespace, name).cloned() else {
            return false;
        };
        s.write(&self.shared.changes, r, "DELETED", obj);
        true
    }

    /// The Lease as stored.
    pub fn lease(&self, name: &str) -> Option<Value> {
        self.object("leases", name)
    }

    /// Edit a Lease by hand (see [`KubeApi::edit`]).
    pub fn edit_lease(&self, name: &str, f: impl FnOnce(&mut Value)) -> bool {
        self.edit("leases", name, f)
    }

    /// Delete a Lease by hand (`kubectl delete lease`).
    pub fn delete_lease(&self, name: &str) -> bool {
        self.delete("leases", name)
    }

    /// Add a Pod (for the labeler).
    pub fn add_pod(&self, name: &str) {
        self.put(
            "pods",
            json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {}}}),
        );
    }

    /// A Pod's label value.
    pub fn pod_label(&self, pod: &str, key: &str) -> Option<String> {
        self.object("pods", pod)
            .and_then(|p| p["metadata"]["labels"][key].as_str().map(str::to_owned))
    }

    /// Set a Pod's label by hand (`kubectl label --overwrite`).
    pub fn set_pod_label(&self, pod: &str, key: &str, value: &str) {
        assert!(
            self.edit("pods", pod, |p| p["metadata"]["labels"][key] = json!(value)),
            "no such Pod"
        );
    }

    /// Events created so far.
    pub fn events(&self) -> Vec<Value> {
        self.objects("events")
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

    /// How many watches of this client are streaming now.
    pub fn open_watches(&self) -> usize {
        self.open_watches.load(Ordering::SeqCst)
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
    let response = handle_request(&ep, &r, authorized).await;
    ep.log.lock().unwrap().push(Logged {
        verb: r.k8s_verb(),
        resource: r.resource().to_owned(),
        user_agent,
        field_manager: r.q.get("fieldManager").cloned().unwrap_or_default(),
        name: r.object_name(),
        code: response.status().as_u16(),
    });
    response
}

/// Authentication, faults, RBAC, then the route's answer.
async fn handle_request(ep: &Arc<Endpoint>, r: &ApiRequest, authorized: bool) -> Response {
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
    if let Some(injected) = r.injected(&fault) {
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
        return status(403, "Forbidden", &r.forbidden(&ep.shared.user));
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
    /// `/api/v1/namespaces/NS/PLURAL` or `/apis/GROUP/V/namespaces/NS/PLURAL`.
    Collection {
        r: Resource,
        ns: &'a str,
    },
    /// The same with `/NAME`.
    Object {
        r: Resource,
        ns: &'a str,
        name: &'a str,
    },
    Review,
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
        match self.route() {
            Route::Collection { r, .. } | Route::Object { r, .. } => r.key,
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
    fn injected(&self, fault: &Fault) -> Option<Response> {
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
            self.forbidden("system:serviceaccount:ns:leader-elector")
        } else {
            format!("injected {code}")
        };
        Some(status(code, reason_of(code), &msg))
    }

    /// The Kubernetes verb of this request (RBAC's word for it).
    /// The object a request names (see [`Logged::name`]).
    fn object_name(&self) -> String {
        match self.route() {
            Route::Object { name, .. } => name.to_owned(),
            _ => self.body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        }
    }

    fn k8s_verb(&self) -> &'static str {
        let named = matches!(self.route(), Route::Object { .. });
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
    fn resource(&self) -> &'static str {
        match self.route() {
            Route::Review => "selfsubjectaccessreviews",
            Route::Collection { r, .. } | Route::Object { r, .. } => r.plural,
            Route::Other => "other",
        }
    }

    /// The message of an RBAC refusal of this request, worded as the real
    /// server words it.
    fn forbidden(&self, user: &str) -> String {
        let (r, what) = match self.route() {
            Route::Object { r, name, .. } => (Some(r), format!("{} \"{name}\"", r.qualified())),
            Route::Collection { r, .. } => (Some(r), r.qualified()),
            _ => (None, self.resource().to_owned()),
        };
        format!(
            "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" in the namespace \"{ns}\"",
            verb = self.k8s_verb(),
            plural = self.resource(),
            group = r.map_or("", |r| r.group),
            ns = self
                .seg()
                .windows(2)
                .find(|w| w[0] == "namespaces")
                .map_or("", |w| w[1]),
        )
    }

    /// Which object or collection the path names.
    fn route(&self) -> Route<'_> {
        let seg = self.seg();
        let (group, version, rest) = match seg.as_slice() {
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ] => {
                return Route::Review;
            }
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return Route::Other,
        };
        let (ns, plural, name) = match rest {
            ["namespaces", ns, plural] => (*ns, *plural, None),
            ["namespaces", ns, plural, name] => (*ns, *plural, Some(*name)),
            _ => return Route::Other,
        };
        let Some(r) = store::resource(group, version, plural) else {
            return Route::Other;
        };
        match name {
            Some(name) => Route::Object { r, ns, name },
            None => Route::Collection { r, ns },
        }
    }

    /// The answer of the route the request names (no fault applied).
    async fn answer(&self, ep: &Arc<Endpoint>) -> Response {
        let shared = &ep.shared;
        let tx = &shared.changes;
        let mut response = match (self.route(), &self.method) {
            (Route::Collection { r, ns }, &Method::GET) => {
                let sel = match Selector::parse(r, ns, &self.q) {
                    Ok(sel) => sel,
                    Err(message) => return status(400, "BadRequest", &message),
                };
                if self.watching {
                    watch::watch(ep.clone(), r, sel, self.q.clone()).await
                } else {
                    store::list(&shared.store.lock().unwrap(), &sel, r)
                }
            }
            (Route::Collection { r, ns }, &Method::POST) => {
                store::create(&mut shared.store.lock().unwrap(), tx, r, ns, &self.body)
            }
            (Route::Object { r, ns, name }, m) => {
                let mut s = shared.store.lock().unwrap();
                store::object(&mut s, tx, r, (ns, name), m, &self.body)
            }
            _ => status(
                404,
                "NotFound",
                &format!("the server could not find {}", self.path),
            ),
        };
        if self.resource() == "endpoints" {
            // As v1.33+ servers answer every request for Endpoints.
            response.headers_mut().insert(
                "warning",
                header::HeaderValue::from_static(
                    "299 - \"v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice\"",
                ),
            );
        }
        response
    }
}
