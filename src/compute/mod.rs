//! The compute path: every launch of a process whose tenant has a share or
//! a ceiling goes through `gate`. What may launch, and when, is decided by
//! the policy in `cuslice_core::gpu::policy`; this module supplies the
//! clock, the draining, the waiting and the events.
//!
//! A process launches in **passes**: a pass lets a number of launches (its
//! budget) through until its deadline, with one fetch-sub per launch (and a
//! clock read every 16th) and no lock, syscall or allocation. At a pass's
//! end (the slow path, under a process-local mutex):
//! - a process that launched freely is charged the pass's wall time in
//!   flight, an upper bound of its GPU time; where that bound could make
//!   it heavy on a contended GPU, what `crate::gputime`'s probes measure
//!   instead (its kernels' GPU time from records during a probe, the
//!   probe's ratio of GPU time to time in flight between probes); one
//!   that holds the lease renews it (charged the slice) or, when a waiting
//!   tenant is owed the GPU or its ceiling is reached, drains its work
//!   (`cuCtxSynchronize`), is charged the slice and releases the lease;
//! - the queue is bounded with events: a lease holder keeps about one
//!   slice queued; beside a latency tenant every standard process keeps
//!   well under a millisecond queued (`SHALLOW_PASS_NS`; one kernel at a
//!   time when kernels are longer), so that the latency tenant's kernels
//!   find the GPU at the next kernel boundary;
//! - a standard process holds back while a latency tenant has work in
//!   flight;
//! - a process without the lease asks the policy how to go on: freely (its
//!   tenant's demand is under its share), through the lease (waiting on a
//!   futex in the segment), or, a latency tenant out of ceiling tokens,
//!   after a wait.
//!
//! A latency tenant's process reads the clock at every launch and stamps
//! its work in flight into the segment at each pass (short passes); the
//! synchronising calls (`sync_begin` / `sync_end`, from `hooks::sync`)
//! stamp it until they return.

//!
//! Files, by concern:
//! - `pass`: the fast path's passes, their budgets, and the queue bound
//!   (checkpoint events);
//! - `lease`: routing (freely, the lease, a throttled wait) and waiting for
//!   the lease;
//! - `latency`: the latency class (privilege, others holding back, short
//!   queues) and the synchronising calls;
//! - `charge`: what a process is charged (time in flight, measured GPU
//!   time, a holder's measured hold under a ceiling) and what it gives the
//!   GPU time meter (`crate::gputime`, through `Meter`, its `Sink`).
//!
//! The meter is called one way: this module asks it for probes and reads
//! its window; it hands its measurements back through the `Sink` trait.

mod charge;
mod latency;
mod lease;
mod pass;

use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering,
};

use cuslice_core::config::{Config, DEFAULT_COMPUTE_SLICE_MS, format_uuid};
use cuslice_core::gpu::{GpuSegment, LATENCY_LINGER_NS, LATENCY_PRIVILEGE_NS, futex_wake_all};

use crate::generated::real;
pub use crate::gputime::now_ns;
use crate::gputime::ratio::Estimate;
use crate::sys::*;
use charge::{BUSY_GAP_NS, Meter};

/// How a process launches now (`Pass::mode`).
const NONE: u8 = 0;
const FREE: u8 = 1;
const HOLDING: u8 = 2;

/// Per GPU: the process's tenant entry and slot in the GPU segment, and
/// its launching state, by concern.
pub struct Gpu {
    seg: GpuSegment,
    tenant: usize,
    slot: usize,
    slice_ns: u64,
    latency: bool,
    /// The tenant's share on this GPU, percent (refills a latency
    /// process's privilege).
    share: u32,
    pass: Pass,
    queue: Queue,
    busy: Busy,
    lat: Latency,
    time: GpuTime,
    stats: Stats,
    /// Serialises pass ends and lease waits within the process.
    slow: Mutex<()>,
}

/// The current pass (`pass.rs`).
struct Pass {
    /// Launches left in this pass (the fast path's one atomic; 0 while no
    /// pass is open, so that the next launch takes the slow path).
    credits: AtomicI64,
    /// `credits & clock_mask == 0` launches read the clock: 15 (every
    /// 16th), or 0 for a latency tenant (every launch).
    clock_mask: AtomicI64,
    /// End of the current pass.
    deadline: AtomicU64,
    /// NONE, FREE or HOLDING.
    mode: AtomicU8,
    /// End of the current slice of the lease (HOLDING).
    lease_deadline: AtomicU64,
    /// Launches allowed in this pass, and in the last pass with a bound.
    budget: AtomicU64,
    bounded_budget: AtomicU64,
    /// Measured average GPU time per launch, ns (0: not yet known).
    per_launch_ns: AtomicU64,
    start: AtomicU64,
    /// Whether no other tenant competed for this GPU, and the tenant has no
    /// ceiling, when this process was last routed to launch freely: its
    /// free passes then last a slice, not `FREE_PASS_NS` (nothing to
    /// arbitrate; fewer pass ends).
    alone: AtomicBool,
}

