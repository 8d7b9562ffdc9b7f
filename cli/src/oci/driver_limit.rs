//! The driver's per-cgroup memory limit: the container's cgroup v2
//! directory given its memory quota through NVML, where the driver has the
//! limit (the record says what came of it).

use super::*;

/// The directory of a process's cgroup in the cgroup v2 hierarchy: its
/// `0::` line of `/proc/<pid>/cgroup` (`cgroup_text`) under where this
/// process sees the v2 hierarchy mounted (`mountinfo`: /sys/fs/cgroup on a
/// v2 host, /sys/fs/cgroup/unified on a hybrid one). Err (why not): no v2
/// hierarchy, or a process in its root cgroup (a limit there would hold
/// every process on the host), or a path that is not plain.
pub(super) fn cgroup_v2_dir(cgroup_text: &str, mountinfo: &str) -> Result<String, String> {
    let mount = mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            (right.split(' ').next() == Some("cgroup2") && f.get(3) == Some(&"/"))
                .then(|| f.get(4).map(|m| m.to_string()))
                .flatten()
        })
        .filter(|m| m.starts_with('/') && !m.contains('\\'))
        .ok_or("no cgroup v2 hierarchy is mounted")?;
    let path = cgroup_text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("the container has no cgroup v2")?
        .trim_end_matches('/');
    if path.is_empty() {
        return Err("the container is in the root cgroup of the v2 hierarchy".into());
    }
    if !path.starts_with('/') || path.split('/').any(|c| c == ".." || c == ".") {
        return Err(format!(
            "the container's cgroup {path:?} is not a plain path"
        ));
    }
    Ok(format!("{}{path}", mount.trim_end_matches('/')))
}

/// Where the driver has a per-cgroup memory limit (NVML's
/// `nvmlDeviceSetMemoryLimits_v1`, R615 on, cgroup v2), the container's
/// cgroup gets its quota as hard (and soft) limit on every GPU it has a
/// quota on, so that a process that escapes the shim is still held by the
/// driver. Never fails the container: a driver without the limit is said
/// in the record, a driver that refuses is one warning and the record;
/// the shim enforces either way. None where the container has no memory
/// quota.
pub(super) fn driver_memory_limits(cfg: &config::Config, cgroup_text: &str) -> Option<String> {
    if !cfg.has_memory() {
        return None;
    }
    let outcome = (|| -> Result<String, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dir = match cgroup_v2_dir(cgroup_text, &mountinfo) {
            Ok(d) => d,
            Err(why) => return Ok(format!("unsupported: {why}")),
        };
        // No NVML, no driver limit (a host without the NVIDIA driver: the
        // shim has no GPU to hold either).
        let nvml = match cuslice_host::gpu::nvml::Nvml::open() {
            Ok(n) => n,
            Err(e) => return Ok(format!("unsupported: NVML: {e}")),
        };
        // Quota files the hook takes name GPUs by UUID or apply to all
        // (annotations' indices are mapped to UUIDs, claims name UUIDs).
        nvml.set_quota_limits(cfg, &dir)
    })();
    Some(match outcome {
        Ok(s) => s,
        Err(e) => {
            // (The cgroup path and NVML's words, shown, not sent: one line.)
            eprintln!(
                "cuslice oci-hook: warning: the driver's memory limit was not set ({}); the shim enforces the quota",
                cuslice_host::text::clean(&e)
            );
            format!("failed: {e}")
        }
    })
}
