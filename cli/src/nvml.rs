//! NVML, loaded at run time for the GPU header of `status` / `top` and the
//! exporter's GPU metrics: name, memory used / total, utilization, per GPU;
//! and for `cuslice watch`, per process: device memory
//! (`nvmlDeviceGetComputeRunningProcesses_v3`) and SM utilization
//! (`nvmlDeviceGetProcessUtilization`).
//!
//! The command does not link NVML (it must run on a host without the
//! NVIDIA driver too): it `dlopen`s `libnvidia-ml.so.1` (or
//! `$CUSLICE_REAL_NVML`, as the shim does), and without it carries on with
//! no GPU header, saying why in one line. In the tests, the fake NVML of
//! tests/fake answers.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};

type Device = *mut c_void;
type Ret = c_int;

const NVML_SUCCESS: Ret = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: Ret = 7;
const NVML_ERROR_NOT_FOUND: Ret = 6;
/// `usedGpuMemory` when NVML cannot tell (NVML_VALUE_NOT_AVAILABLE).
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// NVML_DEVICE_NAME_V2_BUFFER_SIZE; a UUID needs 80 at most.
const NAME_BYTES: usize = 96;

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`), what the `_v3` and
/// `_v2` process listings fill.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t`, what the unversioned listing fills.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UtilSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

const _: () = assert!(std::mem::size_of::<ProcessInfo>() == 24);
const _: () = assert!(std::mem::size_of::<ProcessInfoV1>() == 16);
const _: () = assert!(std::mem::size_of::<UtilSample>() == 32);

/// One compute process on a GPU, as NVML lists it: its PID in this
/// process's PID namespace, and the device memory it uses (None: NVML
/// cannot tell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    pub used: Option<u64>,
}

/// One process's SM utilization sample: percent of the sample period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtilizationSample {
    pub pid: u32,
    /// CPU time stamp, microseconds.
    pub time_us: u64,
    pub sm: u32,
}

type ProcsFn<T> = unsafe extern "C" fn(Device, *mut c_uint, *mut T) -> Ret;
type UtilFn = unsafe extern "C" fn(Device, *mut UtilSample, *mut c_uint, u64) -> Ret;

/// The process listing the library has, newest first.
#[derive(Clone, Copy)]
enum Procs {
    V3(ProcsFn<ProcessInfo>),
    V2(ProcsFn<ProcessInfo>),
    V1(ProcsFn<ProcessInfoV1>),
}

/// What NVML says about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML's index (as `nvidia-smi` numbers the GPUs).
    pub index: u32,
    /// `GPU-xxxxxxxx-...`, as cuslice names its GPU segments.
    pub uuid: String,
    pub name: String,
    pub memory_used: u64,
    pub memory_total: u64,
    /// Percent of the last sample period a kernel ran; None where NVML
    /// does not support it on this GPU.
    pub utilization: Option<u32>,
}

