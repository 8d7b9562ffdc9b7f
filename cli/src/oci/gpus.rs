//! The GPUs a container is given: named by its quota file, else its
//! device nodes, else every GPU of the host.

use super::*;

/// A GPU of the host: NVML's index, UUID, and its device node's minor
/// (None where NVML does not tell).
pub(super) type HostGpu = (u32, String, Option<u32>);

/// The GPUs a container is given: those its quota file names by UUID (its
/// annotation `cuslice.io/gpus`, a claim's allocation); else those whose
/// device nodes its spec makes (`/dev/nvidia<minor>`: CDI and `--device`
/// put them there); else, where neither says, every GPU of the host.
pub(super) fn container_gpus<'a>(
    named: &[[u8; 16]],
    minors: &[u32],
    host: &'a [HostGpu],
) -> Vec<&'a HostGpu> {
    if !named.is_empty() {
        return host
            .iter()
            .filter(|(_, u, _)| config::parse_uuid(u).is_ok_and(|u| named.contains(&u)))
            .collect();
    }
    if !minors.is_empty() {
        return host
            .iter()
            .filter(|(_, _, m)| m.is_some_and(|m| minors.contains(&m)))
            .collect();
    }
    host.iter().collect()
}

/// NVML's handles of the GPUs a container is given ([`container_gpus`]:
/// named by its quota file, else its device nodes' minors, else all).
pub(super) fn container_devices(
    nvml: &cuslice_host::gpu::nvml::Nvml,
    cfg: &config::Config,
    minors: &[u32],
) -> Result<Vec<cuslice_host::gpu::nvml::DeviceHandle>, String> {
    let devices = nvml.devices()?;
    let host: Vec<HostGpu> = devices
        .iter()
        .map(|d| (d.index, d.uuid.clone(), nvml.minor_number(d).ok()))
        .collect();
    let named: Vec<[u8; 16]> = cfg.by_uuid.keys().copied().collect();
    let mine = container_gpus(&named, minors, &host);
    Ok(devices
        .iter()
        .filter(|d| mine.iter().any(|(i, _, _)| *i == d.index))
        .cloned()
        .collect())
}
