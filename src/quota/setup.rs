//! Setting the quota up, once per process (`init`'s work): the
//! configuration read and checked, the devices this process sees, the
//! container's segment and this process's slot in it, the GPUs' memory
//! pools joined, the tables made, and the state published.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use cuslice_core::config::{self, Config, format_uuid};
use cuslice_core::pool::Pool as GpuPool;
use cuslice_core::segment::{MAX_DEVICES, Segment, UNLIMITED};

use super::{BUILDING_FD, Dev, FORKS, MAX_POOLS, Pool, Quota, STATE};
use crate::generated::real;
use crate::sys::{CUdevice, CUresult, CUuuid};
use crate::table::Table;

/// The GPUs this process sees, as (CUDA ordinal order) UUIDs.
fn devices() -> Result<Vec<[u8; 16]>, String> {
    let mut n: c_int = 0;
    // SAFETY: real driver call with a valid out pointer; cuInit succeeded.
    let r = unsafe { real::cuDeviceGetCount(&mut n) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!(
            "cannot count CUDA devices (cuDeviceGetCount returned {})",
            r.0
        ));
    }
    let n = n.max(0) as usize;
    if n > MAX_DEVICES {
        return Err(format!(
            "this process sees {n} GPUs; cuslice supports at most {MAX_DEVICES}"
        ));
    }
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let mut dev: CUdevice = 0;
        let mut uuid = CUuuid::default();
        // SAFETY: real driver calls with valid out pointers.
        let r = unsafe { real::cuDeviceGet(&mut dev, i as c_int) };
        let r = if r == CUresult::CUDA_SUCCESS {
            // SAFETY: as above; `dev` is the device the driver just named.
            unsafe { real::cuDeviceGetUuid_v2(&mut uuid, dev) }
        } else {
            r
        };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("cannot identify CUDA device {i} (status {})", r.0));
        }
        v.push(uuid.bytes.map(|b| b as u8));
    }
    Ok(v)
}

