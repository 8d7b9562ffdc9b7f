//! Loading CUPTI and the calls the meter makes to it: finding the library,
//! its entry points, the clock offset, switching kernel recording on and
//! off, and detaching and attaching CUPTI between probes.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::Ordering;

use super::{Loaded, SHARED, now_ns};
use crate::sys::CUcontext;

pub const CUPTI_SUCCESS: i32 = 0;
pub const CUPTI_ERROR_MAX_LIMIT_REACHED: i32 = 12;
pub const CUPTI_ERROR_UNKNOWN: i32 = 999;
/// `cuptiActivityFlushAll`'s flag: buffers holding incomplete records too.
const CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: u32 = 1;
/// Activity kinds of kernel records.
pub const KIND_KERNEL: u32 = 3;
pub const KIND_CONCURRENT_KERNEL: u32 = 10;

pub type Requested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub type Completed = unsafe extern "C" fn(CUcontext, u32, *mut u8, usize, usize);
/// `CUpti_CallbackFunc`: (userdata, domain, callback id, callback data).
pub type CallbackFunc = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
/// `cuptiSubscribe(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *)`:
/// the handle is a pointer to an opaque struct.
pub type Subscribe =
    unsafe extern "C" fn(*mut *mut c_void, Option<CallbackFunc>, *mut c_void) -> i32;
/// `cuptiSubscribe_v2(..., CUpti_SubscriberParams *)`: `cuptiSubscribe`
/// with optional parameters.
pub type Subscribe2 =
    unsafe extern "C" fn(*mut *mut c_void, Option<CallbackFunc>, *mut c_void, *mut c_void) -> i32;
/// `cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params *)`.
pub type ProfilerInit = unsafe extern "C" fn(*mut c_void) -> i32;

pub struct Api {
    pub register: unsafe extern "C" fn(Option<Requested>, Option<Completed>) -> i32,
    enable: unsafe extern "C" fn(u32) -> i32,
    disable: unsafe extern "C" fn(u32) -> i32,
    flush_all: unsafe extern "C" fn(u32) -> i32,
    pub next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut u8) -> i32,
    timestamp: unsafe extern "C" fn(*mut u64) -> i32,
    result_string: Option<unsafe extern "C" fn(i32, *mut *const c_char) -> i32>,
    /// `cuptiFinalize` (optional: without it CUPTI stays attached between
    /// probes).
    pub finalize: Option<unsafe extern "C" fn() -> i32>,
    /// `cuptiSubscribe`, `cuptiSubscribe_v2` and `cuptiProfilerInitialize`,
    /// where the library has them: where the program's calls to ours go
    /// on to.
    pub subscribe: Option<Subscribe>,
    pub subscribe2: Option<Subscribe2>,
    pub profiler_init: Option<ProfilerInit>,
}

/// Where to look for libcupti, in order, after `CUSLICE_CUPTI`.
fn candidates() -> Vec<String> {
    let mut v: Vec<String> = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(r) = std::env::var(var)
            && !r.is_empty()
        {
            roots.push(r);
        }
    }
    roots.push("/usr/local/cuda".into());
    for r in roots {
        for sub in ["extras/CUPTI/lib64", "targets/x86_64-linux/lib", "lib64"] {
            for so in ["libcupti.so.13", "libcupti.so.12", "libcupti.so"] {
                v.push(format!("{r}/{sub}/{so}"));
            }
        }
    }
    v
}

/// Opens libcupti: `CUSLICE_CUPTI`'s, else the one the program already
/// loaded, else the first of `candidates` that loads.
pub fn open() -> Result<(*mut c_void, String), String> {
    let chosen = std::env::var("CUSLICE_CUPTI").unwrap_or_default();
    let list = if chosen.is_empty() {
        // Already loaded by the program (PyTorch's profiler links it): that one.
        for (so, c) in [
            ("libcupti.so.13", c"libcupti.so.13"),
            ("libcupti.so.12", c"libcupti.so.12"),
            ("libcupti.so", c"libcupti.so"),
        ] {
            // SAFETY: dlopen with a NUL-terminated name; RTLD_NOLOAD only
            // returns an object already loaded.
            let h = unsafe {
                libc::dlopen(
                    c.as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_LOCAL,
                )
            };
            if !h.is_null() {
                return Ok((h, so.to_string()));
            }
        }
        candidates()
    } else {
        vec![chosen.clone()]
    };
    for p in &list {
        let Ok(c) = std::ffi::CString::new(p.as_str()) else {
            continue;
        };
        // SAFETY: dlopen with a NUL-terminated path.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !h.is_null() {
            return Ok((h, p.clone()));
        }
    }
    Err(if chosen.is_empty() {
        "no libcupti.so.13, .12 or libcupti.so on the library path or under CUDA_HOME, CUDA_PATH or /usr/local/cuda (set CUSLICE_CUPTI to its path)".into()
    } else {
        // SAFETY: dlerror returns null or a NUL-terminated string.
        let e = unsafe { libc::dlerror() };
        let why = if e.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: non-null NUL-terminated.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        format!("CUSLICE_CUPTI={chosen}: cannot load it: {why}")
    })
}

