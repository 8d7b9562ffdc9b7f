//! The CUPTI entry points the shim exports in front of CUPTI's own, so
//! that the meter sees the program use CUPTI itself: its own activity
//! callbacks (a profiler: the meter steps aside), its callback API or
//! range profiler (the meter never detaches CUPTI again). The program's
//! calls go on to CUPTI's functions.

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cupti::{
    CUPTI_ERROR_UNKNOWN, CallbackFunc, Completed, ProfilerInit, Requested, Subscribe, Subscribe2,
    cast,
};
use super::{CALLBACKS, PROFILES, SHARED, now_ns};

/// The program registers its own activity callbacks (a profiler: PyTorch's,
/// Nsight's in-process part): the meter steps aside for good, and the call
/// goes on to CUPTI.
fn program_registers() {
    let _g = SHARED.loading.lock().unwrap_or_else(|e| e.into_inner());
    if SHARED.program.fetch_or(PROFILES, Ordering::AcqRel) & PROFILES != 0 {
        return;
    }
    match SHARED.loaded.get() {
        Some(m) if !m.lost.swap(true, Ordering::AcqRel) => {
            if m.recording() {
                // Ours off and delivered before the program's callbacks
                // replace ours.
                m.until.store(now_ns(), Ordering::Release);
                m.disable();
                m.flush();
            }
        }
        Some(_) => return,
        // Started, CUPTI not loaded yet: it never will be.
        None if SHARED.started.load(Ordering::Acquire) => {}
        None => return,
    }
    crate::info!(
        "the program registers its own CUPTI activity callbacks (a profiler): cuslice's GPU time meter steps aside; charging wall time in flight"
    );
}

/// The CUPTI entry points the shim exports in front of CUPTI's own, so
/// that it sees the program call them (the dlsym hook hands ours out for
/// their names too).
#[derive(Clone, Copy)]
enum Front {
    Register = 0,
    Subscribe = 1,
    ProfilerInit = 2,
    Subscribe2 = 3,
}

const FRONT_NAMES: [&CStr; 4] = [
    c"cuptiActivityRegisterCallbacks",
    c"cuptiSubscribe",
    c"cuptiProfilerInitialize",
    c"cuptiSubscribe_v2",
];

/// Per entry point (by `Front`), in `super::Shared::fronts`: written by
/// the dlsym hook (`front_for`) and the fronts, read by the fronts, on the
/// program's threads.
pub(super) struct Fronts {
    /// CUPTI's function for the program's calls, once found.
    real: [AtomicUsize; 4],
    /// The real address the dlsym hook found for the name when it handed
    /// ours out (a program that opened libcupti privately, as Python's
    /// ctypes does, is not reached through `RTLD_NEXT`).
    seen: [AtomicUsize; 4],
}

impl Fronts {
    pub(super) const fn new() -> Self {
        Fronts {
            real: [const { AtomicUsize::new(0) }; 4],
            seen: [const { AtomicUsize::new(0) }; 4],
        }
    }
}

/// Our exports, by `Front`.
fn front_hooks() -> [*mut c_void; 4] {
    [
        cuptiActivityRegisterCallbacks as *mut c_void,
        cuptiSubscribe as *mut c_void,
        cuptiProfilerInitialize as *mut c_void,
        cuptiSubscribe_v2 as *mut c_void,
    ]
}

/// CUPTI's function behind our export `f`, for a program's call: the one
/// the dlsym hook found for the program where it looked the name up, else
/// the meter's library's where it is loaded and has it, else the next
/// definition after ours.
/// Null: there is none (no CUPTI in the process).
fn front_real(f: Front) -> *mut c_void {
    let i = f as usize;
    let fronts = &SHARED.fronts;
    let p = fronts.real[i].load(Ordering::Acquire);
    if p != 0 {
        return p as *mut c_void;
    }
    // What the program's own lookup found comes first: a program that
    // opened a libcupti of its own privately calls that library, not the
    // meter's.
    let seen = fronts.seen[i].load(Ordering::Acquire);
    let meter = SHARED.loaded.get().and_then(|m| match f {
        Front::Register => Some(m.api.register as *mut c_void),
        Front::Subscribe => m.api.subscribe.map(|s| s as *mut c_void),
        Front::ProfilerInit => m.api.profiler_init.map(|s| s as *mut c_void),
        Front::Subscribe2 => m.api.subscribe2.map(|s| s as *mut c_void),
    });
    let p = match (seen, meter) {
        (0, Some(p)) => p,
        (0, None) => crate::real::sym(libc::RTLD_NEXT, FRONT_NAMES[i]),
        (seen, _) => seen as *mut c_void,
    };
    if !p.is_null() {
        fronts.real[i].store(p as usize, Ordering::Release);
    }
    p
}