/// Loads the configuration once and builds both the memory quota and the
/// compute limiter from it. The quota state is published last, and only if
/// everything succeeded: a failed process must find no state (its memory
/// hooks then refuse, see `failed`).
pub(super) fn build_all() -> Result<(), String> {
    let cfg = config::load(&|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    if !matches!(cfg.source, config::Source::File(_)) {
        // Without a quota file the environment carries the limits: a
        // misspelt limit variable is an error, not a limit dropped.
        let set: Vec<String> = std::env::vars_os()
            .filter(|(_, v)| !v.is_empty())
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        config::check_env_names(set.iter().map(String::as_str)).map_err(|e| e.to_string())?;
    }
    report_ignored_env(&cfg);
    if !cfg.has_limits() {
        crate::debug!("no limits configured: every call passes through");
        return Ok(());
    }
    let uuids = devices()?;
    report_unmatched(&cfg, &uuids);
    crate::compute::build(&cfg, &uuids)?;
    build(&cfg, &uuids)
}

/// The memory segment while the state that will own it is being built: its
/// descriptor is announced in `BUILDING_FD` (for a fork child to close)
/// until the state is published, or until it is dropped on a failure or a
/// panic, when the announcement is withdrawn before the descriptor closes
/// (a stale number could name another file by then).
pub(super) struct Announced(ManuallyDrop<Segment>);

impl Announced {
    pub(super) fn open(path: &std::path::Path) -> Result<Announced, String> {
        // A fork between the open and the announcement would give the child
        // a copy of the descriptor nobody knows to close: the child would
        // then keep this process's slot lock (taken later, through the same
        // open file description) alive after this process dies. Such an
        // open is dropped (no lock was ever taken through it) and the
        // segment opened afresh, which the child never sees.
        for _ in 0..64 {
            let forks = FORKS.load(Ordering::SeqCst);
            let seg = Segment::open_or_create(path).map_err(|e| e.to_string())?;
            BUILDING_FD.store(seg.raw_fd(), Ordering::SeqCst);
            let a = Announced(ManuallyDrop::new(seg));
            if FORKS.load(Ordering::SeqCst) == forks {
                return Ok(a);
            }
        }
        Err(format!(
            "{}: the process forked during each of 64 attempts to open the segment",
            path.display()
        ))
    }

    /// The segment, still announced: the caller publishes the state that
    /// owns it and then withdraws the announcement.
    pub(super) fn into_segment(self) -> Segment {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: taken once; `this` is never dropped, so neither is the
        // segment inside it.
        unsafe { ManuallyDrop::take(&mut this.0) }
    }
}

impl std::ops::Deref for Announced {
    type Target = Segment;
    fn deref(&self) -> &Segment {
        &self.0
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        BUILDING_FD.store(-1, Ordering::SeqCst);
        // SAFETY: dropped once, here; `into_segment` forgets `self` instead.
        unsafe { ManuallyDrop::drop(&mut self.0) };
    }
}

/// Test hooks of debug builds (the integration tests run one); release
/// builds neither contain this code nor read these variables.
/// `CUSLICE_TEST_INIT_DELAY_MS`: sleep this long with the segment open and
/// the slot claimed (to fork or call cuInit meanwhile);
/// `CUSLICE_TEST_PANIC_IN_INIT`: then panic.
#[cfg(debug_assertions)]
fn test_faults_in_build() {
    if let Some(ms) = std::env::var("CUSLICE_TEST_INIT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if std::env::var_os("CUSLICE_TEST_PANIC_IN_INIT").is_some() {
        panic!("CUSLICE_TEST_PANIC_IN_INIT is set");
    }
}

/// Builds and publishes the memory quota state, if a memory limit is
/// configured.
fn build(cfg: &Config, uuids: &[[u8; 16]]) -> Result<(), String> {
    if !cfg.has_memory() {
        crate::debug!("no memory quota configured: memory calls pass through");
        return Ok(());
    }
    let path = cfg.segment_dir.join("memory.seg");
    let seg = Announced::open(&path)?;
    // SAFETY: getpid has no preconditions.
    let slot = seg
        .claim_slot(unsafe { libc::getpid() } as u32)
        .map_err(|e| e.to_string())?;
    let mut devs = Vec::with_capacity(uuids.len());
    let ctx_overhead = cfg.context_overhead.unwrap_or(DEFAULT_CONTEXT_OVERHEAD);
    let name = cfg.tenant_name();
    let tag = cfg.slice_tag();
    for (i, uuid) in uuids.iter().enumerate() {
        let l = cfg.limits_for(i as u32, uuid);
        let limit = l.memory_limit().unwrap_or(UNLIMITED);
        let guarantee = l.memory.unwrap_or(UNLIMITED).min(limit);
        if limit < ctx_overhead {
            // Every context this process makes there would be refused: said
            // once, at the start, rather than only as an allocation refused.
            crate::warn!(
                "GPU {i} ({}): the memory quota {} is below the {} each process is charged for its CUDA context (context_overhead): no context can be made on this GPU; raise the quota, or set context_overhead where the driver needs less",
                format_uuid(uuid),
                config::format_size(limit),
                config::format_size(ctx_overhead)
            );
        }
        let (s, resized) = seg
            .register_device_with(uuid, guarantee, limit)
            .map_err(|e| e.to_string())?;
        if let Some(now) = resized {
            crate::warn!(
                "GPU {i} ({}): the container's memory quota is {now} bytes in its segment ({}), not the {limit} bytes this process's configuration says: the segment's applies (a live process of this slice registered it, or `cuslice resize` set it; with neither, a process takes its own)",
                format_uuid(uuid),
                path.display()
            );
        }
        let limit = resized.unwrap_or(limit);
        crate::info!(
            "GPU {i} ({}): memory quota {}",
            format_uuid(uuid),
            if limit == UNLIMITED {
                "none".to_string()
            } else {
                format!("{limit} bytes")
            }
        );
        let pool = if limit == UNLIMITED {
            None
        } else {
            match join_pool(cfg, &seg, s, i, uuid, &name, tag) {
                Ok(p) => Some(p),
                // A tenant that may not burst needs nothing of the pool
                // but that its guarantee be counted there (for others'
                // bursts) and its frees wake waiters: it goes on without,
                // said where the default level shows it (a file of
                // another user in a shared /dev/shm, say). One that may
                // burst, or wait, needs it.
                Err(e) if guarantee >= limit && cfg.memory_wait_ms.unwrap_or(0) == 0 => {
                    crate::warn!(
                        "GPU {i}: {e}: this container's quota holds, but its guarantee is not counted in the GPU's memory pool (tenants that may burst past theirs could take it)"
                    );
                    None
                }
                Err(e) => return Err(e),
            }
        };
        devs.push(Dev {
            seg: s,
            limit,
            uuid: *uuid,
            ctx_charged: AtomicBool::new(false),
            page: page_size(i),
            pool,
        });
    }
    let table = |cap: usize, what: &str| {
        Table::new(cap).ok_or_else(|| format!("cannot map cuslice's {what} table ({cap} entries)"))
    };
    let (ptrs, handles, maps, arrays) = (
        table(PTRS, "allocation")?,
        table(HANDLES, "handle")?,
        table(MAPS, "mapping")?,
        table(ARRAYS, "array")?,
    );
    #[cfg(debug_assertions)]
    test_faults_in_build();
    // Nothing fails from here on: the segment goes into the state, which
    // is published, and only then is the announcement withdrawn (a fork
    // child in between finds both and closes the descriptor once).
    let q = Quota {
        ptrs,
        handles,
        maps,
        arrays,
        pools: no_pools(),
        pool_sync: std::sync::Mutex::new(()),
        refusal_logged: AtomicBool::new(false),
        wait_ms: cfg.memory_wait_ms.unwrap_or(0),
        wait_logged: AtomicBool::new(false),
        ctx_overhead,
        seg: seg.into_segment(),
        slot,
        devs,
    };
    STATE.store(Box::into_raw(Box::new(q)), Ordering::Release);
    BUILDING_FD.store(-1, Ordering::SeqCst);
    Ok(())
}

/// Joins the memory pool of GPU `ordinal` (`uuid`): every tenant with a
/// quota there registers what it is guaranteed, so that a tenant that may
/// burst past its guarantee takes only what nobody is guaranteed. Links the
/// container's device entry `d` to it. The pool is kept for the process's
/// life (leaked: the segment links to it).
fn join_pool(
    cfg: &Config,
    seg: &Segment,
    d: usize,
    ordinal: usize,
    uuid: &[u8; 16],
    name: &str,
    tag: u64,
) -> Result<(&'static GpuPool, usize), String> {
    let path = cuslice_core::pool::path(&cfg.gpu_segment_dir, uuid);
    let pool: &'static GpuPool = Box::leak(Box::new(
        GpuPool::open_or_create(&path).map_err(|e| e.to_string())?,
    ));
    // The entry as it is (whatever its state word says: a process of the
    // container may have scribbled on it; the host's watch restores it).
    let dev = seg
        .device(d)
        .ok_or_else(|| format!("{}: no device entry {d}", seg.path.display()))?;
    let limit = dev.limit.load(Ordering::Acquire);
    let g = dev.guarantee.load(Ordering::Acquire);
    let guarantee = if g == 0 || g > limit { limit } else { g };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let (entry, slot) = pool
        .join(name, tag, guarantee, limit, gpu_memory(ordinal), pid)
        .map_err(|e| e.to_string())?;
    seg.link_pool(d, pool, entry);
    if guarantee < limit {
        crate::info!(
            "GPU {ordinal} ({}): {} guaranteed, up to {} while memory no tenant is guaranteed is free ({})",
            format_uuid(uuid),
            config::format_size(guarantee),
            config::format_size(limit),
            path.display()
        );
    }
    Ok((pool, slot))
}

