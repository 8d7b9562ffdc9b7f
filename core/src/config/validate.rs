//! Validation shared by the file and the environment: tenant names,
//! directories, memory and context-overhead ranges, and the consistency of
//! shares and ceilings wherever entries meet on one GPU.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::types::{
    Config, Limits, MAX_CONTEXT_OVERHEAD, MAX_MEMORY, MIN_MEMORY, SLICE_MAX_LEN, Source,
    TENANT_MAX_LEN,
};
use super::units::{format_size, shown};

/// What a tenant name may be, for messages.
pub(super) const TENANT_EXPECTED: &str = "1 to 56 characters of A-Z a-z 0-9 . _ / -";
const _: () = assert!(TENANT_MAX_LEN == 56, "TENANT_EXPECTED names it");

/// What a slice may be, for messages.
pub(super) const SLICE_EXPECTED: &str = "a string of 1 to 128 characters of A-Z a-z 0-9 . _ : / -";
const _: () = assert!(SLICE_MAX_LEN == 128, "SLICE_EXPECTED names it");

/// The error for a latency class without a share to charge it against;
/// `{}` is where the setting was given.
pub(super) const LATENCY_NEEDS_COMPUTE: &str = "{}: expected a tenant with a compute share (compute or compute_max for some GPU): a latency tenant's GPU time counts against its share, got none";

/// The error for a setting that shapes how a compute share is enforced
/// (`compute_burst_ms`, `compute_slice_ms`) without a share or ceiling:
/// it would do nothing; `{}` is where it was given.
pub(super) const SHAPE_NEEDS_COMPUTE: &str = "{}: expected a tenant with a compute share (compute or compute_max for some GPU): it only shapes how a share is enforced, got none";

/// The error for `memory_wait` without a memory quota to wait under; `{}`
/// is where it was given.
pub(super) const WAIT_NEEDS_MEMORY: &str = "{}: expected a tenant with a memory quota (memory for some GPU): it says how long an allocation refused under the quota waits, got none";

/// A value and the label that names it in messages: a key path
/// (`device.0.compute`) or a variable with its value (`CUSLICE_COMPUTE="40"`).
#[derive(Debug, Clone)]
pub(super) struct Field<T> {
    pub(super) value: T,
    pub(super) label: String,
}

/// One entry ([all], a device table, or the variables of one index) before
/// the cross-entry checks.
#[derive(Debug, Clone, Default)]
pub(super) struct Entry {
    pub(super) memory: Option<Field<u64>>,
    pub(super) memory_max: Option<Field<u64>>,
    pub(super) compute: Option<Field<u8>>,
    pub(super) compute_max: Option<Field<u8>>,
}

impl Entry {
    fn limits(&self) -> Limits {
        Limits {
            memory: self.memory.as_ref().map(|f| f.value),
            memory_max: self.memory_max.as_ref().map(|f| f.value),
            compute: self.compute.as_ref().map(|f| f.value),
            compute_max: self.compute_max.as_ref().map(|f| f.value),
        }
    }
}

/// Everything parsed, before the share-consistency checks.
#[derive(Debug, Default)]
pub(super) struct Draft {
    pub(super) all: Entry,
    /// index -> (entry name for messages, entry)
    pub(super) by_index: BTreeMap<u32, (String, Entry)>,
    /// uuid -> (entry name for messages, entry)
    pub(super) by_uuid: BTreeMap<[u8; 16], (String, Entry)>,
}

impl Draft {
    /// Whether some entry gives a compute share or ceiling.
    pub(super) fn has_compute(&self) -> bool {
        let c = |e: &Entry| e.compute.is_some() || e.compute_max.is_some();
        c(&self.all)
            || self.by_index.values().any(|(_, e)| c(e))
            || self.by_uuid.values().any(|(_, e)| c(e))
    }

    /// Whether some entry gives a memory quota.
    pub(super) fn has_memory(&self) -> bool {
        let m = |e: &Entry| e.memory.is_some() || e.memory_max.is_some();
        m(&self.all)
            || self.by_index.values().any(|(_, e)| m(e))
            || self.by_uuid.values().any(|(_, e)| m(e))
    }

    /// `compute_max >= compute` wherever the two meet on one GPU. Checks the
    /// simplest combination first so the message blames the narrowest entry.
    pub(super) fn check_shares(&self) -> Result<(), String> {
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

    pub(super) fn into_config(self, source: Source) -> Config {
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
    check_memory_combo(levels, note)?;
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

/// `memory_max` only beside a `memory` (the guarantee) for the same GPU,
/// and never below it.
fn check_memory_combo(levels: &[&Entry], note: &str) -> Result<(), String> {
    let g = levels.iter().find_map(|e| e.memory.as_ref());
    let m = levels.iter().find_map(|e| e.memory_max.as_ref());
    match (g, m) {
        (None, Some(m)) => Err(format!(
            "{}: expected memory (the guarantee) set for the same GPU{note}: memory_max is what a tenant may use beyond its guarantee, got no memory",
            m.label
        )),
        (Some(g), Some(m)) if m.value < g.value => Err(format!(
            "{}: expected at least the guaranteed memory {} ({}){note}, got {}",
            m.label,
            format_size(g.value),
            g.label,
            format_size(m.value)
        )),
        _ => Ok(()),
    }
}

/// Range check of a memory limit; `shown` is how the value was written.
pub(super) fn check_memory(bytes: u64, shown: &str) -> Result<u64, String> {
    if (MIN_MEMORY..=MAX_MEMORY).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(format!("expected a size from 1MiB to 1PiB, got {shown}"))
    }
}

/// Tenant names: 1..=56 of `[A-Za-z0-9._/-]`, `/`-separated components none
/// of which is empty, `.` or `..` (the name may end up in file names).
pub(super) fn check_tenant(s: &str) -> Result<(), String> {
    let charset_ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
    if s.is_empty() || s.len() > TENANT_MAX_LEN || !charset_ok {
        return Err(format!("expected {TENANT_EXPECTED}, got {}", shown(s)));
    }
    if s.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!(
            "expected /-separated names without empty, \".\" or \"..\" parts, got {}",
            shown(s)
        ));
    }
    Ok(())
}

/// A slice: 1..=128 of `[A-Za-z0-9._:/-]` (only hashed into a tag, never
/// a path; the charset keeps it one plain word in messages and files).
pub(super) fn check_slice_id(s: &str) -> Result<(), String> {
    let charset_ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
    if s.is_empty() || s.len() > SLICE_MAX_LEN || !charset_ok {
        return Err(format!("expected {SLICE_EXPECTED}, got {}", shown(s)));
    }
    Ok(())
}

/// Range check of a context overhead (a size from 0 to 16 GiB).
pub(super) fn check_overhead(bytes: u64) -> Result<u64, String> {
    if bytes > MAX_CONTEXT_OVERHEAD {
        return Err(format!(
            "expected at most {}, got {}",
            format_size(MAX_CONTEXT_OVERHEAD),
            format_size(bytes)
        ));
    }
    Ok(bytes)
}

pub(super) fn check_segment_dir(s: &str) -> Result<PathBuf, String> {
    if !s.starts_with('/') || s.contains('\0') {
        return Err(format!(
            "expected an absolute path like /run/cuslice/abc, got {}",
            shown(s)
        ));
    }
    Ok(PathBuf::from(s))
}
