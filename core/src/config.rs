//! Quota configuration: the per-container quota file and the environment
//! variables, validated once, with errors that name where, what and why.
//!
//! # Where the configuration comes from
//!
//! 1. `/etc/cuslice/quota.toml` ([`DEFAULT_CONFIG_PATH`]) if it exists: the
//!    file the container runtime mounts, authoritative over everything below
//!    (`CUSLICE_CONFIG` included). A file that exists but cannot be read
//!    (permissions, a directory, not UTF-8, over 1 MiB) is an error, never a
//!    silent fallback.
//! 2. Otherwise `CUSLICE_CONFIG=<path>` (non-empty): that file. It must exist
//!    and parse; a missing or unreadable file is an error naming the variable.
//! 3. With a quota file, the file is authoritative: the limit variables,
//!    `CUSLICE_TENANT`, `CUSLICE_SEGMENT_DIR`, `CUSLICE_CONTEXT_OVERHEAD`,
//!    `CUSLICE_COMPUTE_BURST_MS`, `CUSLICE_SLICE_MS`, `CUSLICE_LATENCY` (and
//!    `CUSLICE_CONFIG` when the mounted file is used) are ignored (the runtime
//!    mounts the file; the container's own environment must not be able to
//!    raise it). Those that are set are listed in [`Config::ignored_env`] so
//!    the caller can warn.
//! 4. Without a quota file: the environment variables below. With none set,
//!    there are no limits ([`Source::None`]).
//!
//! Any error fails closed: the shim refuses `cuInit` with the one-line
//! message rather than running on an unlimited GPU.
//!
//! # The quota file (TOML)
//!
//! ```toml
//! tenant = "team-a/trainer"          # optional: who this container is
//! segment_dir = "/run/cuslice/abc"   # optional: default /dev/shm/cuslice
//!
//! [all]                              # every GPU the container sees
//! memory = "4GiB"                    # a size string, or an integer number of bytes
//! compute = 30                       # guaranteed share, percent
//! compute_max = 50                   # ceiling, percent
//!
//! [device.0]                         # by index, as CUDA numbers the visible GPUs
//! memory = "8GiB"
//!
//! [device."GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b"]   # by UUID
//! memory = "2GiB"
//! ```
//!
//! Top-level keys (all optional; any other key is an error):
//!
//! | key           | value |
//! |---------------|-------|
//! | `tenant`      | string, 1 to 64 characters of `A-Z a-z 0-9 . _ / -`; `/` separates components, and no component may be empty, `.` or `..` (so no leading, trailing or doubled `/`) |
//! | `segment_dir` | string, an absolute path (no NUL); default `/dev/shm/cuslice` ([`DEFAULT_SEGMENT_DIR`]) |
//! | `gpu_segment_dir` | string, an absolute path: directory of the per-GPU scheduling segments shared by all tenants of the host; default `/dev/shm/cuslice/gpu` ([`DEFAULT_GPU_SEGMENT_DIR`]) |
//! | `context_overhead` | device memory one CUDA context costs, charged to the memory quota once per GPU per process: a size from `0` to `16GiB`; default: the shim's measured value |
//! | `compute_burst_ms` | how long a tenant held back by its ceiling (`compute_max`) then runs at a stretch: whole milliseconds `1`..=`10000` (an integer, or a string `"200"` / `"200ms"`); default 200 ([`DEFAULT_COMPUTE_BURST_MS`]). Longer: throughput closer to the ceiling for power-hungry kernels; shorter: shorter pauses |
//! | `compute_slice_ms` | length of one slice of the GPU lease, in whole milliseconds `1`..=`1000` (an integer, or `"20"` / `"20ms"`); default 20. For experiments: shorter slices hand the GPU over more often, at a higher cost per hand-over |
//! | `latency`     | `true` or `false` (default): the tenant is latency-sensitive (an inference service). While it has work in flight, other tenants on the GPU hold back, and it never waits for the lease while under its share; its GPU time still counts against its share and ceiling (docs/compute-share.md). Needs a `compute` or `compute_max` somewhere in the file |
//! | `[all]`       | a limits table that applies to every GPU |
//! | `[device.<k>]`| a limits table for one GPU; `<k>` is an index `0`..=`63` written in plain decimal (`0`, `7`, not `07`), or a GPU UUID |
//!
//! A limits table holds (all optional; any other key is an error):
//!
//! | key           | value |
//! |---------------|-------|
//! | `memory`      | a size string (see below) or a non-negative integer number of bytes; from 1 MiB to 1 PiB |
//! | `compute`     | guaranteed share of GPU time: an integer `1`..=`100`, or a string `"30"` / `"30%"` |
//! | `compute_max` | ceiling on GPU time, same forms, `1`..=`100`, and not below the guaranteed share that applies to the same GPU |
//!
//! Device indices are CUDA's numbering of the GPUs visible to the process
//! (after `CUDA_VISIBLE_DEVICES`), like HAMi's `CUDA_DEVICE_MEMORY_LIMIT_<i>`.
//! UUIDs are written `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (as
//! `nvidia-smi -L` prints them); the `GPU-` prefix is optional, `MIG-` is
//! accepted as well, and case does not matter. A UUID names 16 bytes, matched
//! against what `cuDeviceGetUuid` reports; the same UUID twice (say in
//! different case) is an error.
//!
//! **Precedence**, per field: a UUID entry wins over an index entry, which
//! wins over `[all]`. So `[all] compute = 30` with `[device.0] memory = "8GiB"`
//! gives device 0 8 GiB *and* 30 %.
//!
//! **Share consistency**: wherever a ceiling and a guaranteed share meet on
//! one GPU, `compute_max >= compute`. This is checked within each table,
//! between each device table and `[all]`, and between every UUID table and
//! every index table (a GPU may match both; which index a UUID gets depends on
//! `CUDA_VISIBLE_DEVICES`, so every pairing must be consistent).
//!
//! An empty file (or only comments) is valid and means no limits.
//!
//! # Sizes
//!
//! `<number>[<unit>]`, the number decimal with an optional fraction
//! (`1.5GiB`), optional spaces before the unit, the unit case-insensitive;
//! whitespace around the whole value is ignored:
//!
//! | unit | factor |
//! |------|--------|
//! | none, `b`                       | 1 (bytes; must be a whole number) |
//! | `k`, `ki`, `kib`, `kb`          | 1024 |
//! | `m`, `mi`, `mib`, `mb`          | 1024² |
//! | `g`, `gi`, `gib`, `gb`          | 1024³ |
//! | `t`, `ti`, `tib`, `tb`          | 1024⁴ |
//! | `p`, `pi`, `pib`, `pb`          | 1024⁵ |
//!
//! **All units are binary**: `4GB` means 4 GiB (4 294 967 296 bytes), not
//! 4 000 000 000 — GPU memory is sized in powers of two, and `nvidia-smi` and
//! HAMi use the same meaning. A fractional size is rounded down to a whole
//! byte (`0.1GiB` = 107 374 182 bytes). Hex (`0x…`) and exponents are not
//! accepted.
//!
//! # Environment variables (used only without a quota file)
//!
//! Empty values count as unset. `<i>` is a device index `0`..=`63`.
//!
//! | variable | meaning |
//! |----------|---------|
//! | `CUSLICE_CONFIG`              | path of the quota file |
//! | `CUSLICE_MEMORY`, `CUSLICE_MEMORY_<i>` | memory, all GPUs / GPU `i`; a size, plain numbers are bytes |
//! | `CUSLICE_COMPUTE`, `CUSLICE_COMPUTE_<i>` | guaranteed share (percent) |
//! | `CUSLICE_COMPUTE_MAX`, `CUSLICE_COMPUTE_MAX_<i>` | ceiling (percent) |
//! | `CUSLICE_TENANT`              | as `tenant` |
//! | `CUSLICE_SEGMENT_DIR`         | as `segment_dir` |
//! | `CUSLICE_CONTEXT_OVERHEAD`    | as `context_overhead` |
//! | `CUSLICE_COMPUTE_BURST_MS`    | as `compute_burst_ms` |
//! | `CUSLICE_SLICE_MS`            | as `compute_slice_ms` |
//! | `CUSLICE_LATENCY`             | as `latency`: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` |
//! | `CUSLICE_GPU_SEGMENT_DIR`     | as `gpu_segment_dir` |
//! | `CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT_<i>` | HAMi: memory, all GPUs / GPU `i` |
//! | `CUDA_DEVICE_SM_LIMIT`, `CUDA_DEVICE_SM_LIMIT_<i>` | HAMi: a hard ceiling in percent (maps to `compute_max`); `0` means no limit |
//!
//! HAMi compatibility, following HAMi-core's `get_limit_from_env`
//! (`src/multiprocess/multiprocess_memory_limit.c`): a plain number in
//! `CUDA_DEVICE_MEMORY_LIMIT*` is **bytes** (HAMi-core's scale factor is 1
//! when the value does not end in `k`/`m`/`g`; the HAMi device plugin writes
//! values like `"4096m"`), and `CUDA_DEVICE_SM_LIMIT*` = `0` means "no limit"
//! (HAMi-core logs exactly that and falls back to 100 %, or for a per-device
//! variable to the all-devices one). Every form HAMi-core reads sensibly
//! means the same here. Differences, all failing closed: HAMi-core reads
//! `CUDA_DEVICE_MEMORY_LIMIT=0` (or garbage) as "no limit" with a warning,
//! cuslice rejects it; HAMi-core's `strtoul(.., 0)` reads `0x…` as hex and a
//! leading `0` as octal, cuslice rejects hex and reads decimal.
//!
//! If a `CUSLICE_` variable and its HAMi equivalent are both set
//! (`CUSLICE_MEMORY` / `CUDA_DEVICE_MEMORY_LIMIT`, `CUSLICE_MEMORY_<i>` /
//! `CUDA_DEVICE_MEMORY_LIMIT_<i>`, `CUSLICE_COMPUTE_MAX` /
//! `CUDA_DEVICE_SM_LIMIT`, `CUSLICE_COMPUTE_MAX_<i>` /
//! `CUDA_DEVICE_SM_LIMIT_<i>`) they must mean the same limit (`4GiB` and
//! `4096m` agree); otherwise it is an error naming both. An SM limit of `0`
//! ("no limit") counts as unset here.
//!
//! # Errors
//!
//! Every error is one line: where (the file path, or the variable and its
//! value), the key, what was expected and what was found, e.g.
//!
//! ```text
//! /etc/cuslice/quota.toml: device.0.memory: expected a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes, got "4 potatoes"
//! /etc/cuslice/quota.toml: line 3: TOML syntax error: ...
//! CUDA_DEVICE_MEMORY_LIMIT_1="lots": expected a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes, got "lots"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the runtime hook mounts the quota file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/cuslice/quota.toml";
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
/// A quota file larger than this is refused (it is a few lines; this stops
/// `CUSLICE_CONFIG=/dev/zero` from eating the process's memory).
const MAX_FILE_BYTES: u64 = 1 << 20;
const TENANT_MAX_LEN: usize = 64;

const SIZE_EXPECTED: &str = "a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes";
const PERCENT_EXPECTED: &str = "a percentage from 1 to 100 like 30 or \"30%\"";
const UUID_EXAMPLE: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";

