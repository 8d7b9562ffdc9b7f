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

/// NVML (the host file layer's loader, opened at the first call and kept),
/// asked at each call. A GPU that NVML cannot describe now (one that fell
/// off the bus answers GPU_IS_LOST to every query but its identity) keeps
/// the description it had at the last call where it answered, so that it
/// stays in the slice for its health to taint it (docs/kubernetes.md,
/// *GPU health*); one never described is left out of the list (withdrawn
/// from the slice), said once per GPU and reason.
#[derive(Default)]
pub struct Nvml {
    state: std::sync::Mutex<NvmlState>,
}

#[derive(Default)]
struct NvmlState {
    nvml: Option<cuslice_host::gpu::nvml::Nvml>,
    /// The last description of each GPU (by index).
    seen: std::collections::BTreeMap<u32, Gpu>,
    /// What was said about GPUs left out.
    said: std::collections::BTreeSet<String>,
}

impl Inventory for Nvml {
    fn gpus(&self) -> Result<Vec<Gpu>, String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        if st.nvml.is_none() {
            st.nvml =
                Some(cuslice_host::gpu::nvml::Nvml::open().map_err(|e| {
                    format!("cannot load NVML ({e}): is the NVIDIA driver installed?")
                })?);
        }
        let nvml = st.nvml.as_ref().ok_or("NVML is not loaded")?;
        let mut out = vec![];
        for d in nvml.devices()? {
            match describe(nvml, &d) {
                Ok(g) => {
                    st.seen.insert(d.index, g.clone());
                    out.push(g);
                }
                Err(e) => match st.seen.get(&d.index).filter(|g| g.uuid == d.uuid) {
                    Some(g) => out.push(g.clone()),
                    None => {
                        let line = format!(
                            "GPU {} ({}) is left out of the node's GPUs: {e}",
                            d.index, d.uuid
                        );
                        if st.said.insert(line.clone()) {
                            eprintln!("cuslice-dra-plugin: {line}");
                        }
                    }
                },
            }
        }
        Ok(out)
    }
}

/// One GPU as NVML describes it; every error names the GPU by index and
/// UUID.
fn describe(
    nvml: &cuslice_host::gpu::nvml::Nvml,
    d: &cuslice_host::gpu::nvml::DeviceHandle,
) -> Result<Gpu, String> {
    let of = |e: String| format!("GPU {} ({}): {e}", d.index, d.uuid);
    let memory = nvml.memory_total(d).map_err(of)?;
    let minor = nvml.minor_number(d).map_err(of)?;
    let (major, minor_cc) = nvml.compute_capability(d).map_err(of)?;
    let cc = match (u32::try_from(major), u32::try_from(minor_cc)) {
        (Ok(major), Ok(minor)) => ComputeCapability { major, minor },
        _ => {
            return Err(of(format!(
                "nvmlDeviceGetCudaComputeCapability: {major}.{minor_cc}, not a compute capability"
            )));
        }
    };
    Ok(Gpu {
        index: d.index,
        uuid: d.uuid.clone(),
        memory,
        minor,
        product: nvml.name(d).unwrap_or_default(),
        compute_capability: Some(cc),
    })
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
