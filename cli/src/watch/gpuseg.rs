//! The one place the watch audits and repairs a per-GPU segment, through
//! core's `gpu::audit` (written on main): what each tenant it knows from
//! the quota files should have, what a live holder may hold.

use std::path::Path;

use cuslice_core::config::{Config, DEFAULT_COMPUTE_BURST_MS, DEFAULT_COMPUTE_SLICE_MS};
use cuslice_core::gpu::TenantSpec;

/// A tenant the watch expects on a GPU, and what the shim registers it
/// with there (as `src/limiter.rs` derives it from the quota file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTenant {
    pub name: String,
    pub spec: TenantSpec,
}

/// The spec the shim registers `cfg`'s tenant with on GPU `index` /
/// `uuid`; None without a compute share or ceiling there.
pub fn spec_for(cfg: &Config, index: u32, uuid: &[u8; 16]) -> Option<TenantSpec> {
    let l = cfg.limits_for(index, uuid);
    if l.compute.is_none() && l.compute_max.is_none() {
        return None;
    }
    let slice_ms = cfg.compute_slice_ms.unwrap_or(DEFAULT_COMPUTE_SLICE_MS);
    let default_burst = if cfg.latency {
        slice_ms
    } else {
        DEFAULT_COMPUTE_BURST_MS
    };
    let max = l.compute_max.map_or(100, u32::from);
    Some(TenantSpec {
        share: l.compute.map_or(max, u32::from),
        max,
        burst_ns: u64::from(cfg.compute_burst_ms.unwrap_or(default_burst)) * 1_000_000,
        latency: cfg.latency,
    })
}

/// What one audit found and repaired.
#[derive(Debug, Default)]
pub struct Audit {
    /// (tenant, one line) per finding.
    pub findings: Vec<(String, String)>,
    /// What was restored, one line each.
    pub repaired: Vec<String>,
    pub error: Option<String>,
}

/// Audits the GPU segment at `path` against `expected`; with `repair`,
/// restores it. `live(pid)`: whether a process entry's PID is alive.
pub fn audit(
    path: &Path,
    expected: &[ExpectedTenant],
    live: &dyn Fn(u32) -> bool,
    now_ns: u64,
    repair: bool,
) -> Audit {
    // Until core's gpu::audit is merged: nothing is audited here.
    let _ = (path, expected, live, now_ns, repair);
    Audit::default()
}
