//! Finding the real driver libraries and their functions.
//!
//! - The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", ...)`: the
//!   shim exports its own `dlsym`, so it must never call the symbol `dlsym`.
//! - The real `libcuda.so.1` / `libnvidia-ml.so.1` come from
//!   `CUSLICE_REAL_LIBCUDA` / `CUSLICE_REAL_NVML` or the normal search path,
//!   and are refused if they turn out to be cuslice itself.
//! - Each declared function is resolved lazily, once, into an atomic slot;
//!   a symbol the library lacks stays "missing" and its callers get the
//!   library's not-found status, never a call through NULL.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::generated::{COUNT, EXPORTED, LIBS, NAMES, hook_addr};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda = 0,
    Nvml = 1,
}

impl Lib {
    fn default_name(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }

    fn env_var(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"CUSLICE_REAL_LIBCUDA",
            Lib::Nvml => c"CUSLICE_REAL_NVML",
        }
    }

    /// A function every real library of this kind exports, used to tell the
    /// real library from cuslice itself.
    fn probe(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"cuInit",
            Lib::Nvml => c"nvmlDeviceGetMemoryInfo",
        }
    }
}

const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

/// The resolved address of one declared function.
pub struct Slot(AtomicUsize);

impl Slot {
    pub const fn new() -> Slot {
        Slot(AtomicUsize::new(UNRESOLVED))
    }
}

impl Default for Slot {
    fn default() -> Self {
        Slot::new()
    }
}

static SLOTS: [Slot; COUNT] = [const { Slot::new() }; COUNT];

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

unsafe extern "C" {
    // Not in every libc crate version for every target; declared here.
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The C library's own `dlsym`.
///
/// Safe to call from the `dlsym` hook before anything is initialised: one
/// atomic load on the fast path, no allocation, no lazy statics.
#[inline]
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings; it
            // returns the next object's (libc's) versioned dlsym or null.
            let f = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
            if !f.is_null() {
                p = f as usize;
                break;
            }
        }
        if p == 0 {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is the address of glibc's dlsym, whose type is DlsymFn.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// Looks `name` up in `handle` with the real dlsym.
pub(crate) fn sym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: real dlsym with a valid handle (or pseudo-handle) and name.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

const LIB_UNRESOLVED: usize = 0;
/// Failed and reported.
const LIB_FAILED: usize = 1;
/// Failed while probing quietly: not reported yet, retried by a real use.
const LIB_FAILED_QUIET: usize = 2;
static HANDLES: [AtomicUsize; 2] = [
    AtomicUsize::new(LIB_UNRESOLVED),
    AtomicUsize::new(LIB_UNRESOLVED),
];

fn dlerror_text() -> &'static str {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error";
    }
    // SAFETY: non-null, NUL-terminated; the text is only read right away.
    unsafe { CStr::from_ptr(e) }
        .to_str()
        .unwrap_or("(non-UTF-8 dlerror text)")
}

