//! The compute share: every launch of a process whose tenant has a share or
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
//!   it heavy on a contended GPU, what `crate::meter`'s probes measure
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

use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering,
};

use cuslice_core::config::{Config, DEFAULT_COMPUTE_SLICE_MS, format_uuid};
use cuslice_core::gpu::{
    Acquire, GpuSegment, LATENCY_LINGER_NS, LATENCY_PRIVILEGE_NS, Route, WHOLE_PPM, futex_wait,
    futex_wake_all, privilege_refill,
};

use crate::generated::real;
use crate::sys::*;

/// Launches let through in the first slice under the lease, before any
/// measurement. The budget then follows the measured GPU time per launch
/// but at most doubles from one pass to the next (a slow start: a first
/// estimate taken before the GPU queue filled would be far too optimistic
/// for long kernels).
const FIRST_BUDGET: u64 = 4;
/// The first budget of a free pass. A light tenant (a service launching a
/// few dozen kernels per request) stays under it and never touches an
/// event; a launcher that outruns the GPU reaches it within microseconds,
/// and from then on its budget follows its GPU time per launch.
const FREE_FIRST_BUDGET: u64 = 64;
/// A free pass: how long a process that launches freely goes before it is
/// charged and asked again how to go on.
const FREE_PASS_NS: u64 = 2_000_000;
/// Beside a latency tenant: the GPU work a standard process lets through
/// per pass. With the queue bounded to about two passes, a latency tenant
/// waits for well under a millisecond of others' work (kernels longer than
/// this run one at a time). Measured on an H100 with 0.2 ms matmuls: two in
/// flight cost the service nothing and the trainer nothing; with 1.6 ms
/// matmuls, one at a time (docs/benchmarks/2026-11-23-h100-colocation-explore.md).
const SHALLOW_PASS_NS: u64 = 250_000;
/// A latency tenant's pass: its stamp is renewed at least this often while
/// it launches.
const LATENCY_PASS_NS: u64 = LATENCY_LINGER_NS / 2;
/// A gap this long between a process's passes (or synchronising calls)
/// ends its busy period.
const BUSY_GAP_NS: u64 = 200_000;
/// How often a standard process looks whether a latency tenant is live.
const PRESENCE_CHECK_NS: u64 = 50_000_000;
/// Longest single sleep while holding back for a latency tenant (it wakes
/// us when its work is done; this bounds a missed wake-up).
const HOLD_SLEEP_NS: u64 = 2_000_000;
/// A budget that never ends a pass before its deadline.
const UNBOUNDED: u64 = 1 << 40;
/// A process on a contended GPU asks the meter for probes (`crate::meter`)
/// once its wall time in flight could make its tenant heavy: in flight
/// this long without a break...
const NEED_BUSY_NS: u64 = 10_000_000;
/// ...or at least this much of its share (per mille) over a demand window.
/// Under it, charged its wall time in flight (an upper bound), it is light
/// whatever its kernels ran.
const NEED_SHARE_PERMILLE: u64 = 500;
/// A probe's ratio of GPU time to wall time in flight stands in for
/// records this long (probes come every `PROBE_NS + REST_NS` while needed,
/// at most every `PROBE_NS + REST_LONGEST_NS` for a steady process).
const RATIO_STALE_NS: u64 = crate::meter::REST_LONGEST_NS + 1_400_000_000;
/// Two probes in a row measured the same (the rest may lengthen) where
/// their ratios differ by at most this (ppm), or a quarter of the earlier.
const STEADY_PPM: u64 = 10_000;
/// A probe that saw less wall time in flight than this teaches nothing (the
/// process was idle through it): the last ratio stands.
const MIN_PROBE_WALL_NS: u64 = 2_000_000;
/// A holder alone under a ceiling whose kernels ran less than this share of
/// its hold (ppm) is charged what they ran (`hold_ppm`); one that ran more
/// (a saturating loop: ~95-100 %) is charged its hold, as the caps were
/// measured.
const HOLD_MEASURED_BELOW_PPM: u64 = 500_000;
/// How long a holder alone under a ceiling may wait for its first
/// measurement before its ceiling applies (`hold_ppm`, `booting`): a
/// probe's length and CUPTI's loading.
const FIRST_MEASURE_NS: u64 = crate::meter::PROBE_NS + 150_000_000;
/// A holder that waited this long at a slice end for the checkpoint it
/// recorded a slice before keeps its GPU fed (`queue_state`).
const QUEUE_FED_NS: u64 = 200_000;
/// Held this long inside the first probe, a loop whose kernels ran at least
/// `HOLD_MEASURED_BELOW_PPM` of it ends its wait for the measurement then.
const BOOT_PARTIAL_NS: u64 = 20_000_000;
const QUEUE_UNKNOWN: u8 = 0;
const QUEUE_FED: u8 = 1;
const QUEUE_DRAINED: u8 = 2;
const BOOT_NOT_YET: u8 = 0;
const BOOT_WAITING: u8 = 1;
const BOOT_DONE: u8 = 2;
const NO_RATIO: u64 = u64::MAX;

const NONE: u8 = 0;
const FREE: u8 = 1;
const HOLDING: u8 = 2;

