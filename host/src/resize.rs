//! The record of a live resize (`cuslice resize`): `resize.json` in a
//! slice's directory ([`RESIZE_RECORD`]; a container's beside its quota
//! directory, not in it: the container does not see it), written by the
//! resize before the
//! quota file itself, read by `cuslice watch` (the grace it gives a tenant
//! over a memory quota the resize lowered) and `cuslice status` (the grace
//! left). Whose file it is follows the slice's quota file: root's under
//! the hook's root (a container's, a DRA claim's), the session user's in a
//! `cuslice run` directory (`discover` reads it by that rule).
//!
//! A record speaks for the quota file only while the file still holds
//! what the resize wrote ([`ResizeRecord::applies_to`]): once something
//! else rewrites the file (the DRA plugin preparing its claim again, a
//! later resize that failed halfway), the record is stale and grants no
//! grace. That is also why it is written first: a watch that sees the new
//! quota file always finds its record with it.

use serde::{Deserialize, Serialize};

use cuslice_core::config::{self, Config, Limits};

use crate::fs::Dir;
use crate::layout::RESIZE_RECORD;

/// The grace `cuslice resize` gives by default.
pub const DEFAULT_GRACE_SECONDS: f64 = 30.0;
/// The longest grace a resize may give (an hour, as the longest
/// `memory_wait`).
pub const MAX_GRACE_SECONDS: f64 = 3_600.0;
/// A record larger than this is not read (it is a few hundred bytes).
pub const RECORD_MAX: u64 = 64 << 10;
/// The mode of the record.
pub const RECORD_MODE: u32 = 0o644;

/// A quota file's entry, as the record names it: `all`, or
/// `device.GPU-<uuid>` (a resize never changes an entry given by index:
/// which GPU that is depends on each process's `CUDA_VISIBLE_DEVICES`).
pub const ALL: &str = "all";

/// One limit a resize changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The entry: [`ALL`] or `device.GPU-...` (as [`config::format_uuid`]
    /// writes the UUID).
    pub entry: String,
    /// `memory` (bytes), `compute` or `compute_max` (percent).
    pub field: String,
    /// What applied on the GPUs of that entry before (None: none).
    pub from: Option<u64>,
    pub to: u64,
}

/// What one `cuslice resize` did, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResizeRecord {
    /// When, CLOCK_REALTIME seconds.
    pub at_unix: f64,
    /// How long after `at_unix` the watch leaves a tenant over a memory
    /// quota this resize lowered to its shim (which refuses every new
    /// allocation above the quota at once), seconds.
    pub grace_seconds: f64,
    /// The effective uid of the `cuslice resize` that wrote it.
    pub by_uid: u32,
    pub changes: Vec<Change>,
}

/// The limits of entry `entry` of `cfg` (None: no such entry).
fn entry_limits(cfg: &Config, entry: &str) -> Option<Limits> {
    if entry == ALL {
        return Some(cfg.all);
    }
    let uuid = config::parse_uuid(entry.strip_prefix("device.")?).ok()?;
    cfg.by_uuid.get(&uuid).copied()
}

/// Field `field` of `l`, as a number.
fn field_of(l: &Limits, field: &str) -> Option<u64> {
    match field {
        "memory" => l.memory,
        "compute" => l.compute.map(u64::from),
        "compute_max" => l.compute_max.map(u64::from),
        _ => None,
    }
}

/// The entry name of GPU `uuid`'s own entry.
pub fn device_entry(uuid: &[u8; 16]) -> String {
    format!("device.{}", config::format_uuid(uuid))
}

impl ResizeRecord {
    /// Whether `cfg` (the quota file as it is now) still holds every value
    /// this resize wrote: otherwise the file was written again since, and
    /// the record says nothing about it.
    pub fn applies_to(&self, cfg: &Config) -> bool {
        !self.changes.is_empty()
            && self.changes.iter().all(|c| {
                entry_limits(cfg, &c.entry).and_then(|l| field_of(&l, &c.field)) == Some(c.to)
            })
    }

    /// When the grace ends, CLOCK_REALTIME seconds.
    pub fn grace_until(&self) -> f64 {
        self.at_unix + self.grace_seconds
    }

    /// Whether this resize lowered the memory quota `cfg` gives GPU
    /// `uuid`: the entry that gives it (its own by UUID, else `[all]`) is
    /// one this resize lowered, and `cfg` is still the file it wrote. A
    /// GPU whose quota an index entry may give is never one (a resize does
    /// not write such files).
    pub fn lowered_memory_on(&self, cfg: &Config, uuid: &[u8; 16]) -> bool {
        if !self.applies_to(cfg) || cfg.by_index.values().any(|l| l.memory.is_some()) {
            return false;
        }
        let entry = if cfg.by_uuid.get(uuid).is_some_and(|l| l.memory.is_some()) {
            device_entry(uuid)
        } else if cfg.all.memory.is_some() {
            ALL.to_string()
        } else {
            return false;
        };
        self.changes
            .iter()
            .any(|c| c.field == "memory" && c.entry == entry && c.from.is_some_and(|f| c.to < f))
    }

    /// For a tenant over its memory quota on GPU `uuid`: when the grace
    /// this resize gives it there ends (CLOCK_REALTIME seconds); None where
    /// the resize did not lower that quota (or `cfg` is no longer the file
    /// it wrote).
    pub fn grace_on(&self, cfg: &Config, uuid: &[u8; 16]) -> Option<f64> {
        self.lowered_memory_on(cfg, uuid)
            .then(|| self.grace_until())
    }

