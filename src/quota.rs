//! Memory quota state of this process: the configuration resolved against
//! the devices CUDA shows it, the container's shared segment, this
//! process's slot in it, and the tables that remember what each allocation
//! cost so frees credit exactly.
//!
//! Initialised by the `cuInit` hook once the real driver is up. When no
//! memory limit is configured there is no state at all and every hook is a
//! pass-through. A configuration or segment error fails closed: `cuInit`
//! (and every later allocation) returns `CUDA_ERROR_NOT_PERMITTED`, with one
//! line on stderr saying what is wrong where.
//!
//! Initialisation is a small state machine in `PHASE`: UNINIT ->
//! INITIALIZING (one thread builds) -> READY or FAILED. Whatever happens
//! while building, an error or a panic, ends in READY or FAILED: other
//! threads' `cuInit` sleep on the phase word (a futex) until then, never
//! spin. A fork child whose parent was initialising resets the phase (see
//! `after_fork_child`).

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use cuslice_core::config::{self, Config, format_uuid};
use cuslice_core::pool::Pool as GpuPool;
use cuslice_core::segment::{Admit, MAX_DEVICES, Segment, UNLIMITED};

use crate::generated::real;
use crate::sys::{CUdevice, CUresult, CUuuid};
use crate::table::Table;

/// One GPU as CUDA numbers it in this process.
pub struct Dev {
    /// Entry in the segment (keyed by UUID, shared by the container).
    pub seg: usize,
    pub limit: u64,
    pub uuid: [u8; 16],
    /// Context overhead already charged for this device by this process.
    ctx_charged: AtomicBool,
    /// The device's memory page (the driver's allocation granularity): a
    /// linear allocation of at least one page takes whole pages.
    pub page: u64,
    /// The GPU's memory pool (every tenant's guarantee and burst) and this
    /// process's slot there; None: no quota on this GPU.
    pub pool: Option<(&'static GpuPool, usize)>,
}

/// State of one stream-ordered memory pool this process allocated from.
pub struct Pool {
    pub handle: AtomicU64,
    pub ordinal: AtomicU32,
    /// Bytes of live allocations we made from it.
    pub used: AtomicU64,
    /// Bytes of the pool's reservation charged to the quota.
    pub charged: AtomicU64,
}

pub const MAX_POOLS: usize = 64;

pub struct Quota {
    pub seg: Segment,
    pub slot: usize,
    pub devs: Vec<Dev>,
    pub ctx_overhead: u64,
    /// device pointer -> (size, meta)
    pub ptrs: Table,
    /// VMM handle -> (size, meta)
    pub handles: Table,
    /// mapped VA -> (size, handle)
    pub maps: Table,
    /// CUarray / CUmipmappedArray -> (size, ordinal)
    pub arrays: Table,
    pub pools: [Pool; MAX_POOLS],
    /// Serialises pool reconciliation (slow path only: growth, trim, and
    /// before refusing an allocation).
    pub pool_sync: std::sync::Mutex<()>,
    refusal_logged: AtomicBool,
    /// `memory_wait`, ms (0: a refused allocation fails at once).
    wait_ms: u64,
    wait_logged: AtomicBool,
}

/// Why an allocation was refused.
#[derive(Debug, Clone, Copy)]
pub enum Short {
    /// The container's quota (its `memory_max`).
    Quota { used: u64, limit: u64 },
    /// Past its guarantee, and the GPU's pool has not that much that no
    /// tenant is guaranteed.
    Pool { short: u64, room: u64 },
    /// Within its guarantee, but that part of it (`pending`) is still lent
    /// out to tenants that burst before it arrived: it comes back as they
    /// free.
    Lent { pending: u64 },
    /// The driver: the GPU is full.
    Driver,
}

impl Short {
    fn what(&self) -> &'static str {
        match self {
            Short::Quota { .. } => "under the quota",
            Short::Pool { .. } => "for memory no tenant is guaranteed",
            Short::Lent { .. } => "for its guarantee, lent out to others' bursts, to come back",
            Short::Driver => "for the GPU to have room (the driver refused)",
        }
    }
}

