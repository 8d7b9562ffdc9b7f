//! The configuration's types: where it came from, the limits of one GPU,
//! the validated configuration and which entry applies to a GPU (the
//! precedence), the error; and the defaults and bounds of every setting.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::units::one_line;

/// Where the runtime hook mounts the quota file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/cuslice/quota.toml";
// Inside a container the OCI hook prepares (for itself or a DRA claim),
// where it mounts what the container's shim uses; the quota files the hook
// and the DRA plugin write name the two segment directories.
/// The directory the quota file is mounted in ([`DEFAULT_CONFIG_PATH`]'s).
pub const CONTAINER_CONFIG_DIR: &str = "/etc/cuslice";
/// The container's (or its claim's) memory segment directory: its quota
/// file's `segment_dir`.
pub const CONTAINER_SEGMENT_DIR: &str = "/run/cuslice/segment";
/// The host's GPU segment directory: its quota file's `gpu_segment_dir`.
pub const CONTAINER_GPU_SEGMENT_DIR: &str = "/run/cuslice/gpu";
/// Where the shared-memory segments live unless configured otherwise.
pub const DEFAULT_SEGMENT_DIR: &str = "/dev/shm/cuslice";
/// Where the per-GPU scheduling segments live by default (one file per GPU,
/// shared by every tenant on the host: the runtime bind-mounts it).
pub const DEFAULT_GPU_SEGMENT_DIR: &str = "/dev/shm/cuslice/gpu";
/// Highest device index a `[device.<i>]` table or `*_<i>` variable may name.
pub const MAX_DEVICE_INDEX: u32 = 63;
/// Smallest memory limit accepted (1 MiB).
pub const MIN_MEMORY: u64 = 1 << 20;
/// Largest memory limit accepted (1 PiB).
pub const MAX_MEMORY: u64 = 1 << 50;
/// Default `compute_slice_ms`: long enough that a hand-over (drain and
/// wake-up, tens of microseconds) costs well under 1 %, short enough for
/// fair sharing.
pub const DEFAULT_COMPUTE_SLICE_MS: u32 = 20;
/// Default `compute_burst_ms`: long enough that a power-hungry kernel loop
/// held at its ceiling runs at the clocks of sustained load (measured on an
/// H200: docs/benchmarks/2026-11-21-h200-burst.md).
pub const DEFAULT_COMPUTE_BURST_MS: u32 = 200;
/// Upper bound for `context_overhead` (a context costs well under 1 GiB).
pub const MAX_CONTEXT_OVERHEAD: u64 = 16 << 30;
/// The longest tenant name: a GPU segment's tenant entry keeps the name in
/// 56 of its 64 name bytes and the slice's tag in the other 8
/// (`gpu::layout`).
pub const TENANT_MAX_LEN: usize = 56;
/// The longest `slice`.
pub const SLICE_MAX_LEN: usize = 128;

/// Where the limits came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A quota file (it may hold no limits at all).
    File(PathBuf),
    /// Environment variables (at least one limit variable was set).
    Env,
    /// No quota file and no limit variable.
    None,
}

/// Limits of one GPU, or of one entry of the configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory quota in bytes: what the tenant is guaranteed.
    pub memory: Option<u64>,
    /// What the tenant may use while memory no tenant is guaranteed is
    /// free (bytes; at least `memory`, which must be set with it). None:
    /// `memory` is also the most it may use.
    pub memory_max: Option<u64>,
    /// Guaranteed share of GPU time, percent 1..=100.
    pub compute: Option<u8>,
    /// Ceiling on GPU time, percent 1..=100.
    pub compute_max: Option<u8>,
}

