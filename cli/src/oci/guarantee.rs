//! The container's memory guarantee in its GPUs' memory pools: registered
//! before its first process (`create`), released when it goes
//! (`poststop`, a failed `create`).

use super::*;

/// Registers the container's memory guarantee on each GPU it is given in
/// that GPU's memory pool (`cuslice_host::guarantee`), checked against
/// NVML's memory: a guarantee that cannot fit beside the others
/// registered there is refused in one line. Where the hook cannot load
/// NVML (no driver's library) nothing is registered: the container's
/// first process registers it (docs/memory-quota.md).
pub(super) fn register_guarantee(
    a: &HookArgs,
    cfg: &config::Config,
    minors: &[u32],
) -> Result<(), String> {
    use cuslice_host::guarantee::{self, GpuMemory};
    if !cfg.has_memory() {
        return Ok(());
    }
    let Ok(nvml) = cuslice_host::gpu::nvml::Nvml::open() else {
        return Ok(());
    };
    let mut gpus = vec![];
    for d in container_devices(&nvml, cfg, minors)? {
        let index = d.index;
        let total = nvml
            .memory_total(&d)
            .map_err(|e| format!("GPU {index}: cannot read its memory through NVML: {e}"))?;
        let uuid = config::parse_uuid(&d.uuid)
            .map_err(|e| format!("NVML's GPU {index} UUID {:?}: {e}", d.uuid))?;
        gpus.push(GpuMemory { index, uuid, total });
    }
    let root = Dir::keep_root(&a.root, 0o700)?;
    root.keep_dir(GPU_DIR, 0o755)?;
    let done = guarantee::register(
        &a.root.join(GPU_DIR),
        cfg,
        &gpus,
        cuslice_core::pool::Maker::Root,
        Some(0o666),
    )
    .map_err(|e| format!("the container's memory guarantee: {e}"))?;
    for line in done.iter().filter_map(|r| r.pending_line()) {
        eprintln!(
            "cuslice oci-hook: warning: {}",
            cuslice_host::text::clean_to(&line, cuslice_host::text::LINE_MAX)
        );
    }
    Ok(())
}

/// Releases the guarantee of container `id` (quota `cfg`) from the GPU
/// memory pools under `root`: only a container's own slice (a claim's
/// containers share the claim's, which the DRA plugin releases). What
/// cannot be released is said, one line each.
pub(super) fn release_guarantee(root: &Path, id: &str, cfg: &config::Config) {
    if cfg.slice.as_deref() != Some(container_slice(id).as_str()) {
        return;
    }
    for e in cuslice_host::guarantee::release(&root.join(GPU_DIR), cfg) {
        eprintln!(
            "cuslice oci-hook: warning: the container's guarantee: {}",
            cuslice_host::text::clean_to(&e, cuslice_host::text::LINE_MAX)
        );
    }
}