std::thread_local! {
    /// Set while a stream-ordered allocation is admitted: it never waits
    /// (it may be captured into a graph, and waiting would stall the
    /// capture).
    static NO_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with waiting for memory off on this thread.
pub fn without_waiting<R>(f: impl FnOnce() -> R) -> R {
    NO_WAIT.with(|w| {
        let old = w.replace(true);
        let r = f();
        w.set(old);
        r
    })
}

const UNINIT: u32 = 0;
const INITIALIZING: u32 = 1;
const READY: u32 = 2;
const FAILED: u32 = 3;

static PHASE: AtomicU32 = AtomicU32::new(UNINIT);
static STATE: AtomicPtr<Quota> = AtomicPtr::new(std::ptr::null_mut());

/// The quota state, if this process has one (after a successful cuInit with
/// a memory limit configured).
#[inline]
pub fn get() -> Option<&'static Quota> {
    let p = STATE.load(Ordering::Acquire);
    if p.is_null() {
        None
    } else {
        // SAFETY: published once with Release after full construction, and
        // never freed (leaked for the process lifetime; see after_fork).
        Some(unsafe { &*p })
    }
}

/// Whether initialisation failed (every allocation is then refused).
#[inline]
pub fn failed() -> bool {
    PHASE.load(Ordering::Acquire) == FAILED
}

/// Forks of this process so far, counted by the prepare handler in the
/// parent before each fork (see `Announced::open`).
static FORKS: AtomicU64 = AtomicU64::new(0);
/// The descriptor of the memory segment an initialisation in progress has
/// opened (-1: none), so that a fork child can close it (see
/// `after_fork_child`).
static BUILDING_FD: AtomicI32 = AtomicI32::new(-1);

/// Runs once, after the real cuInit succeeded. Err: the status cuInit must
/// return instead of success.
pub fn init() -> Result<(), CUresult> {
    run_once(&PHASE, build_all)
}

/// The state machine of `init` on the phase word `phase`: the first caller
/// runs `build`, the others sleep until it is done and share its outcome.
fn run_once(phase: &AtomicU32, build: impl FnOnce() -> Result<(), String>) -> Result<(), CUresult> {
    loop {
        match phase.compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(READY) => return Ok(()),
            Err(FAILED) => return Err(CUresult::CUDA_ERROR_NOT_PERMITTED),
            // Another thread is initialising: sleep until it is done.
            Err(p) => wait_while(phase, p),
        }
    }
    // A panic is contained here rather than at the FFI boundary: the phase
    // must not stay INITIALIZING (every later cuInit would wait for ever).
    let outcome = match catch_unwind(AssertUnwindSafe(build)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(msg)) => {
            crate::error!("{msg}; CUDA is refused to this process (CUDA_ERROR_NOT_PERMITTED)");
            Err(CUresult::CUDA_ERROR_NOT_PERMITTED)
        }
        Err(_) => {
            crate::error!(
                "internal error (panic) while setting up cuslice's limits; CUDA is refused to this process (CUDA_ERROR_NOT_PERMITTED). Please report this."
            );
            Err(CUresult::CUDA_ERROR_NOT_PERMITTED)
        }
    };
    phase.store(
        if outcome.is_ok() { READY } else { FAILED },
        Ordering::Release,
    );
    futex_wake_all(phase);
    outcome
}