/// The environment variables that carry limits, by family: (CUSLICE name,
/// HAMi equivalent if any). Each also exists with a `_<i>` suffix.
const ENV_MEMORY: &str = "CUSLICE_MEMORY";
const ENV_COMPUTE: &str = "CUSLICE_COMPUTE";
const ENV_COMPUTE_MAX: &str = "CUSLICE_COMPUTE_MAX";
const ENV_HAMI_MEMORY: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const ENV_HAMI_SM: &str = "CUDA_DEVICE_SM_LIMIT";
const ENV_LIMIT_FAMILIES: [&str; 5] = [
    ENV_MEMORY,
    ENV_COMPUTE,
    ENV_COMPUTE_MAX,
    ENV_HAMI_MEMORY,
    ENV_HAMI_SM,
];
const ENV_CONFIG: &str = "CUSLICE_CONFIG";
const ENV_TENANT: &str = "CUSLICE_TENANT";
const ENV_SEGMENT_DIR: &str = "CUSLICE_SEGMENT_DIR";
const ENV_CONTEXT_OVERHEAD: &str = "CUSLICE_CONTEXT_OVERHEAD";
const ENV_GPU_SEGMENT_DIR: &str = "CUSLICE_GPU_SEGMENT_DIR";
const ENV_COMPUTE_BURST: &str = "CUSLICE_COMPUTE_BURST_MS";
const ENV_SLICE: &str = "CUSLICE_SLICE_MS";
const ENV_LATENCY: &str = "CUSLICE_LATENCY";
/// Default `compute_slice_ms`: long enough that a hand-over (drain and
/// wake-up, tens of microseconds) costs well under 1 %, short enough for
/// fair sharing.
pub const DEFAULT_COMPUTE_SLICE_MS: u32 = 20;
/// Upper bound for `compute_slice_ms`.
pub const MAX_COMPUTE_SLICE_MS: u32 = 1_000;
/// Default `compute_burst_ms`: long enough that a power-hungry kernel loop
/// held at its ceiling runs at the clocks of sustained load (measured on an
/// H200: docs/benchmarks/2026-11-21-h200-burst.md).
pub const DEFAULT_COMPUTE_BURST_MS: u32 = 200;
/// Upper bound for `compute_burst_ms`.
pub const MAX_COMPUTE_BURST_MS: u32 = 10_000;
/// Upper bound for `context_overhead` (a context costs well under 1 GiB).
pub const MAX_CONTEXT_OVERHEAD: u64 = 16 << 30;

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
    /// Memory quota in bytes.
    pub memory: Option<u64>,
    /// Guaranteed share of GPU time, percent 1..=100.
    pub compute: Option<u8>,
    /// Ceiling on GPU time, percent 1..=100.
    pub compute_max: Option<u8>,
}

impl Limits {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.compute.is_none() && self.compute_max.is_none()
    }

    /// `self` with every field that `over` sets replaced by `over`'s.
    pub fn overlaid_with(self, over: Limits) -> Limits {
        Limits {
            memory: over.memory.or(self.memory),
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
            segment_dir: PathBuf::from(DEFAULT_SEGMENT_DIR),
            gpu_segment_dir: PathBuf::from(DEFAULT_GPU_SEGMENT_DIR),
            context_overhead: None,
            compute_burst_ms: None,
            compute_slice_ms: None,
            latency: false,
            all: Limits::default(),
            by_index: BTreeMap::new(),
            by_uuid: BTreeMap::new(),
            ignored_env: Vec::new(),
        }
    }

    /// Effective limits of the device CUDA numbers `index` with UUID `uuid`:
    /// per field, a UUID entry wins over an index entry, which wins over [all].
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

    /// True when some GPU gets a compute share or ceiling.
    pub fn has_compute(&self) -> bool {
        let c = |l: &Limits| l.compute.is_some() || l.compute_max.is_some();
        c(&self.all) || self.by_index.values().any(c) || self.by_uuid.values().any(c)
    }

    /// True when some limit is set anywhere.
    pub fn has_limits(&self) -> bool {
        !self.all.is_empty()
            || self.by_index.values().any(|l| !l.is_empty())
            || self.by_uuid.values().any(|l| !l.is_empty())
    }
}

/// A configuration error: one line naming where, the key, what was expected
/// and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl ConfigError {
    /// Builds the error, forcing the message onto one line (paths and values
    /// may hold newlines or control characters).
    fn new(msg: impl AsRef<str>) -> ConfigError {
        ConfigError(one_line(msg.as_ref()))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Loads the configuration the way the shim does. `env` looks up an environment variable.
pub fn load(env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    load_with(env, Path::new(DEFAULT_CONFIG_PATH))
}

/// [`load`] with the default file path as a parameter (tests point it at a
/// temporary directory).
fn load_with(
    env: &dyn Fn(&str) -> Option<String>,
    default_path: &Path,
) -> Result<Config, ConfigError> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());

    // The mounted default file wins over everything, CUSLICE_CONFIG included:
    // otherwise a variable set inside a container could point the shim at a
    // more generous file. CUSLICE_CONFIG is for hosts without one.
    let default = match read_file(default_path) {
        Ok(d) => d,
        Err(e) => return Err(ConfigError::new(format!("{}: {e}", default_path.display()))),
    };
    let file = if let Some(text) = default {
        Some((default_path.to_path_buf(), text))
    } else if let Some(p) = get(ENV_CONFIG) {
        let path = PathBuf::from(&p);
        match read_file(&path) {
            Ok(Some(text)) => Some((path, text)),
            Ok(None) => {
                return Err(ConfigError::new(format!(
                    "{ENV_CONFIG}={}: expected an existing quota file, got no such file",
                    shown(&p)
                )));
            }
            Err(e) => {
                return Err(ConfigError::new(format!("{ENV_CONFIG}={}: {e}", shown(&p))));
            }
        }
    } else {
        None
    };

    match file {
        Some((path, text)) => {
            let mut cfg = parse_file(&path, &text)?;
            let used_env_config = path != default_path;
            cfg.ignored_env = env_var_names()
                .into_iter()
                .filter(|n| get(n).is_some())
                .filter(|n| !(used_env_config && n == ENV_CONFIG))
                .collect();
            Ok(cfg)
        }
        None => from_env(&get),
    }
}

/// Reads a quota file. `Ok(None)` when it does not exist; any other failure
/// is an error (fail closed: an unreadable mounted file must not mean
/// "unlimited").
fn read_file(path: &Path) -> Result<Option<String>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("expected a readable quota file, got {e}")),
    };
    let mut bytes = Vec::new();
    if let Err(e) = f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return Err(format!("expected a readable quota file, got {e}"));
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err("expected a quota file of at most 1MiB, got a larger one".to_string());
    }
    match String::from_utf8(bytes) {
        Ok(s) => Ok(Some(s)),
        Err(e) => Err(format!(
            "expected UTF-8 text, got invalid UTF-8 at byte {}",
            e.utf8_error().valid_up_to()
        )),
    }
}

/// Every environment variable that carries a limit, a tenant or a segment
/// directory, in a fixed order (for [`Config::ignored_env`]).
fn env_var_names() -> Vec<String> {
    let mut names = Vec::new();
    for fam in ENV_LIMIT_FAMILIES {
        names.push(fam.to_string());
        for i in 0..=MAX_DEVICE_INDEX {
            names.push(format!("{fam}_{i}"));
        }
    }
    names.push(ENV_CONFIG.to_string());
    names.push(ENV_TENANT.to_string());
    names.push(ENV_SEGMENT_DIR.to_string());
    names.push(ENV_CONTEXT_OVERHEAD.to_string());
    names.push(ENV_GPU_SEGMENT_DIR.to_string());
    names.push(ENV_COMPUTE_BURST.to_string());
    names.push(ENV_SLICE.to_string());
    names.push(ENV_LATENCY.to_string());
    names
}

// ---------------------------------------------------------------------------
// Validation shared by the file and the environment.

/// A value and the label that names it in messages: a key path
/// (`device.0.compute`) or a variable with its value (`CUSLICE_COMPUTE="40"`).
#[derive(Debug, Clone)]
struct Field<T> {
    value: T,
    label: String,
}

/// One entry ([all], a device table, or the variables of one index) before
/// the cross-entry checks.
#[derive(Debug, Clone, Default)]
struct Entry {
    memory: Option<Field<u64>>,
    compute: Option<Field<u8>>,
    compute_max: Option<Field<u8>>,
}

impl Entry {
    fn limits(&self) -> Limits {
        Limits {
            memory: self.memory.as_ref().map(|f| f.value),
            compute: self.compute.as_ref().map(|f| f.value),
            compute_max: self.compute_max.as_ref().map(|f| f.value),
        }
    }
}

/// Everything parsed, before the share-consistency checks.
#[derive(Debug, Default)]
struct Draft {
    all: Entry,
    /// index -> (entry name for messages, entry)
    by_index: BTreeMap<u32, (String, Entry)>,
    /// uuid -> (entry name for messages, entry)
    by_uuid: BTreeMap<[u8; 16], (String, Entry)>,
}

impl Draft {
    /// Whether some entry gives a compute share or ceiling.
    fn has_compute(&self) -> bool {
        let c = |e: &Entry| e.compute.is_some() || e.compute_max.is_some();
        c(&self.all)
            || self.by_index.values().any(|(_, e)| c(e))
            || self.by_uuid.values().any(|(_, e)| c(e))
    }

    /// `compute_max >= compute` wherever the two meet on one GPU. Checks the
    /// simplest combination first so the message blames the narrowest entry.
    fn check_shares(&self) -> Result<(), String> {
        check_combo(&[&self.all], "")?;
        for (_, e) in self.by_index.values() {
            check_combo(&[e, &self.all], "")?;
        }
        for (_, e) in self.by_uuid.values() {
            check_combo(&[e, &self.all], "")?;
        }
        for (uname, u) in self.by_uuid.values() {
            for (iname, i) in self.by_index.values() {
                let note = format!(" for a GPU matched by both {uname} and {iname}");
                check_combo(&[u, i, &self.all], &note)?;
            }
        }
        Ok(())
    }

    fn into_config(self, source: Source) -> Config {
        let mut cfg = Config::unlimited(source);
        cfg.all = self.all.limits();
        cfg.by_index = self
            .by_index
            .into_iter()
            .map(|(k, (_, e))| (k, e.limits()))
            .collect();
        cfg.by_uuid = self
            .by_uuid
            .into_iter()
            .map(|(k, (_, e))| (k, e.limits()))
            .collect();
        cfg
    }
}

/// Checks one combination of entries, most specific first, the way
/// `limits_for` would merge them.
fn check_combo(levels: &[&Entry], note: &str) -> Result<(), String> {
    let c = levels
        .iter()
        .enumerate()
        .find_map(|(i, e)| e.compute.as_ref().map(|f| (i, f)));
    let m = levels
        .iter()
        .enumerate()
        .find_map(|(i, e)| e.compute_max.as_ref().map(|f| (i, f)));
    match (c, m) {
        (Some((ci, c)), Some((mi, m))) if m.value < c.value => Err(if mi <= ci {
            format!(
                "{}: expected a ceiling of at least the guaranteed share {} ({}){note}, got {}",
                m.label, c.value, c.label, m.value
            )
        } else {
            format!(
                "{}: expected a guaranteed share of at most the ceiling {} ({}){note}, got {}",
                c.label, m.value, m.label, c.value
            )
        }),
        _ => Ok(()),
    }
}

