//! The stand-in's objects: one store for every resource it serves, with the
//! API server's generic REST semantics (`k8s.io/apiserver`'s registry
//! store) — create (with `generateName`), get, list and watch with field and
//! label selectors, update with a `resourceVersion` and `uid` precondition,
//! JSON merge patch (a `resourceVersion` in the patch is a precondition),
//! delete with `preconditions` — and per-kind validation of what we send.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::{json_ok, status};
use axum::http::Method;
use axum::response::Response;

/// A resource the stand-in serves: where it lives in the API and what it is
/// called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group (`""` for the core group).
    pub group: &'static str,
    pub version: &'static str,
    /// The plural, as RBAC and the path have it (`leases`).
    pub plural: &'static str,
    /// The object's `kind` (`Lease`).
    pub kind: &'static str,
    /// The word of the request counters (`GET lease`).
    pub key: &'static str,
}

impl Resource {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as the server's messages name it (`leases.coordination.k8s.io`, `pods`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

const fn res(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    key: &'static str,
) -> Resource {
    Resource {
        group,
        version: "v1",
        plural,
        kind,
        key,
    }
}

/// Every resource served (all namespaced, all `v1`).
pub const RESOURCES: &[Resource] = &[
    res("coordination.k8s.io", "leases", "Lease", "lease"),
    res("", "pods", "Pod", "pod"),
    res("", "events", "Event", "event"),
    res("", "services", "Service", "service"),
    res("", "endpoints", "Endpoints", "endpoints"),
    res(
        "discovery.k8s.io",
        "endpointslices",
        "EndpointSlice",
        "endpointslice",
    ),
];

/// The resource a path's group, version and plural name.
pub fn resource(group: &str, version: &str, plural: &str) -> Option<Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .copied()
}

/// The resource of `plural`.
pub fn by_plural(plural: &str) -> Resource {
    *RESOURCES
        .iter()
        .find(|r| r.plural == plural)
        .unwrap_or_else(|| panic!("the stand-in serves no {plural}"))
}

/// One change, as a watch delivers it.
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    pub resource: &'static str,
    pub object: Value,
}

/// Every object, keyed by (plural, namespace, name).
#[derive(Debug, Default)]
pub struct Store {
    pub rv: u64,
    pub objects: BTreeMap<(&'static str, String, String), Value>,
    pub history: Vec<Change>,
    /// Changes at or below this version are forgotten (compaction).
    pub compacted: u64,
    pub namespaces: Vec<String>,
    /// For `generateName` and Service cluster IPs.
    pub serial: u64,
}

impl Store {
    pub fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Store `obj` at a new version and tell the watches (`kind` is the
    /// watch event type).
    pub fn write(
        &mut self,
        tx: &broadcast::Sender<Change>,
        r: Resource,
        kind: &'static str,
        mut obj: Value,
    ) -> Value {
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (
            r.plural,
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            obj["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        );
        if kind == "DELETED" {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, obj.clone());
        }
        let change = Change {
            rv,
            kind,
            resource: r.plural,
            object: obj.clone(),
        };
        self.history.push(change.clone());
        let _ = tx.send(change);
        obj
    }

    pub fn get(&self, r: Resource, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(r.plural, ns.to_owned(), name.to_owned()))
    }
}

/// Which objects a list or watch selects: one resource in one namespace,
/// narrowed by `fieldSelector` (`metadata.name`, `metadata.namespace`) and
/// `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`).
#[derive(Clone, Debug)]
pub struct Selector {
    pub resource: &'static str,
    pub ns: String,
    fields: Vec<(String, bool, String)>,
    labels: Vec<Term>,
}

#[derive(Clone, Debug)]
enum Term {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl Selector {
    /// The selector of a request's query, or the message of the 400 the
    /// real server answers for a field it cannot select on or a malformed
    /// selector.
    pub fn parse(r: Resource, ns: &str, q: &HashMap<String, String>) -> Result<Selector, String> {
        let mut fields = Vec::new();
        for term in q.get("fieldSelector").map_or("", String::as_str).split(',') {
            if term.is_empty() {
                continue;
            }
            let (k, neg, v) = if let Some((k, v)) = term.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, false, v)
            } else {
                return Err(format!("invalid selector: '{term}'"));
            };
            if k != "metadata.name" && k != "metadata.namespace" {
                return Err(format!("field label not supported: {k}"));
            }
            fields.push((k.to_owned(), neg, v.to_owned()));
        }
        let labels = parse_labels(q.get("labelSelector").map_or("", String::as_str))?;
        Ok(Selector {
            resource: r.plural,
            ns: ns.to_owned(),
            fields,
            labels,
        })
    }

