//! The per-GPU scheduling segment: one file per physical GPU (named by its
//! UUID) in a host directory that every container using that GPU mounts.
//! It holds each tenant's share, ceiling, class, accounting and demand, and
//! the lease that gives one process at a time the GPU for a short slice.
//!
//! Two parts, so that the scheduling can change without a new
//! shared-memory format:
//! - [`layout`]: the format (header, entries, registration, liveness);
//! - [`policy`]: what the shim decides on it (who launches freely, who
//!   waits for the lease, ceilings, the latency class);
//! - [`bounds`]: what a real cuslice process can write there, the limits
//!   `policy` clamps with and [`audit`] (the host watchdog) judges by.

pub mod audit;
pub mod bounds;
pub mod layout;
pub mod policy;

use std::sync::atomic::AtomicU32;

pub use bounds::{MAX_BURST_NS, MAX_SLICE_NS};
pub use layout::*;
pub use policy::*;

/// CLOCK_MONOTONIC in ns: the clock every time in this segment uses (host
/// wide, so comparable across containers).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime (vDSO) into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps while the segment word `word` holds `expected`, at most
/// `timeout_ns` (the caller looks again: a wake-up it missed costs at most
/// that long).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as _,
        tv_nsec: (timeout_ns % 1_000_000_000) as _,
    };
    // SAFETY: FUTEX_WAIT (shared: the word is in a MAP_SHARED file mapping
    // other processes wake) on a live 4-byte aligned atomic; the kernel only
    // sleeps if the word still holds `expected`.
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

/// Wakes every process sleeping on the segment word `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE (shared) on a live atomic; wakes sleepers, touches
    // no memory.
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