/// The GPU's memory as its driver gives it (the pool's capacity).
fn gpu_memory(ordinal: usize) -> u64 {
    let mut dev: CUdevice = 0;
    let mut bytes: usize = 0;
    // SAFETY: real driver calls with valid out pointers; cuInit succeeded.
    let ok = unsafe { real::cuDeviceGet(&mut dev, ordinal as c_int) } == CUresult::CUDA_SUCCESS
        && unsafe { real::cuDeviceTotalMem_v2(&mut bytes, dev) } == CUresult::CUDA_SUCCESS;
    if ok { bytes as u64 } else { 0 }
}

/// The page size of current NVIDIA GPUs' device memory, for a driver that
/// cannot say.
pub(super) const FALLBACK_PAGE: u64 = 2 << 20;

/// The memory page of device `ordinal`, as its driver gives it
/// (`cuMemGetAllocationGranularity`, minimum granularity of a pinned
/// device allocation: 2 MiB on current GPUs, where `cuMemAlloc` takes
/// whole 2 MiB pages for a large allocation); [`FALLBACK_PAGE`] if it
/// cannot say or says something implausible.
fn page_size(ordinal: usize) -> u64 {
    use crate::sys::{CUmemAllocationProp, CUmemAllocationType, CUmemLocationType};
    type Granularity =
        unsafe extern "C" fn(*mut usize, *const CUmemAllocationProp, c_int) -> CUresult;
    let Some(h) = crate::real::handle(crate::real::Lib::Cuda, true) else {
        return FALLBACK_PAGE;
    };
    let f = crate::real::sym(h, c"cuMemGetAllocationGranularity");
    if f.is_null() {
        return FALLBACK_PAGE;
    }
    // SAFETY: the driver's cuMemGetAllocationGranularity has this signature
    // (cuda.h: size_t *, const CUmemAllocationProp *, an enum option).
    let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Granularity>(f) };
    let mut prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        ..Default::default()
    };
    prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.__bindgen_anon_1.id = ordinal as c_int;
    let mut g: usize = 0;
    // SAFETY: valid out pointer and property; 0 is
    // CU_MEM_ALLOC_GRANULARITY_MINIMUM; cuInit succeeded.
    let r = unsafe { f(&mut g, &prop, 0) };
    let g = g as u64;
    if r == CUresult::CUDA_SUCCESS && g.is_power_of_two() && (4096..=1 << 30).contains(&g) {
        g
    } else {
        crate::debug!(
            "GPU {ordinal}: cuMemGetAllocationGranularity returned {} ({g}): charging 2 MiB pages",
            r.0
        );
        FALLBACK_PAGE
    }
}

