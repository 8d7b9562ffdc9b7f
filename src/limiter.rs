//! The compute share: every launch of a process whose tenant has a share or
//! a ceiling goes through `gate`, which lets it through while the process
//! holds the GPU's lease (see `cuslice_core::gpu` for the policy).
//!
//! Hot path (holding the lease, inside the slice): one fetch-sub, and a
//! clock read every 16th launch. No lock, no syscall, no allocation.
//!
//! At the end of a slice (its deadline passed, or it used its launch
//! budget): if nobody else waits and the ceiling allows, the slice is
//! renewed, and the queue is kept to about one slice of work by waiting for
//! an event recorded at the previous renewal. Otherwise the process drains
//! its work (`cuCtxSynchronize`), is charged the slice's wall time (it had
//! the GPU to itself), releases the lease, and waits for it again on a
//! futex in the shared segment.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use cuslice_core::config::{Config, format_uuid};
use cuslice_core::gpu::{Acquire, GpuSegment};

use crate::generated::real;
use crate::sys::*;

/// Slice length: long enough that a hand-over (drain + wake-up, tens of
/// microseconds) costs well under 1 %, short enough for fair sharing.
pub const DEFAULT_SLICE_NS: u64 = 20_000_000;

/// Launches let through in the first slice, before any measurement. The
/// budget then follows the measured GPU time per launch but at most doubles
/// from one slice to the next (a slow start: a first estimate taken before
/// the GPU queue filled would be far too optimistic for long kernels).
const FIRST_BUDGET: u64 = 4;

pub struct Gpu {
    seg: GpuSegment,
    tenant: usize,
    slot: usize,
    slice_ns: u64,
    holding: AtomicBool,
    deadline: AtomicU64,
    /// Launches left in this slice (the fast path's one atomic; 0 while the
    /// lease is not held, so that the next launch takes the slow path).
    credits: AtomicI64,
    /// Launches allowed in this slice.
    budget: AtomicU64,
    /// Measured average GPU time per launch, ns (0: not yet known).
    per_launch_ns: AtomicU64,
    slice_start: AtomicU64,
    /// Event recorded at the last renewal (bounds the queue).
    event: AtomicPtr<CUevent_st>,
    /// Serialises slice ends and lease waits within the process.
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
    // SAFETY: published once after construction and never freed.
    if p.is_null() {
        None
    } else {
        Some(unsafe { &*p })
    }
}

pub use cuslice_core::gpu::monotonic_ns as now_ns;

/// The tenant name: the configured one, else one derived from the segment
/// directory (unique per container, shared by its processes).
fn tenant_name(cfg: &Config) -> String {
    if let Some(t) = &cfg.tenant {
        return t.clone();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cfg.segment_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
    }
    format!("seg-{h:016x}")
}

