//! The one place the watch audits and repairs a per-GPU segment, through
//! core's `gpu::audit`: the tenants it knows from the quota files get back
//! what their files give them, a lease stays only with a live holder. What
//! it finds is core's [`Finding`]s, as the segment holds them (tenant
//! names as tenants wrote them): the judge words them, escaped
//! (`judge::segments::gpu_segment_findings`).

use std::path::Path;

use cuslice_core::gpu::{GpuSegment, audit as core_audit};

pub use core_audit::{Expected, Finding};

/// What the audit finds in `seg` (the read-only mapping the watch keeps)
/// against `expected`. Reads only.
pub fn audit(seg: &GpuSegment, expected: &[Expected], now_ns: u64) -> Vec<Finding> {
    core_audit::audit(seg, expected, now_ns)
}

/// Repairs the GPU segment at `path` (a writable mapping, opened whoever
/// owns the file) against `expected`; what it found as it repaired.
/// `audited_ns`: when the audit that called for it ran (the repair's
/// clock is never earlier).
pub fn repair(path: &Path, expected: &[Expected], audited_ns: u64) -> Result<Vec<Finding>, String> {
    let w = GpuSegment::open_existing(path).map_err(|e| e.to_string())?;
    let now = cuslice_core::gpu::monotonic_ns().max(audited_ns);
    let found = core_audit::repair(&w, expected, now);
    if w.truncated() {
        return Err(format!(
            "{}: the file was truncated while it was repaired",
            path.display()
        ));
    }
    Ok(found)
}