pub(super) fn no_pools() -> [Pool; MAX_POOLS] {
    std::array::from_fn(|_| Pool {
        handle: AtomicU64::new(0),
        ordinal: AtomicU32::new(0),
        used: AtomicU64::new(0),
        charged: AtomicU64::new(0),
    })
}

/// Table capacities (entries): live allocations, VMM handles, mappings and
/// arrays one process can hold under the quota.
const PTRS: usize = 1 << 18;
const HANDLES: usize = 1 << 16;
const MAPS: usize = 1 << 16;
const ARRAYS: usize = 1 << 14;

/// What a CUDA context costs on the device, charged once per device per
/// process. Measured with NVML on an H200, driver 580.159, CUDA 13: 518 MiB
/// for a bare driver-API context, 612 MiB for PyTorch 2.11 after its first
/// kernel (docs/memory-quota.md). 640 MiB covers both, so a process's NVML
/// usage stays within the quota.
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 640 << 20;

/// A device entry that matches none of the GPUs this process sees sets
/// no limit here: said, once per entry, where the default log level shows
/// it (say `[device.3]` in a container given two GPUs, or a UUID of
/// another host's GPU). Not an error: one quota file serves every process
/// of a container, and a process may see fewer of its GPUs.
fn report_unmatched(cfg: &Config, uuids: &[[u8; 16]]) {
    let from = match &cfg.source {
        config::Source::File(p) => p.display().to_string(),
        _ => "the environment".to_string(),
    };
    for e in cfg.unmatched_entries(uuids) {
        crate::warn!(
            "{from}: {e} matches none of the {} GPUs this process sees (CUDA_VISIBLE_DEVICES {}): its limits apply to no GPU here",
            uuids.len(),
            match std::env::var("CUDA_VISIBLE_DEVICES") {
                Ok(v) => format!("{v:?}"),
                Err(_) => "unset".to_string(),
            }
        );
    }
}

fn report_ignored_env(cfg: &Config) {
    if let config::Source::File(path) = &cfg.source {
        for v in &cfg.ignored_env {
            crate::warn!(
                "{v} is set but ignored: the quota file {} is authoritative",
                path.display()
            );
        }
    }
}