pub struct Gpu {
    seg: GpuSegment,
    tenant: usize,
    slot: usize,
    slice_ns: u64,
    latency: bool,
    /// The tenant's share on this GPU, percent (refills a latency
    /// process's privilege).
    share: u32,
    /// A latency process: whether its passes stamp their work in flight
    /// (others hold back), decided at each route from its privilege budget
    /// (`priv_tokens`, ns, as of `priv_at`; see `privilege_refill`).
    privileged: AtomicBool,
    priv_tokens: AtomicI64,
    priv_at: AtomicU64,
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
    pass_start: AtomicU64,
    /// Two checkpoint events, recorded at pass ends in turn (bound the
    /// queue); `checkpoint` counts the records.
    events: [AtomicPtr<CUevent_st>; 2],
    checkpoint: AtomicU64,
    /// Busy period: work in flight since `busy_since`, last seen at
    /// `busy_last` (ns).
    busy_since: AtomicU64,
    busy_last: AtomicU64,
    /// Whether no other tenant competed for this GPU, and the tenant has no
    /// ceiling, when this process was last routed to launch freely: its
    /// free passes then last a slice, not `FREE_PASS_NS` (nothing to
    /// arbitrate; fewer pass ends).
    alone: AtomicBool,
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
    /// GPU time from kernel records (`crate::meter`): charged at the next
    /// flush (`pending`), and in all (`metered`); `busy_metered` is
    /// `metered` when the busy period began.
    pending: AtomicU64,
    metered: AtomicU64,
    busy_metered: AtomicU64,
    /// The process held the lease from `hold_from` to `hold_to` (u64::MAX
    /// while it holds it): kernel records in that span are not charged
    /// again (the lease charges its slices).
    hold_from: AtomicU64,
    hold_to: AtomicU64,
    /// The current probe (`crate::meter`): GPU time its records charged,
    /// and wall time in flight of free passes inside it.
    probe_gpu: AtomicU64,
    probe_wall: AtomicU64,
    /// GPU time per wall time in flight, parts per million, as the last
    /// probe measured it at `ratio_at` (`NO_RATIO`: none yet).
    ratio_ppm: AtomicU64,
    ratio_at: AtomicU64,
    /// The same while holding the lease alone under a ceiling: the current
    /// probe's GPU time from records and time held inside it (counted up
    /// to `held_counted`), and GPU time per time held as the last probe
    /// measured it (see `hold_ppm`).
    probe_held_gpu: AtomicU64,
    probe_held: AtomicU64,
    held_counted: AtomicU64,
    hold_ratio_ppm: AtomicU64,
    hold_ratio_at: AtomicU64,
    /// Whether records of kernels run while holding the lease are charged
    /// (`hold_ppm`).
    hold_metered: AtomicBool,
    /// Whether the holder keeps its GPU fed: `QUEUE_UNKNOWN`, `QUEUE_FED`
    /// (at a slice end it waited for the checkpoint recorded a slice
    /// before) or `QUEUE_DRAINED` (that had long run: the GPU waited for
    /// it); from checkpoints recorded since `hold_checkpoint` (this hold).
    queue_state: AtomicU8,
    hold_checkpoint: AtomicU64,
    /// Alone under a ceiling, the first measurement: `BOOT_NOT_YET`,
    /// `BOOT_WAITING` (since `boot_since`; the hold meanwhile in
    /// `boot_ns`, charged when it ends) or `BOOT_DONE` (see `hold_ppm`).
    boot: AtomicU8,
    boot_since: AtomicU64,
    boot_ns: AtomicU64,
    /// Wall time in flight of free passes in the current window (from
    /// `wall_start`), and per mille of the last whole window.
    wall_start: AtomicU64,
    wall_ns: AtomicU64,
    wall_pm: AtomicU64,
    /// What this process's launches went through, for the log at exit:
    /// passes launching freely and holding the lease, times it went
    /// through the lease, and time (ns) its launching thread waited for
    /// its own queue (checkpoints) and for others (the lease, a latency
    /// tenant, its ceiling).
    free_passes: AtomicU64,
    priv_passes: AtomicU64,
    held_passes: AtomicU64,
    leases: AtomicU64,
    queue_wait_ns: AtomicU64,
    held_back_ns: AtomicU64,
    /// Serialises pass ends and lease waits within the process.
    slow: Mutex<()>,
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

pub use cuslice_core::gpu::monotonic_ns as now_ns;

/// Builds the limiter (called once from `quota::init`).
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
            privileged: AtomicBool::new(false),
            priv_tokens: AtomicI64::new(LATENCY_PRIVILEGE_NS as i64),
            priv_at: AtomicU64::new(now_ns()),
            credits: AtomicI64::new(0),
            clock_mask: AtomicI64::new(15),
            deadline: AtomicU64::new(0),
            mode: AtomicU8::new(NONE),
            lease_deadline: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            bounded_budget: AtomicU64::new(0),
            per_launch_ns: AtomicU64::new(0),
            pass_start: AtomicU64::new(0),
            events: [
                AtomicPtr::new(std::ptr::null_mut()),
                AtomicPtr::new(std::ptr::null_mut()),
            ],
            checkpoint: AtomicU64::new(0),
            busy_since: AtomicU64::new(0),
            busy_last: AtomicU64::new(0),
            alone: AtomicBool::new(false),
            shallow: AtomicBool::new(false),
            shallow_at: AtomicU64::new(0),
            syncing: AtomicU32::new(0),
            sync_start: AtomicU64::new(0),
            sync_charged: AtomicBool::new(false),
            sync_stamped: AtomicBool::new(false),
            pending: AtomicU64::new(0),
            metered: AtomicU64::new(0),
            busy_metered: AtomicU64::new(0),
            hold_from: AtomicU64::new(u64::MAX),
            hold_to: AtomicU64::new(u64::MAX),
            probe_gpu: AtomicU64::new(0),
            probe_wall: AtomicU64::new(0),
            ratio_ppm: AtomicU64::new(NO_RATIO),
            ratio_at: AtomicU64::new(0),
            probe_held_gpu: AtomicU64::new(0),
            probe_held: AtomicU64::new(0),
            held_counted: AtomicU64::new(0),
            hold_ratio_ppm: AtomicU64::new(NO_RATIO),
            hold_ratio_at: AtomicU64::new(0),
            hold_metered: AtomicBool::new(false),
            queue_state: AtomicU8::new(QUEUE_UNKNOWN),
            hold_checkpoint: AtomicU64::new(0),
            boot: AtomicU8::new(BOOT_NOT_YET),
            boot_since: AtomicU64::new(0),
            boot_ns: AtomicU64::new(0),
            wall_start: AtomicU64::new(now_ns()),
            wall_ns: AtomicU64::new(0),
            wall_pm: AtomicU64::new(0),
            free_passes: AtomicU64::new(0),
            priv_passes: AtomicU64::new(0),
            held_passes: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            queue_wait_ns: AtomicU64::new(0),
            held_back_ns: AtomicU64::new(0),
            slow: Mutex::new(()),
        }));
    }
    if any {
        let n = gpus.len();
        STATE.store(Box::into_raw(Box::new(Limiter { gpus })), Ordering::Release);
        crate::meter::start(n);
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
}

