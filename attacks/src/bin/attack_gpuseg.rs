//! `attack-gpuseg [SECONDS [PERIOD_MS]]`: initialises the driver (through
//! the shim when it is preloaded, which registers its tenant on the GPU),
//! then rewrites every per-GPU segment in
//! the GPU segment directory of the configuration the shim would load
//! (`/run/cuslice/gpu` in a container given its slice by the OCI hook):
//! its own tenant (the configured tenant name) gets share 100 and ceiling
//! 100, every other tenant share 1. With PERIOD_MS, rewrites again every
//! PERIOD_MS (undoing a re-registration) until SECONDS have passed or it is
//! killed. Prints one line per segment:
//! `ATTACK gpuseg <file>: <tenant> share <old> -> 100 ceiling <old> -> 100; <other> share <old> -> 1; ...; pid <pid>`.
//! Exits 2 if there is no segment or its own tenant is in none.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cuslice_attacks::{Driver, arg, die, hold, shim_config};
use cuslice_core::gpu::GpuSegment;

/// Forges one segment; returns what changed (None: own tenant absent).
fn forge(seg: &GpuSegment, me: &str) -> Option<String> {
    let tenants = seg.tenants();
    tenants.iter().find(|t| t.name == me)?;
    let mut what = Vec::new();
    for v in &tenants {
        let Some(t) = seg.tenant(v.index) else {
            continue;
        };
        if v.name == me {
            t.share.store(100, Ordering::Release);
            t.max.store(100, Ordering::Release);
            what.insert(
                0,
                format!(
                    "{} share {} -> 100 ceiling {} -> 100",
                    v.name, v.share, v.max
                ),
            );
        } else {
            t.share.store(1, Ordering::Release);
            what.push(format!("{} share {} -> 1", v.name, v.share));
        }
    }
    Some(what.join("; "))
}

fn main() {
    let secs: Option<f64> = std::env::args().nth(1).map(|_| arg(1, "SECONDS", None));
    let period: Option<u64> = std::env::args().nth(2).map(|_| arg(2, "PERIOD_MS", None));
    let cfg = shim_config();
    let me = cfg.tenant_name();
    // Like any GPU process of the tenant: through the shim (if preloaded,
    // with a compute share) this registers the tenant in the GPU segment.
    let drv = Driver::load();
    drv.init_device0();
    let dir = cfg.gpu_segment_dir.clone();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    let segs: Vec<GpuSegment> = files
        .iter()
        .filter_map(|p| match GpuSegment::open_or_create(p) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("attack: {}", e.0);
                None
            }
        })
        .collect();
    let pid = std::process::id();
    let mut any = false;
    for s in &segs {
        if let Some(what) = forge(s, &me) {
            println!("ATTACK gpuseg {}: {what}; pid {pid}", s.path.display());
            any = true;
        }
    }
    if !any {
        die(&format!(
            "tenant {me:?} is in no GPU segment under {}",
            dir.display()
        ));
    }
    hold(secs, period.map(Duration::from_millis), || {
        for s in &segs {
            forge(s, &me);
        }
    });
}