    /// The changes, for a line: `memory 8GiB -> 4GiB ([all]), compute 30%
    /// -> 50% ([device.GPU-...])`.
    pub fn describe(&self) -> String {
        self.changes
            .iter()
            .map(|c| {
                let v = |n: u64| match c.field.as_str() {
                    "memory" => config::format_size(n),
                    _ => format!("{n}%"),
                };
                format!(
                    "{} {} -> {} ([{}])",
                    c.field,
                    c.from.map_or_else(|| "none".to_string(), v),
                    v(c.to),
                    c.entry
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The record as its file holds it.
    pub fn to_json(&self) -> String {
        // A plain struct of strings and numbers: encoding cannot fail.
        serde_json::to_string(self).unwrap_or_default() + "\n"
    }

    /// Writes the record into `dir` (a slice's directory: whole, to a new
    /// file renamed over the old one, never through a link, mode
    /// [`RECORD_MODE`]).
    pub fn write(&self, dir: &Dir) -> Result<(), String> {
        dir.replace_file(RESIZE_RECORD, self.to_json().as_bytes(), RECORD_MODE)
            .map_err(String::from)
    }

    /// The record in `text` (`shown`: its path, for the error).
    pub fn parse(shown: &std::path::Path, text: &str) -> Result<ResizeRecord, String> {
        let r: ResizeRecord = serde_json::from_str(text)
            .map_err(|e| format!("{}: not a resize record: {e}", shown.display()))?;
        if !r.at_unix.is_finite() || !(0.0..=MAX_GRACE_SECONDS).contains(&r.grace_seconds) {
            return Err(format!(
                "{}: not a resize record: its time or grace is out of range",
                shown.display()
            ));
        }
        Ok(r)
    }
}

/// CLOCK_REALTIME now, seconds.
pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A time of day for messages: `10:46:43 UTC`.
pub fn utc_time_of_day(unix: f64) -> String {
    let s = (unix.max(0.0) as u64) % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const GPU0: [u8; 16] = [0xa0; 16];
    const GPU1: [u8; 16] = [0xa1; 16];

    fn cfg(text: &str) -> Config {
        config::parse_file(Path::new("quota.toml"), text).expect("quota file")
    }

    fn record(changes: Vec<Change>) -> ResizeRecord {
        ResizeRecord {
            at_unix: 1000.0,
            grace_seconds: 30.0,
            by_uid: 0,
            changes,
        }
    }

    fn change(entry: &str, field: &str, from: Option<u64>, to: u64) -> Change {
        Change {
            entry: entry.into(),
            field: field.into(),
            from,
            to,
        }
    }

    const G: u64 = 1 << 30;

    #[test]
    fn a_lowered_quota_for_all_gpus_gives_every_gpu_the_grace_while_the_file_is_the_resizes() {
        let r = record(vec![change(ALL, "memory", Some(8 * G), 4 * G)]);
        let now = cfg("[all]\nmemory = \"4GiB\"\n");
        assert!(r.applies_to(&now));
        assert_eq!(r.grace_on(&now, &GPU0), Some(1030.0));
        assert_eq!(r.grace_on(&now, &GPU1), Some(1030.0));
        // A GPU with a quota of its own by UUID: not the entry lowered.
        let own = cfg(&format!(
            "[all]\nmemory = \"4GiB\"\n[device.\"{}\"]\nmemory = \"6GiB\"\n",
            config::format_uuid(&GPU1)
        ));
        assert_eq!(r.grace_on(&own, &GPU0), Some(1030.0));
        assert_eq!(r.grace_on(&own, &GPU1), None);
        // The file written again since (the DRA plugin's prepare): stale.
        let again = cfg("[all]\nmemory = \"8GiB\"\n");
        assert!(!r.applies_to(&again));
        assert_eq!(r.grace_on(&again, &GPU0), None);
    }

    #[test]
    fn a_raise_or_a_compute_change_gives_no_grace() {
        let up = record(vec![change(ALL, "memory", Some(4 * G), 8 * G)]);
        assert_eq!(up.grace_on(&cfg("[all]\nmemory = \"8GiB\"\n"), &GPU0), None);
        let compute = record(vec![change(ALL, "compute", Some(30), 20)]);
        let c = cfg("[all]\nmemory = \"8GiB\"\ncompute = 20\n");
        assert!(compute.applies_to(&c));
        assert_eq!(compute.grace_on(&c, &GPU0), None);
    }

    #[test]
    fn a_gpus_own_entry_lowered_gives_that_gpu_alone_the_grace() {
        let e = device_entry(&GPU0);
        let r = record(vec![change(&e, "memory", Some(8 * G), 2 * G)]);
        let c = cfg(&format!(
            "[all]\nmemory = \"8GiB\"\n[device.\"{}\"]\nmemory = \"2GiB\"\n",
            config::format_uuid(&GPU0).to_lowercase()
        ));
        assert_eq!(r.grace_on(&c, &GPU0), Some(1030.0));
        assert_eq!(r.grace_on(&c, &GPU1), None);
        assert_eq!(r.describe(), format!("memory 8GiB -> 2GiB ([{e}])"),);
    }

    #[test]
    fn a_record_reads_back_and_junk_is_one_line() {
        let r = record(vec![change(ALL, "memory", None, 4 * G)]);
        let p = Path::new("/r/resize.json");
        assert_eq!(ResizeRecord::parse(p, &r.to_json()), Ok(r));
        let e = ResizeRecord::parse(p, "{\"at_unix\": 1}").expect_err("junk");
        assert!(
            e.starts_with("/r/resize.json: not a resize record: "),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = ResizeRecord::parse(
            p,
            r#"{"at_unix":1,"grace_seconds":1e9,"by_uid":0,"changes":[]}"#,
        )
        .expect_err("grace");
        assert!(e.ends_with("its time or grace is out of range"), "{e}");
        assert_eq!(utc_time_of_day(86_400.0 * 3.0 + 3723.9), "01:02:03 UTC");
    }
}
