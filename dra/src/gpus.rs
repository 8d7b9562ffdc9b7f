//! The node's GPUs, as the plugin names them: device `gpu-<index>` of the
//! node's pool, with its UUID, memory, device node and CUDA compute
//! capability. From NVML (`libnvidia-ml.so.1`, loaded at run time: the
//! plugin starts on a host without it and says so), or from a JSON file
//! (`--gpus-file`, for tests and for hosts where NVML is elsewhere): a list
//! of
//!
//! ```json
//! {"index": 0, "uuid": "GPU-...", "memory": 151397597184, "minor": 0,
//!  "product": "NVIDIA H200", "compute_capability": "9.0"}
//! ```
//!
//! (`product` and `compute_capability` optional; no other key).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A CUDA compute capability, `major.minor` (9.0 for an H100 or an H200,
/// 8.0 for an A100): what NVML's `nvmlDeviceGetCudaComputeCapability` and
/// CUDA's `cuDeviceGetAttribute` answer. Written `"9.0"` in the inventory
/// file; published as the semantic version `9.0.0` (see
/// [`crate::slice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl ComputeCapability {
    /// As a semantic version (semver.org 2.0.0), the form of a DRA `version`
    /// attribute: 9.0 is `9.0.0`.
    pub fn semver(&self) -> String {
        format!("{}.{}.0", self.major, self.minor)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = String;

    /// `"<major>.<minor>"`, two decimal numbers (digits only: no sign, no
    /// space, no third part).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("compute capability {s:?}: expected \"<major>.<minor>\", e.g. \"9.0\"");
        let (major, minor) = s.split_once('.').ok_or_else(bad)?;
        let num = |t: &str| {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse::<u32>().map_err(|_| bad())
        };
        Ok(ComputeCapability {
            major: num(major)?,
            minor: num(minor)?,
        })
    }
}

impl Serialize for ComputeCapability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ComputeCapability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

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
    /// Its CUDA compute capability. Always there from NVML (a GPU whose
    /// capability NVML will not tell is an error); optional in the file
    /// (`"compute_capability": "9.0"`; files from before it still parse),
    /// and without it the slice has no `cudaComputeCapability` attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<ComputeCapability>,
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
    use super::{ComputeCapability, Gpu};
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
        let capability: extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int =
            sym(lib, c"nvmlDeviceGetCudaComputeCapability")?;
        // Only for the messages: an NVML without it still lists its GPUs.
        let describe: Option<extern "C" fn(c_int) -> *const c_char> =
            sym(lib, c"nvmlErrorString").ok();
        let ok = |what: &str, r: c_int| {
            if r == 0 {
                return Ok(());
            }
            let text = describe
                .map(|f| f(r))
                .filter(|p| !p.is_null())
                // SAFETY: nvmlErrorString returns a static NUL-terminated
                // string (checked non-NULL).
                .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
            Err(match text {
                Some(t) => format!("NVML {what}: error {r} ({t})"),
                None => format!("NVML {what}: error {r}"),
            })
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
                ok("nvmlDeviceGetHandleByIndex_v2", by_index(i, &mut d))
                    .map_err(|e| format!("GPU {i}: {e}"))?;
                let uuid = text(uuid, d, "nvmlDeviceGetUUID").map_err(|e| format!("GPU {i}: {e}"))?;
                // Every error from here on names the GPU by index and UUID.
                let of = |e: String| format!("GPU {i} ({uuid}): {e}");
                let mut m = Memory::default();
                ok("nvmlDeviceGetMemoryInfo", memory(d, &mut m)).map_err(of)?;
                let mut mi: c_uint = 0;
                ok("nvmlDeviceGetMinorNumber", minor(d, &mut mi)).map_err(of)?;
                let (mut major, mut minor_cc): (c_int, c_int) = (-1, -1);
                ok(
                    "nvmlDeviceGetCudaComputeCapability",
                    capability(d, &mut major, &mut minor_cc),
                )
                .map_err(of)?;
                let cc = match (u32::try_from(major), u32::try_from(minor_cc)) {
                    (Ok(major), Ok(minor)) => ComputeCapability { major, minor },
                    _ => {
                        return Err(of(format!(
                            "NVML nvmlDeviceGetCudaComputeCapability: {major}.{minor_cc}, not a compute capability"
                        )));
                    }
                };
                Ok(Gpu {
                    index: i,
                    memory: m.total,
                    minor: mi,
                    product: text(name, d, "nvmlDeviceGetName").unwrap_or_default(),
                    compute_capability: Some(cc),
                    uuid,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"[{"index": 0, "uuid": "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b", "memory": 151397597184, "minor": 0, "product": "NVIDIA H200"}]"#;

    #[test]
    fn the_file_form_takes_an_optional_compute_capability() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A file from before the field: still read, without one.
        let old = dir.path().join("old.json");
        std::fs::write(&old, OLD).expect("write");
        let gpus = File(old).gpus().expect("an old file parses");
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].compute_capability, None);
        assert_eq!(gpus[0].product, "NVIDIA H200");
        // With it.
        let new = dir.path().join("new.json");
        std::fs::write(
            &new,
            r#"[{"index": 1, "uuid": "GPU-1", "memory": 1, "minor": 1, "compute_capability": "12.1"}]"#,
        )
        .expect("write");
        let gpus = File(new).gpus().expect("parses");
        let cc = gpus[0].compute_capability.expect("compute capability");
        assert_eq!((cc.major, cc.minor), (12, 1));
        assert_eq!(cc.to_string(), "12.1");
        assert_eq!(cc.semver(), "12.1.0");
        // Written back the same way; absent stays absent.
        let j = serde_json::to_value(&gpus[0]).expect("json");
        assert_eq!(j["compute_capability"], "12.1");
        let j: serde_json::Value =
            serde_json::to_value(serde_json::from_str::<Vec<Gpu>>(OLD).expect("old"))
                .expect("json");
        assert!(j[0].get("compute_capability").is_none(), "{j}");
    }

    #[test]
    fn a_malformed_compute_capability_in_the_file_is_an_error_naming_it() {
        let file = |v: &str| {
            format!(
                r#"[{{"index": 0, "uuid": "GPU-1", "memory": 1, "minor": 0, "compute_capability": {v}}}]"#
            )
        };
        for bad in [
            "9",
            "9.0.0",
            "9.",
            ".0",
            "+9.0",
            "9.-1",
            " 9.0",
            "9.0 ",
            "nine.zero",
            "4294967296.0",
            "",
        ] {
            let e = serde_json::from_str::<Vec<Gpu>>(&file(&format!("{bad:?}")))
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains(&format!("compute capability {bad:?}")) && e.contains("\"9.0\""),
                "{bad:?}: {e}"
            );
        }
        // Not a string: two numbers would read 9.1 and 9.10 alike.
        for bad in ["9.0", "90", "[9, 0]"] {
            serde_json::from_str::<Vec<Gpu>>(&file(bad)).expect_err(bad);
        }
        // A misspelt key is refused, as every unknown key is.
        let text = r#"[{"index": 0, "uuid": "GPU-1", "memory": 1, "minor": 0, "computeCapability": "9.0"}]"#;
        let e = serde_json::from_str::<Vec<Gpu>>(text).expect_err("unknown key");
        assert!(e.to_string().contains("computeCapability"), "{e}");
    }
}