impl Pass {
    fn new() -> Self {
        Pass {
            credits: AtomicI64::new(0),
            clock_mask: AtomicI64::new(15),
            deadline: AtomicU64::new(0),
            mode: AtomicU8::new(NONE),
            lease_deadline: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            bounded_budget: AtomicU64::new(0),
            per_launch_ns: AtomicU64::new(0),
            start: AtomicU64::new(0),
            alone: AtomicBool::new(false),
        }
    }
}

/// The queue bound (`pass.rs`): two checkpoint events, recorded at pass
/// ends in turn; `checkpoint` counts the records.
struct Queue {
    events: [AtomicPtr<CUevent_st>; 2],
    checkpoint: AtomicU64,
    /// Whether the holder keeps its GPU fed: `QUEUE_UNKNOWN`, `QUEUE_FED`
    /// (at a slice end it waited for the checkpoint recorded a slice
    /// before) or `QUEUE_DRAINED` (that had long run: the GPU waited for
    /// it); from checkpoints recorded since `hold_checkpoint` (this hold).
    state: AtomicU8,
    hold_checkpoint: AtomicU64,
}

const QUEUE_UNKNOWN: u8 = 0;
const QUEUE_FED: u8 = 1;
const QUEUE_DRAINED: u8 = 2;

impl Queue {
    fn new() -> Self {
        Queue {
            events: [
                AtomicPtr::new(std::ptr::null_mut()),
                AtomicPtr::new(std::ptr::null_mut()),
            ],
            checkpoint: AtomicU64::new(0),
            state: AtomicU8::new(QUEUE_UNKNOWN),
            hold_checkpoint: AtomicU64::new(0),
        }
    }
}

/// Work in flight of free passes (`charge.rs`).
struct Busy {
    /// Busy period: work in flight since `since`, last seen at `last`
    /// (ns); `metered` is `GpuTime::metered` when it began.
    since: AtomicU64,
    last: AtomicU64,
    metered: AtomicU64,
    /// Wall time in flight in the current window (from `wall_start`), and
    /// per mille of the last whole window.
    wall_start: AtomicU64,
    wall_ns: AtomicU64,
    wall_pm: AtomicU64,
}

impl Busy {
    fn new(now: u64) -> Self {
        Busy {
            since: AtomicU64::new(0),
            last: AtomicU64::new(0),
            metered: AtomicU64::new(0),
            wall_start: AtomicU64::new(now),
            wall_ns: AtomicU64::new(0),
            wall_pm: AtomicU64::new(0),
        }
    }
}

/// The latency class and the synchronising calls (`latency.rs`).
struct Latency {
    /// A latency process: whether its passes stamp their work in flight
    /// (others hold back), decided at each route from its privilege budget
    /// (`tokens`, ns, as of `at`; see `privilege_refill`).
    privileged: AtomicBool,
    tokens: AtomicI64,
    at: AtomicU64,
    /// Whether a latency tenant is live on this GPU, as of `shallow_at`.
    shallow: AtomicBool,
    shallow_at: AtomicU64,
    /// Threads inside a synchronising call, since `sync_start`; whether
    /// that wait is charged (the process was launching freely) and whether
    /// it stamped a latency tenant's work in flight.
    syncing: AtomicU32,
    sync_start: AtomicU64,
    sync_charged: AtomicBool,
    sync_stamped: AtomicBool,
}

impl Latency {
    fn new(now: u64) -> Self {
        Latency {
            privileged: AtomicBool::new(false),
            tokens: AtomicI64::new(LATENCY_PRIVILEGE_NS as i64),
            at: AtomicU64::new(now),
            shallow: AtomicBool::new(false),
            shallow_at: AtomicU64::new(0),
            syncing: AtomicU32::new(0),
            sync_start: AtomicU64::new(0),
            sync_charged: AtomicBool::new(false),
            sync_stamped: AtomicBool::new(false),
        }
    }
}

