//! The `dlsym` override: the second way a program reaches the driver
//! (`dlopen("libcuda.so.1")` + `dlsym(handle, "cuXxx")`), which plain symbol
//! interposition misses because `dlsym` on a handle does not search
//! preloaded objects.
//!
//! `dlsym` runs before anything is initialised (other libraries'
//! constructors, Rust's std) and for every symbol of every library, so:
//! - for a name that is not `cu*` / `nvml*` the hook tail-calls glibc's
//!   dlsym with the caller's own arguments and return address. glibc resolves
//!   `RTLD_NEXT` relative to the return address it sees, so the tail call
//!   keeps `dlsym(RTLD_NEXT, "malloc")` from another interposer exactly as
//!   it was. That path touches one atomic and the name's first bytes;
//! - for a `cu*` / `nvml*` name it asks the real dlsym and maps the answer
//!   by pointer identity ([`crate::real::map_to_hook`]): if the driver handed
//!   out the real address of a function we hook, the caller gets the hook.
//! - `RTLD_NEXT` lookups always take the tail call, whatever the name.

use std::ffi::{CStr, c_char, c_void};

use crate::real::{Lib, map_to_hook, real_dlsym};

/// Returned in rax:rdx to the assembly entry: `tail != 0` means "jump to
/// `value` (glibc's dlsym) with the caller's original arguments".
#[repr(C)]
pub struct Route {
    value: *mut c_void,
    tail: usize,
}

#[inline(always)]
fn lib_of(name: *const c_char) -> Option<Lib> {
    if name.is_null() {
        return None;
    }
    // SAFETY: name is a NUL-terminated string (dlsym's contract); we read at
    // most 4 bytes and stop at the NUL.
    let b = |i: usize| unsafe { *name.add(i) } as u8;
    if b(0) == b'c' && b(1) == b'u' {
        return Some(Lib::Cuda);
    }
    if b(0) == b'n' && b(1) == b'v' && b(2) == b'm' && b(3) == b'l' {
        return Some(Lib::Nvml);
    }
    None
}

extern "C" fn route(handle: *mut c_void, name: *const c_char) -> Route {
    let Some(real) = real_dlsym() else {
        // No glibc dlsym found at all: nothing sensible to hand out.
        return Route {
            value: std::ptr::null_mut(),
            tail: 0,
        };
    };
    let lib = match lib_of(name) {
        // RTLD_NEXT keeps glibc's meaning for every name: the caller asked
        // for the definition after itself. From the program (before cuslice)
        // that is cuslice's hook anyway; from an interposer loaded after
        // cuslice it is the driver, which is what such a chain wants.
        Some(lib) if !crate::ffi::disabled() && handle != libc::RTLD_NEXT => lib,
        _ => {
            return Route {
                value: real as *mut c_void,
                tail: 1,
            };
        }
    };
    // SAFETY: forwarding the caller's arguments to glibc's dlsym.
    let p = unsafe { real(handle, name) };
    // A program that looks CUPTI's registration, subscription or profiler
    // initialisation up by name gets ours (the GPU time meter steps aside
    // for its profiler, or stops detaching CUPTI from under it).
    if !p.is_null()
        // SAFETY: name is non-null and NUL-terminated (checked by lib_of).
        && let Some(ours) = crate::gputime::front_for(unsafe { CStr::from_ptr(name) }, p)
    {
        return Route {
            value: ours,
            tail: 0,
        };
    }
    let mapped = map_to_hook(p, lib);
    if mapped != p && crate::log::enabled(crate::log::Level::Debug) {
        // SAFETY: name is non-null and NUL-terminated (checked by lib_of).
        let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        crate::debug!("dlsym({n}) -> hook");
    }
    Route {
        value: mapped,
        tail: 0,
    }
}

/// The exported `dlsym`. Naked so that the pass-through path is a true tail
/// call: glibc sees the original caller's return address.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // Entry: rsp = 8 mod 16. Two pushes and 8 bytes realign it for the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rdx, rdx",
        "jnz 2f",
        "ret",
        "2:",
        "jmp rax",
        route = sym route,
    )
}
