//! A slice's memory guarantee, registered by whoever makes the slice
//! before any of its processes runs: the OCI hook at a container's create,
//! the DRA plugin at a claim's prepare (both root), `cuslice run` before it
//! starts its program. Registered in each GPU's memory pool
//! ([`cuslice_core::pool`]), the guarantee belongs to the slice, not to its
//! processes: a container whose first process starts after another
//! tenant's burst finds it reserved (or pending, where the burst came
//! first: never over-admitted), and a restart finds it whole. Released at
//! poststop, unprepare, or the run's end.
//!
//! The capacity a guarantee is checked against is the GPU's memory as
//! NVML gives it to the maker, never the pool file's own field (tenants
//! can write the file).

use std::path::Path;

use cuslice_core::config::{self, Config};
use cuslice_core::pool::{Maker, Pool};

/// How [`register`]'s error starts where the pool file itself could not be
/// used (another user's in a shared directory, a foreign file): not a
/// refusal of the guarantee.
pub const UNUSABLE: &str = "unusable GPU memory pool: ";

/// A GPU as its maker sees it through NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    /// NVML's index (the host's numbering).
    pub index: u32,
    pub uuid: [u8; 16],
    /// Its memory, bytes (NVML's total).
    pub total: u64,
}

/// What a slice registered on one GPU.
pub struct Registration {
    pub index: u32,
    pub uuid: [u8; 16],
    pub guarantee: u64,
    /// The part still lent out to bursts taken before it (0: all reserved).
    pub pending: u64,
    /// The maker's process slot (`cuslice run`): given back at its end.
    pub slot: Option<usize>,
    /// The pool, held open: a maker process's slot lives as long as this
    /// open file description does (its lock).
    pool: Pool,
}

impl Registration {
    /// One line for a maker to print where part of the guarantee is
    /// pending (None: all of it reserved).
    pub fn pending_line(&self) -> Option<String> {
        (self.pending > 0).then(|| {
            format!(
                "GPU {} ({}): {} of the {} guaranteed are lent out to tenants that burst before this slice arrived; they come back as those free (until then an allocation past the rest waits with memory_wait, or is refused)",
                self.index,
                config::format_uuid(&self.uuid),
                config::format_size(self.pending),
                config::format_size(self.guarantee)
            )
        })
    }
}

/// The guarantee `cfg` gives on GPU `g`, with the most it may use: None
/// where it sets no memory limit there.
pub fn guarantee_on(cfg: &Config, g: &GpuMemory) -> Option<(u64, u64)> {
    let l = cfg.limits_for(g.index, &g.uuid);
    let limit = l.memory_limit()?;
    Some((l.memory.unwrap_or(limit).min(limit), limit))
}

/// Registers `cfg`'s guarantee on each of `gpus` in its memory pool in
/// `gpu_dir` (the pool files made there as the shim makes them, and given
/// mode `mode` where set: root's hook makes them usable by a container of
/// any user), for `maker`. All or nothing: a guarantee that does not fit
/// on one GPU releases those registered on the others, and the error names
/// the GPU and the figures. `gpu_dir` is root's own directory (the hook's,
/// the plugin's) or the one the slice's processes will use (`cuslice
/// run`'s, as its user): nobody else can put a link there.
pub fn register(
    gpu_dir: &Path,
    cfg: &Config,
    gpus: &[GpuMemory],
    maker: Maker,
    mode: Option<u32>,
) -> Result<Vec<Registration>, String> {
    let (name, tag) = (cfg.tenant_name(), cfg.slice_tag());
    let mut done: Vec<Registration> = Vec::new();
    for g in gpus {
        let Some((guarantee, limit)) = guarantee_on(cfg, g) else {
            continue;
        };
        let r = (|| {
            let p = gpu_dir.join(format!("{}.memory", config::format_uuid(&g.uuid)));
            let pool = Pool::open_or_create(&p).map_err(|e| format!("{UNUSABLE}{}", e.0))?;
            if let Some(mode) = mode {
                // SAFETY: the pool's descriptor, live while the pool is.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(pool.raw_fd()) };
                crate::fs::set_file_mode(fd, &p, mode).map_err(|e| e.to_string())?;
            }
            let r = pool
                .register(&name, tag, guarantee, limit, g.total, maker)
                .map_err(|e| format!("GPU {}: {}", g.index, e.0))?;
            Ok::<_, String>((pool, r))
        })();
        match r {
            Ok((pool, r)) => done.push(Registration {
                index: g.index,
                uuid: g.uuid,
                guarantee,
                pending: r.pending,
                slot: r.slot,
                pool,
            }),
            Err(e) => {
                finish(cfg, done);
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Gives back the maker's process slots of `done` (`cuslice run`'s, at its
/// end, or a registration undone) and releases the slice `cfg` names from
/// their pools.
pub fn finish(cfg: &Config, done: Vec<Registration>) {
    let (name, tag) = (cfg.tenant_name(), cfg.slice_tag());
    for r in done {
        if let Some(s) = r.slot {
            r.pool.leave(s);
        }
        r.pool.release(&name, tag);
    }
}

/// Releases the slice `cfg` names from every GPU memory pool in
/// `gpu_dir` (`*.memory`): its entries leave the pools where none of its
/// processes is left. What could not be released, one line each (a pool
/// file that is not a pool, say); a missing directory is nothing to do.
pub fn release(gpu_dir: &Path, cfg: &Config) -> Vec<String> {
    let (name, tag) = (cfg.tenant_name(), cfg.slice_tag());
    let Ok(rd) = std::fs::read_dir(gpu_dir) else {
        return vec![];
    };
    let mut errors = vec![];
    for ent in rd.flatten() {
        let p = ent.path();
        if p.extension().is_none_or(|x| x != "memory") {
            continue;
        }
        match Pool::open_existing(&p) {
            Ok(pool) => {
                if let (_, Some(busy)) = pool.release(&name, tag) {
                    errors.push(format!("{busy}: released without it"));
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    errors
}