/// GPU time as the meter measures it (`charge.rs`).
struct GpuTime {
    /// GPU time from kernel records: charged at the next flush
    /// (`pending`), and in all (`metered`).
    pending: AtomicU64,
    metered: AtomicU64,
    /// The process held the lease from `hold_from` to `hold_to` (u64::MAX
    /// while it holds it): kernel records in that span are not charged
    /// again (the lease charges its slices).
    hold_from: AtomicU64,
    hold_to: AtomicU64,
    /// Free passes: GPU time from records and wall time in flight inside
    /// the current probe, and the ratio of the two the last probe learned.
    free: Estimate,
    /// The same while holding the lease alone under a ceiling: GPU time
    /// from records and time held inside the probe (counted up to
    /// `held_counted`); see `hold_ppm`.
    held: Estimate,
    held_counted: AtomicU64,
    /// Whether records of kernels run while holding the lease are charged
    /// (`hold_ppm`).
    hold_metered: AtomicBool,
    /// Alone under a ceiling, the first measurement: `BOOT_NOT_YET`,
    /// `BOOT_WAITING` (since `boot_since`; the hold meanwhile in
    /// `boot_ns`, charged when it ends) or `BOOT_DONE` (see `hold_ppm`).
    boot: AtomicU8,
    boot_since: AtomicU64,
    boot_ns: AtomicU64,
    /// Launches and time in flight (free passes, and holds measured under
    /// a ceiling) since the process started: the meter's activity
    /// (`Sink::activity`).
    launches: AtomicU64,
    in_flight: AtomicU64,
}

const BOOT_NOT_YET: u8 = 0;
const BOOT_WAITING: u8 = 1;
const BOOT_DONE: u8 = 2;

impl GpuTime {
    fn new() -> Self {
        GpuTime {
            pending: AtomicU64::new(0),
            metered: AtomicU64::new(0),
            hold_from: AtomicU64::new(u64::MAX),
            hold_to: AtomicU64::new(u64::MAX),
            free: Estimate::new(),
            held: Estimate::new(),
            held_counted: AtomicU64::new(0),
            hold_metered: AtomicBool::new(false),
            boot: AtomicU8::new(BOOT_NOT_YET),
            boot_since: AtomicU64::new(0),
            boot_ns: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }
}

/// What this process's launches went through, for the log at exit: passes
/// launching freely and holding the lease, times it went through the
/// lease, and time (ns) its launching thread waited for its own queue
/// (checkpoints) and for others (the lease, a latency tenant, its
/// ceiling).
#[derive(Default)]
struct Stats {
    free_passes: AtomicU64,
    priv_passes: AtomicU64,
    held_passes: AtomicU64,
    leases: AtomicU64,
    queue_wait_ns: AtomicU64,
    held_back_ns: AtomicU64,
}

pub struct Limiter {
    /// By CUDA ordinal; None where the tenant has neither share nor ceiling.
    gpus: Vec<Option<Gpu>>,
}

static STATE: AtomicPtr<Limiter> = AtomicPtr::new(std::ptr::null_mut());

#[inline]
pub fn get() -> Option<&'static Limiter> {
    let p = STATE.load(Ordering::Acquire);
    if p.is_null() {
        None
    } else {
        // SAFETY: published once after construction and never freed.
        Some(unsafe { &*p })
    }
}

/// Builds the compute path's state (called once from `quota::init`).
pub fn build(cfg: &Config, uuids: &[[u8; 16]]) -> Result<(), String> {
    let slice_ms = cfg.compute_slice_ms.unwrap_or(DEFAULT_COMPUTE_SLICE_MS);
    let slice_ns = u64::from(slice_ms) * 1_000_000;
    let name = cfg.tenant_name();
    // Entries are per slice: this container's (claim's, session's) own,
    // whoever else took the same tenant name.
    let tag = cfg.slice_tag();
    let mut gpus = Vec::with_capacity(uuids.len());
    let mut any = false;
    for (i, uuid) in uuids.iter().enumerate() {
        let Some(spec) = cfg.tenant_spec(i as u32, uuid) else {
            gpus.push(None);
            continue;
        };
        let (share, max) = (spec.share, spec.max);
        let path = cfg
            .gpu_segment_dir
            .join(format!("{}.seg", format_uuid(uuid)));
        let seg = GpuSegment::open_or_create(&path).map_err(|e| e.to_string())?;
        let (tenant, old) = seg
            .register(&name, tag, spec, now_ns())
            .map_err(|e| e.to_string())?;
        if let Some((s, m)) = old {
            // Two processes of one slice that disagree (a quota file read
            // with other CUDA_VISIBLE_DEVICES, one edited by hand between
            // them): the last to start wins, said where the default level
            // shows it. Another slice of the same tenant name has an entry
            // of its own, never changed from here.
            crate::warn!(
                "tenant {name} on GPU {i}: share and ceiling changed from {s}%/{m}% to {share}%/{max}% by this process (the last process of this container, claim or session to start sets them)"
            );
        }
        // SAFETY: getpid has no preconditions.
        let slot = seg
            .claim_proc(tenant, unsafe { libc::getpid() } as u32)
            .map_err(|e| e.to_string())?;
        if cfg.latency {
            // Tell the others at once that a latency tenant is live (they
            // shorten their queues before its first request).
            let now = now_ns();
            seg.latency_stamp(tenant, now.saturating_add(LATENCY_LINGER_NS));
        }
        crate::info!(
            "GPU {i} ({}): compute share {share}%, ceiling {}, {}, tenant {name}",
            format_uuid(uuid),
            if max >= 100 {
                "none".to_string()
            } else {
                format!("{max}%")
            },
            if cfg.latency {
                "latency class"
            } else {
                "standard class"
            }
        );
        any = true;
        gpus.push(Some(Gpu {
            seg,
            tenant,
            slot,
            slice_ns,
            latency: cfg.latency,
            share,
            pass: Pass::new(),
            queue: Queue::new(),
            busy: Busy::new(now_ns()),
            lat: Latency::new(now_ns()),
            time: GpuTime::new(),
            stats: Stats::default(),
            slow: Mutex::new(()),
        }));
    }
    if any {
        let n = gpus.len();
        STATE.store(Box::into_raw(Box::new(Limiter { gpus })), Ordering::Release);
        crate::gputime::start(n, &Meter);
    }
    Ok(())
}

