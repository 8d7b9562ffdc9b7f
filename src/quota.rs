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

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use cuslice_core::config::{self, Config, format_uuid};
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
    // SAFETY: published once with Release after full construction, and
    // never freed (leaked for the process lifetime; see after_fork).
    if p.is_null() {
        None
    } else {
        Some(unsafe { &*p })
    }
}

/// Whether initialisation failed (every allocation is then refused).
#[inline]
pub fn failed() -> bool {
    PHASE.load(Ordering::Acquire) == FAILED
}

/// Runs once, after the real cuInit succeeded. Err: the status cuInit must
/// return instead of success.
pub fn init() -> Result<(), CUresult> {
    loop {
        match PHASE.compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(READY) => return Ok(()),
            Err(FAILED) => return Err(CUresult::CUDA_ERROR_NOT_PERMITTED),
            // Another thread is initialising: wait for it (cuInit is not hot).
            Err(_) => std::thread::yield_now(),
        }
    }
    match build_all() {
        Ok(()) => {
            PHASE.store(READY, Ordering::Release);
            Ok(())
        }
        Err(msg) => {
            crate::error!("{msg}; CUDA is refused to this process (CUDA_ERROR_NOT_PERMITTED)");
            PHASE.store(FAILED, Ordering::Release);
            Err(CUresult::CUDA_ERROR_NOT_PERMITTED)
        }
    }
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
/// compute limiter from it.
fn build_all() -> Result<(), String> {
    let cfg = config::load(&|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    report_ignored_env(&cfg);
    if !cfg.has_limits() {
        crate::debug!("no limits configured: every call passes through");
        return Ok(());
    }
    let uuids = devices()?;
    if let Some(q) = build(&cfg, &uuids)? {
        STATE.store(Box::into_raw(Box::new(q)), Ordering::Release);
    }
    crate::limiter::build(&cfg, &uuids)
}

fn build(cfg: &Config, uuids: &[[u8; 16]]) -> Result<Option<Quota>, String> {
    let any_memory = cfg.all.memory.is_some()
        || cfg.by_index.values().any(|l| l.memory.is_some())
        || cfg.by_uuid.values().any(|l| l.memory.is_some());
    if !any_memory {
        crate::debug!("no memory quota configured: memory calls pass through");
        return Ok(None);
    }
    let path = cfg.segment_dir.join("memory.seg");
    let seg = Segment::open_or_create(&path).map_err(|e| e.to_string())?;
    // SAFETY: getpid has no preconditions.
    let slot = seg
        .claim_slot(unsafe { libc::getpid() } as u32)
        .map_err(|e| e.to_string())?;
    let mut devs = Vec::with_capacity(uuids.len());
    for (i, uuid) in uuids.iter().enumerate() {
        let limit = cfg.limits_for(i as u32, uuid).memory.unwrap_or(UNLIMITED);
        let s = seg
            .register_device(uuid, limit)
            .map_err(|e| e.to_string())?;
        crate::info!(
            "GPU {i} ({}): memory quota {}",
            format_uuid(uuid),
            if limit == UNLIMITED {
                "none".to_string()
            } else {
                format!("{limit} bytes")
            }
        );
        devs.push(Dev {
            seg: s,
            limit,
            uuid: *uuid,
            ctx_charged: AtomicBool::new(false),
        });
    }
    let table =
        |cap: usize| Table::new(cap).ok_or_else(|| "cannot map the allocation table".to_string());
    Ok(Some(Quota {
        ptrs: table(1 << 18)?,
        handles: table(1 << 16)?,
        maps: table(1 << 16)?,
        arrays: table(1 << 14)?,
        pools: std::array::from_fn(|_| Pool {
            handle: AtomicU64::new(0),
            ordinal: AtomicU32::new(0),
            used: AtomicU64::new(0),
            charged: AtomicU64::new(0),
        }),
        pool_sync: std::sync::Mutex::new(()),
        refusal_logged: AtomicBool::new(false),
        ctx_overhead: cfg.context_overhead.unwrap_or(DEFAULT_CONTEXT_OVERHEAD),
        seg,
        slot,
        devs,
    }))
}

/// What a CUDA context costs on the device, charged once per device per
/// process. Measured with NVML on an H200, driver 580.159, CUDA 13: 518 MiB
/// for a bare driver-API context, 612 MiB for PyTorch 2.11 after its first
/// kernel (docs/memory-quota.md). 640 MiB covers both, so a process's NVML
/// usage stays within the quota.
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 640 << 20;

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

/// A fork child must not keep its parent's slot lock alive, and CUDA state
/// does not survive fork: drop the inherited state (without touching the
/// shared segment) so the child's own cuInit registers it afresh.
pub fn after_fork_child() {
    let p = STATE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !p.is_null() {
        // SAFETY: the state is leaked, never freed: only its fd is closed
        // (async-signal-safe), which leaves the parent's OFD lock to the
        // parent.
        let q = unsafe { &*p };
        unsafe { libc::close(q.seg.raw_fd()) };
    }
    if PHASE.load(Ordering::Acquire) == READY {
        PHASE.store(UNINIT, Ordering::Release);
    }
}

/// At normal exit: give our slot back so the container's usage drops now
/// rather than when someone next looks.
pub fn at_exit() {
    if let Some(q) = get() {
        q.seg.release_slot(q.slot);
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
    /// and re-reads pool reservations).
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
        // Slow path: maybe others died, or pools released memory.
        self.seg.reclaim_dead();
        self.sync_all_pools();
        match self.seg.admit(dev.seg, self.slot, bytes) {
            Admit::Granted => Ok(()),
            Admit::Refused { used, limit } => {
                if !self.refusal_logged.swap(true, Ordering::Relaxed) {
                    crate::error!(
                        "out of memory under the quota on GPU {ordinal} ({}): asked for {bytes} bytes with {used} of {limit} bytes in use by this container (further refusals are not logged)",
                        format_uuid(&dev.uuid)
                    );
                }
                Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    pub fn credit(&self, ordinal: usize, bytes: u64) {
        if let Some(dev) = self.devs.get(ordinal)
            && bytes > 0
        {
            self.seg.credit(dev.seg, self.slot, bytes);
        }
    }

    /// (limit, used by the container) of device `ordinal`, if it has a quota.
    pub fn usage(&self, ordinal: usize) -> Option<(u64, u64)> {
        let dev = self.devs.get(ordinal)?;
        if dev.limit == UNLIMITED {
            return None;
        }
        let u = self.seg.device_usage(dev.seg)?;
        Some((dev.limit, u.used))
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
