//! The environment variables, used only without a quota file, HAMi's
//! included.

use super::types::{Config, ConfigError, MAX_DEVICE_INDEX, Source};
use super::units::{
    format_size, parse_burst, parse_percent, parse_size, parse_slice, parse_switch, parse_wait,
    shown,
};
use super::validate::{
    Draft, Entry, Field, LATENCY_NEEDS_COMPUTE, SHAPE_NEEDS_COMPUTE, WAIT_NEEDS_MEMORY,
    check_memory, check_overhead, check_segment_dir, check_tenant,
};

/// The environment variables that carry limits, by family: (CUSLICE name,
/// HAMi equivalent if any). Each also exists with a `_<i>` suffix.
const ENV_MEMORY: &str = "CUSLICE_MEMORY";
const ENV_MEMORY_MAX: &str = "CUSLICE_MEMORY_MAX";
const ENV_COMPUTE: &str = "CUSLICE_COMPUTE";
const ENV_COMPUTE_MAX: &str = "CUSLICE_COMPUTE_MAX";
const ENV_HAMI_MEMORY: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const ENV_HAMI_SM: &str = "CUDA_DEVICE_SM_LIMIT";
const ENV_LIMIT_FAMILIES: [&str; 6] = [
    ENV_MEMORY,
    ENV_MEMORY_MAX,
    ENV_COMPUTE,
    ENV_COMPUTE_MAX,
    ENV_HAMI_MEMORY,
    ENV_HAMI_SM,
];
pub(super) const ENV_CONFIG: &str = "CUSLICE_CONFIG";
const ENV_TENANT: &str = "CUSLICE_TENANT";
const ENV_SEGMENT_DIR: &str = "CUSLICE_SEGMENT_DIR";
const ENV_CONTEXT_OVERHEAD: &str = "CUSLICE_CONTEXT_OVERHEAD";
const ENV_GPU_SEGMENT_DIR: &str = "CUSLICE_GPU_SEGMENT_DIR";
const ENV_COMPUTE_BURST: &str = "CUSLICE_COMPUTE_BURST_MS";
const ENV_SLICE: &str = "CUSLICE_SLICE_MS";
const ENV_LATENCY: &str = "CUSLICE_LATENCY";
const ENV_MEMORY_WAIT: &str = "CUSLICE_MEMORY_WAIT";

/// Every environment variable that carries a limit, a tenant or a segment
/// directory, in a fixed order (for [`Config::ignored_env`]).
pub(super) fn env_var_names() -> Vec<String> {
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
    names.push(ENV_MEMORY_WAIT.to_string());
    names
}