impl Limiter {
    #[inline]
    fn gpu(&self) -> Option<&Gpu> {
        if self.gpus.len() == 1 {
            return self.gpus[0].as_ref();
        }
        let mut d: CUdevice = 0;
        // SAFETY: real driver call with a valid out pointer.
        if unsafe { real::cuCtxGetDevice(&mut d) } != CUresult::CUDA_SUCCESS {
            return None;
        }
        self.gpus.get(usize::try_from(d).ok()?)?.as_ref()
    }

    fn each(&self) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().flatten()
    }
}

/// Lets one launch on `stream` through, waiting if needed.
#[inline]
pub fn gate(stream: CUstream) -> Result<(), CUresult> {
    let Some(l) = get() else { return Ok(()) };
    let Some(g) = l.gpu() else { return Ok(()) };
    // One atomic per launch; the clock is read every 16th (every launch for
    // a latency tenant).
    let c = g.pass.credits.fetch_sub(1, Ordering::AcqRel);
    if c > 1
        && (c & g.pass.clock_mask.load(Ordering::Relaxed) != 0
            || now_ns() < g.pass.deadline.load(Ordering::Relaxed))
    {
        return Ok(());
    }
    g.slow_path(stream);
    Ok(())
}

fn capturing(stream: CUstream) -> bool {
    let mut st = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: real driver call with a valid out pointer.
    let r = unsafe { real::cuStreamIsCapturing(stream, &mut st) };
    r == CUresult::CUDA_SUCCESS && st != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// Around a synchronising call (`cuStreamSynchronize`, `cuEventSynchronize`,
/// `cuCtxSynchronize`): a process that launches freely is charged the wait
/// (its work is in flight), and a latency tenant's work counts as in flight
/// until the call returns.
pub fn synchronized<R>(call: impl FnOnce() -> R) -> R {
    let g = get().and_then(Limiter::gpu);
    if let Some(g) = g {
        g.sync_begin();
    }
    let r = call();
    if let Some(g) = g {
        g.sync_end();
    }
    r
}

/// A fork child: drop the inherited limiter (closing its segment fds, so
/// the parent's slots die with the parent); the child's cuInit builds its own.
pub fn after_fork_child() {
    let p = STATE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !p.is_null() {
        // SAFETY: the state is leaked; only its fds are closed.
        let l = unsafe { &*p };
        for g in l.gpus.iter().flatten() {
            // SAFETY: closing an fd the (leaked) segment owns; nothing in
            // the child uses it again.
            unsafe { libc::close(g.seg.raw_fd()) };
        }
    }
}

/// Normal exit: give the lease (if held) and our slots back, and say (at
/// `info`) how this process's launches went.
pub fn at_exit() {
    if let Some(l) = get() {
        for (i, g) in l.gpus.iter().enumerate() {
            let Some(g) = g else { continue };
            let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
            crate::info!(
                "GPU {i}: {} passes launching freely ({} privileged), {} holding the lease (taken {} times); waited {:.1} ms for others (lease, latency tenant, ceiling) and {:.1} ms for its own queue",
                g.stats.free_passes.load(Ordering::Relaxed),
                g.stats.priv_passes.load(Ordering::Relaxed),
                g.stats.held_passes.load(Ordering::Relaxed),
                g.stats.leases.load(Ordering::Relaxed),
                ms(&g.stats.held_back_ns),
                ms(&g.stats.queue_wait_ns)
            );
        }
        if let Some(s) = crate::gputime::summary() {
            crate::info!("GPU time meter: {s}");
        }
        for g in l.gpus.iter().flatten() {
            g.seg.release_proc(g.slot, now_ns());
            futex_wake_all(g.seg.generation_word());
        }
    }
}