/// Builds the limiter (called once from `quota::init`).
pub fn build(cfg: &Config, uuids: &[[u8; 16]]) -> Result<(), String> {
    let slice_ns = match std::env::var("CUSLICE_SLICE_MS") {
        Ok(v) => match v.parse::<u64>() {
            Ok(ms) if (1..=cuslice_core::gpu::MAX_SLICE_NS / 1_000_000).contains(&ms) => {
                ms * 1_000_000
            }
            _ => {
                return Err(format!(
                    "CUSLICE_SLICE_MS={v:?}: expected a whole number of milliseconds from 1 to 1000"
                ));
            }
        },
        Err(_) => DEFAULT_SLICE_NS,
    };
    let burst_ns = u64::from(
        cfg.compute_burst_ms
            .unwrap_or(cuslice_core::config::DEFAULT_COMPUTE_BURST_MS),
    ) * 1_000_000;
    let name = tenant_name(cfg);
    let mut gpus = Vec::with_capacity(uuids.len());
    let mut any = false;
    for (i, uuid) in uuids.iter().enumerate() {
        let l = cfg.limits_for(i as u32, uuid);
        if l.compute.is_none() && l.compute_max.is_none() {
            gpus.push(None);
            continue;
        }
        let max = l.compute_max.unwrap_or(100) as u32;
        let share = l.compute.map(u32::from).unwrap_or(max);
        let path = cfg
            .gpu_segment_dir
            .join(format!("{}.seg", format_uuid(uuid)));
        let seg = GpuSegment::open_or_create(&path).map_err(|e| e.to_string())?;
        let (tenant, old) = seg
            .register_tenant(&name, share, max, burst_ns, now_ns())
            .map_err(|e| e.to_string())?;
        if let Some((s, m)) = old {
            crate::info!(
                "tenant {name} on GPU {i}: share changed from {s}%/{m}% to {share}%/{max}%"
            );
        }
        // SAFETY: getpid has no preconditions.
        let slot = seg
            .claim_proc(tenant, unsafe { libc::getpid() } as u32)
            .map_err(|e| e.to_string())?;
        crate::info!(
            "GPU {i} ({}): compute share {share}%, ceiling {}, tenant {name}",
            format_uuid(uuid),
            if max >= 100 {
                "none".to_string()
            } else {
                format!("{max}%")
            }
        );
        any = true;
        gpus.push(Some(Gpu {
            seg,
            tenant,
            slot,
            slice_ns,
            holding: AtomicBool::new(false),
            deadline: AtomicU64::new(0),
            credits: AtomicI64::new(0),
            budget: AtomicU64::new(0),
            per_launch_ns: AtomicU64::new(0),
            slice_start: AtomicU64::new(0),
            event: AtomicPtr::new(std::ptr::null_mut()),
            slow: Mutex::new(()),
        }));
    }
    if any {
        STATE.store(Box::into_raw(Box::new(Limiter { gpus })), Ordering::Release);
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

/// Lets one launch on `stream` through, waiting for the lease if needed.
#[inline]
pub fn gate(stream: CUstream) -> Result<(), CUresult> {
    let Some(l) = get() else { return Ok(()) };
    let Some(g) = l.gpu() else { return Ok(()) };
    // One atomic per launch; the clock is read every 16th.
    let c = g.credits.fetch_sub(1, Ordering::AcqRel);
    if c > 1 && (c & 15 != 0 || now_ns() < g.deadline.load(Ordering::Relaxed)) {
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

fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as _,
        tv_nsec: (timeout_ns % 1_000_000_000) as _,
    };
    // SAFETY: FUTEX_WAIT (shared: the word is in a MAP_SHARED file mapping
    // other processes wake) on a live 4-byte aligned atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

impl Gpu {
    #[cold]
    fn slow_path(&self, stream: CUstream) {
        let _g = self.slow.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_ns();
        if self.holding.load(Ordering::Acquire) {
            let within = self.credits.load(Ordering::Acquire) > 0
                && now < self.deadline.load(Ordering::Relaxed);
            // Launches into a capturing stream are recorded, not run: they
            // neither end a slice nor wait.
            if within || capturing(stream) {
                return;
            }
            if !self.end_slice(stream, now) {
                return; // renewed
            }
        } else if capturing(stream) {
            return;
        }
        self.acquire();
    }

    /// Ends the current slice: renews it (returns false) or drains and
    /// releases the lease (returns true).
    fn end_slice(&self, stream: CUstream, now: u64) -> bool {
        let left = self.credits.load(Ordering::Acquire);
        let launches = (self.budget.load(Ordering::Relaxed) as i64 - left).max(1) as u64;
        if !self.seg.must_release(self.tenant, now, self.slice_ns) {
            // Keep about one slice queued: wait for what the previous slice
            // submitted before submitting more.
            let ev = self.event();
            if !ev.is_null() {
                // SAFETY: real driver calls on our own event.
                unsafe {
                    real::cuEventSynchronize(ev);
                    real::cuEventRecord(ev, stream);
                }
            }
            let t = now_ns();
            self.measure(t, launches);
            if let Some(deadline) = self.seg.renew(self.slot, self.tenant, t, self.slice_ns) {
                self.start_slice(t, deadline);
                return false;
            }
            self.credits.store(0, Ordering::Release);
            self.holding.store(false, Ordering::Release);
            return true; // the lease was taken from us
        }
        // SAFETY: real driver call; drains this context's work.
        unsafe { real::cuCtxSynchronize() };
        let t = now_ns();
        self.measure(t, launches);
        self.credits.store(0, Ordering::Release);
        self.holding.store(false, Ordering::Release);
        if self.seg.release(self.slot, self.tenant, t) {
            futex_wake_all(self.seg.generation_word());
        }
        true
    }

    fn event(&self) -> CUevent {
        let e = self.event.load(Ordering::Acquire);
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
        self.event.store(e, Ordering::Release);
        e
    }

    /// GPU time per launch over the slice that just ended.
    fn measure(&self, now: u64, launches: u64) {
        let start = self.slice_start.load(Ordering::Relaxed);
        self.per_launch_ns.store(
            now.saturating_sub(start) / launches.max(1),
            Ordering::Relaxed,
        );
    }

    fn start_slice(&self, now: u64, deadline: u64) {
        let per = self.per_launch_ns.load(Ordering::Relaxed);
        let prev = self.budget.load(Ordering::Relaxed).max(FIRST_BUDGET);
        let budget = match self.slice_ns.checked_div(per) {
            Some(n) => (n.max(1) + 1).min(prev.saturating_mul(2)),
            None => FIRST_BUDGET,
        };
        self.slice_start.store(now, Ordering::Relaxed);
        self.budget.store(budget, Ordering::Relaxed);
        self.deadline.store(deadline, Ordering::Relaxed);
        self.holding.store(true, Ordering::Release);
        // The launch that called us is the slice's first.
        self.credits.store(budget as i64 - 1, Ordering::Release);
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
                    self.start_slice(now, deadline);
                    return;
                }
                Acquire::Wait { until } => {
                    let timeout = until.saturating_sub(now).clamp(50_000, 2_000_000);
                    futex_wait(seg.generation_word(), generation, timeout);
                }
            }
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
            unsafe { libc::close(g.seg.raw_fd()) };
        }
    }
}

/// Normal exit: give the lease (if held) and our slots back.
pub fn at_exit() {
    if let Some(l) = get() {
        for g in l.gpus.iter().flatten() {
            g.seg.release_proc(g.slot, now_ns());
            futex_wake_all(g.seg.generation_word());
        }
    }
}
