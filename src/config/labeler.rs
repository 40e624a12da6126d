//! The settings of the tasks that act on this Pod's Kubernetes objects: the
//! Pod labeler (the label key, and the Pod it labels, from the Downward
//! API's `POD_NAME` and `POD_NAMESPACE`) and the EndpointSlice writer
//! (the Service, and the Pod's IP from `POD_IP`).

use super::{Cli, ConfigError, config_error};

pub(super) fn labeler_config(
    cli: &Cli,
) -> Result<Option<crate::kube_label::LabelerConfig>, ConfigError> {
    let key = cli.pod_label_key.trim();
    if key.is_empty() {
        return Ok(None);
    }
    crate::kube_label::check_label_key(key)
        .map_err(|e| config_error(format!("--pod-label-key: {e}")))?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match (env("POD_NAME"), env("POD_NAMESPACE")) {
        (Some(pod), Some(namespace)) => Ok(Some(crate::kube_label::LabelerConfig {
            key: key.to_owned(),
            pod,
            namespace,
            events: cli.pod_events,
        })),
        // Not in a Pod (or no Downward API): nothing to label; app::run says so.
        _ => Ok(None),
    }
}

/// The EndpointSlice writer's settings: `None` without
/// `--endpointslice-service`; an error naming the fix when the Service name
/// is invalid or the Downward API variables are missing (unlike the labeler,
/// which labels by default, this is asked for, so a silent no is wrong).
pub(super) fn slice_config(
    cli: &Cli,
) -> Result<Option<crate::endpoint_slice::SliceConfig>, ConfigError> {
    let service = cli.endpointslice_service.trim();
    if service.is_empty() {
        return Ok(None);
    }
    crate::endpoint_slice::check_service_name(service)
        .map_err(|e| config_error(format!("--endpointslice-service: {e}")))?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (Some(pod), Some(namespace), Some(ip)) =
        (env("POD_NAME"), env("POD_NAMESPACE"), env("POD_IP"))
    else {
        return Err(config_error(
            "--endpointslice-service needs POD_NAME, POD_NAMESPACE and POD_IP\nhint: set them from the Downward API (fieldRef metadata.name, metadata.namespace, status.podIP); the Helm chart does",
        ));
    };
    let pod_ip = ip.trim().parse().map_err(|_| {
        config_error(format!(
            "--endpointslice-service: POD_IP {ip:?} is not an IP address\nhint: set it from the Downward API (fieldRef status.podIP)"
        ))
    })?;
    Ok(Some(crate::endpoint_slice::SliceConfig {
        service: service.to_owned(),
        namespace,
        pod,
        pod_ip,
        node: env("NODE_NAME"),
    }))
}
