//! The one place the watch audits and repairs a per-GPU segment, through
//! core's `gpu::audit`: the tenants it knows from the quota files get back
//! what their files give them, a lease stays only with a live holder. What
//! it found names tenants by what they wrote into the segment: escaped.

use std::path::Path;

use cuslice_core::gpu::{GpuSegment, audit as core_audit};

use crate::host::text;

pub use core_audit::Expected;

/// What one audit found, per finding (tenant or `-`, kind, one line), and
/// whether it was repaired.
#[derive(Debug, Default)]
pub struct Audit {
    pub findings: Vec<(String, String)>,
    pub repaired: bool,
    pub error: Option<String>,
}

/// Audits the GPU segment at `path` against `expected`; with `repair`,
/// restores it (a writable mapping, opened whoever owns the file). `seg`
/// is the read-only mapping the watch keeps.
pub fn audit(
    seg: &GpuSegment,
    path: &Path,
    expected: &[Expected],
    now_ns: u64,
    repair: bool,
) -> Audit {
    let found = core_audit::audit(seg, expected, now_ns);
    if found.is_empty() {
        return Audit::default();
    }
    let mut a = Audit::default();
    let found = if repair {
        match GpuSegment::open_existing(path) {
            Ok(w) => {
                a.repaired = true;
                core_audit::repair(&w, expected, monotonic_now(now_ns))
            }
            Err(e) => {
                a.error = Some(format!("cannot repair: {e}"));
                found
            }
        }
    } else {
        found
    };
    // Tenant names are whatever a tenant wrote into the segment.
    a.findings = found
        .into_iter()
        .map(|f| {
            (
                f.tenant.as_deref().map_or_else(|| "-".into(), text::clean),
                text::clean_to(&format!("{} ({})", f, f.kind), text::LINE_MAX),
            )
        })
        .collect();
    a
}

fn monotonic_now(at_least: u64) -> u64 {
    cuslice_core::gpu::monotonic_ns().max(at_least)
}
