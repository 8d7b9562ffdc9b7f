//! CUPTI's kernel activity records: our buffer callbacks (registered when
//! CUPTI is loaded, and again after each detach), the buffers CUPTI asks
//! for and hands back, read into GPU time per device, each span counted
//! once.

use std::sync::atomic::{AtomicU64, Ordering};

use super::cupti::{
    CUPTI_ERROR_MAX_LIMIT_REACHED, CUPTI_SUCCESS, KIND_CONCURRENT_KERNEL, KIND_KERNEL,
};
use super::{Loaded, SHARED, now_ns};
use crate::sys::CUcontext;

/// One record buffer (CUPTI wants 8-byte alignment).
const BUFFER_BYTES: usize = 256 * 1024;
const BUFFER_ALIGN: usize = 8;
/// Offsets in a kernel record (`CUpti_ActivityKernel4` to `10`, CUDA 11 to
/// 13: unchanged; checked against NVIDIA's header on the GPU host).
const REC_START: usize = 16;
const REC_END: usize = 24;
const REC_DEVICE: usize = 40;

/// The part of a kernel that ran from `start` to `end` (CUPTI's clock,
/// `offset` ahead of ours) not yet counted on its device: the union of a
/// process's concurrent kernels is charged once. `covered` is the end of
/// what was counted; only what ran from `since` (the recording's start)
/// counts. Returns the part, in our clock, and the new end of what is
/// counted; None where nothing is new.
pub fn uncounted(
    start: u64,
    end: u64,
    offset: i64,
    since: u64,
    covered: u64,
) -> Option<(u64, u64)> {
    let s = (start as i64).wrapping_sub(offset).max(0) as u64;
    let e = (end as i64).wrapping_sub(offset).max(0) as u64;
    if e <= s || e < since {
        return None;
    }
    let from = s.max(covered).max(since);
    (e > from).then_some((from, e))
}

impl Loaded {
    /// Registers our buffer callbacks (CUPTI attaches).
    pub fn register(&self) -> i32 {
        // SAFETY: CUPTI call with our two callbacks (valid for the process).
        unsafe { (self.api.register)(Some(requested), Some(completed)) }
    }

    /// Before a probe where CUPTI was detached: our callbacks registered
    /// again (CUPTI attaches anew). False, the meter stopped for good,
    /// where the program's own profiler took CUPTI meanwhile or the
    /// registration failed (said, naming the library at `path`).
    pub fn attach(&self, path: &str) -> bool {
        let _g = SHARED.loading.lock().unwrap_or_else(|e| e.into_inner());
        if super::program_profiles() || self.lost.load(Ordering::Acquire) {
            self.lost.store(true, Ordering::Release);
            return false;
        }
        let r = self.register();
        if r != CUPTI_SUCCESS {
            crate::warn!(
                "{}: cannot register activity callbacks again: {}; charging wall time in flight",
                path,
                self.error(r)
            );
            self.lost.store(true, Ordering::Release);
            return false;
        }
        true
    }
}

/// CUPTI asks for a buffer: one from the pool, else a new one.
pub unsafe extern "C" fn requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    let Some(m) = SHARED.loaded.get() else { return };
    let reused = m.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let p = reused.unwrap_or_else(|| {
        match std::alloc::Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) {
            // SAFETY: a layout of non-zero size.
            Ok(layout) => unsafe { std::alloc::alloc(layout) as usize },
            // Unreachable for these constants; CUPTI then drops records.
            Err(_) => 0,
        }
    });
    // SAFETY: CUPTI passes valid out pointers.
    unsafe {
        *buffer = p as *mut u8;
        *size = if p == 0 { 0 } else { BUFFER_BYTES };
        *max_records = 0;
    }
}

/// CUPTI hands a buffer of records back: each kernel's new GPU time goes
/// to the sink (`super::Sink::kernels`), then the sink charges it
/// (`flush`), and the buffer goes back to the pool.
pub unsafe extern "C" fn completed(
    _ctx: CUcontext,
    _stream: u32,
    buf: *mut u8,
    _size: usize,
    valid: usize,
) {
    let Some(m) = SHARED.loaded.get() else { return };
    if buf.is_null() {
        return;
    }
    let offset = m.offset.load(Ordering::Acquire);
    let since = m.since.load(Ordering::Acquire);
    let mut rec: *mut u8 = std::ptr::null_mut();
    let mut n = 0u64;
    loop {
        // SAFETY: CUPTI walks the buffer it filled; `rec` is null or its
        // previous answer.
        let r = unsafe { (m.api.next_record)(buf, valid, &mut rec) };
        if r != CUPTI_SUCCESS || rec.is_null() {
            if r != CUPTI_ERROR_MAX_LIMIT_REACHED && r != CUPTI_SUCCESS {
                crate::debug!("reading kernel records: {}", m.error(r));
            }
            break;
        }
        // SAFETY: every record starts with its u32 kind; kernel records hold
        // start, end and deviceId at these offsets (CUpti_ActivityKernel4..10). Unaligned
        // reads: the layout is CUPTI's, not ours.
        let (start, end, dev) = unsafe {
            let kind = (rec as *const u32).read_unaligned();
            if kind != KIND_CONCURRENT_KERNEL && kind != KIND_KERNEL {
                continue;
            }
            (
                (rec.add(REC_START) as *const u64).read_unaligned(),
                (rec.add(REC_END) as *const u64).read_unaligned(),
                (rec.add(REC_DEVICE) as *const u32).read_unaligned(),
            )
        };
        n += 1;
        let Some(cov) = m.covered.get(dev as usize) else {
            continue;
        };
        if let Some((from, e)) = uncounted(start, end, offset, since, cov.load(Ordering::Relaxed)) {
            cov.fetch_max(e, Ordering::Relaxed);
            m.sink.kernels(dev as usize, from, e);
        }
    }
    m.records.fetch_add(n, Ordering::Relaxed);
    m.sink.flush(now_ns());
    m.pool
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(buf as usize);
}

/// Forgets what was counted (a probe begins).
pub fn reset_covered(covered: &[AtomicU64]) {
    for c in covered {
        c.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_kernels_are_counted_once() {
        // Two kernels overlapping by 30 ns: the second counts from the
        // first's end.
        let a = uncounted(100, 200, 0, 0, 0).expect("first");
        assert_eq!(a, (100, 200));
        assert_eq!(uncounted(170, 260, 0, 0, a.1), Some((200, 260)));
        // Inside what was counted: nothing.
        assert_eq!(uncounted(120, 180, 0, 0, 260), None);
        // After a gap: all of it.
        assert_eq!(uncounted(300, 350, 0, 0, 260), Some((300, 350)));
    }

    #[test]
    fn only_what_ran_since_the_recording_began_counts() {
        assert_eq!(uncounted(100, 200, 0, 150, 0), Some((150, 200)));
        assert_eq!(uncounted(100, 140, 0, 150, 0), None);
    }

    #[test]
    fn cuptis_clock_is_moved_to_ours() {
        // CUPTI's clock 1000 ahead.
        assert_eq!(uncounted(1100, 1200, 1000, 0, 0), Some((100, 200)));
        // Behind ours.
        assert_eq!(uncounted(100, 200, -1000, 0, 0), Some((1100, 1200)));
        // A record from before our clock's zero is clamped, not wrapped.
        assert_eq!(uncounted(100, 200, 1000, 0, 0), None);
    }

    #[test]
    fn an_empty_or_backwards_record_counts_nothing() {
        assert_eq!(uncounted(200, 200, 0, 0, 0), None);
        assert_eq!(uncounted(300, 200, 0, 0, 0), None);
    }
}