/// Range check of a memory limit; `shown` is how the value was written.
fn check_memory(bytes: u64, shown: &str) -> Result<u64, String> {
    if (MIN_MEMORY..=MAX_MEMORY).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(format!("expected a size from 1MiB to 1PiB, got {shown}"))
    }
}

/// Tenant names: 1..=64 of `[A-Za-z0-9._/-]`, `/`-separated components none
/// of which is empty, `.` or `..` (the name may end up in file names).
fn check_tenant(s: &str) -> Result<(), String> {
    let charset_ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
    if s.is_empty() || s.len() > TENANT_MAX_LEN || !charset_ok {
        return Err(format!(
            "expected 1 to 64 characters of A-Z a-z 0-9 . _ / -, got {}",
            shown(s)
        ));
    }
    if s.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!(
            "expected /-separated names without empty, \".\" or \"..\" parts, got {}",
            shown(s)
        ));
    }
    Ok(())
}

fn check_segment_dir(s: &str) -> Result<PathBuf, String> {
    if !s.starts_with('/') || s.contains('\0') {
        return Err(format!(
            "expected an absolute path like /run/cuslice/abc, got {}",
            shown(s)
        ));
    }
    Ok(PathBuf::from(s))
}

// ---------------------------------------------------------------------------
// The quota file.

/// Parses quota-file text (`path` only for messages).
pub fn parse_file(path: &Path, text: &str) -> Result<Config, ConfigError> {
    parse_table(text)
        .map(|d| d.into_config(Source::File(path.to_path_buf())))
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))
}

/// The file's text to a [`Config`] minus the source; errors lack the path.
fn parse_table(text: &str) -> Result<ParsedFile, String> {
    // toml's parser is not expected to panic, but this runs inside other
    // people's processes at cuInit: a parser bug must become an error.
    let parsed = std::panic::catch_unwind(|| text.parse::<toml::Table>());
    let table = match parsed {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            let line = e.span().map(|s| {
                let end = s.start.min(text.len());
                text.as_bytes()[..end]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            });
            let msg = e
                .message()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            return Err(match line {
                Some(n) => format!("line {n}: TOML syntax error: {msg}"),
                None => format!("TOML syntax error: {msg}"),
            });
        }
        Err(_) => return Err("TOML syntax error: the TOML parser failed".to_string()),
    };

    let mut out = ParsedFile::default();
    for (key, value) in &table {
        match key.as_str() {
            "tenant" => {
                let s = value
                    .as_str()
                    .ok_or_else(|| {
                        format!(
                            "tenant: expected a string of 1 to 64 characters of A-Z a-z 0-9 . _ / -, got {}",
                            describe(value)
                        )
                    })?;
                check_tenant(s).map_err(|e| format!("tenant: {e}"))?;
                out.tenant = Some(s.to_string());
            }
            "segment_dir" => {
                let s = value.as_str().ok_or_else(|| {
                    format!(
                        "segment_dir: expected a string holding an absolute path, got {}",
                        describe(value)
                    )
                })?;
                out.segment_dir =
                    Some(check_segment_dir(s).map_err(|e| format!("segment_dir: {e}"))?);
            }
            "gpu_segment_dir" => {
                let s = value.as_str().ok_or_else(|| {
                    format!(
                        "gpu_segment_dir: expected a string holding an absolute path, got {}",
                        describe(value)
                    )
                })?;
                out.gpu_segment_dir =
                    Some(check_segment_dir(s).map_err(|e| format!("gpu_segment_dir: {e}"))?);
            }
            "context_overhead" => {
                out.context_overhead =
                    Some(overhead_from_value(value).map_err(|m| format!("context_overhead: {m}"))?);
            }
            "compute_burst_ms" => {
                out.compute_burst_ms =
                    Some(burst_from_value(value).map_err(|m| format!("compute_burst_ms: {m}"))?);
            }
            "compute_slice_ms" => {
                out.compute_slice_ms =
                    Some(slice_from_value(value).map_err(|m| format!("compute_slice_ms: {m}"))?);
            }
            "latency" => {
                out.latency = value.as_bool().ok_or_else(|| {
                    format!("latency: expected true or false, got {}", describe(value))
                })?;
            }
            "all" => out.draft.all = entry_from_value("all", value)?,
            "device" => parse_devices(value, &mut out.draft)?,
            other => {
                return Err(unknown_key(
                    "",
                    other,
                    &[
                        "tenant",
                        "segment_dir",
                        "gpu_segment_dir",
                        "context_overhead",
                        "compute_burst_ms",
                        "compute_slice_ms",
                        "latency",
                        "all",
                        "device",
                    ],
                ));
            }
        }
    }
    out.draft.check_shares()?;
    if out.latency && !out.draft.has_compute() {
        return Err(LATENCY_NEEDS_COMPUTE.replace("{}", "latency"));
    }
    Ok(out)
}

/// The error for a latency class without a share to charge it against;
/// `{}` is where the setting was given.
const LATENCY_NEEDS_COMPUTE: &str = "{}: expected a tenant with a compute share (compute or compute_max for some GPU): a latency tenant's GPU time counts against its share, got none";

#[derive(Debug, Default)]
struct ParsedFile {
    tenant: Option<String>,
    segment_dir: Option<PathBuf>,
    gpu_segment_dir: Option<PathBuf>,
    context_overhead: Option<u64>,
    compute_burst_ms: Option<u32>,
    compute_slice_ms: Option<u32>,
    latency: bool,
    draft: Draft,
}

impl ParsedFile {
    fn into_config(self, source: Source) -> Config {
        let mut cfg = self.draft.into_config(source);
        cfg.tenant = self.tenant;
        cfg.context_overhead = self.context_overhead;
        cfg.compute_burst_ms = self.compute_burst_ms;
        cfg.compute_slice_ms = self.compute_slice_ms;
        cfg.latency = self.latency;
        if let Some(d) = self.gpu_segment_dir {
            cfg.gpu_segment_dir = d;
        }
        if let Some(d) = self.segment_dir {
            cfg.segment_dir = d;
        }
        cfg
    }
}

fn parse_devices(value: &toml::Value, draft: &mut Draft) -> Result<(), String> {
    let table = value.as_table().ok_or_else(|| {
        format!(
            "device: expected tables like [device.0] or [device.\"{UUID_EXAMPLE}\"], got {}",
            describe(value)
        )
    })?;
    for (key, v) in table {
        let name = format!("device.{}", key_segment(key));
        match parse_device_key(key).map_err(|e| format!("{name}: {e}"))? {
            DeviceKey::Index(i) => {
                let e = entry_from_value(&name, v)?;
                // TOML already rejects the same key twice, and only canonical
                // decimal is accepted, so an index cannot repeat.
                draft.by_index.insert(i, (name, e));
            }
            DeviceKey::Uuid(u) => {
                if let Some((first, _)) = draft.by_uuid.get(&u) {
                    return Err(format!(
                        "{name}: expected each GPU once, got the same UUID as {first}"
                    ));
                }
                let e = entry_from_value(&name, v)?;
                draft.by_uuid.insert(u, (name, e));
            }
        }
    }
    Ok(())
}

enum DeviceKey {
    Index(u32),
    Uuid([u8; 16]),
}

fn parse_device_key(key: &str) -> Result<DeviceKey, String> {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
        let n = key.parse::<u32>().ok();
        return match n {
            Some(i) if i <= MAX_DEVICE_INDEX && (key == "0" || !key.starts_with('0')) => {
                Ok(DeviceKey::Index(i))
            }
            _ if key.starts_with('0') && key.len() > 1 => Err(format!(
                "expected a device index from 0 to {MAX_DEVICE_INDEX} in plain decimal, got {}",
                shown(key)
            )),
            _ => Err(format!(
                "expected a device index from 0 to {MAX_DEVICE_INDEX}, got {}",
                shown(key)
            )),
        };
    }
    let lower = key.to_ascii_lowercase();
    if lower.starts_with("gpu-") || lower.starts_with("mig-") {
        // Looks like a UUID: report what is wrong with it.
        return parse_uuid(key).map(DeviceKey::Uuid);
    }
    parse_uuid(key).map(DeviceKey::Uuid).map_err(|_| {
        format!(
            "expected a device index from 0 to {MAX_DEVICE_INDEX} or a GPU UUID like {UUID_EXAMPLE}, got {}",
            shown(key)
        )
    })
}

/// A limits table ([all] or [device.X]); `name` is its key path.
fn entry_from_value(name: &str, value: &toml::Value) -> Result<Entry, String> {
    let table = value.as_table().ok_or_else(|| {
        format!(
            "{name}: expected a table of memory, compute, compute_max, got {}",
            describe(value)
        )
    })?;
    let mut e = Entry::default();
    for (key, v) in table {
        let label = format!("{name}.{}", key_segment(key));
        match key.as_str() {
            "memory" => {
                let bytes = size_from_value(v).map_err(|m| format!("{label}: {m}"))?;
                e.memory = Some(Field {
                    value: bytes,
                    label,
                });
            }
            "compute" => {
                let p = percent_from_value(v).map_err(|m| format!("{label}: {m}"))?;
                e.compute = Some(Field { value: p, label });
            }
            "compute_max" => {
                let p = percent_from_value(v).map_err(|m| format!("{label}: {m}"))?;
                e.compute_max = Some(Field { value: p, label });
            }
            other => {
                return Err(unknown_key(
                    name,
                    other,
                    &["memory", "compute", "compute_max"],
                ));
            }
        }
    }
    Ok(e)
}

fn size_from_value(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::String(s) => {
            let bytes = parse_size(s)?;
            check_memory(bytes, &shown(s))
        }
        toml::Value::Integer(i) => match u64::try_from(*i) {
            Ok(bytes) => check_memory(bytes, &i.to_string()),
            Err(_) => Err(format!("expected {SIZE_EXPECTED}, got {i}")),
        },
        other => Err(format!("expected {SIZE_EXPECTED}, got {}", describe(other))),
    }
}

/// `context_overhead`: a size (or integer bytes) from 0 to 16 GiB.
fn overhead_from_value(v: &toml::Value) -> Result<u64, String> {
    let bytes = match v {
        toml::Value::String(s) => parse_size(s)?,
        toml::Value::Integer(i) => {
            u64::try_from(*i).map_err(|_| format!("expected {SIZE_EXPECTED}, got {i}"))?
        }
        other => return Err(format!("expected {SIZE_EXPECTED}, got {}", describe(other))),
    };
    if bytes > MAX_CONTEXT_OVERHEAD {
        return Err(format!(
            "expected at most {}, got {}",
            format_size(MAX_CONTEXT_OVERHEAD),
            format_size(bytes)
        ));
    }
    Ok(bytes)
}

/// `compute_burst_ms`: an integer, or a string of digits with an optional
/// `ms` suffix.
fn burst_from_value(v: &toml::Value) -> Result<u32, String> {
    match v {
        toml::Value::Integer(i) => check_burst(*i as i128, &i.to_string()),
        toml::Value::String(s) => parse_burst(s),
        other => Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_BURST_MS}, got {}",
            describe(other)
        )),
    }
}

