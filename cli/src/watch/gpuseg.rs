//! The one place the watch audits and repairs a per-GPU segment, through
//! core's `gpu::audit`: the tenants it knows from the quota files get back
//! what their files give them, a lease stays only with a live holder. What
//! it found names tenants by what they wrote into the segment: escaped.

use std::path::Path;

use cuslice_core::gpu::{GpuSegment, audit as core_audit};

use crate::host::text;

pub use core_audit::Expected;

/// What the audit finds in `seg` (the read-only mapping the watch keeps)
/// against `expected`, per finding: the tenant or `-`, one line. Reads
/// only.
pub fn audit(seg: &GpuSegment, expected: &[Expected], now_ns: u64) -> Vec<(String, String)> {
    shown(core_audit::audit(seg, expected, now_ns))
}

/// Repairs the GPU segment at `path` (a writable mapping, opened whoever
/// owns the file) against `expected`; what it found as it repaired, as
/// [`audit`] says it. `audited_ns`: when the audit that called for it
/// ran (the repair's clock is never earlier).
pub fn repair(
    path: &Path,
    expected: &[Expected],
    audited_ns: u64,
) -> Result<Vec<(String, String)>, String> {
    let w = GpuSegment::open_existing(path).map_err(|e| e.to_string())?;
    let now = cuslice_core::gpu::monotonic_ns().max(audited_ns);
    let found = shown(core_audit::repair(&w, expected, now));
    if w.truncated() {
        return Err(format!(
            "{}: the file was truncated while it was repaired",
            path.display()
        ));
    }
    Ok(found)
}

/// Tenant names are whatever a tenant wrote into the segment.
fn shown(found: Vec<core_audit::Finding>) -> Vec<(String, String)> {
    found
        .into_iter()
        .map(|f| {
            (
                f.tenant.as_deref().map_or_else(|| "-".into(), text::clean),
                text::clean_to(&format!("{} ({})", f, f.kind), text::LINE_MAX),
            )
        })
        .collect()
}