/// Limits from the environment (no quota file). `get` returns non-empty values only.
pub(super) fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let mut any_limit_var = false;
    let mut draft = Draft::default();
    for index in std::iter::once(None).chain((0..=MAX_DEVICE_INDEX).map(Some)) {
        let e = env_entry(get, index, &mut any_limit_var).map_err(ConfigError::new)?;
        match index {
            None => draft.all = e,
            Some(i) => {
                if e.memory.is_some()
                    || e.memory_max.is_some()
                    || e.compute.is_some()
                    || e.compute_max.is_some()
                {
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
        cfg.context_overhead =
            Some(parse_size(&v).and_then(check_overhead).map_err(|e| {
                ConfigError::new(format!("{ENV_CONTEXT_OVERHEAD}={}: {e}", shown(&v)))
            })?);
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
    for name in [ENV_COMPUTE_BURST, ENV_SLICE] {
        if let Some(v) = get(name).filter(|_| !cfg.has_compute()) {
            return Err(ConfigError::new(
                SHAPE_NEEDS_COMPUTE.replace("{}", &format!("{name}={}", shown(&v))),
            ));
        }
    }
    if let Some(v) = get(ENV_MEMORY_WAIT) {
        let label = format!("{ENV_MEMORY_WAIT}={}", shown(&v));
        cfg.memory_wait_ms =
            Some(parse_wait(&v).map_err(|e| ConfigError::new(format!("{label}: {e}")))?);
        if !cfg.has_memory() {
            return Err(ConfigError::new(WAIT_NEEDS_MEMORY.replace("{}", &label)));
        }
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
    let cus_mem_max = lookup(ENV_MEMORY_MAX);
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
    if let Some(v) = &hami_mem {
        no_octal(v)?;
    }
    let hm = hami_mem.as_ref().map(env_size).transpose()?;
    e.memory = agree(cm, hm, format_size)?;
    e.memory_max = cus_mem_max.as_ref().map(env_size).transpose()?;

    if let Some(v) = &cus_compute {
        e.compute = Some(env_percent(v)?);
    }

    // Ceiling: CUSLICE_COMPUTE_MAX* and HAMi's CUDA_DEVICE_SM_LIMIT*. In
    // HAMi-core an SM limit of 0 means "no limit" (get_limit_from_env logs
    // "device core util limit set to 0, which means no limit"; a per-device 0
    // falls back to the all-devices value, an all-devices 0 to 100 %), so 0
    // counts as unset here; so does 100 (HAMi-core's rate limiter returns
    // at once for a limit of 100 or more: the whole GPU, no ceiling), where
    // a ceiling of 100 here would still make the tenant's share 100.
    let cx = cus_max.as_ref().map(env_percent).transpose()?;
    let hx = match &hami_sm {
        Some(v) => {
            no_octal(v)?;
            let p = env_percent(v);
            match p {
                _ if is_zero_percent(&v.1) => None,
                Ok(f) if f.value == 100 => None,
                p => Some(p?),
            }
        }
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

/// HAMi-core reads its variables with `strtoul(.., 0)`: a leading `0`
/// makes the rest octal (`010g` is 8 GiB there). Such a value is refused
/// rather than read as decimal, which would grant more than HAMi does.
fn no_octal((_, raw, label): &(String, String, String)) -> Result<(), String> {
    let t = raw.trim().as_bytes();
    if t.len() > 1 && t[0] == b'0' && t[1].is_ascii_digit() {
        return Err(format!(
            "{label}: expected a number without a leading 0 (HAMi reads {} as octal), got {}",
            shown(raw),
            shown(raw)
        ));
    }
    Ok(())
}

fn is_zero_percent(raw: &str) -> bool {
    let t = raw.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim_end();
    !t.is_empty() && t.bytes().all(|b| b == b'0')
}

/// Name prefixes of the variables above: a set variable that starts with
/// one and is none of them (`CUSLICE_MEMORY_64`, `CUSLICE_MEM`,
/// `CUDA_DEVICE_MEMORY_LIMIT_01`) is a limit the user meant to set and
/// the shim would otherwise drop without a word.
const LOOKALIKE_PREFIXES: [&str; 10] = [
    "CUSLICE_MEM",
    "CUSLICE_COMPUTE",
    "CUSLICE_SLICE",
    "CUSLICE_LATENC",
    "CUSLICE_TENANT",
    "CUSLICE_SEGMENT",
    "CUSLICE_GPU_SEGMENT",
    "CUSLICE_CONTEXT",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
];

/// The first of `names` (set, non-empty variables) that looks like one of
/// the variables above but is none of them, as an error naming it and
/// what was expected.
pub(super) fn check_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    let known = env_var_names();
    for n in names {
        if known.iter().any(|k| k == n) {
            continue;
        }
        // Names are read as spelt, upper-case: `cuslice_memory` or
        // `Cuda_Device_Memory_Limit` is a limit the user meant to set as
        // surely as `CUSLICE_MEM` is, and would be dropped as silently.
        // Only names that start like ours once upper-cased are judged,
        // so other programs' lower-case variables pass.
        let upper = n.to_ascii_uppercase();
        if known.contains(&upper) {
            return Err(ConfigError::new(format!(
                "{}: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected {upper}",
                shown_name(n)
            )));
        }
        if !LOOKALIKE_PREFIXES.iter().any(|p| upper.starts_with(p)) {
            continue;
        }
        // The family it extends, the longest that matches (COMPUTE_MAX
        // before COMPUTE).
        let family = ENV_LIMIT_FAMILIES
            .iter()
            .filter(|f| upper.starts_with(&format!("{f}_")))
            .max_by_key(|f| f.len());
        let expected = match family {
            Some(f) => format!(
                "{f} or {f}_<i>, <i> a device index from 0 to {MAX_DEVICE_INDEX} in plain decimal"
            ),
            None => format!(
                "one of {}, each of the first five also with _<i>",
                [
                    ENV_MEMORY,
                    ENV_COMPUTE,
                    ENV_COMPUTE_MAX,
                    ENV_HAMI_MEMORY,
                    ENV_HAMI_SM,
                    ENV_TENANT,
                    ENV_SEGMENT_DIR,
                    ENV_GPU_SEGMENT_DIR,
                    ENV_CONTEXT_OVERHEAD,
                    ENV_COMPUTE_BURST,
                    ENV_SLICE,
                    ENV_LATENCY,
                ]
                .join(", ")
            ),
        };
        return Err(ConfigError::new(format!(
            "{}: not a variable cuslice reads, so its limit would be dropped: expected {expected}",
            shown_name(n)
        )));
    }
    Ok(())
}

/// A variable's name in a message: as it is, cut at 80 characters.
fn shown_name(n: &str) -> String {
    match n.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &n[..i]),
        None => n.to_string(),
    }
}
