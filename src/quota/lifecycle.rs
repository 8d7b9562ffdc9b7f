//! The phase state machine of `init` (UNINIT -> INITIALIZING -> READY or
//! FAILED, waiters asleep on the phase word), and the process's fork and
//! exit handlers.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{BUILDING_FD, FAILED, FORKS, INITIALIZING, PHASE, READY, STATE, UNINIT, get};
use crate::sys::CUresult;

/// The state machine of `init` on the phase word `phase`: the first caller
/// runs `build`, the others sleep until it is done and share its outcome.
pub(super) fn run_once(
    phase: &AtomicU32,
    build: impl FnOnce() -> Result<(), String>,
) -> Result<(), CUresult> {
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
pub(super) fn phase_after_fork(phase: u32) -> u32 {
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
