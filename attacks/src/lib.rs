//! Hostile tenant programs for issue #12 (the host watchdog): each does one
//! thing a tenant can do today that the shim cannot stop, prints one line
//! starting with `ATTACK` saying what it did, then holds what it took until
//! killed (or for the number of seconds given), so that a test or a person
//! can watch a watchdog react.
//!
//! - `attack-quota BYTES [SECONDS]`: under the shim, raises its own
//!   container's memory quota in the memory segment, then allocates BYTES
//!   through the shim.
//! - `attack-gpuseg [SECONDS [PERIOD_MS]]`: gives its own tenant share 100
//!   and ceiling 100 in every per-GPU segment and the other tenants share 1,
//!   again every PERIOD_MS if given.
//! - `attack_noshim` (C, tests/apps/attack_noshim.c): reaches the driver
//!   around the shim through its own ELF symbol lookup.
//!
//! The segments are opened with cuslice-core's own types, so the layouts
//! they forge are the ones the shim uses, never a second copy.

use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

use cuslice_core::config::{self, Config};

/// Prints `attack: <msg>` on stderr and exits 2.
pub fn die(msg: &str) -> ! {
    eprintln!("attack: {msg}");
    std::process::exit(2)
}

/// The configuration the shim would load in this process (the mounted
/// quota file, `CUSLICE_CONFIG`, or the environment).
pub fn shim_config() -> Config {
    config::load(&|k| std::env::var(k).ok())
        .unwrap_or_else(|e| die(&format!("configuration: {}", e.0)))
}

/// Argument `i` (1-based) parsed, or `default` when absent.
pub fn arg<T: std::str::FromStr>(i: usize, what: &str, default: Option<T>) -> T {
    match std::env::args().nth(i) {
        Some(a) => a
            .parse()
            .unwrap_or_else(|_| die(&format!("{what}: cannot parse {a:?}"))),
        None => default.unwrap_or_else(|| die(&format!("missing argument: {what}"))),
    }
}

/// Keeps the process (and what it holds) alive: for `secs` seconds, or
/// until killed when `secs` is None. `tick`, if given, runs every `period`.
pub fn hold(secs: Option<f64>, period: Option<Duration>, mut tick: impl FnMut()) {
    let end = secs.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    loop {
        let left = end.map(|e| e.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return;
        }
        let step = [left, period, Some(Duration::from_secs(1))]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::from_secs(1));
        std::thread::sleep(step);
        if period.is_some() {
            tick();
        }
    }
}

pub type CuResult = i32;

/// The few driver functions an attack calls, found the ordinary way
/// (`dlopen("libcuda.so.1")` + `dlsym`): with the shim preloaded, its
/// `dlsym` hands out the shim's hooks, so every call goes through it.
pub struct Driver {
    pub init: unsafe extern "C" fn(u32) -> CuResult,
    pub device_get: unsafe extern "C" fn(*mut i32, i32) -> CuResult,
    pub primary_retain: unsafe extern "C" fn(*mut *mut c_void, i32) -> CuResult,
    pub ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
}

impl Driver {
    pub fn load() -> Driver {
        // SAFETY: dlopen with a constant NUL-terminated name.
        let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            die(&format!("dlopen(libcuda.so.1): {}", dlerror()));
        }
        let sym = |name: &CStr| -> *mut c_void {
            // SAFETY: h is a live handle; name is NUL-terminated.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) };
            if p.is_null() {
                die(&format!("dlsym({name:?}): {}", dlerror()));
            }
            p
        };
        // SAFETY: each symbol is the CUDA driver function of that name, whose
        // C signature is the one given (cuda.h); a data pointer from dlsym
        // converts to a function pointer on this platform.
        unsafe {
            Driver {
                init: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u32) -> CuResult>(
                    sym(c"cuInit"),
                ),
                device_get: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut i32, i32) -> CuResult,
                >(sym(c"cuDeviceGet")),
                primary_retain: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut *mut c_void, i32) -> CuResult,
                >(sym(c"cuDevicePrimaryCtxRetain")),
                ctx_set_current: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut c_void) -> CuResult,
                >(sym(c"cuCtxSetCurrent")),
                mem_alloc: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut u64, usize) -> CuResult,
                >(sym(c"cuMemAlloc_v2")),
            }
        }
    }

    /// cuInit, then device 0's primary context made current.
    pub fn init_device0(&self) {
        let mut dev = 0i32;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the driver's functions, called with valid out-pointers.
        unsafe {
            check("cuInit", (self.init)(0));
            check("cuDeviceGet", (self.device_get)(&mut dev, 0));
            check(
                "cuDevicePrimaryCtxRetain",
                (self.primary_retain)(&mut ctx, dev),
            );
            check("cuCtxSetCurrent", (self.ctx_set_current)(ctx));
        }
    }

    /// cuMemAlloc_v2(bytes): the device pointer, or the CUresult.
    pub fn alloc(&self, bytes: u64) -> Result<u64, CuResult> {
        let mut p = 0u64;
        // SAFETY: the driver's function with a valid out-pointer.
        let r = unsafe { (self.mem_alloc)(&mut p, bytes as usize) };
        if r == 0 { Ok(p) } else { Err(r) }
    }
}

fn check(what: &str, r: CuResult) {
    if r != 0 {
        die(&format!("{what} failed: CUresult {r}"));
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}