pub struct Nvml {
    lib: *mut c_void,
    shutdown: unsafe extern "C" fn() -> Ret,
    count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    by_index: unsafe extern "C" fn(c_uint, *mut Device) -> Ret,
    name: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> Ret,
    utilization: Option<unsafe extern "C" fn(Device, *mut Utilization) -> Ret>,
    procs: Option<Procs>,
    process_utilization: Option<UtilFn>,
    error_string: Option<unsafe extern "C" fn(Ret) -> *const c_char>,
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until
    // the next dl* call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// `dlsym(lib, name)` as a function pointer of type `F`, None if absent.
///
/// # Safety
///
/// `lib` is a live handle from dlopen, and `F` is an `unsafe extern "C"
/// fn` type matching the C prototype of `name`.
unsafe fn sym<F: Copy>(lib: *mut c_void, name: &str) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    let c = CString::new(name).ok()?;
    // SAFETY: a live handle (the caller's promise) and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null symbol address reinterpreted as the function
    // pointer type the caller names for it (same size, asserted above).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Nvml {
    /// Loads and initialises NVML. The error is one line: why not.
    pub fn open() -> Result<Nvml, String> {
        let path = std::env::var("CUSLICE_REAL_NVML")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into());
        let c = CString::new(path.clone()).map_err(|_| format!("{path:?}: contains NUL"))?;
        // SAFETY: dlopen with a NUL-terminated name; NVML's constructors
        // have no preconditions.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(dlerror());
        }
        let missing = |n: &str| format!("{path}: no symbol {n}");
        // SAFETY: `lib` is live; each type below is the symbol's prototype
        // in nvml.h (handles are pointers, lengths unsigned int).
        let nvml = unsafe {
            Nvml {
                lib,
                shutdown: sym(lib, "nvmlShutdown").ok_or_else(|| missing("nvmlShutdown"))?,
                count: sym(lib, "nvmlDeviceGetCount_v2")
                    .ok_or_else(|| missing("nvmlDeviceGetCount_v2"))?,
                by_index: sym(lib, "nvmlDeviceGetHandleByIndex_v2")
                    .ok_or_else(|| missing("nvmlDeviceGetHandleByIndex_v2"))?,
                name: sym(lib, "nvmlDeviceGetName").ok_or_else(|| missing("nvmlDeviceGetName"))?,
                uuid: sym(lib, "nvmlDeviceGetUUID").ok_or_else(|| missing("nvmlDeviceGetUUID"))?,
                memory: sym(lib, "nvmlDeviceGetMemoryInfo")
                    .ok_or_else(|| missing("nvmlDeviceGetMemoryInfo"))?,
                utilization: sym(lib, "nvmlDeviceGetUtilizationRates"),
                procs: sym(lib, "nvmlDeviceGetComputeRunningProcesses_v3")
                    .map(Procs::V3)
                    .or_else(|| sym(lib, "nvmlDeviceGetComputeRunningProcesses_v2").map(Procs::V2))
                    .or_else(|| sym(lib, "nvmlDeviceGetComputeRunningProcesses").map(Procs::V1)),
                process_utilization: sym(lib, "nvmlDeviceGetProcessUtilization"),
                error_string: sym(lib, "nvmlErrorString"),
            }
        };
        // SAFETY: resolved from the same library, prototype `nvmlReturn_t
        // nvmlInit_v2(void)`.
        let init: unsafe extern "C" fn() -> Ret =
            unsafe { sym(lib, "nvmlInit_v2") }.ok_or_else(|| missing("nvmlInit_v2"))?;
        // SAFETY: nvmlInit_v2 takes no arguments.
        let r = unsafe { init() };
        if r != NVML_SUCCESS {
            // Not initialised: Drop must not shut it down.
            let e = format!("nvmlInit: {}", nvml.error(r));
            // SAFETY: nothing of the library is used after this.
            unsafe { libc::dlclose(lib) };
            std::mem::forget(nvml);
            return Err(e);
        }
        Ok(nvml)
    }

    fn error(&self, r: Ret) -> String {
        let Some(f) = self.error_string else {
            return format!("NVML error {r}");
        };
        // SAFETY: nvmlErrorString returns a static NUL-terminated string
        // (or null, checked).
        let s = unsafe { f(r) };
        if s.is_null() {
            return format!("NVML error {r}");
        }
        // SAFETY: non-null, static, NUL-terminated.
        let text = unsafe { CStr::from_ptr(s) }.to_string_lossy();
        format!("{text} ({r})")
    }

    fn string(
        &self,
        f: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
        d: Device,
    ) -> Result<String, Ret> {
        let mut buf = [0 as c_char; NAME_BYTES];
        // SAFETY: a device handle NVML gave us and a writable buffer of the
        // length passed.
        let r = unsafe { f(d, buf.as_mut_ptr(), NAME_BYTES as c_uint) };
        if r != NVML_SUCCESS {
            return Err(r);
        }
        buf[NAME_BYTES - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (forced above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Every GPU NVML sees, by index. The error is one line.
    pub fn gpus(&self) -> Result<Vec<GpuInfo>, String> {
        let mut out = vec![];
        for d in self.devices()? {
            let i = d.index;
            let name = self
                .string(self.name, d.raw)
                .map_err(|r| format!("nvmlDeviceGetName({i}): {}", self.error(r)))?;
            let mut m = Memory::default();
            // SAFETY: a handle NVML gave us and a valid nvmlMemory_t.
            let r = unsafe { (self.memory)(d.raw, &mut m) };
            if r != NVML_SUCCESS {
                return Err(format!("nvmlDeviceGetMemoryInfo({i}): {}", self.error(r)));
            }
            let utilization = self.device_utilization(&d);
            out.push(GpuInfo {
                index: i,
                uuid: d.uuid,
                name,
                memory_used: m.used,
                memory_total: m.total,
                utilization,
            });
        }
        Ok(out)
    }

    /// Every GPU's index, UUID and handle (for `watch`, which asks per
    /// process at every pass). The error is one line.
    pub fn devices(&self) -> Result<Vec<DeviceHandle>, String> {
        let mut n: c_uint = 0;
        // SAFETY: a valid out pointer.
        let r = unsafe { (self.count)(&mut n) };
        if r != NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetCount: {}", self.error(r)));
        }
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let mut d: Device = std::ptr::null_mut();
            // SAFETY: an index below the count, a valid out pointer.
            let r = unsafe { (self.by_index)(i, &mut d) };
            if r != NVML_SUCCESS {
                return Err(format!(
                    "nvmlDeviceGetHandleByIndex({i}): {}",
                    self.error(r)
                ));
            }
            let uuid = self
                .string(self.uuid, d)
                .map_err(|r| format!("nvmlDeviceGetUUID({i}): {}", self.error(r)))?;
            out.push(DeviceHandle {
                index: i,
                uuid,
                raw: d,
            });
        }
        Ok(out)
    }

    /// Whether this NVML lists processes and their utilization (the
    /// error names what is missing).
    pub fn check_per_process(&self) -> Result<(), String> {
        if self.procs.is_none() {
            return Err("no symbol nvmlDeviceGetComputeRunningProcesses(_v3/_v2)".into());
        }
        if self.process_utilization.is_none() {
            return Err("no symbol nvmlDeviceGetProcessUtilization".into());
        }
        Ok(())
    }

    /// The compute processes on `d` and the memory each uses. `cap` is the
    /// buffer size to start with (the last count, say); it grows while NVML
    /// answers INSUFFICIENT_SIZE (processes come and go between calls).
    pub fn processes(&self, d: &DeviceHandle, cap: usize) -> Result<Vec<GpuProcess>, String> {
        let Some(procs) = self.procs else {
            return Err("nvmlDeviceGetComputeRunningProcesses: not in this NVML".into());
        };
        let mut cap = cap.clamp(16, 1 << 16);
        for _ in 0..8 {
            let mut n = cap as c_uint;
            let (r, got) = match procs {
                Procs::V3(f) | Procs::V2(f) => {
                    let mut buf = vec![ProcessInfo::default(); cap];
                    // SAFETY: a handle NVML gave us, a count and a buffer
                    // of that many nvmlProcessInfo_t.
                    let r = unsafe { f(d.raw, &mut n, buf.as_mut_ptr()) };
                    buf.truncate((n as usize).min(cap));
                    (
                        r,
                        buf.iter()
                            .map(|p| (p.pid, p.used_gpu_memory))
                            .collect::<Vec<_>>(),
                    )
                }
                Procs::V1(f) => {
                    let mut buf = vec![ProcessInfoV1::default(); cap];
                    // SAFETY: as above, with nvmlProcessInfo_v1_t.
                    let r = unsafe { f(d.raw, &mut n, buf.as_mut_ptr()) };
                    buf.truncate((n as usize).min(cap));
                    (
                        r,
                        buf.iter()
                            .map(|p| (p.pid, p.used_gpu_memory))
                            .collect::<Vec<_>>(),
                    )
                }
            };
            match r {
                NVML_SUCCESS => {
                    return Ok(got
                        .into_iter()
                        .map(|(pid, used)| GpuProcess {
                            pid,
                            used: (used != VALUE_NOT_AVAILABLE).then_some(used),
                        })
                        .collect());
                }
                NVML_ERROR_INSUFFICIENT_SIZE => {
                    cap = (n as usize).max(cap).saturating_mul(2).min(1 << 16);
                }
                r => {
                    return Err(format!(
                        "nvmlDeviceGetComputeRunningProcesses(GPU {}): {}",
                        d.index,
                        self.error(r)
                    ));
                }
            }
        }
        Err(format!(
            "nvmlDeviceGetComputeRunningProcesses(GPU {}): the process count kept growing",
            d.index
        ))
    }

    /// SM utilization samples of the processes on `d` taken after
    /// `last_seen_us` (NVML's CPU time stamps, microseconds); none is no
    /// error (NOT_FOUND: no sample since then).
    pub fn process_utilization(
        &self,
        d: &DeviceHandle,
        last_seen_us: u64,
        cap: usize,
    ) -> Result<Vec<UtilizationSample>, String> {
        let Some(f) = self.process_utilization else {
            return Err("nvmlDeviceGetProcessUtilization: not in this NVML".into());
        };
        let mut cap = cap.clamp(16, 1 << 16);
        for _ in 0..8 {
            let mut buf = vec![UtilSample::default(); cap];
            let mut n = cap as c_uint;
            // SAFETY: a handle NVML gave us, a buffer of `n` samples.
            let r = unsafe { f(d.raw, buf.as_mut_ptr(), &mut n, last_seen_us) };
            match r {
                NVML_SUCCESS => {
                    buf.truncate((n as usize).min(cap));
                    return Ok(buf
                        .iter()
                        .map(|s| UtilizationSample {
                            pid: s.pid,
                            time_us: s.time_stamp,
                            sm: s.sm_util,
                        })
                        .collect());
                }
                NVML_ERROR_NOT_FOUND => return Ok(vec![]),
                NVML_ERROR_INSUFFICIENT_SIZE => {
                    cap = (n as usize).max(cap).saturating_mul(2).min(1 << 16);
                }
                r => {
                    return Err(format!(
                        "nvmlDeviceGetProcessUtilization(GPU {}): {}",
                        d.index,
                        self.error(r)
                    ));
                }
            }
        }
        Err(format!(
            "nvmlDeviceGetProcessUtilization(GPU {}): the sample count kept growing",
            d.index
        ))
    }

    /// The device memory in use on the GPU, all processes together (one
    /// cheap call: the watch lists the processes again only when this
    /// moves).
    pub fn memory_used(&self, d: &DeviceHandle) -> Option<u64> {
        let mut m = Memory::default();
        // SAFETY: a handle NVML gave us and a valid nvmlMemory_t.
        (unsafe { (self.memory)(d.raw, &mut m) } == NVML_SUCCESS).then_some(m.used)
    }

    /// The GPU's utilization (percent of the last sample period a kernel
    /// ran); None where NVML does not tell.
    pub fn device_utilization(&self, d: &DeviceHandle) -> Option<u32> {
        let f = self.utilization?;
        let mut u = Utilization::default();
        // SAFETY: a handle NVML gave us and a valid nvmlUtilization_t.
        (unsafe { f(d.raw, &mut u) } == NVML_SUCCESS).then_some(u.gpu)
    }
}

/// A GPU's handle, valid while the [`Nvml`] it came from lives.
#[derive(Debug, Clone)]
pub struct DeviceHandle {
    pub index: u32,
    pub uuid: String,
    raw: Device,
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: NVML was initialised in `open`; nothing of the library is
        // used after this.
        unsafe {
            (self.shutdown)();
            libc::dlclose(self.lib);
        }
    }
}