    /// Whether `obj` of resource `resource` is selected.
    pub fn matches(&self, resource: &str, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        resource == self.resource
            && meta["namespace"] == json!(self.ns)
            && self.fields.iter().all(|(k, neg, v)| {
                let have = meta[k.trim_start_matches("metadata.")].as_str() == Some(v);
                have != *neg
            })
            && self.labels.iter().all(|t| t.matches(&meta["labels"]))
    }
}

impl Term {
    fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels[k].as_str().map(str::to_owned);
        match self {
            Term::Eq(k, v) => get(k).as_deref() == Some(v),
            Term::Ne(k, v) => get(k).as_deref() != Some(v),
            Term::Exists(k) => get(k).is_some(),
            Term::Absent(k) => get(k).is_none(),
            Term::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Term::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        }
    }
}

/// Split a label selector at the commas outside parentheses and parse each
/// requirement.
fn parse_labels(s: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    let mut parts = Vec::new();
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    for p in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        terms.push(parse_term(p).ok_or_else(|| format!("unable to parse requirement: {p}"))?);
    }
    Ok(terms)
}

fn parse_term(p: &str) -> Option<Term> {
    let set = |rest: &str| -> Option<Vec<String>> {
        let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
        Some(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    if let Some(k) = p.strip_prefix('!') {
        return Some(Term::Absent(k.trim().to_owned()));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Some(Term::Ne(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Some(Term::Eq(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, rest)) = p.split_once(" notin ") {
        return Some(Term::NotIn(k.trim().to_owned(), set(rest)?));
    }
    if let Some((k, rest)) = p.split_once(" in ") {
        return Some(Term::In(k.trim().to_owned(), set(rest)?));
    }
    Some(Term::Exists(p.to_owned()))
}

/// The `not found` answer for `name`.
pub fn not_found(r: Resource, name: &str) -> Response {
    status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", r.qualified()),
    )
}

/// The optimistic-concurrency refusal, worded as the real server words it.
pub fn conflict(r: Resource, name: &str) -> Response {
    status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            r.qualified()
        ),
    )
}

/// GET of a collection: a `<Kind>List` at the current version.
pub fn list(s: &Store, sel: &Selector, r: Resource) -> Response {
    let items: Vec<Value> = s
        .objects
        .iter()
        .filter(|((p, _, _), v)| sel.matches(p, v))
        .map(|(_, v)| v.clone())
        .collect();
    json_ok(
        200,
        &json!({"apiVersion": r.api_version(), "kind": format!("{}List", r.kind),
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
    )
}

/// POST into `ns`: 404 for an unknown namespace, 400 with a version, 422
/// when invalid, 409 when the name exists; `generateName` gets a suffix.
pub fn create(
    s: &mut Store,
    tx: &broadcast::Sender<Change>,
    r: Resource,
    ns: &str,
    body: &Value,
) -> Response {
    if !s.namespaces.iter().any(|n| n == ns) {
        return status(404, "NotFound", &format!("namespaces \"{ns}\" not found"));
    }
    let mut obj = body.clone();
    if obj["metadata"]["name"].as_str().is_none_or(str::is_empty)
        && let Some(prefix) = body["metadata"]["generateName"].as_str()
    {
        s.serial += 1;
        obj["metadata"]["name"] = json!(format!("{prefix}{:05x}", s.serial));
    }
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(
            422,
            "Invalid",
            "metadata.name: Required value: name or generateName is required",
        );
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
    if s.get(r, ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", r.qualified()),
        );
    }
    stamp(&mut obj, r, ns);
    if let Some(e) = validate(r, &obj, None) {
        return status(422, "Invalid", &e);
    }
    s.serial += 1;
    obj["metadata"]["uid"] = json!(format!("uid-{}-{}", r.key, s.serial));
    obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    if r.plural == "services" && obj["spec"]["clusterIP"].is_null() {
        obj["spec"]["clusterIP"] = json!(format!(
            "10.96.{}.{}",
            s.serial / 250 % 250,
            s.serial % 250 + 1
        ));
    }
    let obj = s.write(tx, r, "ADDED", obj);
    json_ok(201, &obj)
}

/// GET, PUT, PATCH (JSON merge patch) or DELETE of the object `name`.
pub fn object(
    s: &mut Store,
    tx: &broadcast::Sender<Change>,
    r: Resource,
    (ns, name): (&str, &str),
    m: &Method,
    body: &Value,
) -> Response {
    let Some(cur) = s.get(r, ns, name).cloned() else {
        return not_found(r, name);
    };
    match *m {
        Method::GET => json_ok(200, &cur),
        Method::PUT => {
            if let Some(refusal) = refuse_write(r, &cur, name, body) {
                return refusal;
            }
            let mut obj = body.clone();
            stamp(&mut obj, r, ns);
            if let Some(e) = validate(r, &obj, Some(&cur)) {
                return status(422, "Invalid", &e);
            }
            keep_server_fields(&mut obj, &cur);
            json_ok(200, &s.write(tx, r, "MODIFIED", obj))
        }
        Method::PATCH => {
            if let Some(refusal) = refuse_write(r, &cur, name, body) {
                return refusal;
            }
            let mut obj = cur.clone();
            super::merge_patch(&mut obj, body);
            stamp(&mut obj, r, ns);
            if let Some(e) = validate(r, &obj, Some(&cur)) {
                return status(422, "Invalid", &e);
            }
            keep_server_fields(&mut obj, &cur);
            json_ok(200, &s.write(tx, r, "MODIFIED", obj))
        }
        Method::DELETE => {
            if let Some(refusal) = refuse_delete(&cur, body) {
                return refusal;
            }
            json_ok(200, &s.write(tx, r, "DELETED", cur))
        }
        _ => status(405, "MethodNotAllowed", "method not allowed"),
    }
}

/// The 409 of a write whose `resourceVersion` is not the current one (none
/// sent: unconditional) or whose `uid` is another object's.
fn refuse_write(r: Resource, cur: &Value, name: &str, body: &Value) -> Option<Response> {
    let sent_rv = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
    if !sent_rv.is_empty() && cur["metadata"]["resourceVersion"] != json!(sent_rv) {
        return Some(conflict(r, name));
    }
    let sent_uid = body["metadata"]["uid"].as_str().unwrap_or("");
    let uid = cur["metadata"]["uid"].as_str().unwrap_or("");
    if !sent_uid.is_empty() && sent_uid != uid {
        return Some(status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {sent_uid}, UID in object meta: {uid}",
                r.qualified()
            ),
        ));
    }
    None
}

/// The 409 of a DELETE whose `preconditions` (`uid`, `resourceVersion`)
/// the object does not meet.
fn refuse_delete(cur: &Value, body: &Value) -> Option<Response> {
    let pre = &body["preconditions"];
    for field in ["uid", "resourceVersion"] {
        if let Some(want) = pre[field].as_str()
            && cur["metadata"][field].as_str() != Some(want)
        {
            return Some(status(
                409,
                "Conflict",
                &format!(
                    "Precondition failed: {field} in precondition: {want}, {field} in object meta: {}",
                    cur["metadata"][field].as_str().unwrap_or("")
                ),
            ));
        }
    }
    None
}

/// `apiVersion`, `kind` and the namespace the path names.
fn stamp(obj: &mut Value, r: Resource, ns: &str) {
    obj["apiVersion"] = json!(r.api_version());
    obj["kind"] = json!(r.kind);
    obj["metadata"]["namespace"] = json!(ns);
}

/// Fields only the server sets survive an update.
fn keep_server_fields(obj: &mut Value, cur: &Value) {
    for f in ["uid", "creationTimestamp"] {
        obj["metadata"][f] = cur["metadata"][f].clone();
    }
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    let (y, mo, d) = civil(days as i64);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// What the API server's validation rejects in an object we might send
/// (`old`: the stored object, for immutable fields).
pub fn validate(r: Resource, obj: &Value, old: Option<&Value>) -> Option<String> {
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    if !dns_subdomain(name) {
        return Some(format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    match r.plural {
        "leases" => {
            let d = &obj["spec"]["leaseDurationSeconds"];
            if d.as_i64().is_some_and(|n| n <= 0) {
                return Some(
                    "spec.leaseDurationSeconds: Invalid value: must be greater than 0".into(),
                );
            }
            None
        }
        "endpointslices" => validate_slice(obj, old),
        "services" => {
            let ports = obj["spec"]["ports"].as_array().map_or(0, Vec::len);
            (ports == 0).then(|| "spec.ports: Required value".to_owned())
        }
        _ => None,
    }
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
pub fn dns_subdomain(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !name.is_empty()
        && name.len() <= 253
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// The real server's EndpointSlice checks that a writer can trip:
/// `addressType` one of `IPv4`, `IPv6`, `FQDN` and immutable; each
/// endpoint with 1–100 addresses, valid for that type; ports 1–65535 with
/// a protocol of `TCP`, `UDP` or `SCTP` (defaulted to `TCP`).
fn validate_slice(obj: &Value, old: Option<&Value>) -> Option<String> {
    let at = obj["addressType"].as_str().unwrap_or("");
    if !matches!(at, "IPv4" | "IPv6" | "FQDN") {
        return Some(format!(
            "addressType: Unsupported value: \"{at}\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
        ));
    }
    if let Some(old) = old
        && old["addressType"] != obj["addressType"]
    {
        return Some("addressType: Invalid value: field is immutable".into());
    }
    let empty = Vec::new();
    for (i, e) in obj["endpoints"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .enumerate()
    {
        let addrs = e["addresses"].as_array().unwrap_or(&empty);
        if addrs.is_empty() || addrs.len() > 100 {
            return Some(format!(
                "endpoints[{i}].addresses: Invalid value: must contain 1 to 100 addresses"
            ));
        }
        for a in addrs {
            let a = a.as_str().unwrap_or("");
            let ok = match at {
                "IPv4" => a.parse::<std::net::Ipv4Addr>().is_ok(),
                "IPv6" => a.parse::<std::net::Ipv6Addr>().is_ok(),
                _ => dns_subdomain(a),
            };
            if !ok {
                return Some(format!(
                    "endpoints[{i}].addresses: Invalid value: \"{a}\": must be a valid {at} address"
                ));
            }
        }
    }
    for (i, p) in obj["ports"].as_array().unwrap_or(&empty).iter().enumerate() {
        if p["port"]
            .as_i64()
            .is_some_and(|n| !(1..=65535).contains(&n))
        {
            return Some(format!(
                "ports[{i}].port: Invalid value: must be between 1 and 65535, inclusive"
            ));
        }
        if !matches!(
            p["protocol"].as_str().unwrap_or("TCP"),
            "TCP" | "UDP" | "SCTP"
        ) {
            return Some(format!("ports[{i}].protocol: Unsupported value"));
        }
    }
    None
}