/// Handle of the real library, loading it on first use. `quiet`: a failure
/// is logged at debug level only (used when the shim merely probes).
pub fn handle(lib: Lib, quiet: bool) -> Option<*mut c_void> {
    let slot = &HANDLES[lib as usize];
    match slot.load(Ordering::Acquire) {
        LIB_UNRESOLVED => {}
        LIB_FAILED => return None,
        LIB_FAILED_QUIET if quiet => return None,
        LIB_FAILED_QUIET => {}
        h => return Some(h as *mut c_void),
    }
    // SAFETY: getenv with a NUL-terminated name; the result is read at once.
    let env = unsafe { libc::getenv(lib.env_var().as_ptr()) };
    // SAFETY: a non-null getenv result is a NUL-terminated string: its first
    // byte is readable.
    let (path, from_env) = if env.is_null() || unsafe { *env } == 0 {
        (lib.default_name().as_ptr(), false)
    } else {
        (env as *const c_char, true)
    };
    // SAFETY: path is NUL-terminated.
    let path_str = unsafe { CStr::from_ptr(path) }.to_string_lossy();
    // SAFETY: dlopen with a NUL-terminated path.
    let h = unsafe { libc::dlopen(path, libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        let why = dlerror_text();
        let how = if from_env {
            lib.env_var().to_string_lossy()
        } else {
            "the library search path".into()
        };
        if quiet {
            crate::debug!("cannot load {path_str} (from {how}): {why}");
        } else {
            crate::error!(
                "cannot load the real driver library {path_str} (from {how}): {why}; its functions return a not-found error"
            );
        }
        slot.store(
            if quiet { LIB_FAILED_QUIET } else { LIB_FAILED },
            Ordering::Release,
        );
        return None;
    }
    // Refuse ourselves: the probe function must not resolve to our export.
    let probe = sym(h, lib.probe());
    if !probe.is_null() && is_own_export(probe) {
        crate::error!(
            "{path_str} is cuslice itself, not the real driver; set {} to the real library's path",
            lib.env_var().to_string_lossy()
        );
        slot.store(LIB_FAILED, Ordering::Release);
        return None;
    }
    // Racing threads get handles to the same object (dlopen is refcounted);
    // the last store wins and every stored handle stays valid.
    slot.store(h as usize, Ordering::Release);
    Some(h)
}

/// The real address of declared function `id`, resolving it on first use.
#[inline]
pub fn get(id: usize) -> Option<*mut c_void> {
    let v = SLOTS[id].0.load(Ordering::Acquire);
    if v > MISSING {
        return Some(v as *mut c_void);
    }
    if v == MISSING {
        return None;
    }
    resolve(id, false)
}

#[cold]
fn resolve(id: usize, quiet: bool) -> Option<*mut c_void> {
    let lib = LIBS[id];
    let h = handle(lib, quiet)?;
    let p = sym(h, NAMES[id]);
    if p.is_null() {
        crate::debug!(
            "the real {} has no {}",
            lib.default_name().to_string_lossy(),
            crate::log::name(id)
        );
        SLOTS[id].0.store(MISSING, Ordering::Release);
        return None;
    }
    SLOTS[id].0.store(p as usize, Ordering::Release);
    Some(p)
}

/// Whether `p` is the address of one of cuslice's exported hooks.
pub fn is_own_export(p: *mut c_void) -> bool {
    (0..COUNT).any(|i| EXPORTED[i] && hook_addr(i) == p)
}

/// Pointer identity: if `p` is the real address of a function cuslice
/// hooks, returns cuslice's hook for it; otherwise `p` unchanged. Used for
/// whatever the real `dlsym` or `cuGetProcAddress` handed back, so the
/// driver keeps choosing the right version for the caller.
///
/// A linear scan of atomic slots (resolved on first use): no lock, no
/// allocation, safe to re-enter from a library constructor that runs while
/// the driver is being loaded. It runs only for `cu*` / `nvml*` lookups,
/// a few hundred at start-up, never on a launch or allocation.
pub fn map_to_hook(p: *mut c_void, lib: Lib) -> *mut c_void {
    if p.is_null() || crate::ffi::disabled() || is_own_export(p) {
        return p;
    }
    for id in 0..COUNT {
        if !EXPORTED[id] || LIBS[id] != lib {
            continue;
        }
        let real = match SLOTS[id].0.load(Ordering::Acquire) {
            MISSING => continue,
            UNRESOLVED => match resolve(id, true) {
                Some(r) => r,
                None => continue,
            },
            v => v as *mut c_void,
        };
        if real == p {
            return hook_addr(id);
        }
    }
    p
}

/// Path of the shared object containing `p` (for diagnostics).
pub(crate) fn object_path(p: *mut c_void) -> Option<String> {
    // SAFETY: Dl_info is a plain C struct (pointers and integers), valid
    // all zero.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills info for any address; we check its result.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}
