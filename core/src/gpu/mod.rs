//! The per-GPU scheduling segment: one file per physical GPU (named by its
//! UUID) in a host directory that every container using that GPU mounts.
//! It holds each tenant's share, ceiling, class, accounting and demand, and
//! the lease that gives one process at a time the GPU for a short slice.
//!
//! Two parts, so that the scheduling can change without a new
//! shared-memory format:
//! - [`layout`]: the format (header, entries, registration, liveness);
//! - [`policy`]: what the shim decides on it (who launches freely, who
//!   waits for the lease, ceilings, the latency class).

pub mod audit;
pub mod layout;
pub mod policy;

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