/// A function pointer of type `F` from a symbol's address.
///
/// # Safety
/// `p` is the address of a function of type `F`.
pub unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller vouches for the type.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// The entry points the meter uses, from the library `h`.
pub fn load_api(h: *mut c_void) -> Result<Api, String> {
    let get = |name: &CStr| -> Result<*mut c_void, String> {
        let p = crate::real::sym(h, name);
        if p.is_null() {
            Err(format!("it has no {}", name.to_string_lossy()))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol is CUPTI's function of the documented
    // signature its field declares.
    unsafe {
        Ok(Api {
            register: cast(get(c"cuptiActivityRegisterCallbacks")?),
            enable: cast(get(c"cuptiActivityEnable")?),
            disable: cast(get(c"cuptiActivityDisable")?),
            flush_all: cast(get(c"cuptiActivityFlushAll")?),
            next_record: cast(get(c"cuptiActivityGetNextRecord")?),
            timestamp: cast(get(c"cuptiGetTimestamp")?),
            result_string: get(c"cuptiGetResultString").ok().map(|p| cast(p)),
            finalize: get(c"cuptiFinalize").ok().map(|p| cast(p)),
            subscribe: get(c"cuptiSubscribe").ok().map(|p| cast(p)),
            subscribe2: get(c"cuptiSubscribe_v2").ok().map(|p| cast(p)),
            profiler_init: get(c"cuptiProfilerInitialize").ok().map(|p| cast(p)),
        })
    }
}

impl Loaded {
    /// CUPTI's words for `r`.
    pub fn error(&self, r: i32) -> String {
        if let Some(f) = self.api.result_string {
            let mut s: *const c_char = std::ptr::null();
            // SAFETY: CUPTI call with a valid out pointer; the string is static.
            if unsafe { f(r, &mut s) } == CUPTI_SUCCESS && !s.is_null() {
                // SAFETY: non-null NUL-terminated static string from CUPTI.
                return format!("{} ({r})", unsafe { CStr::from_ptr(s) }.to_string_lossy());
            }
        }
        format!("CUPTI error {r}")
    }

    /// Measures CUPTI's clock against ours.
    pub fn calibrate(&self) {
        let mut ts = 0u64;
        let a = now_ns();
        // SAFETY: CUPTI call with a valid out pointer.
        let r = unsafe { (self.api.timestamp)(&mut ts) };
        let b = now_ns();
        if r == CUPTI_SUCCESS {
            let ours = a / 2 + b / 2;
            self.offset
                .store(ts as i64 - ours as i64, Ordering::Release);
        }
    }

    /// Switches kernel recording on.
    pub fn enable(&self) -> i32 {
        // SAFETY: CUPTI call.
        unsafe { (self.api.enable)(KIND_CONCURRENT_KERNEL) }
    }

    /// Switches kernel recording off.
    pub fn disable(&self) {
        // SAFETY: CUPTI call.
        unsafe { (self.api.disable)(KIND_CONCURRENT_KERNEL) };
    }

    /// Delivers the completed buffers (to `completed`, on this thread).
    pub fn flush(&self) {
        // SAFETY: CUPTI call.
        unsafe { (self.api.flush_all)(0) };
    }

    /// Stops for good (said once, at info level).
    pub fn give_up(&self, why: &str) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::info!("GPU time meter stops ({why}): charging wall time in flight from now on");
    }

    /// Detaching between probes, once a probe's last records are in: the
    /// records still in CUPTI's buffers are delivered (a forced flush gives
    /// our buffers back), then CUPTI is detached (`finalize`). True where
    /// it is detached; false where the program's own profiler has CUPTI
    /// (or the meter stopped), or the program keeps CUPTI attached
    /// (`super::keeps_attached`, said once: `said`, the meter's thread's):
    /// it is left alone. The check and the detach are made under
    /// `loading`, which the program's
    /// registration, subscription and profiler initialisation take before
    /// they reach CUPTI: a program that makes one of those calls meanwhile
    /// makes it after the detach (CUPTI attaches again for it), never
    /// before it. Err: `cuptiFinalize`'s error.
    pub fn detach(
        &self,
        finalize: unsafe extern "C" fn() -> i32,
        said: &mut u8,
    ) -> Result<bool, i32> {
        let _g = SHARED.loading.lock().unwrap_or_else(|e| e.into_inner());
        if super::program_profiles() || self.lost.load(Ordering::Acquire) {
            return Ok(false);
        }
        if super::keeps_attached(said) {
            return Ok(false);
        }
        // SAFETY: CUPTI calls: the flush delivers buffers to `completed` on
        // this thread (our callbacks: the program's registration waits for
        // `loading`); then the detach, recording off and flushed.
        let r = unsafe {
            (self.api.flush_all)(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
            finalize()
        };
        if r == CUPTI_SUCCESS { Ok(true) } else { Err(r) }
    }
}
