//! The node's GPUs, as the plugin names them: device `gpu-<index>` of the
//! node's pool, with its UUID, memory and device node. From NVML
//! (`libnvidia-ml.so.1`, loaded at run time: the plugin starts on a host
//! without it and says so), or from a JSON file (`--gpus-file`, for tests
//! and for hosts where NVML is elsewhere).

use serde::{Deserialize, Serialize};

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// NVML's index.
    pub index: u32,
    /// `GPU-xxxxxxxx-...` as NVML gives it.
    pub uuid: String,
    /// Total memory, bytes.
    pub memory: u64,
    /// The minor number of its device node (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// Its product name ("NVIDIA H200").
    #[serde(default)]
    pub product: String,
}

impl Gpu {
    /// Its device name in the ResourceSlice and in allocations.
    pub fn device_name(&self) -> String {
        format!("gpu-{}", self.index)
    }
}

/// Where the GPUs come from.
pub trait Inventory: Send + Sync {
    fn gpus(&self) -> Result<Vec<Gpu>, String>;
}

/// A fixed list (a file, or a test's).
pub struct Fixed(pub Vec<Gpu>);

impl Inventory for Fixed {
    fn gpus(&self) -> Result<Vec<Gpu>, String> {
        Ok(self.0.clone())
    }
}

/// A JSON file holding a list of [`Gpu`]s, read at each call (a GPU taken
/// out of it is gone for the next prepare).
pub struct File(pub std::path::PathBuf);

impl Inventory for File {
    fn gpus(&self) -> Result<Vec<Gpu>, String> {
        let text =
            std::fs::read_to_string(&self.0).map_err(|e| format!("{}: {e}", self.0.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", self.0.display()))
    }
}

/// NVML, asked at each call.
pub struct Nvml;

impl Inventory for Nvml {
    fn gpus(&self) -> Result<Vec<Gpu>, String> {
        nvml::gpus()
    }
}

mod nvml {
    use super::Gpu;
    use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

    #[repr(C)]
    #[derive(Default)]
    struct Memory {
        total: u64,
        free: u64,
        used: u64,
    }

    type Device = *mut c_void;

    fn sym<T>(lib: *mut c_void, name: &CStr) -> Result<T, String> {
        // SAFETY: dlsym on a handle dlopen returned, a NUL-terminated name.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        if p.is_null() {
            return Err(format!(
                "libnvidia-ml.so.1 has no {}",
                name.to_string_lossy()
            ));
        }
        // SAFETY: T is the function pointer type NVML documents for this
        // symbol (the callers name each), of a pointer's size.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }

    pub fn gpus() -> Result<Vec<Gpu>, String> {
        let path =
            std::env::var("CUSLICE_REAL_NVML").unwrap_or_else(|_| "libnvidia-ml.so.1".into());
        let c = std::ffi::CString::new(path.clone()).map_err(|_| "NUL in the NVML path")?;
        // SAFETY: dlopen with a NUL-terminated name; the handle is kept
        // (never closed: NVML stays loaded for the process's life).
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(format!(
                "cannot load {path}: is the NVIDIA driver installed?"
            ));
        }
        let init: extern "C" fn() -> c_int = sym(lib, c"nvmlInit_v2")?;
        let count: extern "C" fn(*mut c_uint) -> c_int = sym(lib, c"nvmlDeviceGetCount_v2")?;
        let by_index: extern "C" fn(c_uint, *mut Device) -> c_int =
            sym(lib, c"nvmlDeviceGetHandleByIndex_v2")?;
        let uuid: extern "C" fn(Device, *mut c_char, c_uint) -> c_int =
            sym(lib, c"nvmlDeviceGetUUID")?;
        let name: extern "C" fn(Device, *mut c_char, c_uint) -> c_int =
            sym(lib, c"nvmlDeviceGetName")?;
        let memory: extern "C" fn(Device, *mut Memory) -> c_int =
            sym(lib, c"nvmlDeviceGetMemoryInfo")?;
        let minor: extern "C" fn(Device, *mut c_uint) -> c_int =
            sym(lib, c"nvmlDeviceGetMinorNumber")?;
        let ok = |what: &str, r: c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(format!("NVML {what}: error {r}"))
            }
        };
        ok("nvmlInit_v2", init())?;
        let mut n: c_uint = 0;
        ok("nvmlDeviceGetCount_v2", count(&mut n))?;
        let text =
            |f: extern "C" fn(Device, *mut c_char, c_uint) -> c_int, d: Device, what: &str| {
                let mut buf = [0u8; 96];
                ok(what, f(d, buf.as_mut_ptr().cast(), buf.len() as c_uint))?;
                CStr::from_bytes_until_nul(&buf)
                    .map(|s| s.to_string_lossy().into_owned())
                    .map_err(|_| format!("NVML {what}: no NUL in its answer"))
            };
        (0..n)
            .map(|i| {
                let mut d: Device = std::ptr::null_mut();
                ok("nvmlDeviceGetHandleByIndex_v2", by_index(i, &mut d))?;
                let mut m = Memory::default();
                ok("nvmlDeviceGetMemoryInfo", memory(d, &mut m))?;
                let mut mi: c_uint = 0;
                ok("nvmlDeviceGetMinorNumber", minor(d, &mut mi))?;
                Ok(Gpu {
                    index: i,
                    uuid: text(uuid, d, "nvmlDeviceGetUUID")?,
                    memory: m.total,
                    minor: mi,
                    product: text(name, d, "nvmlDeviceGetName").unwrap_or_default(),
                })
            })
            .collect()
    }
}