/// "200", "200ms", " 200 ms " -> 200 (whole milliseconds, 1..=10000).
pub fn parse_burst(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = t.strip_suffix("ms").unwrap_or(t).trim_end();
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_BURST_MS} (like 200 or \"200ms\"), got {}",
            shown(s)
        ));
    }
    check_burst(digits.parse::<i128>().unwrap_or(i128::MAX), &shown(s))
}

/// `compute_slice_ms`: an integer, or a string of digits with an optional
/// `ms` suffix.
fn slice_from_value(v: &toml::Value) -> Result<u32, String> {
    match v {
        toml::Value::Integer(i) => check_slice(*i as i128, &i.to_string()),
        toml::Value::String(s) => parse_slice(s),
        other => Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_SLICE_MS}, got {}",
            describe(other)
        )),
    }
}

/// "20", "20ms", " 20 ms " -> 20 (whole milliseconds, 1..=1000).
pub fn parse_slice(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = t.strip_suffix("ms").unwrap_or(t).trim_end();
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_SLICE_MS} (like 20 or \"20ms\"), got {}",
            shown(s)
        ));
    }
    check_slice(digits.parse::<i128>().unwrap_or(i128::MAX), &shown(s))
}

fn check_slice(ms: i128, shown: &str) -> Result<u32, String> {
    if (1..=MAX_COMPUTE_SLICE_MS as i128).contains(&ms) {
        Ok(ms as u32)
    } else {
        Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_SLICE_MS}, got {shown}"
        ))
    }
}

/// A yes/no setting: 1/true/yes/on, 0/false/no/off (case-insensitive).
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "expected 1, true, yes, on or 0, false, no, off, got {}",
            shown(s)
        )),
    }
}

fn check_burst(ms: i128, shown: &str) -> Result<u32, String> {
    if (1..=MAX_COMPUTE_BURST_MS as i128).contains(&ms) {
        Ok(ms as u32)
    } else {
        Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_BURST_MS}, got {shown}"
        ))
    }
}

fn percent_from_value(v: &toml::Value) -> Result<u8, String> {
    match v {
        toml::Value::String(s) => parse_percent(s),
        toml::Value::Integer(i) => match u8::try_from(*i) {
            Ok(p) if (1..=100).contains(&p) => Ok(p),
            _ => Err(format!("expected a percentage from 1 to 100, got {i}")),
        },
        other => Err(format!(
            "expected {PERCENT_EXPECTED}, got {}",
            describe(other)
        )),
    }
}

/// "unknown key" in the usual shape, with a suggestion for a near miss.
fn unknown_key(parent: &str, key: &str, known: &[&str]) -> String {
    let path = if parent.is_empty() {
        key_segment(key)
    } else {
        format!("{parent}.{}", key_segment(key))
    };
    let near = known
        .iter()
        .map(|k| (edit_distance(&key.to_ascii_lowercase(), k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d);
    let hint = match near {
        Some((_, k)) => format!(" (did you mean {k}?)"),
        None => String::new(),
    };
    format!(
        "{path}: expected one of the keys {}, got unknown key {}{hint}",
        known.join(", "),
        shown(key)
    )
}

/// Levenshtein distance; keys are short.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A key as it would be written in a TOML path: bare if it can be.
fn key_segment(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { key.to_string() } else { shown(key) }
}

/// A TOML value for "got ..." in a message.
fn describe(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => shown(s),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => format!("{f:?}"),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => format!("a date-time {d}"),
        toml::Value::Array(_) => "an array".to_string(),
        toml::Value::Table(_) => "a table".to_string(),
    }
}

// ---------------------------------------------------------------------------
// The environment.

/// Limits from the environment (no quota file). `get` returns non-empty values only.
fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let mut any_limit_var = false;
    let mut draft = Draft::default();
    for index in std::iter::once(None).chain((0..=MAX_DEVICE_INDEX).map(Some)) {
        let e = env_entry(get, index, &mut any_limit_var).map_err(ConfigError::new)?;
        match index {
            None => draft.all = e,
            Some(i) => {
                if e.memory.is_some() || e.compute.is_some() || e.compute_max.is_some() {
                    draft.by_index.insert(i, (format!("device {i}"), e));
                }
            }
        }
    }
    draft.check_shares().map_err(ConfigError::new)?;

    let mut cfg = draft.into_config(if any_limit_var {
        Source::Env
    } else {
        Source::None
    });
    if let Some(t) = get(ENV_TENANT) {
        check_tenant(&t)
            .map_err(|e| ConfigError::new(format!("{ENV_TENANT}={}: {e}", shown(&t))))?;
        cfg.tenant = Some(t);
    }
    if let Some(d) = get(ENV_SEGMENT_DIR) {
        cfg.segment_dir = check_segment_dir(&d)
            .map_err(|e| ConfigError::new(format!("{ENV_SEGMENT_DIR}={}: {e}", shown(&d))))?;
    }
    if let Some(d) = get(ENV_GPU_SEGMENT_DIR) {
        cfg.gpu_segment_dir = check_segment_dir(&d)
            .map_err(|e| ConfigError::new(format!("{ENV_GPU_SEGMENT_DIR}={}: {e}", shown(&d))))?;
    }
    if let Some(v) = get(ENV_CONTEXT_OVERHEAD) {
        cfg.context_overhead = Some(
            overhead_from_value(&toml::Value::String(v.clone())).map_err(|e| {
                ConfigError::new(format!("{ENV_CONTEXT_OVERHEAD}={}: {e}", shown(&v)))
            })?,
        );
    }
    if let Some(v) = get(ENV_COMPUTE_BURST) {
        cfg.compute_burst_ms =
            Some(parse_burst(&v).map_err(|e| {
                ConfigError::new(format!("{ENV_COMPUTE_BURST}={}: {e}", shown(&v)))
            })?);
    }
    if let Some(v) = get(ENV_SLICE) {
        cfg.compute_slice_ms = Some(
            parse_slice(&v)
                .map_err(|e| ConfigError::new(format!("{ENV_SLICE}={}: {e}", shown(&v))))?,
        );
    }
    if let Some(v) = get(ENV_LATENCY) {
        let label = format!("{ENV_LATENCY}={}", shown(&v));
        cfg.latency = parse_switch(&v).map_err(|e| ConfigError::new(format!("{label}: {e}")))?;
        if cfg.latency && !cfg.has_compute() {
            return Err(ConfigError::new(
                LATENCY_NEEDS_COMPUTE.replace("{}", &label),
            ));
        }
    }
    Ok(cfg)
}

/// The variables of one entry: the all-devices ones (`index` None) or those
/// with the `_<index>` suffix.
fn env_entry(
    get: &dyn Fn(&str) -> Option<String>,
    index: Option<u32>,
    any_limit_var: &mut bool,
) -> Result<Entry, String> {
    let name = |base: &str| match index {
        None => base.to_string(),
        Some(i) => format!("{base}_{i}"),
    };
    // (variable name, raw value, label) of a set variable.
    let mut lookup = |base: &str| {
        let n = name(base);
        get(&n).map(|raw| {
            *any_limit_var = true;
            let label = format!("{n}={}", shown(&raw));
            (n, raw, label)
        })
    };
    let cus_mem = lookup(ENV_MEMORY);
    let cus_compute = lookup(ENV_COMPUTE);
    let cus_max = lookup(ENV_COMPUTE_MAX);
    let hami_mem = lookup(ENV_HAMI_MEMORY);
    let hami_sm = lookup(ENV_HAMI_SM);

    let env_size = |(_, raw, label): &(String, String, String)| -> Result<Field<u64>, String> {
        let bytes = parse_size(raw)
            .and_then(|b| check_memory(b, &shown(raw)))
            .map_err(|e| format!("{label}: {e}"))?;
        Ok(Field {
            value: bytes,
            label: label.clone(),
        })
    };
    let env_percent = |(_, raw, label): &(String, String, String)| -> Result<Field<u8>, String> {
        let p = parse_percent(raw).map_err(|e| format!("{label}: {e}"))?;
        Ok(Field {
            value: p,
            label: label.clone(),
        })
    };

    let mut e = Entry::default();

    // Memory: CUSLICE_MEMORY* and HAMi's CUDA_DEVICE_MEMORY_LIMIT*. Both
    // read with parse_size; HAMi-core's get_limit_from_env scales a plain
    // number by 1 (bytes) and k/m/g by 1024^n, which parse_size agrees with.
    let cm = cus_mem.as_ref().map(env_size).transpose()?;
    let hm = hami_mem.as_ref().map(env_size).transpose()?;
    e.memory = agree(cm, hm, format_size)?;

    if let Some(v) = &cus_compute {
        e.compute = Some(env_percent(v)?);
    }

    // Ceiling: CUSLICE_COMPUTE_MAX* and HAMi's CUDA_DEVICE_SM_LIMIT*. In
    // HAMi-core an SM limit of 0 means "no limit" (get_limit_from_env logs
    // "device core util limit set to 0, which means no limit"; a per-device 0
    // falls back to the all-devices value, an all-devices 0 to 100 %), so 0
    // counts as unset here.
    let cx = cus_max.as_ref().map(env_percent).transpose()?;
    let hx = match &hami_sm {
        Some(v) if is_zero_percent(&v.1) => None,
        Some(v) => Some(env_percent(v)?),
        None => None,
    };
    e.compute_max = agree(cx, hx, |p| format!("{p}%"))?;
    Ok(e)
}

/// A CUSLICE_ variable and its HAMi equivalent must agree when both are set.
fn agree<T: PartialEq + Copy>(
    cus: Option<Field<T>>,
    hami: Option<Field<T>>,
    fmt: impl Fn(T) -> String,
) -> Result<Option<Field<T>>, String> {
    match (cus, hami) {
        (Some(c), Some(h)) if c.value != h.value => Err(format!(
            "{} conflicts with {}: expected the same limit in both (or only one set), got {} and {}",
            c.label,
            h.label,
            fmt(c.value),
            fmt(h.value)
        )),
        (Some(c), _) => Ok(Some(c)),
        (None, h) => Ok(h),
    }
}

fn is_zero_percent(raw: &str) -> bool {
    let t = raw.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim_end();
    !t.is_empty() && t.bytes().all(|b| b == b'0')
}

// ---------------------------------------------------------------------------
// Value syntax.