/// For the dlsym hook: our export where `name` is one of the CUPTI entry
/// points we front (`real`: what glibc's dlsym found for it, not null,
/// remembered as where the program's calls go on to).
pub fn front_for(name: &CStr, real: *mut c_void) -> Option<*mut c_void> {
    let i = FRONT_NAMES.iter().position(|n| *n == name)?;
    let ours = front_hooks()[i];
    if real != ours {
        let _ = SHARED.fronts.seen[i].compare_exchange(
            0,
            real as usize,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
    Some(ours)
}

/// The program's `cuptiActivityRegisterCallbacks` (exported so that a
/// profiler's registration is seen): the meter steps aside, then CUPTI
/// registers the program's callbacks.
///
/// # Safety
/// CUPTI's contract for `cuptiActivityRegisterCallbacks`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiActivityRegisterCallbacks(
    requested: Option<Requested>,
    completed: Option<Completed>,
) -> i32 {
    program_registers();
    let p = front_real(Front::Register);
    if p.is_null() {
        // No CUPTI in the process: what CUPTI's own stub would say.
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiActivityRegisterCallbacks (never ours:
    // the meter's handle, the address glibc's dlsym found, which is not
    // ours, or RTLD_NEXT).
    let f: unsafe extern "C" fn(Option<Requested>, Option<Completed>) -> i32 = unsafe { cast(p) };
    // SAFETY: forwarding the program's arguments.
    unsafe { f(requested, completed) }
}

/// The program uses CUPTI's callback API or range profiler: from now on
/// the meter never detaches CUPTI (set under `loading`, so that a detach
/// under way ends before the program's call reaches CUPTI, and none
/// begins after).
fn program_uses_cupti() {
    let _g = SHARED.loading.lock().unwrap_or_else(|e| e.into_inner());
    SHARED.program.fetch_or(CALLBACKS, Ordering::AcqRel);
}

/// The program's `cuptiSubscribe` (exported so that the meter sees that
/// the program uses CUPTI's callback API, which a detach would end): the
/// meter stops detaching CUPTI, then CUPTI subscribes the program.
///
/// # Safety
/// CUPTI's contract for `cuptiSubscribe`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiSubscribe(
    subscriber: *mut *mut c_void,
    callback: Option<CallbackFunc>,
    userdata: *mut c_void,
) -> i32 {
    program_uses_cupti();
    let p = front_real(Front::Subscribe);
    if p.is_null() {
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiSubscribe (never ours: see
    // cuptiActivityRegisterCallbacks).
    let f: Subscribe = unsafe { cast(p) };
    // SAFETY: forwarding the program's arguments.
    unsafe { f(subscriber, callback, userdata) }
}

/// The program's `cuptiSubscribe_v2` (CUDA 13's successor of
/// `cuptiSubscribe`; exported for the same reason).
///
/// # Safety
/// CUPTI's contract for `cuptiSubscribe_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiSubscribe_v2(
    subscriber: *mut *mut c_void,
    callback: Option<CallbackFunc>,
    userdata: *mut c_void,
    params: *mut c_void,
) -> i32 {
    program_uses_cupti();
    let p = front_real(Front::Subscribe2);
    if p.is_null() {
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiSubscribe_v2 (never ours: see
    // cuptiActivityRegisterCallbacks).
    let f: Subscribe2 = unsafe { cast(p) };
    // SAFETY: forwarding the program's arguments.
    unsafe { f(subscriber, callback, userdata, params) }
}

/// The program's `cuptiProfilerInitialize` (exported so that the meter
/// sees that the program uses CUPTI's range profiler, which a detach
/// would end): the meter stops detaching CUPTI, then CUPTI initialises
/// the profiler.
///
/// # Safety
/// CUPTI's contract for `cuptiProfilerInitialize`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiProfilerInitialize(params: *mut c_void) -> i32 {
    program_uses_cupti();
    let p = front_real(Front::ProfilerInit);
    if p.is_null() {
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiProfilerInitialize (never ours: see
    // cuptiActivityRegisterCallbacks).
    let f: ProfilerInit = unsafe { cast(p) };
    // SAFETY: forwarding the program's argument.
    unsafe { f(params) }
}
