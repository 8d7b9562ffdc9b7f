//! The health gate: a container is refused on an unhealthy GPU (as the
//! host's health source judged it, or one look now) unless its annotation
//! allows it, and warned of a degraded one.

use super::*;

/// What the hook does about its GPUs' health: the warnings to print (a
/// degraded GPU, an unhealthy one the annotation allows), or the refusal,
/// one line naming the first unhealthy GPU, why, since when and the
/// annotation that overrides it.
pub(super) fn health_verdict(
    gpus: &[&cuslice_host::gpu::health::view::GpuView],
    allow: bool,
) -> Result<Vec<String>, String> {
    use cuslice_host::gpu::health::{State, judge::utc};
    let mut warnings = vec![];
    for g in gpus {
        let h = &g.health;
        let what = format!(
            "GPU {} ({}) is {} since {}: {}",
            g.index,
            g.uuid,
            h.state,
            utc(h.since_unix),
            h.reason.as_deref().unwrap_or("-")
        );
        match h.state {
            State::Healthy => {}
            State::Degraded => warnings.push(format!("{what}; the container starts on it")),
            State::Unhealthy if allow => warnings.push(format!(
                "{what}; the container starts on it as its annotation {ALLOW_UNHEALTHY_ANNOTATION} allows"
            )),
            State::Unhealthy => {
                return Err(format!(
                    "{what}: refusing to start the container on it (annotation {ALLOW_UNHEALTHY_ANNOTATION}: \"true\" starts it anyway)"
                ));
            }
        }
    }
    Ok(warnings)
}

/// Refuses a container whose GPU is unhealthy (as the host's health source
/// judged it, or one look now: `host::health::view`) unless `allow`;
/// warns of a degraded one. Where the hook cannot load NVML there is no
/// GPU it could judge (a host without the NVIDIA driver's library, as the
/// rest of the hook takes it): nothing is checked (docs/containers.md).
pub(super) fn check_gpu_health(
    root: &Path,
    cfg: &config::Config,
    minors: &[u32],
    allow: bool,
) -> Result<(), String> {
    use cuslice_host::gpu::health::{source::now_unix, view};
    let Ok(nvml) = cuslice_host::gpu::nvml::Nvml::open() else {
        return Ok(());
    };
    let handles = container_devices(&nvml, cfg, minors)?;
    let v = view::view(&Layout::new(root), &nvml, &handles, now_unix());
    let views: Vec<&view::GpuView> = v.gpus.iter().collect();
    for w in health_verdict(&views, allow)? {
        eprintln!(
            "cuslice oci-hook: warning: {}",
            cuslice_host::text::clean_to(&w, cuslice_host::text::LINE_MAX)
        );
    }
    Ok(())
}