/// Sizes: "4GiB", "4096MiB", "4g", "512m", "1.5GiB", "1073741824" (bytes),
/// case-insensitive units k/m/g/t/p with optional "i"/"ib"/"b". ALL binary:
/// 1k = 1024 and "4GB" = 4 GiB. A fraction is rounded down to a whole byte;
/// without a unit (or with "b") the number must be whole.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("expected {SIZE_EXPECTED}, got {}", shown(s));
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(num_end);
    let unit = unit.trim_start_matches(' ').to_ascii_lowercase();
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (num, None),
    };
    if int_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || frac_part.is_some_and(|f| f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    let shift: u32 = match unit.as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" | "kb" => 10,
        "m" | "mi" | "mib" | "mb" => 20,
        "g" | "gi" | "gib" | "gb" => 30,
        "t" | "ti" | "tib" | "tb" => 40,
        "p" | "pi" | "pib" | "pb" => 50,
        _ => return Err(bad()),
    };
    let too_large = || format!("expected a size below 16EiB, got {}", shown(s));
    let mult: u128 = 1u128 << shift;
    let mut total: u128 = 0;
    for b in int_part.bytes() {
        total = total
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(b - b'0')))
            .filter(|v| *v <= u128::from(u64::MAX))
            .ok_or_else(too_large)?;
    }
    total = total.checked_mul(mult).ok_or_else(too_large)?;
    if let Some(f) = frac_part {
        if shift == 0 && f.bytes().any(|b| b != b'0') {
            return Err(format!(
                "expected a whole number of bytes (a fraction needs a unit, like 1.5GiB), got {}",
                shown(s)
            ));
        }
        // Digits past the 18th cannot add a byte at these magnitudes
        // (2^50 / 10^18 < 1); ignoring them keeps the arithmetic in u128.
        let f = &f[..f.len().min(18)];
        let mut frac: u128 = 0;
        for b in f.bytes() {
            frac = frac * 10 + u128::from(b - b'0');
        }
        let denom = 10u128.pow(f.len() as u32);
        total = total
            .checked_add(frac * mult / denom)
            .ok_or_else(too_large)?;
    }
    u64::try_from(total).map_err(|_| too_large())
}

/// Percent: "30", "30%", integer 1..=100 (surrounding spaces allowed).
pub fn parse_percent(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let digits = t.strip_suffix('%').unwrap_or(t).trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected {PERCENT_EXPECTED}, got {}", shown(s)));
    }
    match digits.parse::<u32>() {
        Ok(p @ 1..=100) => u8::try_from(p).map_err(|_| String::new()),
        _ => Err(format!(
            "expected a percentage from 1 to 100, got {}",
            shown(s)
        )),
    }
}

/// "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b" (also without the "GPU-"
/// prefix, or with "MIG-", case-insensitive) -> 16 bytes.
pub fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let bad = || format!("expected a GPU UUID like {UUID_EXAMPLE}, got {}", shown(s));
    let t = s.trim();
    let body = match t.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("gpu-") || p.eq_ignore_ascii_case("mig-") => &t[4..],
        _ => t,
    };
    let b = body.as_bytes();
    if b.len() != 36 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    let mut n = 0;
    let mut hi: Option<u8> = None;
    for (pos, &c) in b.iter().enumerate() {
        if matches!(pos, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return Err(bad());
            }
            continue;
        }
        let v = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return Err(bad()),
        };
        match hi.take() {
            None => hi = Some(v),
            Some(h) => {
                // 32 hex digits between the fixed dashes: n stays below 16.
                if let Some(slot) = out.get_mut(n) {
                    *slot = (h << 4) | v;
                }
                n += 1;
            }
        }
    }
    Ok(out)
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A byte count in the largest binary unit that divides it exactly
/// ("4GiB", "1536MiB", "1048577"); parse_size reads it back.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 5] = [
        (50, "PiB"),
        (40, "TiB"),
        (30, "GiB"),
        (20, "MiB"),
        (10, "KiB"),
    ];
    if bytes != 0 {
        for (shift, unit) in UNITS {
            if bytes.trailing_zeros() >= shift {
                return format!("{}{unit}", bytes >> shift);
            }
        }
    }
    bytes.to_string()
}

/// A user-supplied string for a message: quoted and escaped (so it stays on
/// one line), and cut at 80 characters.
fn shown(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() > MAX {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut:?}...")
    } else {
        format!("{s:?}")
    }
}

