//! Leader-only traffic through an EndpointSlice: for a Service without a
//! selector, the leader writes one EndpointSlice
//! (`kubernetes.io/service-name: <service>`,
//! `endpointslice.kubernetes.io/managed-by: leader-elector`) holding only
//! its own Pod IP and the Service's ports, and empties it before it
//! releases its term. kube-proxy and Gateway implementations route by
//! EndpointSlices, so the Service reaches the leader and nobody else.
//!
//! Why not the Pod label and a selector: the endpoints controller adds a
//! Pod labelled `"true"` only after its own watch delay, and a dead
//! leader's label stays `"true"` until someone clears it; here the leader
//! itself writes the one address, at once, and the next leader replaces it.
//!
//! Invariants:
//! - Only the leader writes its address, and only after it has its term;
//!   every write is a compare-and-swap on the slice's `resourceVersion`, so a
//!   late write of a former leader can never overwrite a newer one, and its
//!   removal only removes what it wrote.
//! - The writer is a participant of the Elector: it publishes the fencing
//!   token its address is in the slice for, and the Elector waits (briefly)
//!   for it to empty the slice before releasing the term, so on a graceful
//!   handover the old leader's address is gone before the next leader can be
//!   elected.
//! - A leader that dies or loses the API keeps its address in the slice
//!   until the next leader replaces it (at most the lease duration plus that
//!   leader's election and one write).
//! - A failed call is logged, counted and retried with backoff; it never
//!   changes who leads.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use serde_json::{Value, json};

#[cfg(feature = "kubernetes")]
mod api;
#[cfg(feature = "kubernetes")]
pub use api::{check_permissions, run_slice_writer};

/// The `endpointslice.kubernetes.io/managed-by` value of our slices
/// (Kubernetes reserves `endpointslice-controller.k8s.io` for its own).
pub const MANAGED_BY: &str = "leader-elector";

/// What to write and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceConfig {
    /// The selector-less Service the slice belongs to (`--endpointslice-service`).
    pub service: String,
    /// The namespace of the Service, the slice and this Pod (`POD_NAMESPACE`).
    pub namespace: String,
    /// This Pod's name (`POD_NAME`), for the endpoint's `targetRef`.
    pub pod: String,
    /// This Pod's IP (`POD_IP`, Downward API `status.podIP`).
    pub pod_ip: std::net::IpAddr,
    /// This Pod's node (`NODE_NAME`, `spec.nodeName`), when given.
    pub node: Option<String>,
}

impl SliceConfig {
    /// The slice's name: `<service>-leader-elector` (a Service name is at
    /// most 63 characters, so this is a valid object name).
    pub fn slice_name(&self) -> String {
        format!("{}-{MANAGED_BY}", self.service)
    }

    /// `IPv4` or `IPv6`, from the Pod IP.
    pub fn address_type(&self) -> &'static str {
        if self.pod_ip.is_ipv4() {
            "IPv4"
        } else {
            "IPv6"
        }
    }
}

/// Check a Service name: an RFC 1035 label (1–63 lowercase letters, digits
/// and '-', starting with a letter, ending with a letter or digit), as the
/// API server requires of Service names.
///
/// # Errors
/// A message saying what is wrong.
pub fn check_service_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a Service name: 1-63 lowercase letters, digits and '-', starting with a letter"
        ))
    }
}

/// The slice's ports from the Service's `spec.ports`: each keeps its name
/// and protocol, and its port is the Service's `targetPort` (what the
/// endpoint listens on), or its `port` when no `targetPort` is set.
///
/// # Errors
/// A Service with no ports, or a named `targetPort` (resolving a name needs
/// the Pod's container ports; give the number instead).
pub fn slice_ports(service: &Value) -> Result<Vec<Value>, String> {
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() {
        return Err("the Service has no ports".into());
    }
    ports
        .iter()
        .map(|p| {
            let port = match &p["targetPort"] {
                Value::Null => p["port"].clone(),
                Value::Number(n) => Value::Number(n.clone()),
                Value::String(s) => match s.parse::<u16>() {
                    Ok(n) => json!(n),
                    Err(_) => {
                        return Err(format!(
                            "the Service's targetPort {s:?} is a name; an EndpointSlice needs the number (set targetPort to the container port)"
                        ));
                    }
                },
                other => return Err(format!("the Service's targetPort {other} is not a port")),
            };
            let mut out = json!({"port": port, "protocol": p["protocol"].as_str().unwrap_or("TCP")});
            if let Some(name) = p["name"].as_str() {
                out["name"] = json!(name);
            }
            if let Some(ap) = p["appProtocol"].as_str() {
                out["appProtocol"] = json!(ap);
            }
            Ok(out)
        })
        .collect()
}

/// The slice as the leader writes it (`leading`) or empties it: labels,
/// owner (the Service, by `uid`, so the slice goes with it), address type,
/// ports, and this Pod as the one ready endpoint, or no endpoint.
pub fn slice_body(cfg: &SliceConfig, service_uid: &str, ports: &[Value], leading: bool) -> Value {
    let mut endpoints = Vec::new();
    if leading {
        let mut e = json!({
            "addresses": [cfg.pod_ip.to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "targetRef": {"kind": "Pod", "name": cfg.pod, "namespace": cfg.namespace},
        });
        if let Some(node) = &cfg.node {
            e["nodeName"] = json!(node);
        }
        endpoints.push(e);
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": cfg.slice_name(),
            "namespace": cfg.namespace,
            "labels": {
                "kubernetes.io/service-name": cfg.service,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": cfg.service, "uid": service_uid,
            }],
        },
        "addressType": cfg.address_type(),
        "endpoints": endpoints,
        "ports": ports,
    })
}

/// The addresses a stored slice names (empty for none or a malformed one).
pub fn named_addresses(slice: &Value) -> Vec<String> {
    slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

/// Whether a stored slice names this Pod and nobody else.
pub fn names_only(cfg: &SliceConfig, slice: &Value) -> bool {
    named_addresses(slice) == [cfg.pod_ip.to_string()]
}

#[cfg(test)]
#[path = "endpoint_slice_tests.rs"]
mod tests;