/// Lets one launch on `stream` through, waiting if needed.
#[inline]
pub fn gate(stream: CUstream) -> Result<(), CUresult> {
    let Some(l) = get() else { return Ok(()) };
    let Some(g) = l.gpu() else { return Ok(()) };
    // One atomic per launch; the clock is read every 16th (every launch for
    // a latency tenant).
    let c = g.credits.fetch_sub(1, Ordering::AcqRel);
    if c > 1
        && (c & g.clock_mask.load(Ordering::Relaxed) != 0
            || now_ns() < g.deadline.load(Ordering::Relaxed))
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

impl Gpu {
    #[cold]
    fn slow_path(&self, stream: CUstream) {
        let _g = self.slow.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_ns();
        let mode = self.mode.load(Ordering::Acquire);
        if mode != NONE
            && self.credits.load(Ordering::Acquire) > 0
            && now < self.deadline.load(Ordering::Relaxed)
        {
            return; // another thread opened a pass
        }
        // A holder that went idle (a synchronising call returned) launches
        // again: busy, unless a waiter took the lease meanwhile.
        if mode == HOLDING && !self.seg.mark_holder_busy(self.slot, now) {
            self.credits.store(0, Ordering::Release);
            self.left_lease(now);
        }
        let mode = self.mode.load(Ordering::Acquire);
        // Launches into a capturing stream are recorded, not run: they
        // neither end a pass nor wait.
        if capturing(stream) {
            return;
        }
        if mode != NONE {
            self.end_pass(stream, now, mode);
        }
        if self.mode.load(Ordering::Acquire) == NONE {
            self.route();
        }
        self.hold_back();
        self.start_pass(now_ns());
    }

    /// Closes the pass that ended at `now`: charges a free one, renews or
    /// releases the lease at a slice's end, bounds the queue.
    fn end_pass(&self, stream: CUstream, now: u64, mode: u8) {
        let (left, launches) = self.take_launches();
        let shallow = self.shallow_now(now);
        if mode == FREE {
            // A free pass that used up its budget before its deadline
            // launches more than it runs: bound its queue like a holder's
            // (and learn its GPU time per launch). One that ran into its
            // deadline is light and pays nothing more.
            let by_budget = left <= 0 && now < self.deadline.load(Ordering::Relaxed);
            self.close_free_pass(now);
            if !self.latency && (by_budget || shallow) {
                let _ = self.bound_queue(stream, shallow);
                // Beside a latency tenant a trainer's passes are short and
                // its kernels run while it waits here for them: the wait
                // is work in flight (charged only its passes, it was
                // charged a seventh of its GPU time and never measured).
                let t = now_ns();
                if shallow {
                    self.charge_in_flight(now, t, t);
                }
                if by_budget {
                    self.measure(t, launches);
                }
            }
            return;
        }
        if now >= self.lease_deadline.load(Ordering::Relaxed) {
            let ppm = self.hold_ppm(now);
            if !self.booting()
                && self
                    .seg
                    .decide_release_measured(self.tenant, now, self.slice_ns, ppm)
            {
                // SAFETY: real driver call; drains this context's work.
                unsafe { real::cuCtxSynchronize() };
                let t = now_ns();
                self.measure(t, launches);
                let ppm = if ppm == WHOLE_PPM {
                    ppm
                } else {
                    self.hold_ppm(t)
                };
                self.count_held(t);
                // Whatever waits next (its ceiling, others) is no time to
                // measure it in.
                crate::meter::unwant();
                self.left_lease(t);
                if self.seg.release_measured(self.slot, self.tenant, t, ppm) {
                    futex_wake_all(self.seg.generation_word());
                }
                return;
            }
            // Nobody else waits: keep about one slice queued (wait for what
            // the previous pass submitted), then renew.
            let (k, waited) = self.bound_queue(stream, shallow);
            if k > self.hold_checkpoint.load(Ordering::Relaxed) {
                let fed = if waited >= QUEUE_FED_NS {
                    QUEUE_FED
                } else {
                    QUEUE_DRAINED
                };
                self.queue_state.store(fed, Ordering::Relaxed);
            }
            let t = now_ns();
            self.measure(t, launches);
            let ppm = if ppm == WHOLE_PPM {
                ppm
            } else {
                self.hold_ppm(t)
            };
            self.count_held(t);
            match self
                .seg
                .renew_measured(self.slot, self.tenant, t, self.slice_ns, ppm)
            {
                Some(deadline) => self.lease_deadline.store(deadline, Ordering::Relaxed),
                None => self.left_lease(t), // taken from us
            }
            return;
        }
        let _ = self.bound_queue(stream, shallow);
        self.measure(now_ns(), launches);
    }

    /// The pass's credits left, and the launches it made (counted for the
    /// meter's records-stopped check), wherever a pass ends: at the next
    /// launch's slow path or at a synchronising call.
    fn take_launches(&self) -> (i64, u64) {
        let left = self.credits.swap(0, Ordering::AcqRel);
        let launches = (self.budget.load(Ordering::Relaxed) as i64 - left).max(1) as u64;
        crate::meter::launched(launches);
        (left, launches)
    }

    /// Charges a free pass (its wall time, up to its deadline: a pass that
    /// ended long after it had nothing in flight is not charged the idle
    /// time; nothing where its kernels' GPU time is measured) and notes the
    /// busy period.
    fn close_free_pass(&self, now: u64) {
        let end = now.min(self.deadline.load(Ordering::Relaxed));
        let start = self.pass_start.load(Ordering::Relaxed);
        self.charge_in_flight(start, end, now);
        self.credits.store(0, Ordering::Release);
        self.mode.store(NONE, Ordering::Release);
    }

    /// Work of a process that launches freely was in flight from `start`
    /// to `end`: charged as GPU time (what the meter's records cover of it
    /// by them; the rest by the last probe's ratio where there is one, else
    /// whole, an upper bound), and the busy period goes on to `end`.
    fn charge_in_flight(&self, start: u64, end: u64, now: u64) {
        // A privileged latency process spends its privilege budget by its
        // wall time in flight: that is what its privilege costs the others
        // (they hold back meanwhile), however little of it its kernels run.
        // Its share is charged like anyone's: its kernels' GPU time where
        // measured (a privilege spent is not GPU time used: charged its
        // wall time, a decode loop's first milliseconds of each request
        // made it heavy, and through the lease it stayed so).
        if self.latency && self.privileged.load(Ordering::Relaxed) {
            self.priv_tokens
                .fetch_sub(end.saturating_sub(start) as i64, Ordering::Relaxed);
        }
        let wall = end.saturating_sub(start);
        self.note_wall(wall, now);
        crate::meter::in_flight(wall);
        let window = crate::meter::window();
        let recorded = window.map_or(0, |(s, u)| end.min(u).saturating_sub(start.max(s)));
        if recorded > 0 {
            self.probe_wall.fetch_add(recorded, Ordering::Relaxed);
        }
        let ratio = self.ratio(now);
        let rest = wall - recorded.min(wall);
        if rest > 0 {
            match ratio {
                Some(r) => self.seg.charge_free(self.tenant, of_ppm(rest, r), now),
                // Nothing measured it: counted apart too (status sets it
                // against NVML's per-process time).
                None => self.seg.charge_bound(self.slot, self.tenant, rest, now),
            }
        }
        self.busy_last.store(end, Ordering::Relaxed);
        let busy_since = self.busy_since.load(Ordering::Relaxed);
        match window {
            Some((since, u64::MAX)) => {
                // Measured from when both the busy period and the records
                // began (records lag by a flush: an underestimate).
                let busy = end.saturating_sub(busy_since.max(since));
                let gpu = self
                    .metered
                    .load(Ordering::Relaxed)
                    .saturating_sub(self.busy_metered.load(Ordering::Relaxed));
                self.seg.note_busy(self.tenant, busy, Some(gpu), now);
            }
            _ => {
                let busy = end.saturating_sub(busy_since);
                match ratio {
                    Some(r) => self
                        .seg
                        .note_busy(self.tenant, busy, Some(of_ppm(busy, r)), now),
                    // Where the meter works (or a probe asked for is on its
                    // way), a stretch is judged by what probes measure, not
                    // by its wall time; one not measured yet is charged its
                    // wall time meanwhile, which its demand then shows.
                    None if crate::meter::usable() || crate::meter::coming(now) => {}
                    None => self.seg.note_busy(self.tenant, busy, None, now),
                }
            }
        }
    }

    /// Counts `ns` of wall time in flight into this process's window.
    fn note_wall(&self, ns: u64, now: u64) {
        let start = self.wall_start.load(Ordering::Relaxed);
        let span = now.saturating_sub(start);
        if span >= cuslice_core::gpu::DEMAND_WINDOW_NS {
            let total = self.wall_ns.swap(0, Ordering::Relaxed) + ns;
            self.wall_pm.store(
                (total.saturating_mul(1000) / span).min(1000),
                Ordering::Relaxed,
            );
            self.wall_start.store(now, Ordering::Relaxed);
        } else {
            self.wall_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// What share of its hold since its last charge a holder is charged
    /// at `now` (parts per million). All of it, unless its tenant has a
    /// ceiling, nobody else competes, and it does not keep the GPU fed (a
    /// launch-bound loop: kernels a tenth of its time, the lease held
    /// through its host gaps and between requests; charged its hold, it
    /// was held to its ceiling in wall time). Then the meter probes it,
    /// and as a free process is, it is charged its kernels' GPU time from
    /// the records inside a probe (`metered`; that part of the hold is not
    /// charged) and outside, its hold times the last probe's ratio of GPU
    /// time to time held. A loop that keeps the GPU fed is charged its
    /// hold, as the caps were measured, and never loads CUPTI for it; so
    /// is a program that replays CUDA graphs (probing one crashed it).
    ///
    /// Until it is measured (at most `FIRST_MEASURE_NS`, once), its hold
    /// is counted, not charged, and it keeps the lease whatever its
    /// ceiling says (`booting`): its bucket starts empty, and charged its
    /// whole hold before its first probe, a decode loop spent it in one
    /// slice and waited for a whole burst (~0.7 s) before anything could
    /// measure it. The count is charged when the wait ends: times the
    /// ratio measured, else whole.
    fn hold_ppm(&self, now: u64) -> u64 {
        // A program replaying CUDA graphs is charged its hold, unprobed, as
        // before holds were measured: probing one crashed it on a GPU
        // (`crate::meter::graphs_launched`).
        if self.seg.uncapped(self.tenant)
            || self.seg.contended(self.tenant, now)
            || crate::meter::graphs_launched()
        {
            self.hold_metered.store(false, Ordering::Relaxed);
            self.end_boot(WHOLE_PPM, now);
            return WHOLE_PPM;
        }
        let state = self.queue_state.load(Ordering::Relaxed);
        let r = self.hold_ratio_ppm.load(Ordering::Relaxed);
        let usable = crate::meter::usable();
        let fresh = standing(&self.hold_ratio_ppm, &self.hold_ratio_at, now).is_some();
        // Probed while it does not keep the GPU fed, until a probe finds it
        // saturating (then again once that is stale: each probe costs a
        // launch-heavy loop a little throughput).
        if state == QUEUE_DRAINED && !(fresh && r >= HOLD_MEASURED_BELOW_PPM) {
            crate::meter::prepare();
            crate::meter::want_measured(now);
        }
        if self.boot.load(Ordering::Relaxed) != BOOT_DONE {
            if self.boot.swap(BOOT_WAITING, Ordering::Relaxed) == BOOT_NOT_YET {
                self.boot_since.store(now, Ordering::Relaxed);
            }
            // A probe's records so far already show a saturating loop.
            let held = self.probe_held.load(Ordering::Relaxed);
            let saturating = held >= BOOT_PARTIAL_NS
                && self.probe_held_gpu.load(Ordering::Relaxed) * 1_000_000
                    >= held * HOLD_MEASURED_BELOW_PPM;
            let waiting = state != QUEUE_FED
                && r == NO_RATIO
                && !saturating
                && !crate::meter::given_up()
                && now.saturating_sub(self.boot_since.load(Ordering::Relaxed)) < FIRST_MEASURE_NS;
            if waiting {
                self.hold_metered.store(false, Ordering::Relaxed);
                return 0;
            }
            let ppm = if fresh && state == QUEUE_DRAINED {
                r
            } else {
                WHOLE_PPM
            };
            self.end_boot(ppm, now);
        }
        let metered = usable && state == QUEUE_DRAINED && !(fresh && r >= HOLD_MEASURED_BELOW_PPM);
        self.hold_metered.store(metered, Ordering::Relaxed);
        if !metered {
            return WHOLE_PPM;
        }
        let (span, inside) = self.held_span(self.held_counted.load(Ordering::Relaxed), now);
        if span == 0 {
            return WHOLE_PPM;
        }
        let outside = span - inside;
        let charged = if fresh { of_ppm(outside, r) } else { outside };
        (u128::from(charged) * u128::from(WHOLE_PPM) / u128::from(span)) as u64
    }

    /// The wait for a first measurement ends (`hold_ppm`): the hold counted
    /// meanwhile is charged at `ppm`.
    fn end_boot(&self, ppm: u64, now: u64) {
        if self.boot.swap(BOOT_DONE, Ordering::Relaxed) == BOOT_WAITING {
            let ns = self.boot_ns.swap(0, Ordering::Relaxed);
            crate::debug!(
                "ceiling: first measurement after {:.1} ms ({:.1} ms held), charged at {} ppm",
                now.saturating_sub(self.boot_since.load(Ordering::Relaxed)) as f64 / 1e6,
                ns as f64 / 1e6,
                ppm
            );
            self.seg.charge_free(self.tenant, of_ppm(ns, ppm), now);
        }
    }

    /// Whether a holder alone under a ceiling waits for its first
    /// measurement (`hold_ppm`): it keeps the lease meanwhile.
    fn booting(&self) -> bool {
        self.boot.load(Ordering::Relaxed) == BOOT_WAITING
    }

    /// The hold from `from` (the last charge, or the last count into a
    /// probe) to `now`, as the lease charges it (idle gaps left out), and
    /// how much of that falls inside the meter's recording (in proportion).
    fn held_span(&self, from: u64, now: u64) -> (u64, u64) {
        let wall = now.saturating_sub(from);
        if wall == 0 {
            return (0, 0);
        }
        let span = self
            .seg
            .charged_from()
            .map_or(wall, |h| now.saturating_sub(h))
            .min(wall);
        let inside_wall =
            crate::meter::window().map_or(0, |(s, u)| now.min(u).saturating_sub(from.max(s)));
        let inside = (u128::from(span) * u128::from(inside_wall) / u128::from(wall)) as u64;
        (span, inside.min(span))
    }

    /// Counts the time held up to `t` (not counted yet) into the current
    /// probe, where it falls inside its recording (and into the wait for a
    /// first measurement).
    fn count_held(&self, t: u64) {
        let from = self.held_counted.fetch_max(t, Ordering::AcqRel);
        if from >= t {
            return;
        }
        // Only a holder measured alone under a ceiling (`hold_ppm`): what
        // the others hold stays out of the meter's counts.
        let booting = self.booting();
        if !booting && !self.hold_metered.load(Ordering::Relaxed) {
            return;
        }
        let (span, inside) = self.held_span(from, t);
        if booting {
            self.boot_ns.fetch_add(span, Ordering::Relaxed);
        }
        crate::meter::in_flight(span);
        if inside > 0 {
            self.probe_held.fetch_add(inside, Ordering::Relaxed);
        }
    }

    /// Whether this process's wall time in flight could make its tenant
    /// heavy (then its GPU time is worth measuring): a busy stretch of
    /// `NEED_BUSY_NS`, or in flight `NEED_SHARE_PERMILLE` of its share over
    /// the last window or the current one so far.
    ///
    /// (Not relaxed where the last ratio puts the process far under its
    /// share: under contention every free process's ratio is low, a
    /// saturating one's too, and it rises when the others are held; probed
    /// only every 2 s such processes were charged at a stale low ratio and
    /// eight saturating tenants missed their shares by up to 8 points.)
    fn needs_probe(&self, now: u64) -> bool {
        let busy = now.saturating_sub(self.busy_last.load(Ordering::Relaxed)) <= BUSY_GAP_NS
            && now.saturating_sub(self.busy_since.load(Ordering::Relaxed)) >= NEED_BUSY_NS;
        let bar = u64::from(self.share.clamp(1, 100)) * 10 * NEED_SHARE_PERMILLE / 1000;
        let span = now
            .saturating_sub(self.wall_start.load(Ordering::Relaxed))
            .max(cuslice_core::gpu::DEMAND_WINDOW_NS);
        let current = self.wall_ns.load(Ordering::Relaxed).saturating_mul(1000) / span;
        busy || self.wall_pm.load(Ordering::Relaxed) >= bar || current >= bar
    }

    /// The last probe's ratio of GPU time to wall time in flight (ppm),
    /// while it is fresh and the meter works.
    fn ratio(&self, now: u64) -> Option<u64> {
        standing(&self.ratio_ppm, &self.ratio_at, now)
    }

    /// The process no longer holds the lease (released, taken, or handed
    /// over while it was idle) as of `now`.
    fn left_lease(&self, now: u64) {
        self.hold_to.store(now, Ordering::Release);
        self.mode.store(NONE, Ordering::Release);
    }

    /// Without the lease: how to go on (waits while the policy says so).
    fn route(&self) {
        let begin = now_ns();
        loop {
            let now = now_ns();
            match self.seg.route(self.tenant, now, self.slice_ns) {
                Route::Free => {
                    let contended = self.seg.contended(self.tenant, now);
                    let uncapped = self.seg.uncapped(self.tenant);
                    if self.latency {
                        self.privilege(now);
                    }
                    // Charge what the GPU ran, not the time in flight,
                    // where the difference can matter. (Alone under a
                    // ceiling, a process soon holds the lease, and is
                    // measured there: `hold_ppm`.)
                    if contended {
                        crate::meter::prepare();
                    }
                    crate::meter::want(contended, contended && self.needs_probe(now), now);
                    self.alone.store(!contended && uncapped, Ordering::Relaxed);
                    self.mode.store(FREE, Ordering::Release);
                    break;
                }
                Route::Throttle { until } => {
                    // A latency tenant out of ceiling tokens.
                    let generation = self.seg.generation_word().load(Ordering::Acquire);
                    let timeout = until.saturating_sub(now).clamp(50_000, 2_000_000);
                    futex_wait(self.seg.generation_word(), generation, timeout);
                }
                Route::Lease => {
                    self.leases.fetch_add(1, Ordering::Relaxed);
                    self.acquire();
                    let t = now_ns();
                    self.held_counted.store(t, Ordering::Relaxed);
                    self.hold_checkpoint
                        .store(self.checkpoint.load(Ordering::Relaxed), Ordering::Relaxed);
                    self.hold_to.store(u64::MAX, Ordering::Release);
                    self.hold_from.store(t, Ordering::Release);
                    // A probe may begin at once (alone under a ceiling).
                    self.hold_ppm(t);
                    self.mode.store(HOLDING, Ordering::Release);
                    break;
                }
            }
        }
        let waited = now_ns().saturating_sub(begin);
        self.held_back_ns.fetch_add(waited, Ordering::Relaxed);
        if waited > 50_000 && self.mode.load(Ordering::Relaxed) == FREE {
            self.seg.add_throttled(self.tenant, waited);
        }
    }

    /// A latency process: refills its privilege budget to `now` and decides
    /// whether its next passes are privileged (budget left, tenant not
    /// heavy).
    fn privilege(&self, now: u64) -> bool {
        let elapsed = now.saturating_sub(self.priv_at.swap(now, Ordering::Relaxed));
        let tokens = privilege_refill(
            self.priv_tokens.load(Ordering::Relaxed),
            elapsed,
            self.share,
        );
        self.priv_tokens.store(tokens, Ordering::Relaxed);
        let p = tokens > 0 && self.seg.latency_privileged(self.tenant);
        self.privileged.store(p, Ordering::Relaxed);
        p
    }

    /// A standard process waits while a latency tenant has work in flight
    /// (it wakes us when that work is done).
    fn hold_back(&self) {
        if self.latency {
            return;
        }
        let begin = now_ns();
        let mut now = begin;
        while let Some(until) = self.seg.latency_hold(now) {
            let s = self.seg.sched();
            let generation = s.lat_gen.load(Ordering::Acquire);
            s.lat_waiters.fetch_add(1, Ordering::AcqRel);
            let timeout = until.saturating_sub(now).clamp(20_000, HOLD_SLEEP_NS);
            futex_wait(self.seg.latency_word(), generation, timeout);
            let _ = s
                .lat_waiters
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_sub(1))
                });
            now = now_ns();
        }
        if now > begin {
            self.seg.add_throttled(self.tenant, now - begin);
            self.held_back_ns.fetch_add(now - begin, Ordering::Relaxed);
        }
    }

    /// Whether standard tenants should keep short queues now (a latency
    /// tenant is live on this GPU); looked up every `PRESENCE_CHECK_NS`, and
    /// at once when a latency tenant stamped work (or registered) since the
    /// last look, so that its first request finds short queues.
    fn shallow_now(&self, now: u64) -> bool {
        if self.latency {
            return false;
        }
        let at = self.shallow_at.load(Ordering::Relaxed);
        let stamped = self.seg.sched().lat_until.load(Ordering::Relaxed) > at;
        if stamped || now.saturating_sub(at) >= PRESENCE_CHECK_NS {
            self.shallow
                .store(self.seg.latency_present(), Ordering::Relaxed);
            self.shallow_at.store(now, Ordering::Relaxed);
        }
        self.shallow.load(Ordering::Relaxed)
    }

    /// Opens a pass at `now` for the current mode.
    fn start_pass(&self, now: u64) {
        let mode = self.mode.load(Ordering::Acquire);
        let shallow = self.shallow_now(now);
        let per = self.per_launch_ns.load(Ordering::Relaxed);
        // Slow start: a budget at most doubles from one bounded pass to the
        // next (an estimate taken before the GPU queue filled would be far
        // too optimistic for long kernels).
        let prev = self.bounded_budget.load(Ordering::Relaxed);
        let bounded = |horizon: u64, first: u64, extra: u64| match horizon.checked_div(per) {
            Some(n) => (n.max(1) + extra).min(prev.max(first).saturating_mul(2)),
            None => first,
        };
        let (horizon, budget) = if self.latency && mode == FREE {
            if self.privileged.load(Ordering::Relaxed) {
                self.seg
                    .latency_stamp(self.tenant, now.saturating_add(LATENCY_LINGER_NS));
                self.priv_passes.fetch_add(1, Ordering::Relaxed);
            }
            (LATENCY_PASS_NS, UNBOUNDED)
        } else if shallow {
            (SHALLOW_PASS_NS, bounded(SHALLOW_PASS_NS, 1, 0))
        } else if mode == HOLDING {
            (self.slice_ns, bounded(self.slice_ns, FIRST_BUDGET, 1))
        } else if self.alone.load(Ordering::Relaxed) {
            (self.slice_ns, bounded(self.slice_ns, FREE_FIRST_BUDGET, 1))
        } else {
            (FREE_PASS_NS, bounded(FREE_PASS_NS, FREE_FIRST_BUDGET, 1))
        };
        if budget != UNBOUNDED {
            self.bounded_budget.store(budget, Ordering::Relaxed);
        }
        let mut deadline = now.saturating_add(horizon);
        if mode == HOLDING {
            deadline = deadline.min(self.lease_deadline.load(Ordering::Relaxed));
        }
        if mode == FREE && now.saturating_sub(self.busy_last.load(Ordering::Relaxed)) > BUSY_GAP_NS
        {
            self.busy_since.store(now, Ordering::Relaxed);
            self.busy_metered
                .store(self.metered.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if mode == HOLDING {
            self.held_passes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.free_passes.fetch_add(1, Ordering::Relaxed);
        }
        self.pass_start.store(now, Ordering::Relaxed);
        self.budget.store(budget, Ordering::Relaxed);
        self.deadline.store(deadline, Ordering::Relaxed);
        self.clock_mask
            .store(if self.latency { 0 } else { 15 }, Ordering::Relaxed);
        // The launch that called us is the pass's first.
        self.credits
            .store(budget.min(i64::MAX as u64) as i64 - 1, Ordering::Release);
    }

    /// GPU time per launch over the pass that just ended, its queue bound
    /// included (what the GPU took to run it, once the queue is full).
    fn measure(&self, now: u64, launches: u64) {
        let start = self.pass_start.load(Ordering::Relaxed);
        self.per_launch_ns.store(
            now.saturating_sub(start) / launches.max(1),
            Ordering::Relaxed,
        );
    }

    /// Records a checkpoint on `stream` and waits for an earlier one: the
    /// previous pass's (about one pass stays queued), or, in a short queue
    /// with launches longer than a shallow pass, this one (one at a time).
    /// Returns the checkpoint's number and how long it waited (ns).
    fn bound_queue(&self, stream: CUstream, shallow: bool) -> (u64, u64) {
        let k = self.checkpoint.fetch_add(1, Ordering::Relaxed);
        let (cur, prev) = (
            self.event((k % 2) as usize),
            self.event(((k + 1) % 2) as usize),
        );
        if cur.is_null() || prev.is_null() {
            return (k, 0);
        }
        let one_at_a_time =
            shallow && self.per_launch_ns.load(Ordering::Relaxed) >= SHALLOW_PASS_NS;
        let begin = now_ns();
        // SAFETY: real driver calls on our own events (an event never
        // recorded synchronises at once).
        unsafe {
            real::cuEventRecord(cur, stream);
            real::cuEventSynchronize(if one_at_a_time { cur } else { prev });
        }
        let waited = now_ns().saturating_sub(begin);
        self.queue_wait_ns.fetch_add(waited, Ordering::Relaxed);
        (k, waited)
    }

    fn event(&self, i: usize) -> CUevent {
        let slot = &self.events[i];
        let e = slot.load(Ordering::Acquire);
        if !e.is_null() {
            return e;
        }
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: real driver call with a valid out pointer; the process's
        // context is current on this (launching) thread.
        let r = unsafe { real::cuEventCreate(&mut e, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) };
        if r != CUresult::CUDA_SUCCESS {
            return std::ptr::null_mut();
        }
        slot.store(e, Ordering::Release);
        e
    }

    /// Waits for the lease (futex on the segment's generation word).
    fn acquire(&self) {
        let seg = &self.seg;
        let begin = now_ns();
        seg.begin_wait(self.slot, self.tenant, begin);
        loop {
            let generation = seg.generation_word().load(Ordering::Acquire);
            let now = now_ns();
            match seg.try_acquire(self.slot, self.tenant, now, self.slice_ns) {
                Acquire::Granted { deadline } => {
                    seg.end_wait(self.slot, self.tenant);
                    seg.add_throttled(self.tenant, now.saturating_sub(begin));
                    self.lease_deadline.store(deadline, Ordering::Relaxed);
                    return;
                }
                Acquire::Wait { until } => {
                    let timeout = until.saturating_sub(now).clamp(50_000, 2_000_000);
                    futex_wait(seg.generation_word(), generation, timeout);
                }
            }
        }
    }

    /// A thread enters a synchronising call. Never blocks: a thread that
    /// waits for the lease (holding `slow`) must not delay another's
    /// synchronisation, which did not wait for cuslice before.
    fn sync_begin(&self) {
        if self.syncing.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        let now = now_ns();
        // A free pass ends here; the wait is charged as work in flight.
        // (If another thread is in the slow path, it closes the pass.)
        let free = match self.slow.try_lock() {
            Ok(_g) if self.mode.load(Ordering::Acquire) == FREE => {
                // (Its launches count here: a process that synchronises
                // after every few launches ends all its passes here.)
                self.take_launches();
                self.close_free_pass(now);
                true
            }
            _ => false,
        };
        self.sync_charged.store(free, Ordering::Relaxed);
        self.sync_start.store(now, Ordering::Relaxed);
        let stamp = self.latency
            && self.privileged.load(Ordering::Relaxed)
            && self.seg.latency_privileged(self.tenant);
        if stamp {
            self.seg.latency_sync_begin(self.slot, self.tenant, now);
        }
        self.sync_stamped.store(stamp, Ordering::Relaxed);
    }

    /// The last thread inside a synchronising call returns from it.
    fn sync_end(&self) {
        if self.syncing.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let now = now_ns();
        if self.sync_charged.swap(false, Ordering::Relaxed) {
            let start = self.sync_start.load(Ordering::Relaxed);
            self.charge_in_flight(start, now, now);
        }
        if self.sync_stamped.swap(false, Ordering::Relaxed)
            && self.seg.latency_sync_end(self.slot, self.tenant, now)
        {
            futex_wake_all(self.seg.latency_word());
        }
        // A holder whose work is done may go idle (a service waiting for
        // its next request): its next launch takes the slow path (which
        // says it is busy again), and a waiter may take the lease once it
        // has been idle for `IDLE_HANDOFF_NS`, charging it only up to now.
        if self.mode.load(Ordering::Acquire) == HOLDING {
            self.credits.store(0, Ordering::Release);
            if self.seg.mark_holder_idle(self.slot, now) {
                futex_wake_all(self.seg.generation_word());
            }
        }
    }
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

/// Kernel records say process's kernels ran on CUDA device `dev` from
/// `start` to `end` (our clock; the meter's thread). Charged at the next
/// `metered_flush`, less what the process ran holding the lease (its slices
/// are charged by the lease).
pub fn metered(dev: usize, start: u64, end: u64) {
    let Some(g) = get().and_then(|l| l.gpus.get(dev)).and_then(Option::as_ref) else {
        return;
    };
    let (hf, ht) = (
        g.hold_from.load(Ordering::Acquire),
        g.hold_to.load(Ordering::Acquire),
    );
    let held = end.min(ht).saturating_sub(start.max(hf));
    if held > 0 {
        g.probe_held_gpu.fetch_add(held, Ordering::Relaxed);
    }
    let ns = (end - start).saturating_sub(held);
    if ns > 0 {
        g.metered.fetch_add(ns, Ordering::Relaxed);
        g.probe_gpu.fetch_add(ns, Ordering::Relaxed);
    }
    // Records of kernels run holding the lease are charged only where the
    // lease does not charge that time (`hold_ppm`).
    let charged = if g.hold_metered.load(Ordering::Relaxed) {
        ns + held
    } else {
        ns
    };
    if charged > 0 {
        g.pending.fetch_add(charged, Ordering::Relaxed);
    }
}

/// A probe's ratio (ppm, as of `at`) while it stands: measured, not stale,
/// and the meter still works.
fn standing(ratio: &AtomicU64, at: &AtomicU64, now: u64) -> Option<u64> {
    let r = ratio.load(Ordering::Relaxed);
    (r != NO_RATIO
        && now.saturating_sub(at.load(Ordering::Relaxed)) < RATIO_STALE_NS
        && crate::meter::usable())
    .then_some(r)
}

/// `ns` times `ppm` parts per million.
fn of_ppm(ns: u64, ppm: u64) -> u64 {
    (u128::from(ns) * u128::from(ppm) / 1_000_000) as u64
}

/// The meter begins a probe (its thread): GPU time and wall time in flight
/// count for it from now on.
pub fn probe_begin() {
    let Some(l) = get() else { return };
    for g in l.gpus.iter().flatten() {
        g.probe_gpu.store(0, Ordering::Relaxed);
        g.probe_wall.store(0, Ordering::Relaxed);
        g.probe_held_gpu.store(0, Ordering::Relaxed);
        g.probe_held.store(0, Ordering::Relaxed);
    }
}

/// A probe ended and its records are in (the meter's thread, at `now`):
/// each GPU's ratio of GPU time to wall time in flight over it, where the
/// process had work in flight in it. Whether it measured something, and
/// whether every such ratio agreed with the one standing before it
/// (steady: the meter may rest longer).
pub fn probe_end(now: u64) -> (bool, bool) {
    let Some(l) = get() else {
        return (false, false);
    };
    let (mut any, mut steady) = (false, true);
    for g in l.gpus.iter().flatten() {
        // A holder's time held up to the recording's end counts (its next
        // slice end may come long after: a service idle between requests).
        if g.mode.load(Ordering::Acquire) == HOLDING
            && let Some((_, u)) = crate::meter::window()
        {
            g.count_held(u.min(now));
        }
        let (held, held_gpu) = (
            g.probe_held.swap(0, Ordering::Relaxed),
            g.probe_held_gpu.swap(0, Ordering::Relaxed),
        );
        if held >= MIN_PROBE_WALL_NS {
            crate::debug!(
                "GPU time meter: held {:.1} ms of the probe, kernels ran {:.1} ms of it",
                held as f64 / 1e6,
                held_gpu as f64 / 1e6
            );
        }
        for (gpu, wall, ratio, at) in [
            (held_gpu, held, &g.hold_ratio_ppm, &g.hold_ratio_at),
            (
                g.probe_gpu.swap(0, Ordering::Relaxed),
                g.probe_wall.swap(0, Ordering::Relaxed),
                &g.ratio_ppm,
                &g.ratio_at,
            ),
        ] {
            if wall < MIN_PROBE_WALL_NS {
                continue;
            }
            let ppm = (u128::from(gpu) * 1_000_000 / u128::from(wall)).min(1_000_000) as u64;
            // The ratio before, where it was still standing.
            let before = standing(ratio, at, now);
            any = true;
            steady &= before.is_some_and(|b| ppm.abs_diff(b) <= STEADY_PPM.max(b / 4));
            ratio.store(ppm, Ordering::Relaxed);
            at.store(now, Ordering::Relaxed);
        }
    }
    (any, any && steady)
}

/// Who else competes for this process's GPUs now (each GPU's
/// `competition`, folded into one number that changes when any of them
/// does): the meter's thread ends a lengthened rest when it changes.
pub fn competition(now: u64) -> u64 {
    let Some(l) = get() else { return 0 };
    l.gpus.iter().flatten().fold(0u64, |acc, g| {
        let (n, heavy) = g.seg.competition(g.tenant, now);
        acc.wrapping_mul(1_000_003).wrapping_add(n << 32 | heavy)
    })
}

/// Charges what `metered` collected (after each buffer of records).
pub fn metered_flush(now: u64) {
    let Some(l) = get() else { return };
    for g in l.gpus.iter().flatten() {
        let ns = g.pending.swap(0, Ordering::Relaxed);
        if ns > 0 {
            g.seg.charge_free(g.tenant, ns, now);
        }
    }
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
                g.free_passes.load(Ordering::Relaxed),
                g.priv_passes.load(Ordering::Relaxed),
                g.held_passes.load(Ordering::Relaxed),
                g.leases.load(Ordering::Relaxed),
                ms(&g.held_back_ns),
                ms(&g.queue_wait_ns)
            );
        }
        if let Some(s) = crate::meter::summary() {
            crate::info!("GPU time meter: {s}");
        }
        for g in l.gpus.iter().flatten() {
            g.seg.release_proc(g.slot, now_ns());
            futex_wake_all(g.seg.generation_word());
        }
    }
}