/// Forces a message onto one line: control characters become escapes.
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const P: &str = "/etc/cuslice/quota.toml";
    const U1: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";
    const U1_BYTES: [u8; 16] = [
        0x8f, 0x3c, 0x2a, 0x1e, 0x5b, 0x7d, 0x4c, 0x2e, 0x9a, 0x1b, 0x0c, 0x3d, 0x4e, 0x5f, 0x6a,
        0x7b,
    ];
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn file(text: &str) -> Result<Config, ConfigError> {
        parse_file(Path::new(P), text)
    }

    fn env_of(vars: &[(&str, &str)]) -> HashMap<String, String> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A fresh temporary directory (nothing in it unless a test writes).
    fn tmpdir() -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "cuslice-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// load() with a default path that does not exist, unless `default_text` is given.
    fn load_env(vars: &[(&str, &str)], default_text: Option<&str>) -> Result<Config, ConfigError> {
        let map = env_of(vars);
        let dir = tmpdir();
        let default = dir.join("quota.toml");
        if let Some(t) = default_text {
            std::fs::write(&default, t).unwrap();
        }
        let r = load_with(&|k| map.get(k).cloned(), &default);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    // -- bad inputs -------------------------------------------------------

    enum Bad {
        File(&'static str),
        Env(&'static [(&'static str, &'static str)]),
    }

    #[test]
    fn context_overhead_file_and_env() {
        let p = Path::new("/q.toml");
        let c = parse_file(p, "context_overhead = \"300MiB\"\n").expect("parse");
        assert_eq!(c.context_overhead, Some(300 << 20));
        assert_eq!(
            parse_file(p, "context_overhead = 0\n")
                .expect("parse")
                .context_overhead,
            Some(0)
        );
        let e = parse_file(p, "context_overhead = \"32GiB\"\n").expect_err("too big");
        assert_eq!(
            e.0,
            "/q.toml: context_overhead: expected at most 16GiB, got 32GiB"
        );
        let e = parse_file(p, "context_overhead = true\n").expect_err("type");
        assert!(
            e.0.starts_with("/q.toml: context_overhead: expected a size like"),
            "{e}"
        );
        let env = |k: &str| match k {
            "CUSLICE_CONTEXT_OVERHEAD" => Some("1MiB".to_string()),
            "CUSLICE_MEMORY" => Some("1GiB".to_string()),
            _ => None,
        };
        let c = load_with(&env, Path::new("/nonexistent/quota.toml")).expect("env");
        assert_eq!(c.context_overhead, Some(1 << 20));
        let bad = |k: &str| (k == "CUSLICE_CONTEXT_OVERHEAD").then(|| "lots".to_string());
        let e = load_with(&bad, Path::new("/nonexistent/quota.toml")).expect_err("bad env");
        assert!(
            e.0.starts_with("CUSLICE_CONTEXT_OVERHEAD=\"lots\": expected a size like"),
            "{e}"
        );
    }

    #[test]
    fn latency_class_file_and_env() {
        let p = Path::new("/q.toml");
        let c = parse_file(p, "latency = true\n[all]\ncompute = 40\n").expect("latency");
        assert!(c.latency);
        let c =
            parse_file(p, "latency = true\n[device.1]\ncompute_max = 40\n").expect("per device");
        assert!(c.latency);
        assert!(!parse_file(p, "").expect("empty").latency);
        for (text, msg) in [
            (
                "latency = \"yes\"\n[all]\ncompute = 40\n",
                "latency: expected true or false, got \"yes\"",
            ),
            (
                "latency = 1\n[all]\ncompute = 40\n",
                "latency: expected true or false, got 1",
            ),
            (
                "latency = true\n[all]\nmemory = \"1GiB\"\n",
                "latency: expected a tenant with a compute share",
            ),
            ("latncy = true\n", "latncy: expected one of the keys"),
        ] {
            let e = parse_file(p, text).expect_err(text);
            assert!(e.0.starts_with(&format!("/q.toml: {msg}")), "{text}: {e}");
        }
        let c = load_env(
            &[("CUSLICE_LATENCY", "on"), ("CUSLICE_COMPUTE", "30")],
            None,
        )
        .expect("env");
        assert!(c.latency);
        let c = load_env(&[("CUSLICE_LATENCY", "0"), ("CUSLICE_COMPUTE", "30")], None)
            .expect("env off");
        assert!(!c.latency);
        let e = load_env(
            &[("CUSLICE_LATENCY", "sure"), ("CUSLICE_COMPUTE", "30")],
            None,
        )
        .expect_err("bad");
        assert_eq!(
            e.0,
            "CUSLICE_LATENCY=\"sure\": expected 1, true, yes, on or 0, false, no, off, got \"sure\""
        );
        let e = load_env(&[("CUSLICE_LATENCY", "1")], None).expect_err("no share");
        assert!(
            e.0.starts_with("CUSLICE_LATENCY=\"1\": expected a tenant with a compute share"),
            "{e}"
        );
        // A quota file is authoritative: the variable cannot make a tenant
        // latency-sensitive (it would hold the others back).
        let c = load_env(&[("CUSLICE_LATENCY", "1")], Some("[all]\ncompute = 30\n")).expect("file");
        assert!(!c.latency);
        assert!(
            c.ignored_env.contains(&"CUSLICE_LATENCY".to_string()),
            "{:?}",
            c.ignored_env
        );
    }

    #[test]
    fn compute_slice_file_and_env() {
        let p = Path::new("/q.toml");
        assert_eq!(
            parse_file(p, "compute_slice_ms = 5\n")
                .expect("5")
                .compute_slice_ms,
            Some(5)
        );
        assert_eq!(
            parse_file(p, "compute_slice_ms = \"1000ms\"\n")
                .expect("1000")
                .compute_slice_ms,
            Some(1000)
        );
        for (text, msg) in [
            (
                "compute_slice_ms = 0\n",
                "expected whole milliseconds from 1 to 1000, got 0",
            ),
            (
                "compute_slice_ms = 1001\n",
                "expected whole milliseconds from 1 to 1000, got 1001",
            ),
            (
                "compute_slice_ms = \"fast\"\n",
                "expected whole milliseconds from 1 to 1000 (like 20 or \"20ms\"), got \"fast\"",
            ),
        ] {
            let e = parse_file(p, text).expect_err(text);
            assert_eq!(e.0, format!("/q.toml: compute_slice_ms: {msg}"), "{text}");
        }
        let c = load_env(
            &[("CUSLICE_SLICE_MS", "5"), ("CUSLICE_COMPUTE", "30")],
            None,
        )
        .expect("env");
        assert_eq!(c.compute_slice_ms, Some(5));
        let e = load_env(&[("CUSLICE_SLICE_MS", "0")], None).expect_err("bad");
        assert_eq!(
            e.0,
            "CUSLICE_SLICE_MS=\"0\": expected whole milliseconds from 1 to 1000, got \"0\""
        );
        // Before, the shim read this variable whatever the quota file said.
        let c =
            load_env(&[("CUSLICE_SLICE_MS", "1")], Some("[all]\ncompute = 30\n")).expect("file");
        assert_eq!(c.compute_slice_ms, None);
        assert!(
            c.ignored_env.contains(&"CUSLICE_SLICE_MS".to_string()),
            "{:?}",
            c.ignored_env
        );
    }

    #[test]
    fn compute_burst_file_and_env() {
        let p = Path::new("/q.toml");
        for (text, want) in [
            ("compute_burst_ms = 500\n", 500),
            ("compute_burst_ms = \"1000ms\"\n", 1000),
            ("compute_burst_ms = \" 20 ms \"\n", 20),
            ("compute_burst_ms = 10000\n", 10_000),
        ] {
            let c = parse_file(p, text).expect(text);
            assert_eq!(c.compute_burst_ms, Some(want), "{text}");
        }
        assert_eq!(parse_file(p, "").expect("empty").compute_burst_ms, None);
        for (text, msg) in [
            (
                "compute_burst_ms = 0\n",
                "expected whole milliseconds from 1 to 10000, got 0",
            ),
            (
                "compute_burst_ms = 10001\n",
                "expected whole milliseconds from 1 to 10000, got 10001",
            ),
            (
                "compute_burst_ms = -5\n",
                "expected whole milliseconds from 1 to 10000, got -5",
            ),
            (
                "compute_burst_ms = \"0.5s\"\n",
                "expected whole milliseconds from 1 to 10000 (like 200 or \"200ms\"), got \"0.5s\"",
            ),
            (
                "compute_burst_ms = 1.5\n",
                "expected whole milliseconds from 1 to 10000, got 1.5",
            ),
        ] {
            let e = parse_file(p, text).expect_err(text);
            assert_eq!(e.0, format!("/q.toml: compute_burst_ms: {msg}"), "{text}");
        }
        let env = |k: &str| match k {
            "CUSLICE_COMPUTE_BURST_MS" => Some("50".to_string()),
            "CUSLICE_COMPUTE_MAX" => Some("30".to_string()),
            _ => None,
        };
        let c = load_with(&env, Path::new("/nonexistent/quota.toml")).expect("env");
        assert_eq!(c.compute_burst_ms, Some(50));
        let bad =
            |k: &str| (k == "CUSLICE_COMPUTE_BURST_MS").then(|| "99999999999999999999".to_string());
        let e = load_with(&bad, Path::new("/nonexistent/quota.toml")).expect_err("bad env");
        assert!(
            e.0.starts_with(
                "CUSLICE_COMPUTE_BURST_MS=\"99999999999999999999\": expected whole milliseconds"
            ),
            "{e}"
        );
        // A quota file is authoritative: the variable cannot change the burst.
        let c = load_env(
            &[("CUSLICE_COMPUTE_BURST_MS", "5")],
            Some("compute_burst_ms = 300\n"),
        )
        .expect("file");
        assert_eq!(c.compute_burst_ms, Some(300));
        assert!(
            c.ignored_env
                .contains(&"CUSLICE_COMPUTE_BURST_MS".to_string()),
            "{:?}",
            c.ignored_env
        );
    }

    #[test]
    fn bad_inputs_table() {
        use Bad::*;
        let size = "expected a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes";
        #[rustfmt::skip]
        let cases: Vec<(Bad, String)> = vec![
            // syntax
            (File("tenant = \"a\"\n\n[all]\nmemory = = 3\n"),
             format!("{P}: line 4: TOML syntax error: ")),
            (File("[all\nmemory = 1\n"), format!("{P}: line 1: TOML syntax error: ")),
            (File("[all]\nmemory = 1\nmemory = 2\n"), format!("{P}: line 3: TOML syntax error: ")),
            // unknown keys
            (File("tenants = \"a\"\n"),
             format!("{P}: tenants: expected one of the keys tenant, segment_dir, gpu_segment_dir, context_overhead, compute_burst_ms, compute_slice_ms, latency, all, device, got unknown key \"tenants\" (did you mean tenant?)")),
            (File("[all]\nswap = \"1GiB\"\n"),
             format!("{P}: all.swap: expected one of the keys memory, compute, compute_max, got unknown key \"swap\"")),
            (File("[device.0]\nmemroy = \"1GiB\"\n"),
             format!("{P}: device.0.memroy: expected one of the keys memory, compute, compute_max, got unknown key \"memroy\" (did you mean memory?)")),
            (File("[all.extra]\n"), format!("{P}: all.extra: expected one of the keys")),
            // memory
            (File("[all]\nmemory = -5\n"), format!("{P}: all.memory: {size}, got -5")),
            (File("[all]\nmemory = 0\n"), format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got 0")),
            (File("[all]\nmemory = \"0\"\n"), format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got \"0\"")),
            (File("[device.0]\nmemory = \"4 potatoes\"\n"),
             format!("{P}: device.0.memory: {size}, got \"4 potatoes\"")),
            (File("[all]\nmemory = \"4GX\"\n"), format!("{P}: all.memory: {size}, got \"4GX\"")),
            (File("[all]\nmemory = \"2PiB\"\n"),
             format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got \"2PiB\"")),
            (File("[all]\nmemory = \"512KiB\"\n"),
             format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got \"512KiB\"")),
            (File("[all]\nmemory = \"99999999999999999999\"\n"),
             format!("{P}: all.memory: expected a size below 16EiB, got \"99999999999999999999\"")),
            (File("[all]\nmemory = \"1.5\"\n"), format!("{P}: all.memory: expected a whole number of bytes")),
            (File("[all]\nmemory = true\n"), format!("{P}: all.memory: {size}, got true")),
            (File("[all]\nmemory = 4.5\n"), format!("{P}: all.memory: {size}, got 4.5")),
            (File("[all]\nmemory = [1]\n"), format!("{P}: all.memory: {size}, got an array")),
            // compute
            (File("[all]\ncompute = 0\n"), format!("{P}: all.compute: expected a percentage from 1 to 100, got 0")),
            (File("[all]\ncompute = 101\n"), format!("{P}: all.compute: expected a percentage from 1 to 100, got 101")),
            (File("[all]\ncompute = \"abc\"\n"),
             format!("{P}: all.compute: expected a percentage from 1 to 100 like 30 or \"30%\", got \"abc\"")),
            (File("[all]\ncompute = \"0%\"\n"), format!("{P}: all.compute: expected a percentage from 1 to 100, got \"0%\"")),
            (File("[all]\ncompute = 30.0\n"), format!("{P}: all.compute: expected a percentage from 1 to 100 like 30 or \"30%\", got 30.0")),
            (File("[all]\ncompute_max = 0\n"), format!("{P}: all.compute_max: expected a percentage from 1 to 100, got 0")),
            (File("[all]\ncompute = 40\ncompute_max = 30\n"),
             format!("{P}: all.compute_max: expected a ceiling of at least the guaranteed share 40 (all.compute), got 30")),
            (File("[all]\ncompute = 40\n[device.1]\ncompute_max = 30\n"),
             format!("{P}: device.1.compute_max: expected a ceiling of at least the guaranteed share 40 (all.compute), got 30")),
            (File("[all]\ncompute_max = 50\n[device.1]\ncompute = 60\n"),
             format!("{P}: device.1.compute: expected a guaranteed share of at most the ceiling 50 (all.compute_max), got 60")),
            (File("[device.0]\ncompute_max = 50\n[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\ncompute = 60\n"),
             format!("{P}: device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b.compute: expected a guaranteed share of at most the ceiling 50 (device.0.compute_max) for a GPU matched by both device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b and device.0, got 60")),
            // device keys
            (File("[device.gpu0]\nmemory = \"1GiB\"\n"),
             format!("{P}: device.gpu0: expected a device index from 0 to 63 or a GPU UUID like {U1}, got \"gpu0\"")),
            (File("[device.64]\nmemory = \"1GiB\"\n"),
             format!("{P}: device.64: expected a device index from 0 to 63, got \"64\"")),
            (File("[device.99999999999]\n"), format!("{P}: device.99999999999: expected a device index from 0 to 63, got")),
            (File("[device.01]\n"), format!("{P}: device.01: expected a device index from 0 to 63 in plain decimal, got \"01\"")),
            (File("[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7\"]\n"),
             format!("{P}: device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7: expected a GPU UUID like {U1}, got \"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7\"")),
            (File("[device.\"GPU-zf3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\n"),
             format!("{P}: device.GPU-zf3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b: expected a GPU UUID like")),
            (File("[device.\"GPU-8F3C2A1E-5B7D-4C2E-9A1B-0C3D4E5F6A7B\"]\n[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\n"),
             format!("{P}: device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b: expected each GPU once, got the same UUID as device.GPU-8F3C2A1E-5B7D-4C2E-9A1B-0C3D4E5F6A7B")),
            (File("device = 3\n"), format!("{P}: device: expected tables like [device.0]")),
            (File("[device]\n0 = 3\n"), format!("{P}: device.0: expected a table of memory, compute, compute_max, got 3")),
            (File("all = \"4GiB\"\n"), format!("{P}: all: expected a table of memory, compute, compute_max, got \"4GiB\"")),
            // segment_dir, tenant
            (File("segment_dir = \"run/cuslice\"\n"),
             format!("{P}: segment_dir: expected an absolute path like /run/cuslice/abc, got \"run/cuslice\"")),
            (File("segment_dir = 5\n"), format!("{P}: segment_dir: expected a string holding an absolute path, got 5")),
            (File("tenant = \"team a\"\n"),
             format!("{P}: tenant: expected 1 to 64 characters of A-Z a-z 0-9 . _ / -, got \"team a\"")),
            (File("tenant = \"\"\n"), format!("{P}: tenant: expected 1 to 64 characters")),
            (File("tenant = \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n"),
             format!("{P}: tenant: expected 1 to 64 characters")),
            (File("tenant = \"../etc\"\n"), format!("{P}: tenant: expected /-separated names without empty, \".\" or \"..\" parts, got \"../etc\"")),
            (File("tenant = 7\n"), format!("{P}: tenant: expected a string of 1 to 64 characters of A-Z a-z 0-9 . _ / -, got 7")),
            // environment
            (Env(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "lots")]),
             format!("CUDA_DEVICE_MEMORY_LIMIT_0=\"lots\": {size}, got \"lots\"")),
            (Env(&[("CUSLICE_MEMORY", "4GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g")]),
             "CUSLICE_MEMORY=\"4GiB\" conflicts with CUDA_DEVICE_MEMORY_LIMIT=\"2g\": expected the same limit in both (or only one set), got 4GiB and 2GiB".to_string()),
            (Env(&[("CUSLICE_MEMORY_3", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT_3", "2048m")]),
             "CUSLICE_MEMORY_3=\"1GiB\" conflicts with CUDA_DEVICE_MEMORY_LIMIT_3=\"2048m\"".to_string()),
            (Env(&[("CUSLICE_COMPUTE_MAX", "50"), ("CUDA_DEVICE_SM_LIMIT", "60")]),
             "CUSLICE_COMPUTE_MAX=\"50\" conflicts with CUDA_DEVICE_SM_LIMIT=\"60\": expected the same limit in both (or only one set), got 50% and 60%".to_string()),
            (Env(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")]),
             "CUDA_DEVICE_MEMORY_LIMIT=\"0\": expected a size from 1MiB to 1PiB, got \"0\"".to_string()),
            (Env(&[("CUDA_DEVICE_MEMORY_LIMIT", "0x100000000")]),
             format!("CUDA_DEVICE_MEMORY_LIMIT=\"0x100000000\": {size}")),
            (Env(&[("CUDA_DEVICE_SM_LIMIT", "120")]),
             "CUDA_DEVICE_SM_LIMIT=\"120\": expected a percentage from 1 to 100, got \"120\"".to_string()),
            (Env(&[("CUSLICE_COMPUTE", "abc")]),
             "CUSLICE_COMPUTE=\"abc\": expected a percentage from 1 to 100 like 30 or \"30%\", got \"abc\"".to_string()),
            (Env(&[("CUSLICE_COMPUTE", "40"), ("CUDA_DEVICE_SM_LIMIT_2", "30")]),
             "CUDA_DEVICE_SM_LIMIT_2=\"30\": expected a ceiling of at least the guaranteed share 40 (CUSLICE_COMPUTE=\"40\"), got 30".to_string()),
            (Env(&[("CUSLICE_TENANT", "a b")]),
             "CUSLICE_TENANT=\"a b\": expected 1 to 64 characters".to_string()),
            (Env(&[("CUSLICE_SEGMENT_DIR", "shm")]),
             "CUSLICE_SEGMENT_DIR=\"shm\": expected an absolute path".to_string()),
            (Env(&[("CUSLICE_CONFIG", "/nonexistent/cuslice/quota.toml")]),
             "CUSLICE_CONFIG=\"/nonexistent/cuslice/quota.toml\": expected an existing quota file, got no such file".to_string()),
        ];
        assert!(cases.len() >= 20);
        for (input, want) in &cases {
            let (what, got) = match input {
                File(t) => (format!("file {t:?}"), file(t)),
                Env(vars) => (format!("env {vars:?}"), load_env(vars, None)),
            };
            match got {
                Ok(c) => panic!("{what}: expected an error containing {want:?}, got Ok({c:?})"),
                Err(e) => {
                    assert!(
                        e.0.starts_with(want.as_str()),
                        "{what}:\n  want prefix {want:?}\n  got         {:?}",
                        e.0
                    );
                    assert!(
                        !e.0.contains('\n') && !e.0.contains('\r'),
                        "{what}: not one line: {e}"
                    );
                    assert_eq!(e.to_string(), e.0);
                }
            }
        }
    }

    #[test]
    fn syntax_error_message_is_flattened() {
        let e = file("[all]\nmemory = \"4GiB\"\ncompute = \n").unwrap_err();
        assert!(
            e.0.starts_with(&format!("{P}: line 3: TOML syntax error: ")),
            "{e}"
        );
        assert!(!e.0.contains('\n'));
    }

    #[test]
    fn weird_paths_and_values_stay_on_one_line() {
        let e =
            parse_file(Path::new("/tmp/a\nb.toml"), "[all]\nmemory = \"1\\nGiB\"\n").unwrap_err();
        assert!(!e.0.contains('\n'), "{e}");
        assert!(e.0.starts_with("/tmp/a\\nb.toml: all.memory: "), "{e}");
        let long = "x".repeat(500);
        let e = file(&format!("[all]\nmemory = \"{long}\"\n")).unwrap_err();
        assert!(e.0.len() < 300, "{e}");
    }

    #[test]
    fn unreadable_default_file_is_an_error_not_a_fallback() {
        // A directory where the file should be: it exists but cannot be read.
        let dir = tmpdir();
        let default = dir.join("quota.toml");
        std::fs::create_dir(&default).unwrap();
        let e = load_with(&|_| None, &default).unwrap_err();
        assert!(
            e.0.starts_with(&format!(
                "{}: expected a readable quota file, got ",
                default.display()
            )),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cuslice_config_unreadable_names_the_variable() {
        let dir = tmpdir();
        let d = dir.display().to_string();
        let map = env_of(&[("CUSLICE_CONFIG", &d)]);
        let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
        assert!(
            e.0.starts_with(&format!(
                "CUSLICE_CONFIG={d:?}: expected a readable quota file"
            )),
            "{e}"
        );
        // Not UTF-8.
        let f = dir.join("bin.toml");
        std::fs::write(&f, b"tenant = \"\xff\"\n").unwrap();
        let fs = f.display().to_string();
        let map = env_of(&[("CUSLICE_CONFIG", &fs)]);
        let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
        assert!(
            e.0.contains("expected UTF-8 text, got invalid UTF-8 at byte 10"),
            "{e}"
        );
        // Too large.
        let big = dir.join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
        let bs = big.display().to_string();
        let map = env_of(&[("CUSLICE_CONFIG", &bs)]);
        let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
        assert!(e.0.contains("expected a quota file of at most 1MiB"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cuslice_config_file_errors_name_its_path() {
        let dir = tmpdir();
        let f = dir.join("q.toml");
        std::fs::write(&f, "[all]\ncompute = 101\n").unwrap();
        let fs = f.display().to_string();
        let map = env_of(&[("CUSLICE_CONFIG", &fs)]);
        let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
        assert_eq!(
            e.0,
            format!("{fs}: all.compute: expected a percentage from 1 to 100, got 101")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    // -- good inputs ------------------------------------------------------

    #[test]
    fn size_forms() {
        let cases: &[(&str, u64)] = &[
            ("4GiB", 4 * GIB),
            ("4096MiB", 4 * GIB),
            ("4g", 4 * GIB),
            ("4G", 4 * GIB),
            ("4Gi", 4 * GIB),
            ("4GB", 4 * GIB),
            ("4gb", 4 * GIB),
            ("512m", 512 * MIB),
            ("512 MiB", 512 * MIB),
            (" 512M ", 512 * MIB),
            ("1.5GiB", 3 * GIB / 2),
            ("0.5g", GIB / 2),
            ("0.1GiB", 107_374_182),
            ("1073741824", GIB),
            ("1073741824b", GIB),
            ("1024k", MIB),
            ("1KiB", 1024),
            ("1kb", 1024),
            ("2t", 2 << 40),
            ("1TiB", 1 << 40),
            ("1PiB", 1 << 50),
            ("1p", 1 << 50),
            ("0", 0),
            ("1.0", 1),
            ("1.00000000000000000000000001GiB", GIB),
            ("1.99999999999999999999999999k", 2047),
        ];
        for (s, want) in cases {
            assert_eq!(parse_size(s), Ok(*want), "{s}");
        }
        // Units above P are not known.
        assert!(parse_size("1EiB").is_err());
        assert_eq!(parse_size("16383PiB"), Ok(16383u64 << 50));
        assert!(parse_size("16384PiB").unwrap_err().contains("below 16EiB"));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_size("18446744073709551616").is_err());
        for bad in [
            "",
            " ",
            "g",
            "4.g",
            ".5g",
            "-1",
            "+1",
            "4 potatoes",
            "4GX",
            "4gib2",
            "1e9",
            "0x10",
            "4,5g",
            "4..5g",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(
                e.starts_with(
                    "expected a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes, got "
                ),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn format_size_round_trips() {
        for b in [
            0,
            1,
            1023,
            1024,
            MIB,
            1536 * MIB,
            4 * GIB,
            1 << 40,
            1 << 50,
            3 << 50,
            1_048_577,
            u64::MAX,
        ] {
            assert_eq!(parse_size(&format_size(b)), Ok(b), "{b}");
        }
        assert_eq!(format_size(4 * GIB), "4GiB");
        assert_eq!(format_size(1536 * MIB), "1536MiB");
        assert_eq!(format_size(1_048_577), "1048577");
    }

    #[test]
    fn percent_forms() {
        assert_eq!(parse_percent("30"), Ok(30));
        assert_eq!(parse_percent("30%"), Ok(30));
        assert_eq!(parse_percent(" 30 % "), Ok(30));
        assert_eq!(parse_percent("1"), Ok(1));
        assert_eq!(parse_percent("100%"), Ok(100));
        assert_eq!(parse_percent("007"), Ok(7));
        for bad in ["0", "101", "", "%", "-5", "30.5", "abc", "99999999999999"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uuid_forms() {
        assert_eq!(parse_uuid(U1), Ok(U1_BYTES));
        assert_eq!(parse_uuid(&U1.to_uppercase()), Ok(U1_BYTES));
        assert_eq!(parse_uuid(&U1[4..]), Ok(U1_BYTES));
        assert_eq!(
            parse_uuid("gpu-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b"),
            Ok(U1_BYTES)
        );
        assert_eq!(
            parse_uuid("MIG-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b"),
            Ok(U1_BYTES)
        );
        assert_eq!(format_uuid(&U1_BYTES), U1);
        assert_eq!(parse_uuid(&format_uuid(&[0xab; 16])), Ok([0xab; 16]));
        for bad in [
            "",
            "GPU-",
            "GPU-8f3c2a1e5b7d4c2e9a1b0c3d4e5f6a7b",
            "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b0",
            "GPU-8f3c2a1e-5b7d-4c2e-9a1b_0c3d4e5f6a7b",
            "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7g",
            "XPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b",
            "GPU-é3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b",
        ] {
            let e = parse_uuid(bad).unwrap_err();
            assert!(e.starts_with("expected a GPU UUID like GPU-"), "{bad}: {e}");
        }
    }

    #[test]
    fn full_file_and_precedence_per_field() {
        let text = format!(
            r#"
# a comment
tenant = "team-a/trainer"
segment_dir = "/run/cuslice/abc"

[all]
memory = "4GiB"
compute = 30
compute_max = 50

[device.0]
memory = 8589934592
compute_max = "60%"

[device.1]
compute = "35"

[device."{U1}"]
memory = "2GiB"
compute = 40
"#
        );
        let c = file(&text).unwrap();
        assert_eq!(c.source, Source::File(PathBuf::from(P)));
        assert_eq!(c.tenant.as_deref(), Some("team-a/trainer"));
        assert_eq!(c.segment_dir, PathBuf::from("/run/cuslice/abc"));
        assert_eq!(
            c.all,
            Limits {
                memory: Some(4 * GIB),
                compute: Some(30),
                compute_max: Some(50)
            }
        );
        assert!(c.has_limits());
        assert!(c.ignored_env.is_empty());
        let other = [0u8; 16];
        // Index 0, another GPU: memory and ceiling from device.0, share from [all].
        assert_eq!(
            c.limits_for(0, &other),
            Limits {
                memory: Some(8 * GIB),
                compute: Some(30),
                compute_max: Some(60)
            }
        );
        // Index 0 with U1: memory and share from the UUID, ceiling from device.0.
        assert_eq!(
            c.limits_for(0, &U1_BYTES),
            Limits {
                memory: Some(2 * GIB),
                compute: Some(40),
                compute_max: Some(60)
            }
        );
        // Index 1: share from device.1, the rest from [all].
        assert_eq!(
            c.limits_for(1, &other),
            Limits {
                memory: Some(4 * GIB),
                compute: Some(35),
                compute_max: Some(50)
            }
        );
        // Index 5 with U1: UUID over [all].
        assert_eq!(
            c.limits_for(5, &U1_BYTES),
            Limits {
                memory: Some(2 * GIB),
                compute: Some(40),
                compute_max: Some(50)
            }
        );
        // Nothing configured for index 7: [all].
        assert_eq!(c.limits_for(7, &other), c.all);
    }

    #[test]
    fn uuid_keys_without_prefix_or_bare() {
        let c = file(&format!("[device.{}]\nmemory = \"1g\"\n", &U1[4..])).unwrap();
        assert_eq!(c.by_uuid.get(&U1_BYTES).and_then(|l| l.memory), Some(GIB));
        let c = file(&format!("[device.{U1}]\nmemory = \"1g\"\n")).unwrap();
        assert_eq!(c.limits_for(3, &U1_BYTES).memory, Some(GIB));
        assert_eq!(c.limits_for(3, &[0; 16]).memory, None);
    }

    #[test]
    fn empty_file_means_no_limits() {
        for text in ["", "\n", "# nothing here\n", "[all]\n", "[device]\n"] {
            let c = file(text).unwrap();
            assert_eq!(c.source, Source::File(PathBuf::from(P)));
            assert!(!c.has_limits(), "{text:?}");
            assert_eq!(c.segment_dir, PathBuf::from(DEFAULT_SEGMENT_DIR));
            assert_eq!(c.tenant, None);
            assert_eq!(c.limits_for(0, &[0; 16]), Limits::default());
        }
        // An empty device table is still an entry, but sets nothing.
        let c = file("[device.2]\n").unwrap();
        assert!(!c.has_limits());
    }

    #[test]
    fn boundaries_accepted() {
        let c = file("[all]\nmemory = \"1MiB\"\ncompute = 100\ncompute_max = 100\n").unwrap();
        assert_eq!(
            c.all,
            Limits {
                memory: Some(MIB),
                compute: Some(100),
                compute_max: Some(100)
            }
        );
        let c = file("[device.63]\nmemory = \"1PiB\"\ncompute = 1\ncompute_max = 1\n").unwrap();
        assert_eq!(c.by_index[&63].memory, Some(1 << 50));
        let c = file("[all]\ncompute = 30\ncompute_max = 30\n").unwrap();
        assert_eq!(c.all.compute_max, Some(30));
        // A device's own ceiling may lift [all]'s only up to 100, and a
        // device's share below [all]'s ceiling is fine.
        let c =
            file("[all]\ncompute_max = 50\n[device.0]\ncompute = 20\ncompute_max = 90\n").unwrap();
        assert_eq!(
            c.limits_for(0, &[0; 16]),
            Limits {
                memory: None,
                compute: Some(20),
                compute_max: Some(90)
            }
        );
        // A device that sets both overrides [all]'s inconsistent-looking pair.
        let c = file("[all]\ncompute = 60\n[device.0]\ncompute = 10\ncompute_max = 20\n").unwrap();
        assert_eq!(c.limits_for(0, &[0; 16]).compute, Some(10));
    }

    #[test]
    fn limits_for_clamps_a_hand_built_inconsistent_config() {
        let mut c = Config::unlimited(Source::None);
        c.all.compute = Some(60);
        c.by_index.insert(
            0,
            Limits {
                compute_max: Some(40),
                ..Limits::default()
            },
        );
        assert_eq!(c.limits_for(0, &[0; 16]).compute, Some(40));
        assert!(c.has_limits());
    }

    #[test]
    fn no_file_no_env_is_none() {
        let c = load_env(&[], None).unwrap();
        assert_eq!(c, Config::unlimited(Source::None));
        // Empty values count as unset.
        let c = load_env(&[("CUSLICE_MEMORY", ""), ("CUSLICE_CONFIG", "")], None).unwrap();
        assert_eq!(c.source, Source::None);
        // Tenant and segment dir alone are not limits.
        let c = load_env(
            &[
                ("CUSLICE_TENANT", "t1"),
                ("CUSLICE_SEGMENT_DIR", "/tmp/seg"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.source, Source::None);
        assert_eq!(c.tenant.as_deref(), Some("t1"));
        assert_eq!(c.segment_dir, PathBuf::from("/tmp/seg"));
    }

    #[test]
    fn env_only_configs() {
        let c = load_env(
            &[
                ("CUSLICE_MEMORY", "4GiB"),
                ("CUSLICE_MEMORY_1", "2147483648"),
                ("CUSLICE_COMPUTE", "30%"),
                ("CUSLICE_COMPUTE_MAX", "50"),
                ("CUSLICE_COMPUTE_2", "45"),
                ("CUSLICE_COMPUTE_MAX_3", "80"),
                ("CUSLICE_TENANT", "team-b"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.source, Source::Env);
        assert_eq!(c.tenant.as_deref(), Some("team-b"));
        assert_eq!(
            c.all,
            Limits {
                memory: Some(4 * GIB),
                compute: Some(30),
                compute_max: Some(50)
            }
        );
        let z = [0u8; 16];
        assert_eq!(c.limits_for(1, &z).memory, Some(2 * GIB)); // CUSLICE plain number = bytes
        assert_eq!(c.limits_for(2, &z).compute, Some(45));
        assert_eq!(c.limits_for(3, &z).compute_max, Some(80));
        assert_eq!(c.limits_for(0, &z), c.all);
        assert_eq!(
            c.by_index.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(c.ignored_env.is_empty());
    }

    #[test]
    fn hami_semantics() {
        let z = [0u8; 16];
        // Plain numbers are bytes in HAMi-core too; m/g suffixes binary.
        let c = load_env(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "1073741824"),
                ("CUDA_DEVICE_MEMORY_LIMIT_2", "2g"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.source, Source::Env);
        assert_eq!(c.all.memory, Some(4 * GIB));
        assert_eq!(c.limits_for(1, &z).memory, Some(GIB));
        assert_eq!(c.limits_for(2, &z).memory, Some(2 * GIB));
        // SM limit -> compute_max, a ceiling; per device too.
        let c = load_env(
            &[
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("CUDA_DEVICE_SM_LIMIT_0", "60"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            c.all,
            Limits {
                memory: None,
                compute: None,
                compute_max: Some(30)
            }
        );
        assert_eq!(c.limits_for(0, &z).compute_max, Some(60));
        assert_eq!(c.limits_for(1, &z).compute_max, Some(30));
        // SM limit 0 means no limit; the variable still makes the source Env.
        let c = load_env(&[("CUDA_DEVICE_SM_LIMIT", "0")], None).unwrap();
        assert_eq!(c.source, Source::Env);
        assert!(!c.has_limits());
        // A per-device 0 falls back to the all-devices value, as in HAMi-core.
        let c = load_env(
            &[
                ("CUDA_DEVICE_SM_LIMIT", "40"),
                ("CUDA_DEVICE_SM_LIMIT_0", "0"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.limits_for(0, &z).compute_max, Some(40));
        // 0 does not conflict with a CUSLICE ceiling: it is unset.
        let c = load_env(
            &[("CUSLICE_COMPUTE_MAX", "70"), ("CUDA_DEVICE_SM_LIMIT", "0")],
            None,
        )
        .unwrap();
        assert_eq!(c.all.compute_max, Some(70));
        // Both set to the same limit, written differently: fine.
        let c = load_env(
            &[
                ("CUSLICE_MEMORY", "4GiB"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
                ("CUSLICE_COMPUTE_MAX", "30%"),
                ("CUDA_DEVICE_SM_LIMIT", "30"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            c.all,
            Limits {
                memory: Some(4 * GIB),
                compute: None,
                compute_max: Some(30)
            }
        );
        // Share and HAMi ceiling together.
        let c = load_env(
            &[("CUSLICE_COMPUTE", "20"), ("CUDA_DEVICE_SM_LIMIT", "50")],
            None,
        )
        .unwrap();
        assert_eq!(
            c.all,
            Limits {
                memory: None,
                compute: Some(20),
                compute_max: Some(50)
            }
        );
    }

    #[test]
    fn file_wins_and_env_is_listed_as_ignored() {
        let c = load_env(
            &[
                ("CUSLICE_MEMORY", "64GiB"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"),
                ("CUDA_DEVICE_SM_LIMIT", "100"),
                ("CUSLICE_TENANT", "someone-else"),
                ("CUSLICE_SEGMENT_DIR", "/tmp/elsewhere"),
                ("CUSLICE_COMPUTE", "not even valid"),
                ("CUSLICE_COMPUTE_MAX", ""),
                ("HOME", "/root"),
            ],
            Some("tenant = \"team-a\"\n[all]\nmemory = \"4GiB\"\ncompute_max = 20\n"),
        )
        .unwrap();
        assert!(matches!(c.source, Source::File(_)));
        assert_eq!(c.tenant.as_deref(), Some("team-a"));
        assert_eq!(c.segment_dir, PathBuf::from(DEFAULT_SEGMENT_DIR));
        assert_eq!(
            c.limits_for(0, &[0; 16]),
            Limits {
                memory: Some(4 * GIB),
                compute: None,
                compute_max: Some(20)
            }
        );
        assert_eq!(
            c.ignored_env,
            vec![
                "CUSLICE_MEMORY",
                "CUSLICE_COMPUTE",
                "CUDA_DEVICE_MEMORY_LIMIT_0",
                "CUDA_DEVICE_SM_LIMIT",
                "CUSLICE_TENANT",
                "CUSLICE_SEGMENT_DIR",
            ]
        );
    }

    #[test]
    fn cuslice_config_is_used_only_without_a_mounted_file() {
        let dir = tmpdir();
        let f = dir.join("mine.toml");
        std::fs::write(&f, "[device.0]\nmemory = \"3GiB\"\n").unwrap();
        let default = dir.join("quota.toml");
        let fs = f.display().to_string();
        let map = env_of(&[("CUSLICE_CONFIG", &fs), ("CUSLICE_MEMORY_0", "9GiB")]);
        // No mounted file: CUSLICE_CONFIG names the file, env limits ignored.
        let c = load_with(&|k| map.get(k).cloned(), &default).unwrap();
        assert_eq!(c.source, Source::File(f.clone()));
        assert_eq!(c.limits_for(0, &[0; 16]).memory, Some(3 * GIB));
        assert_eq!(c.all.memory, None);
        assert_eq!(c.ignored_env, vec!["CUSLICE_MEMORY_0"]);
        // A mounted file is authoritative: CUSLICE_CONFIG cannot swap it for
        // a more generous one.
        std::fs::write(&default, "[all]\nmemory = \"1GiB\"\n").unwrap();
        let c = load_with(&|k| map.get(k).cloned(), &default).unwrap();
        assert_eq!(c.source, Source::File(default.clone()));
        assert_eq!(c.all.memory, Some(GIB));
        assert_eq!(c.limits_for(0, &[0; 16]).memory, Some(GIB));
        assert_eq!(c.ignored_env, vec!["CUSLICE_MEMORY_0", "CUSLICE_CONFIG"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn real_default_path_is_the_documented_one() {
        assert_eq!(DEFAULT_CONFIG_PATH, "/etc/cuslice/quota.toml");
        // load() itself must not panic whatever this machine holds.
        let _ = load(&|_| None);
    }

    #[test]
    fn garbage_never_panics() {
        let samples = [
            "\0",
            "[",
            "]]",
            "a=",
            "[device.\"\"]",
            "[device.\"\\u0000\"]",
            "all = []",
            "[[all]]\nmemory=1",
            "[[device]]",
            "device = { 0 = { memory = \"1g\" } }",
            "[all]\nmemory = 9223372036854775807",
            "[all]\nmemory = -9223372036854775808",
            "[all]\ncompute = 255",
            "[all]\ncompute = 256",
            "[all]\ncompute = -1",
            "tenant = \"a/\"",
            "tenant = \"/a\"",
            "tenant = \"a//b\"",
            "tenant = \"a/./b\"",
            "segment_dir = \"/a\\u0000b\"",
            "x = 1979-05-27",
            "[device.\"GPU-\"]",
        ];
        for s in samples {
            let _ = file(s);
        }
        // Inline tables work like sections.
        let c = file("device = { 0 = { memory = \"1g\" } }").unwrap();
        assert_eq!(c.by_index[&0].memory, Some(GIB));
        for (s, ok) in [
            ("tenant = \"a/b.c_d-e\"", true),
            ("tenant = \"a/\"", false),
            ("tenant = \"a/./b\"", false),
        ] {
            assert_eq!(file(s).is_ok(), ok, "{s}");
        }
        assert!(file("segment_dir = \"/a\\u0000b\"").is_err());
    }
}
