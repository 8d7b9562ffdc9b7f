//! The quota file: read (fail closed), parsed as TOML, every key checked
//! and named in errors.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::types::{Config, ConfigError, MAX_DEVICE_INDEX, Source};
use super::units::{
    MAX_COMPUTE_BURST_MS, MAX_COMPUTE_SLICE_MS, PERCENT_EXPECTED, SIZE_EXPECTED, UUID_EXAMPLE,
    check_burst, check_slice, parse_burst, parse_percent, parse_size, parse_slice, parse_uuid,
    parse_wait, shown,
};
use super::validate::{
    Draft, Entry, Field, LATENCY_NEEDS_COMPUTE, SHAPE_NEEDS_COMPUTE, SLICE_EXPECTED,
    TENANT_EXPECTED, WAIT_NEEDS_MEMORY, check_memory, check_overhead, check_segment_dir,
    check_slice_id, check_tenant,
};

/// A quota file larger than this is refused (it is a few lines; this stops
/// `CUSLICE_CONFIG=/dev/zero` from eating the process's memory).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads a quota file. `Ok(None)` when it does not exist; any other failure
/// is an error (fail closed: an unreadable mounted file must not mean
/// "unlimited").
pub(super) fn read_file(path: &Path) -> Result<Option<String>, String> {
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

/// Parses quota-file text (`path` only for messages).
pub fn parse_file(path: &Path, text: &str) -> Result<Config, ConfigError> {
    parse_table(text)
        .map(|d| d.into_config(Source::File(path.to_path_buf())))
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))
}

/// A TOML syntax error in `text` on one line: `line N: TOML syntax error:
/// MESSAGE` (the parser's message has several lines). Also for the host
/// watchdog's watch.toml.
pub fn toml_syntax_error(text: &str, e: &toml::de::Error) -> String {
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
    match line {
        Some(n) => format!("line {n}: TOML syntax error: {msg}"),
        None => format!("TOML syntax error: {msg}"),
    }
}

/// The file's text to a [`Config`] minus the source; errors lack the path.
fn parse_table(text: &str) -> Result<ParsedFile, String> {
    // toml's parser is not expected to panic, but this runs inside other
    // people's processes at cuInit: a parser bug must become an error.
    let parsed = std::panic::catch_unwind(|| text.parse::<toml::Table>());
    let table = match parsed {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(toml_syntax_error(text, &e)),
        Err(_) => return Err("TOML syntax error: the TOML parser failed".to_string()),
    };

    let mut out = ParsedFile::default();
    for (key, value) in &table {
        match key.as_str() {
            "tenant" => {
                let s = value.as_str().ok_or_else(|| {
                    format!(
                        "tenant: expected a string of {TENANT_EXPECTED}, got {}",
                        describe(value)
                    )
                })?;
                check_tenant(s).map_err(|e| format!("tenant: {e}"))?;
                out.tenant = Some(s.to_string());
            }
            "slice" => {
                let s = value.as_str().ok_or_else(|| {
                    format!("slice: expected {SLICE_EXPECTED}, got {}", describe(value))
                })?;
                check_slice_id(s).map_err(|e| format!("slice: {e}"))?;
                out.slice = Some(s.to_string());
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
            "memory_wait" => {
                out.memory_wait_ms =
                    Some(wait_from_value(value).map_err(|m| format!("memory_wait: {m}"))?);
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
                        "slice",
                        "segment_dir",
                        "gpu_segment_dir",
                        "context_overhead",
                        "compute_burst_ms",
                        "compute_slice_ms",
                        "latency",
                        "memory_wait",
                        "all",
                        "device",
                    ],
                ));
            }
        }
    }
    out.draft.check_shares()?;
    if out.memory_wait_ms.is_some() && !out.draft.has_memory() {
        return Err(WAIT_NEEDS_MEMORY.replace("{}", "memory_wait"));
    }
    if out.latency && !out.draft.has_compute() {
        return Err(LATENCY_NEEDS_COMPUTE.replace("{}", "latency"));
    }
    for (key, set) in [
        ("compute_burst_ms", out.compute_burst_ms.is_some()),
        ("compute_slice_ms", out.compute_slice_ms.is_some()),
    ] {
        if set && !out.draft.has_compute() {
            return Err(SHAPE_NEEDS_COMPUTE.replace("{}", key));
        }
    }
    Ok(out)
}

#[derive(Debug, Default)]
struct ParsedFile {
    tenant: Option<String>,
    slice: Option<String>,
    segment_dir: Option<PathBuf>,
    gpu_segment_dir: Option<PathBuf>,
    context_overhead: Option<u64>,
    compute_burst_ms: Option<u32>,
    compute_slice_ms: Option<u32>,
    latency: bool,
    memory_wait_ms: Option<u64>,
    draft: Draft,
}

impl ParsedFile {
    fn into_config(self, source: Source) -> Config {
        let mut cfg = self.draft.into_config(source);
        cfg.tenant = self.tenant;
        cfg.slice = self.slice;
        cfg.context_overhead = self.context_overhead;
        cfg.compute_burst_ms = self.compute_burst_ms;
        cfg.compute_slice_ms = self.compute_slice_ms;
        cfg.latency = self.latency;
        cfg.memory_wait_ms = self.memory_wait_ms;
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
            "{name}: expected a table of memory, memory_max, compute, compute_max, got {}",
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
            "memory_max" => {
                let bytes = size_from_value(v).map_err(|m| format!("{label}: {m}"))?;
                e.memory_max = Some(Field {
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
                    &["memory", "memory_max", "compute", "compute_max"],
                ));
            }
        }
    }
    Ok(e)
}

fn wait_from_value(v: &toml::Value) -> Result<u64, String> {
    match v.as_str() {
        Some(s) => parse_wait(s),
        None => Err(format!(
            "expected a duration string like \"30s\", \"500ms\" or \"2m\" (at most 1h), got {}",
            describe(v)
        )),
    }
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
    check_overhead(bytes)
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