impl Limits {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.memory.is_none()
            && self.memory_max.is_none()
            && self.compute.is_none()
            && self.compute_max.is_none()
    }

    /// The most the tenant may hold: `memory_max`, else `memory` (what the
    /// segment's limit, the watch and the driver's limit hold it to).
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory_max.or(self.memory)
    }

    /// `self` with every field that `over` sets replaced by `over`'s.
    pub fn overlaid_with(self, over: Limits) -> Limits {
        Limits {
            memory: over.memory.or(self.memory),
            memory_max: over.memory_max.or(self.memory_max),
            compute: over.compute.or(self.compute),
            compute_max: over.compute_max.or(self.compute_max),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub source: Source,
    pub tenant: Option<String>,
    /// Who may share the tenant's entry in a GPU segment: one container,
    /// DRA claim or `cuslice run` session (the hook, the plugin and `run`
    /// write a value unique to it). Quota file only. See
    /// [`Config::slice_tag`].
    pub slice: Option<String>,
    pub segment_dir: PathBuf,
    /// Directory of the per-GPU scheduling segments (compute shares).
    pub gpu_segment_dir: PathBuf,
    /// Device memory one CUDA context costs, charged to the quota once per
    /// GPU per process; None: the shim's measured default.
    pub context_overhead: Option<u64>,
    /// Burst of the ceiling's token bucket, ms; None: the default.
    pub compute_burst_ms: Option<u32>,
    /// Length of a lease slice, ms; None: the default.
    pub compute_slice_ms: Option<u32>,
    /// Latency class (see the module documentation).
    pub latency: bool,
    /// How long an allocation refused for want of memory waits for memory
    /// to be freed before it fails, ms (None or 0: it fails at once).
    pub memory_wait_ms: Option<u64>,
    pub all: Limits,
    pub by_index: BTreeMap<u32, Limits>,
    pub by_uuid: BTreeMap<[u8; 16], Limits>,
    /// Env limit variables that were set but ignored because a quota file exists (for a warning line).
    pub ignored_env: Vec<String>,
}

impl Config {
    /// No limits, default segment directory.
    pub fn unlimited(source: Source) -> Config {
        Config {
            source,
            tenant: None,
            slice: None,
            segment_dir: PathBuf::from(DEFAULT_SEGMENT_DIR),
            gpu_segment_dir: PathBuf::from(DEFAULT_GPU_SEGMENT_DIR),
            context_overhead: None,
            compute_burst_ms: None,
            compute_slice_ms: None,
            latency: false,
            memory_wait_ms: None,
            all: Limits::default(),
            by_index: BTreeMap::new(),
            by_uuid: BTreeMap::new(),
            ignored_env: Vec::new(),
        }
    }

    /// Effective limits of the device CUDA numbers `index` with UUID `uuid`:
    /// per field, a UUID entry wins over an index entry, which wins over `[all]`.
    ///
    /// A loaded `Config` never yields `compute_max < compute` (checked when
    /// loading). For a hand-built one that would, the ceiling wins: the
    /// guaranteed share is lowered to it (a ceiling is the hard promise).
    pub fn limits_for(&self, index: u32, uuid: &[u8; 16]) -> Limits {
        let mut l = self.all;
        if let Some(e) = self.by_index.get(&index) {
            l = l.overlaid_with(*e);
        }
        if let Some(e) = self.by_uuid.get(uuid) {
            l = l.overlaid_with(*e);
        }
        if l.compute.zip(l.compute_max).is_some_and(|(c, m)| m < c) {
            l.compute = l.compute_max;
        }
        l
    }

    /// The device entries that apply to none of the GPUs a process sees
    /// (`uuids`, in CUDA's order): an index at or past their number, a UUID
    /// none of them has. Each as `device.<k>`, indices first.
    pub fn unmatched_entries(&self, uuids: &[[u8; 16]]) -> Vec<String> {
        let by_index = self
            .by_index
            .iter()
            .filter(|(i, l)| !l.is_empty() && **i as usize >= uuids.len())
            .map(|(i, _)| format!("device.{i}"));
        let by_uuid = self
            .by_uuid
            .iter()
            .filter(|(u, l)| !l.is_empty() && !uuids.contains(u))
            .map(|(u, _)| format!("device.{}", crate::config::format_uuid(u)));
        by_index.chain(by_uuid).collect()
    }

    /// What the tenant registers with on the device CUDA numbers `index`
    /// with UUID `uuid` (share, ceiling, burst, class): None where it has
    /// neither share nor ceiling there. The shim registers exactly this;
    /// the host watchdog checks the per-GPU segment against it.
    pub fn tenant_spec(&self, index: u32, uuid: &[u8; 16]) -> Option<TenantSpec> {
        let l = self.limits_for(index, uuid);
        if l.compute.is_none() && l.compute_max.is_none() {
            return None;
        }
        let slice_ms = self.compute_slice_ms.unwrap_or(DEFAULT_COMPUTE_SLICE_MS);
        // A latency tenant never saves up a burst before it runs again: its
        // bucket holds at most one slice unless configured otherwise.
        let default_burst = if self.latency {
            slice_ms
        } else {
            DEFAULT_COMPUTE_BURST_MS
        };
        let max = l.compute_max.map_or(100, u32::from);
        Some(TenantSpec {
            share: l.compute.map_or(max, u32::from),
            max,
            burst_ns: u64::from(self.compute_burst_ms.unwrap_or(default_burst)) * 1_000_000,
            latency: self.latency,
        })
    }

    /// The tenant name: the configured one, else one derived from the
    /// segment directory (unique per container, shared by its processes).
    /// The shim registers under it; `cuslice status` finds a memory
    /// segment's tenant the same way.
    pub fn tenant_name(&self) -> String {
        match &self.tenant {
            Some(t) => t.clone(),
            None => default_tenant(&self.segment_dir),
        }
    }

    /// The tag of its slice, kept beside the tenant's name in a GPU
    /// segment's tenant entry: processes share an entry (its share,
    /// ceiling and accounting) only where both the name and the tag are
    /// theirs, so a container given another's tenant name gets an entry
    /// of its own rather than rewriting the other's. FNV-1a 64 of
    /// `slice` (one that comes out 0 is 1); 0 without a slice (a quota
    /// file written by hand or by an older hook, the environment).
    pub fn slice_tag(&self) -> u64 {
        self.slice
            .as_deref()
            .map_or(0, |s| fnv1a64(s.as_bytes()).max(1))
    }

    /// True when some GPU gets a compute share or ceiling.
    pub fn has_compute(&self) -> bool {
        let c = |l: &Limits| l.compute.is_some() || l.compute_max.is_some();
        c(&self.all) || self.by_index.values().any(c) || self.by_uuid.values().any(c)
    }

    /// True when some GPU gets a memory quota: the shim then keeps the
    /// tenant's memory segment, the hook makes it, the watch holds the
    /// tenant to it.
    pub fn has_memory(&self) -> bool {
        let m = |l: &Limits| l.memory.is_some();
        m(&self.all) || self.by_index.values().any(m) || self.by_uuid.values().any(m)
    }

    /// True when some limit is set anywhere.
    pub fn has_limits(&self) -> bool {
        !self.all.is_empty()
            || self.by_index.values().any(|l| !l.is_empty())
            || self.by_uuid.values().any(|l| !l.is_empty())
    }
}

/// The tenant name of a process whose quota file names none: `seg-` and an
/// FNV-1a hash of its memory segment directory (as the process sees it).
pub fn default_tenant(segment_dir: &std::path::Path) -> String {
    let h = fnv1a64(segment_dir.as_os_str().as_encoded_bytes());
    format!("seg-{h:016x}")
}

/// FNV-1a, 64 bits.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A configuration error: one line naming where, the key, what was expected
/// and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl ConfigError {
    /// Builds the error, forcing the message onto one line (paths and values
    /// may hold newlines or control characters).
    pub(super) fn new(msg: impl AsRef<str>) -> ConfigError {
        ConfigError(one_line(msg.as_ref()))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// What a tenant registers with in a per-GPU segment: its configured
/// share, ceiling, burst and class on that GPU (`Config::tenant_spec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantSpec {
    /// Guaranteed share, percent (clamped to 1..=100).
    pub share: u32,
    /// Ceiling, percent (clamped to share..=100; 100: none).
    pub max: u32,
    /// Ceiling bucket's burst, ns (0: one slice).
    pub burst_ns: u64,
    pub latency: bool,
}
