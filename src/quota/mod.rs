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
//!
//! The files: this one holds the types, the phase word and the public
//! entry points; `setup` reads the configuration and builds the state
//! (`init`'s work), `lifecycle` is the phase state machine and the fork and
//! exit handlers, `admit` the allocation path (admission, charges, the
//! `Admission` guard), `burst` what involves the GPU's memory pool (waiting
//! for memory, the headroom reported), `pools` the stream-ordered memory
//! pools.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use cuslice_core::pool::Pool as GpuPool;
use cuslice_core::segment::Segment;

use crate::sys::CUresult;
use crate::table::Table;

mod admit;
mod burst;
mod lifecycle;
mod pools;
mod setup;
#[cfg(test)]
mod tests;

pub use admit::Admission;
pub use burst::without_waiting;
pub use lifecycle::{after_fork_child, at_exit, before_fork};

use lifecycle::run_once;
use setup::build_all;

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