/// Sleeps while `word` holds `value` (or until a timeout: the caller looks
/// again, so a wake-up it missed costs at most that long).
fn wait_while(word: &AtomicU32, value: u32) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    // SAFETY: FUTEX_WAIT on a live, aligned 4-byte atomic of this process
    // (private: no other process wakes it); the kernel only sleeps if the
    // word still holds `value`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            value,
            &ts as *const libc::timespec,
        )
    };
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live atomic; wakes sleepers, touches nothing.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

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
fn build_all() -> Result<(), String> {
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
struct Announced(ManuallyDrop<Segment>);

impl Announced {
    fn open(path: &std::path::Path) -> Result<Announced, String> {
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
    fn into_segment(self) -> Segment {
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
const FALLBACK_PAGE: u64 = 2 << 20;

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

fn no_pools() -> [Pool; MAX_POOLS] {
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

/// In the parent, just before a fork (pthread_atfork prepare handler).
pub fn before_fork() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// A fork child must not keep its parent's slot lock alive, and CUDA state
/// does not survive fork: drop the inherited state (without touching the
/// shared segment) so the child's own cuInit registers it afresh.
///
/// A fork while another thread of the parent was initialising leaves the
/// child with INITIALIZING and no thread that will ever finish it (only
/// the forking thread exists in the child, and it is never the initialiser:
/// building the state does not fork). Failing the child would refuse CUDA
/// to a process whose configuration the parent was about to accept, so the
/// child starts over instead, as after READY: its half-built state is
/// unreachable (a leak, no more), the segment mapping was not inherited
/// (MADV_DONTFORK), and the segment descriptor, the one thing that would
/// tie the parent's slot lock to the child, is closed here. FAILED stays
/// FAILED: the child inherits the parent's configuration.
pub fn after_fork_child() {
    let p = STATE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    let mut closed = -1;
    if !p.is_null() {
        // SAFETY: the state is leaked, never freed: the reference stays
        // valid (the child only reads its fd).
        let q = unsafe { &*p };
        closed = q.seg.raw_fd();
        // SAFETY: only the state's fd is closed (async-signal-safe), which
        // leaves the parent's OFD lock to the parent; nothing in the child
        // uses that descriptor any more.
        unsafe { libc::close(closed) };
        for (pool, _) in q.devs.iter().filter_map(|d| d.pool) {
            // SAFETY: as above, for the pools' descriptors (their process
            // slot locks are the parent's).
            unsafe { libc::close(pool.raw_fd()) };
        }
    }
    // A fork between publishing the state and withdrawing the announcement
    // names the same descriptor twice: close it once.
    let building = BUILDING_FD.swap(-1, Ordering::AcqRel);
    if building >= 0 && building != closed {
        // SAFETY: the descriptor of a segment the parent was building (see
        // `Announced`); nothing in the child uses it.
        unsafe { libc::close(building) };
    }
    PHASE.store(
        phase_after_fork(PHASE.load(Ordering::Acquire)),
        Ordering::Release,
    );
}

/// The phase a fork child starts with, given its parent's.
fn phase_after_fork(phase: u32) -> u32 {
    match phase {
        READY | INITIALIZING => UNINIT,
        other => other,
    }
}

/// At normal exit: give our slot back so the container's usage drops now
/// rather than when someone next looks.
pub fn at_exit() {
    if let Some(q) = get() {
        q.seg.release_slot(q.slot);
        for (pool, slot) in q.devs.iter().filter_map(|d| d.pool) {
            pool.leave(slot);
        }
    }
}

impl Quota {
    /// The device of the calling thread's current context.
    #[inline]
    pub fn current(&self) -> Option<usize> {
        let mut d: CUdevice = 0;
        // SAFETY: real driver call with a valid out pointer.
        let r = unsafe { real::cuCtxGetDevice(&mut d) };
        if r != CUresult::CUDA_SUCCESS || d < 0 || d as usize >= self.devs.len() {
            return None;
        }
        Some(d as usize)
    }

    /// Admits `bytes` on device `ordinal`, or returns the status to fail the
    /// allocation with (after one retry that reclaims dead processes' usage
    /// and re-reads pool reservations, and, with `memory_wait`, after
    /// waiting for memory to be freed).
    pub fn admit(&self, ordinal: usize, bytes: u64) -> Result<(), CUresult> {
        let Some(dev) = self.devs.get(ordinal) else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        if let Admit::Granted = self.seg.admit(dev.seg, self.slot, bytes) {
            return Ok(());
        }
        // Slow path: maybe others died, or pools released memory, or the
        // GPU's pool has room for a burst.
        self.seg.reclaim_dead();
        self.sync_all_pools();
        let why = match self.try_admit(dev, bytes) {
            Ok(()) => return Ok(()),
            Err(w) => w,
        };
        let why = match self.wait(ordinal, bytes, why, || self.try_admit(dev, bytes)) {
            Ok(()) => return Ok(()),
            Err(w) => w,
        };
        if !self.refusal_logged.swap(true, Ordering::Relaxed) {
            match why {
                Short::Pool { short, room } => crate::error!(
                    "out of memory on GPU {ordinal} ({}): asked for {bytes} bytes past this container's guarantee, {short} more than it holds of the memory no tenant is guaranteed, which has {room} bytes free (further refusals are not logged)",
                    format_uuid(&dev.uuid)
                ),
                Short::Lent { pending } => {
                    // The error path only: who borrows it, from the pool.
                    let borrowers = dev
                        .pool
                        .map(|(p, _)| {
                            p.borrowers()
                                .iter()
                                .map(|(n, b)| format!("{n} {b}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default();
                    crate::error!(
                        "out of memory on GPU {ordinal} ({}): asked for {bytes} bytes within this container's guarantee, {pending} bytes of which are still lent out to tenants that burst before it arrived ({}); they come back as those free (set memory_wait to wait for them; further refusals are not logged)",
                        format_uuid(&dev.uuid),
                        if borrowers.is_empty() {
                            "none bursts now".to_string()
                        } else {
                            format!("borrowers, bytes: {borrowers}")
                        }
                    )
                }
                Short::Quota { used, limit } => crate::error!(
                    "out of memory under the quota on GPU {ordinal} ({}): asked for {bytes} bytes with {used} of {limit} bytes in use by this container (further refusals are not logged)",
                    format_uuid(&dev.uuid)
                ),
                Short::Driver => {}
            }
        }
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Admission in the segment, reserving from the GPU's pool what a
    /// burst past the guarantee needs.
    fn try_admit(&self, dev: &Dev, bytes: u64) -> Result<(), Short> {
        match self.seg.admit_or_burst(dev.seg, self.slot, bytes) {
            (Admit::Granted, _) => Ok(()),
            (Admit::Refused { used, limit }, _) => Err(Short::Quota { used, limit }),
            (Admit::Burst { short }, room) => {
                let pending = self
                    .seg
                    .pool_link(dev.seg)
                    .map_or(0, |l| l.pool.pending(l.entry));
                if pending > 0 {
                    Err(Short::Lent { pending })
                } else {
                    Err(Short::Pool { short, room })
                }
            }
        }
    }

    /// With `memory_wait`, retries `again` each time memory is freed on the
    /// GPU (by this container or another tenant), until it succeeds or the
    /// deadline passes. Never waits where nobody else could free memory
    /// (the calling process would wait for itself), nor on a thread
    /// admitting a stream-ordered allocation. One log line per process.
    pub fn wait(
        &self,
        ordinal: usize,
        bytes: u64,
        why: Short,
        mut again: impl FnMut() -> Result<(), Short>,
    ) -> Result<(), Short> {
        let Some(dev) = self.devs.get(ordinal) else {
            return Err(why);
        };
        let Some((pool, _)) = dev.pool else {
            return Err(why);
        };
        if self.wait_ms == 0 || NO_WAIT.with(|w| w.get()) || !self.others_may_free(dev, &why) {
            return Err(why);
        }
        let start = std::time::Instant::now();
        let deadline = start + std::time::Duration::from_millis(self.wait_ms);
        let mut why = why;
        // Counted among the waiters before the first look (see Pool::freed).
        // None only once at_exit gave the pool slot back (another thread is
        // ending the process): the allocation fails as without memory_wait.
        let Some(waiting) = pool.waiting() else {
            return Err(why);
        };
        let outcome = loop {
            let seen = waiting.generation();
            match again() {
                Ok(()) => break Ok(()),
                Err(w) => why = w,
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                break Err(why);
            }
            // Woken by a free; at most a second between looks at processes
            // that died without freeing (their usage is reclaimed here).
            waiting.sleep(
                seen,
                (deadline - now).min(std::time::Duration::from_secs(1)),
            );
            self.seg.reclaim_dead();
        };
        drop(waiting);
        if !self.wait_logged.swap(true, Ordering::Relaxed) {
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let what = why.what();
            match &outcome {
                Ok(()) => crate::info!(
                    "GPU {ordinal}: an allocation of {bytes} bytes waited {ms:.1} ms {what} and was granted (memory_wait {} ms; further waits are not logged)",
                    self.wait_ms
                ),
                Err(_) => crate::warn!(
                    "GPU {ordinal}: an allocation of {bytes} bytes waited {ms:.1} ms {what}, the whole memory_wait, and was refused (further waits are not logged)"
                ),
            }
        }
        outcome
    }

    /// Whether someone other than this process holds memory that a free
    /// could give to it: other processes of the container (a refusal under
    /// the quota), or other processes on the GPU's pool.
    fn others_may_free(&self, dev: &Dev, why: &Short) -> bool {
        let mine = self
            .seg
            .slot(self.slot)
            .map_or(0, |s| s.used[dev.seg].load(Ordering::Relaxed));
        let container = self.seg.device_usage(dev.seg).map_or(0, |u| u.used);
        let in_container = container > mine;
        match why {
            Short::Quota { .. } => in_container,
            Short::Pool { .. } | Short::Lent { .. } | Short::Driver => {
                in_container || dev.pool.is_some_and(|(p, _)| p.others_live())
            }
        }
    }

    /// What this container can still get on device `ordinal` beyond its
    /// use, where it has a guarantee below its limit: its guarantee, its
    /// burst and the pool's room, less its use. For `cuMemGetInfo` and
    /// NVML's memory info, never the allocation path: it may sweep the
    /// pool ([`GpuPool::tidy`]).
    pub fn headroom(&self, ordinal: usize) -> Option<u64> {
        let dev = self.devs.get(ordinal)?;
        let u = self.seg.device_usage(dev.seg)?;
        if u.guarantee == 0 || u.guarantee >= u.limit {
            return None;
        }
        let link = self.seg.pool_link(dev.seg)?;
        // A look at the room: dead processes' bursts and guarantees whose
        // linger is over are swept first (at most ten times a second per
        // process, never waiting for the lock), or a framework sizing its
        // caches by the free memory would be told less than it can get.
        link.pool.tidy();
        let burst = link
            .pool
            .entry(link.entry)
            .map_or(0, |e| e.burst.load(Ordering::Acquire));
        Some(
            u.guarantee
                .saturating_add(burst)
                .saturating_add(link.pool.room())
                .saturating_sub(u.used),
        )
    }

    /// What the driver takes for a linear allocation (`cuMemAlloc*`,
    /// `cuMemAllocManaged`, `cuMemAllocPitch*`) of `size` bytes on device
    /// `ordinal`: whole pages from one page up. A smaller one is
    /// sub-allocated from a page the driver shares between small
    /// allocations, and charged as asked.
    pub fn linear_charge(&self, ordinal: usize, size: u64) -> u64 {
        let page = self.devs.get(ordinal).map_or(FALLBACK_PAGE, |d| d.page);
        if size < page {
            return size;
        }
        size.div_ceil(page).saturating_mul(page)
    }

    /// The page of device `ordinal` (see [`Dev::page`]).
    pub fn page(&self, ordinal: usize) -> u64 {
        self.devs.get(ordinal).map_or(FALLBACK_PAGE, |d| d.page)
    }

    /// Admits `bytes` on device `ordinal` as an [`Admission`]: the charge
    /// is given back when it is dropped, unless committed first.
    pub fn reserve(&self, ordinal: usize, bytes: u64) -> Result<Admission<'_>, CUresult> {
        self.admit(ordinal, bytes)?;
        Ok(Admission {
            q: self,
            ordinal,
            bytes,
        })
    }

    pub fn credit(&self, ordinal: usize, bytes: u64) {
        if let Some(dev) = self.devs.get(ordinal)
            && bytes > 0
        {
            self.seg.credit(dev.seg, self.slot, bytes);
        }
    }

    /// (limit, used by the container) of device `ordinal`, if it has a quota.
    /// The limit is the segment's, as admission reads it: a quota resized
    /// while this process runs (`cuslice resize`) shows at the next call.
    pub fn usage(&self, ordinal: usize) -> Option<(u64, u64)> {
        let dev = self.devs.get(ordinal)?;
        if dev.limit == UNLIMITED {
            return None;
        }
        let u = self.seg.device_usage(dev.seg)?;
        (u.limit != UNLIMITED).then_some((u.limit, u.used))
    }

    /// Quota by UUID (NVML identifies devices by UUID, not CUDA ordinal).
    pub fn ordinal_of_uuid(&self, uuid: &[u8; 16]) -> Option<usize> {
        self.devs.iter().position(|d| &d.uuid == uuid)
    }

    /// Charges the context overhead the first time this process creates or
    /// retains a context on `ordinal`, before the driver makes it. Ok(true):
    /// this call charged it (give it back with `uncharge_context` if the
    /// driver then fails). Refused: the context must not be created.
    pub fn charge_context(&self, ordinal: usize) -> Result<bool, CUresult> {
        let Some(dev) = self.devs.get(ordinal) else {
            return Ok(false);
        };
        if dev.ctx_charged.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        let r = self.admit(ordinal, self.ctx_overhead);
        if r.is_err() {
            dev.ctx_charged.store(false, Ordering::Release);
        }
        r.map(|()| true)
    }

    /// Undoes a `charge_context` that returned Ok(true).
    pub fn uncharge_context(&self, ordinal: usize) {
        if let Some(dev) = self.devs.get(ordinal)
            && dev.ctx_charged.swap(false, Ordering::AcqRel)
        {
            self.credit(ordinal, self.ctx_overhead);
        }
    }

    /// The pool entry for `handle` (created on first use). None if more
    /// than MAX_POOLS pools are in use.
    pub fn pool(&self, handle: u64, ordinal: usize) -> Option<&Pool> {
        if handle == 0 {
            return None;
        }
        for p in &self.pools {
            let h = p.handle.load(Ordering::Acquire);
            if h == handle {
                return Some(p);
            }
            if h == 0 {
                p.ordinal.store(ordinal as u32, Ordering::Relaxed);
                match p
                    .handle
                    .compare_exchange(0, handle, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return Some(p),
                    Err(other) if other == handle => return Some(p),
                    Err(_) => continue,
                }
            }
        }
        None
    }

    /// Index of a pool entry (stored in allocation records).
    pub fn pool_index(&self, p: &Pool) -> usize {
        (p as *const Pool as usize - self.pools.as_ptr() as usize) / std::mem::size_of::<Pool>()
    }

    /// Re-reads the pool's reservation from the driver and moves the quota
    /// charge to it. Err if the pool grew past the quota.
    pub fn sync_pool(&self, p: &Pool) -> Result<(), CUresult> {
        let _g = self.pool_sync.lock().unwrap_or_else(|e| e.into_inner());
        let handle = p.handle.load(Ordering::Acquire);
        if handle == 0 {
            return Ok(());
        }
        let mut reserved: u64 = 0;
        // SAFETY: real driver call; the attribute is a cuuint64_t.
        let r = unsafe {
            real::cuMemPoolGetAttribute(
                handle as crate::sys::CUmemoryPool,
                crate::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        };
        if r != CUresult::CUDA_SUCCESS {
            return Ok(()); // keep the current charge (conservative)
        }
        let ordinal = p.ordinal.load(Ordering::Relaxed) as usize;
        let charged = p.charged.load(Ordering::Acquire);
        if reserved > charged {
            // Not self.admit: its retry path syncs pools, i.e. this lock.
            let dev = self.devs.get(ordinal).map(|d| d.seg).unwrap_or(usize::MAX);
            if let Admit::Refused { .. } = self.seg.admit(dev, self.slot, reserved - charged) {
                return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            }
        } else {
            self.credit(ordinal, charged - reserved);
        }
        p.charged.store(reserved, Ordering::Release);
        Ok(())
    }

    fn sync_all_pools(&self) {
        for p in &self.pools {
            if p.handle.load(Ordering::Acquire) != 0 {
                let _ = self.sync_pool(p);
            }
        }
    }
}

/// Memory admitted under the quota that nothing owns yet. An allocation
/// reserves before its driver call and commits once what the driver
/// returned is recorded, so that its free credits the charge; every other
/// way out (the driver failed, the record could not be made, a panic)
/// drops the admission, which gives the charge back. Being a guard, no
/// failure path can forget to.
#[must_use = "dropping an admission gives its charge back"]
pub struct Admission<'q> {
    q: &'q Quota,
    ordinal: usize,
    bytes: u64,
}

impl Admission<'_> {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Moves the charge to `bytes` (what the driver really allocated):
    /// admits the difference or gives the excess back. Refused: the
    /// admission keeps what it had (dropping it gives that back).
    pub fn settle(&mut self, bytes: u64) -> Result<(), CUresult> {
        if bytes > self.bytes {
            self.q.admit(self.ordinal, bytes - self.bytes)?;
        } else {
            self.q.credit(self.ordinal, self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// The charge now belongs to a record (or a pool) whose release
    /// credits it.
    pub fn commit(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.q.credit(self.ordinal, self.bytes);
    }
}

/// Stored in allocation records: which device, and whether the memory came
/// from a pool (and which).
pub mod meta {
    pub const POOL: u64 = 1 << 32;

    pub fn plain(ordinal: usize) -> u64 {
        ordinal as u64
    }

    pub fn pooled(ordinal: usize, pool: usize) -> u64 {
        POOL | ((pool as u64) << 40) | ordinal as u64
    }

    pub fn ordinal(m: u64) -> usize {
        (m & 0xffff) as usize
    }

    pub fn pool(m: u64) -> Option<usize> {
        if m & POOL != 0 {
            Some(((m >> 40) & 0xffff) as usize)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_fork_child_starts_over_unless_its_parent_failed() {
        assert_eq!(phase_after_fork(UNINIT), UNINIT);
        // The parent's initialiser does not exist in the child: waiting
        // for it would hang the child's cuInit for ever.
        assert_eq!(phase_after_fork(INITIALIZING), UNINIT);
        assert_eq!(phase_after_fork(READY), UNINIT);
        assert_eq!(phase_after_fork(FAILED), FAILED);
    }

    #[test]
    fn a_panic_while_building_fails_initialisation_for_good() {
        let phase = AtomicU32::new(UNINIT);
        let r = run_once(&phase, || panic!("injected"));
        assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_PERMITTED));
        assert_eq!(phase.load(Ordering::Acquire), FAILED);
        let r = run_once(&phase, || unreachable!("built twice"));
        assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_PERMITTED));
    }

    #[test]
    fn an_error_fails_and_success_readies() {
        let phase = AtomicU32::new(UNINIT);
        assert!(run_once(&phase, || Err("bad".into())).is_err());
        assert_eq!(phase.load(Ordering::Acquire), FAILED);
        let phase = AtomicU32::new(UNINIT);
        assert_eq!(run_once(&phase, || Ok(())), Ok(()));
        assert_eq!(run_once(&phase, || unreachable!("built twice")), Ok(()));
        assert_eq!(phase.load(Ordering::Acquire), READY);
    }

    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime into a valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Threads that call while another builds sleep (a yield loop burns
    /// its share of a core: tens of ms over this wait even on a loaded
    /// machine), and see the builder's failure, panic included.
    #[test]
    fn waiters_sleep_and_see_the_initialisers_failure() {
        let phase = Arc::new(AtomicU32::new(UNINIT));
        let (tx, rx) = std::sync::mpsc::channel();
        let builder = {
            let phase = phase.clone();
            std::thread::spawn(move || {
                run_once(&phase, || {
                    let _ = tx.send(());
                    std::thread::sleep(Duration::from_millis(400));
                    panic!("injected")
                })
            })
        };
        rx.recv().expect("builder started");
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let phase = phase.clone();
                std::thread::spawn(move || {
                    let (cpu, t0) = (thread_cpu(), Instant::now());
                    let r = run_once(&phase, || unreachable!("built twice"));
                    (r, thread_cpu() - cpu, t0.elapsed())
                })
            })
            .collect();
        assert_eq!(
            builder.join().expect("builder"),
            Err(CUresult::CUDA_ERROR_NOT_PERMITTED)
        );
        for w in waiters {
            let (r, cpu, waited) = w.join().expect("waiter");
            assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_PERMITTED));
            assert!(
                cpu < Duration::from_millis(5),
                "a waiter used {cpu:?} of CPU in {waited:?}"
            );
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("cuslice-quota-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    /// A quota of `limit` bytes on one device, on a segment in `dir`.
    fn quota(dir: &std::path::Path, limit: u64) -> Quota {
        let seg = Segment::open_or_create(&dir.join("memory.seg")).expect("segment");
        let slot = seg.claim_slot(std::process::id()).expect("slot");
        let uuid = [7u8; 16];
        let d = seg.register_device(&uuid, limit).expect("device").0;
        let table = |cap| Table::new(cap).expect("table");
        Quota {
            seg,
            slot,
            devs: vec![Dev {
                seg: d,
                limit,
                uuid,
                ctx_charged: AtomicBool::new(false),
                page: FALLBACK_PAGE,
                pool: None,
            }],
            ctx_overhead: 0,
            ptrs: table(16),
            handles: table(16),
            maps: table(16),
            arrays: table(16),
            pools: no_pools(),
            pool_sync: std::sync::Mutex::new(()),
            refusal_logged: AtomicBool::new(false),
            wait_ms: 0,
            wait_logged: AtomicBool::new(false),
        }
    }

    #[test]
    fn an_admission_gives_its_charge_back_unless_committed() {
        let dir = scratch("admission");
        let q = quota(&dir, 1000);
        let used = || q.usage(0).expect("quota").1;
        let a = q.reserve(0, 600).expect("fits");
        assert_eq!(used(), 600);
        assert_eq!(
            q.reserve(0, 401).err(),
            Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        drop(a);
        assert_eq!(used(), 0, "dropped: given back");
        q.reserve(0, 600).expect("fits again").commit();
        assert_eq!(used(), 600, "committed: stays charged");
        q.credit(0, 600);
        // Settling to what the driver really allocated.
        let mut a = q.reserve(0, 500).expect("bound");
        a.settle(300).expect("smaller");
        assert_eq!((used(), a.bytes()), (300, 300));
        a.settle(900).expect("larger, still fits");
        assert_eq!(used(), 900);
        assert_eq!(a.settle(1001), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!((used(), a.bytes()), (900, 900), "a refused settle keeps it");
        drop(a);
        assert_eq!(used(), 0);
        // A device without a quota entry is not policed.
        let a = q.reserve(5, 1 << 40).expect("not policed");
        drop(a);
        assert_eq!(used(), 0);
        q.seg.release_slot(q.slot);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_segment_being_built_is_announced_until_published_or_dropped() {
        let dir = scratch("announced");
        let path = dir.join("memory.seg");
        let a = Announced::open(&path).expect("open");
        assert_eq!(BUILDING_FD.load(Ordering::SeqCst), a.raw_fd());
        drop(a);
        assert_eq!(BUILDING_FD.load(Ordering::SeqCst), -1, "withdrawn on drop");
        let a = Announced::open(&path).expect("open");
        let fd = a.raw_fd();
        let seg = a.into_segment();
        assert_eq!(
            BUILDING_FD.load(Ordering::SeqCst),
            fd,
            "still announced until the state is published"
        );
        assert_eq!(seg.raw_fd(), fd);
        BUILDING_FD.store(-1, Ordering::SeqCst);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
