//! The Pod labeler's settings: the label key, and the Pod it labels (from the
//! Downward API's `POD_NAME` and `POD_NAMESPACE`).

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
