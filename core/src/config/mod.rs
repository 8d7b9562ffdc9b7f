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
//! slice = "ctr-3f2a9c"               # optional: which container, claim or session
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
//! | `tenant`      | string, 1 to 56 characters of `A-Z a-z 0-9 . _ / -`; `/` separates components, and no component may be empty, `.` or `..` (so no leading, trailing or doubled `/`). 56: a GPU segment's tenant entry keeps the name in 56 of its 64 name bytes, the slice's tag in the other 8 |
//! | `slice`       | string, 1 to 128 characters of `A-Z a-z 0-9 . _ : / -`: which container, DRA claim or `cuslice run` session the file is for (the OCI hook writes `ctr-<container id>`, the DRA plugin `claim-<claim uid>`, `cuslice run` `run-<its run directory's name>`). Processes share a tenant's entry in a GPU segment (its share, ceiling, accounting) only where both the tenant name and the slice are theirs ([`Config::slice_tag`]): two containers given one tenant name get two entries, and neither can change the other's share. Not settable from the environment; absent, the tag is 0 (as written by an older hook) |
//! | `segment_dir` | string, an absolute path (no NUL); default `/dev/shm/cuslice` ([`DEFAULT_SEGMENT_DIR`]) |
//! | `gpu_segment_dir` | string, an absolute path: directory of the per-GPU scheduling segments shared by all tenants of the host; default `/dev/shm/cuslice/gpu` ([`DEFAULT_GPU_SEGMENT_DIR`]) |
//! | `context_overhead` | device memory one CUDA context costs, charged to the memory quota once per GPU per process: a size from `0` to `16GiB`; default: the shim's measured value |
//! | `compute_burst_ms` | how long a tenant held back by its ceiling (`compute_max`) then runs at a stretch: whole milliseconds `1`..=`10000` (an integer, or a string `"200"` / `"200ms"`); default 200 ([`DEFAULT_COMPUTE_BURST_MS`]). Longer: throughput closer to the ceiling for power-hungry kernels; shorter: shorter pauses. Needs a `compute` or `compute_max` somewhere in the file (alone it would shape nothing: an error) |
//! | `compute_slice_ms` | length of one slice of the GPU lease, in whole milliseconds `1`..=`1000` (an integer, or `"20"` / `"20ms"`); default 20. For experiments: shorter slices hand the GPU over more often, at a higher cost per hand-over. Needs a `compute` or `compute_max` somewhere in the file, as `compute_burst_ms` |
//! | `latency`     | `true` or `false` (default): the tenant is latency-sensitive (an inference service). While it has work in flight, other tenants on the GPU hold back, and it never waits for the lease while under its share; its GPU time still counts against its share and ceiling (docs/compute-share.md). Needs a `compute` or `compute_max` somewhere in the file |
//! | `memory_wait` | how long an allocation refused for want of memory (the quota, the GPU's memory pool, or the driver's out of memory for `cuMemAlloc*`) waits for memory to be freed before it fails: a string `"30s"`, `"500ms"`, `"2m"`, `"1h"` (whole numbers, at most one hour) or `"0"` (the default: it fails at once). Needs a `memory` somewhere in the file |
//! | `[all]`       | a limits table that applies to every GPU |
//! | `[device.<k>]`| a limits table for one GPU; `<k>` is an index `0`..=`63` written in plain decimal (`0`, `7`, not `07`), or a GPU UUID |
//!
//! A limits table holds (all optional; any other key is an error):
//!
//! | key           | value |
//! |---------------|-------|
//! | `memory`      | a size string (see below) or a non-negative integer number of bytes; from 1 MiB to 1 PiB: what the tenant is guaranteed on the GPU |
//! | `memory_max`  | a size as `memory`, not below the `memory` that applies to the same GPU (which must be set): the most the tenant may use while memory no tenant is guaranteed is free (docs/memory-quota.md, "Guaranteed memory and burst") |
//! | `compute`     | guaranteed share of GPU time: an integer `1`..=`100`, or a string `"30"` / `"30%"` |
//! | `compute_max` | ceiling on GPU time, same forms, `1`..=`100`, and not below the guaranteed share that applies to the same GPU. Given alone (no `compute` for that GPU), it is the guaranteed share too: a tenant with `compute_max = 30` is given 30 % and held to 30 % |
//!
//! Device indices are CUDA's numbering of the GPUs visible to the process
//! (after `CUDA_VISIBLE_DEVICES`), like HAMi's `CUDA_DEVICE_MEMORY_LIMIT_<i>`.
//! An entry that matches none of the GPUs a process sees (an index at or
//! past their number, a UUID none of them has) limits nothing in that
//! process: the shim says so in one warning line per entry (not an error:
//! one file serves every process of a container, and a process may see
//! fewer of its GPUs).
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
//! Empty values count as unset. `<i>` is a device index `0`..=`63`, in
//! plain decimal. A set variable that starts like one of these but is
//! none of them (`CUSLICE_MEMORY_64`, `CUSLICE_MEM`,
//! `CUDA_DEVICE_SM_LIMIT_01`, `CUSLICE_COMPUTEMAX`: prefixes
//! `CUSLICE_MEM`, `CUSLICE_COMPUTE`, `CUSLICE_SLICE`, `CUSLICE_LATENC`,
//! `CUSLICE_TENANT`, `CUSLICE_SEGMENT`, `CUSLICE_GPU_SEGMENT`,
//! `CUSLICE_CONTEXT`, `CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`) is
//! an error naming it, where the environment carries the limits (no quota
//! file): a misspelt limit is never dropped silently. Names are read as
//! spelt, in upper case; one in another case that upper-cased is one of
//! these or starts like one (`cuslice_memory`, `Cuslice_Memory`,
//! `cuda_device_memory_limit`) is an error the same way, naming its
//! spelling. Other variables, in any case, are not looked at.
//!
//! | variable | meaning |
//! |----------|---------|
//! | `CUSLICE_CONFIG`              | path of the quota file |
//! | `CUSLICE_MEMORY`, `CUSLICE_MEMORY_<i>` | memory, all GPUs / GPU `i`; a size, plain numbers are bytes |
//! | `CUSLICE_MEMORY_MAX`, `CUSLICE_MEMORY_MAX_<i>` | `memory_max`, all GPUs / GPU `i` |
//! | `CUSLICE_MEMORY_WAIT`         | as `memory_wait` |
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
//! | `CUDA_DEVICE_SM_LIMIT`, `CUDA_DEVICE_SM_LIMIT_<i>` | HAMi: a hard ceiling in percent (maps to `compute_max`); `0` and `100` mean no limit |
//!
//! HAMi compatibility, following HAMi-core's `get_limit_from_env`
//! (`src/multiprocess/multiprocess_memory_limit.c`): a plain number in
//! `CUDA_DEVICE_MEMORY_LIMIT*` is **bytes** (HAMi-core's scale factor is 1
//! when the value does not end in `k`/`m`/`g`; the HAMi device plugin writes
//! values like `"4096m"`), and `CUDA_DEVICE_SM_LIMIT*` = `0` means "no limit"
//! (HAMi-core logs exactly that and falls back to 100 %, or for a per-device
//! variable to the all-devices one), as does `100` (HAMi-core's rate limiter
//! does nothing at 100 % or more; here it counts as unset, since a ceiling
//! of 100 would still make the tenant's share 100). Every form HAMi-core
//! reads sensibly means the same here. Differences, all failing closed:
//! HAMi-core reads `CUDA_DEVICE_MEMORY_LIMIT=0` (or garbage) as "no limit"
//! with a warning, cuslice rejects it; HAMi-core's `strtoul(.., 0)` reads
//! `0x…` as hex and a leading `0` as octal (`010g` is 8 GiB there),
//! cuslice rejects both; an SM limit over 100 (no limit in HAMi-core) is
//! rejected; a per-device `CUDA_DEVICE_SM_LIMIT_<i>=100` falls back to the
//! all-devices variable, as `0` does (HAMi-core leaves that GPU unlimited).
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

