//! The FFI boundary every hook goes through: kill switch, per-thread
//! reentrancy guard, panic containment and the status values a hook returns
//! when it cannot do its job.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sys::{CUresult, nvmlReturn_t};

/// Status types returned by hooked functions.
pub trait Status: Copy {
    /// What to return when the real library lacks the function.
    const NOT_FOUND: Self;
    /// What to return when a hook panicked (a cuslice bug).
    const PANIC: Self;
}

impl Status for CUresult {
    const NOT_FOUND: Self = CUresult::CUDA_ERROR_NOT_FOUND;
    const PANIC: Self = CUresult::CUDA_ERROR_UNKNOWN;
}

impl Status for nvmlReturn_t {
    const NOT_FOUND: Self = nvmlReturn_t::NVML_ERROR_FUNCTION_NOT_FOUND;
    const PANIC: Self = nvmlReturn_t::NVML_ERROR_UNKNOWN;
}

/// `CUSLICE_DISABLE=1`: every export and the dlsym / cuGetProcAddress hooks
/// pass straight through to the real driver. Set once by the constructor.
static DISABLED: AtomicBool = AtomicBool::new(false);

pub fn set_disabled(v: bool) {
    DISABLED.store(v, Ordering::Relaxed);
}

#[inline(always)]
pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

thread_local! {
    /// Set while this thread runs a hook body: a driver call made from inside
    /// a hook (or a driver callback into an export) goes straight to the real
    /// function instead of being policed twice.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Entry of a `pass` export: only counted for the debug log.
#[inline(always)]
pub fn pass(id: usize) {
    crate::log::count(id);
}

/// A `pre` step: runs before the real call on hot paths (launches), so it
/// takes no reentrancy guard (pre steps call only real functions). A panic
/// in it is contained and lets the call through: a limiter bug must not
/// fail the user's launch.
#[inline(always)]
pub fn pre<R: Status>(id: usize, step: impl FnOnce() -> Result<(), R>) -> Result<(), R> {
    if disabled() {
        return Ok(());
    }
    crate::log::count(id);
    match catch_unwind(AssertUnwindSafe(step)) {
        Ok(r) => r,
        Err(_) => {
            crate::log::pre_step_panicked(id);
            Ok(())
        }
    }
}

/// Entry of a `post` / `override` export. Runs `body` under the
/// reentrancy guard with panics contained; runs `bypass` (the plain real
/// call) when disabled or re-entered.
#[inline(always)]
pub fn hook<R: Status>(id: usize, body: impl FnOnce() -> R, bypass: impl FnOnce() -> R) -> R {
    if disabled() {
        return bypass();
    }
    crate::log::count(id);
    // try_with: during thread teardown the TLS slot may be gone; treat that
    // like re-entry (pass through) rather than panic.
    let entered = IN_HOOK
        .try_with(|g| {
            if g.get() {
                false
            } else {
                g.set(true);
                true
            }
        })
        .unwrap_or(false);
    if !entered {
        return bypass();
    }
    let r = catch_unwind(AssertUnwindSafe(body));
    let _ = IN_HOOK.try_with(|g| g.set(false));
    match r {
        Ok(v) => v,
        Err(_) => {
            crate::log::hook_panicked(id);
            R::PANIC
        }
    }
}

/// True while the current thread is inside a hook body (for the tests: the
/// guard itself is `hook`'s).
#[cfg(test)]
fn in_hook() -> bool {
    IN_HOOK.try_with(|g| g.get()).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_in_hook_becomes_error_status() {
        let r: CUresult = hook(0, || panic!("boom"), || CUresult::CUDA_SUCCESS);
        assert_eq!(r, CUresult::CUDA_ERROR_UNKNOWN);
        // The guard is released after a panic: the next hook runs its body.
        let r: CUresult = hook(
            0,
            || CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            || CUresult::CUDA_SUCCESS,
        );
        assert_eq!(r, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }

    #[test]
    fn reentrant_call_bypasses_body() {
        let r: CUresult = hook(
            0,
            || {
                assert!(in_hook());
                // A nested hook on the same thread must take the bypass.
                hook(
                    1,
                    || CUresult::CUDA_ERROR_UNKNOWN,
                    || CUresult::CUDA_ERROR_NOT_READY,
                )
            },
            || CUresult::CUDA_SUCCESS,
        );
        assert_eq!(r, CUresult::CUDA_ERROR_NOT_READY);
        assert!(!in_hook());
    }

    #[test]
    fn panic_in_a_pre_step_lets_the_call_through() {
        let r: Result<(), CUresult> = pre(0, || panic!("boom"));
        assert_eq!(r, Ok(()));
        let r: Result<(), CUresult> = pre(0, || Err(CUresult::CUDA_ERROR_NOT_READY));
        assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_READY));
    }

    #[test]
    fn nvml_status_values() {
        assert_eq!(<nvmlReturn_t as Status>::NOT_FOUND.0, 13);
        assert_eq!(<CUresult as Status>::NOT_FOUND.0, 500);
    }
}