// The code, along its seams: `types` (what a configuration is, its defaults
// and bounds, which entry applies to a GPU), `validate` (the checks both
// sources share), `file` (the quota file), `env` (the environment
// variables), `units` (sizes, percentages, milliseconds, switches, UUIDs, and
// how a value is shown in a message), `write` (the quota file built and
// edited by cuslice itself, checked by `file`). This documentation is the
// reference for all of them.
mod env;
mod file;
mod types;
mod units;
mod validate;
mod write;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use file::{MAX_FILE_BYTES, parse_file, toml_syntax_error};
pub use types::*;
pub use units::{
    MAX_COMPUTE_BURST_MS, MAX_COMPUTE_SLICE_MS, format_size, format_uuid, parse_burst,
    parse_percent, parse_size, parse_slice, parse_switch, parse_uuid, parse_wait,
};
pub use write::{LimitKey, LimitsEntry, QuotaEdit, QuotaFile};

use env::{ENV_CONFIG, env_var_names, from_env};
use file::read_file;
use units::shown;

/// Checks the names of the process's set environment variables (used
/// without a quota file): one that looks like a limit variable but is
/// none (`CUSLICE_MEMORY_64`, `CUSLICE_MEM`, `CUDA_DEVICE_SM_LIMIT_01`) is
/// an error naming it, never a limit silently dropped.
pub fn check_env_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    env::check_names(names)
}

/// Loads the configuration the way the shim does. `env` looks up an environment variable.
pub fn load(env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    load_with(env, Path::new(DEFAULT_CONFIG_PATH))
}

/// [`load`] with the default file path as a parameter (tests point it at a
/// temporary directory, so that they do not depend on the host's
/// `/etc/cuslice/quota.toml`).
pub fn load_with(
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
