//! What a resize changes: the fields given (validated as `run`'s flags
//! are), the entry of the quota file each is changed in, and the changes
//! planned on the file (refused, in one line naming why, where a resize
//! cannot apply live).

use std::path::Path;

use cuslice_core::config::{self, Limits};

use super::ResizeArgs;
use crate::limits;
use cuslice_host::resize::{self as record, Change};

/// The entry a resize changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Entry {
    /// `[all]`, named with `--device all` (a GPU's own entry then keeps
    /// its value), or no `--device` (`plan` picks per field: `[all]`, or
    /// the one GPU entry that gives the field).
    All { named: bool },
    /// `[device."GPU-..."]`.
    Gpu([u8; 16]),
}

impl Entry {
    pub(super) fn parse(device: Option<&str>) -> Result<Entry, String> {
        let Some(d) = device.map(str::trim) else {
            return Ok(Entry::All { named: false });
        };
        if d == "all" {
            return Ok(Entry::All { named: true });
        }
        if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "--device {d}: a GPU by index cannot be resized live (CUDA numbers each process's GPUs after its CUDA_VISIBLE_DEVICES; the segments know GPUs by UUID): give its UUID (nvidia-smi -L), or all"
            ));
        }
        config::parse_uuid(d)
            .map(Entry::Gpu)
            .map_err(|e| format!("--device {d:?}: expected all or a GPU's UUID: {e}"))
    }

    /// Its name in the record.
    fn record_name(&self) -> String {
        match self {
            Entry::All { .. } => record::ALL.to_string(),
            Entry::Gpu(u) => record::device_entry(u),
        }
    }
}

/// A limit field: its key in the quota file and its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Memory,
    Compute,
    ComputeMax,
}

impl Field {
    fn key(self) -> &'static str {
        self.limit().key()
    }

    fn flag(self) -> &'static str {
        match self {
            Field::Memory => "--memory",
            Field::Compute => "--compute",
            Field::ComputeMax => "--compute-max",
        }
    }

    fn of(self, l: &Limits) -> Option<u64> {
        self.limit().of(l)
    }

    /// The quota file's limit it is.
    fn limit(self) -> config::LimitKey {
        match self {
            Field::Memory => config::LimitKey::Memory,
            Field::Compute => config::LimitKey::Compute,
            Field::ComputeMax => config::LimitKey::ComputeMax,
        }
    }

    /// What applies to the GPUs of an entry whose limits are `l`: a share
    /// given by its ceiling alone is the ceiling.
    fn effective(self, l: &Limits) -> Option<u64> {
        match self {
            Field::Compute => l.compute.or(l.compute_max).map(u64::from),
            _ => self.of(l),
        }
    }

    /// Whether the slice's processes registered this kind of limit where
    /// `l` applies: a memory quota, or a share or ceiling.
    fn registered(self, l: &Limits) -> bool {
        match self {
            Field::Memory => l.memory.is_some(),
            Field::Compute | Field::ComputeMax => l.compute.is_some() || l.compute_max.is_some(),
        }
    }
}

/// The fields given, validated as `run`'s flags are: (field, value).
pub(super) fn given(a: &ResizeArgs) -> Result<Vec<(Field, u64)>, String> {
    let l = limits::Limits {
        memory: a.memory.clone(),
        compute: a.compute.clone(),
        compute_max: a.compute_max.clone(),
        ..limits::Limits::default()
    };
    let (_, table) = limits::to_quota(&l, &limits::FLAGS)?;
    let mut out = vec![];
    for f in [Field::Memory, Field::Compute, Field::ComputeMax] {
        if let Some(v) = f.of(&table) {
            out.push((f, v));
        }
    }
    if out.is_empty() {
        return Err("nothing to resize: give --memory, --compute or --compute-max".into());
    }
    if a.grace.is_some() && a.memory.is_none() {
        return Err(
            "--grace: only applies with --memory (the time a tenant over a lowered memory quota is given)"
                .into(),
        );
    }
    Ok(out)
}

/// The changes `fields` make to the quota file `quota` (path `shown`) at
/// `entry`: the file changed in place, and what changed (a field already
/// at its value is left out).
pub(super) fn plan(
    quota: &mut config::QuotaEdit,
    entry: &Entry,
    fields: &[(Field, u64)],
    shown: &Path,
    label: &str,
) -> Result<Vec<Change>, String> {
    let old = quota.config().clone();
    let mut changes = vec![];
    for &(f, to) in fields {
        let by_index: Vec<String> = old
            .by_index
            .iter()
            .filter(|(_, l)| f.of(l).is_some())
            .map(|(i, _)| format!("[device.{i}]"))
            .collect();
        if !by_index.is_empty() {
            return Err(format!(
                "{}: {} is given by index in {}: cuslice resize cannot tell which GPU that is to the slice's processes (CUDA numbers each process's GPUs after its CUDA_VISIBLE_DEVICES; the segments know GPUs by UUID)",
                shown.display(),
                f.key(),
                by_index.join(", ")
            ));
        }
        // The entry for this field: as named, else `[all]` where it gives
        // the field and no GPU's own entry does, else the one GPU entry
        // that gives it.
        let own: Vec<[u8; 16]> = old
            .by_uuid
            .iter()
            .filter(|(_, l)| f.registered(l))
            .map(|(u, _)| *u)
            .collect();
        let listed = |v: &[[u8; 16]]| {
            v.iter()
                .map(|u| format!("[device.\"{}\"]", config::format_uuid(u)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let entry = match entry {
            Entry::All { named: false } if !f.registered(&old.all) && own.len() == 1 => {
                Entry::Gpu(own[0])
            }
            Entry::All { named: false } if !own.is_empty() => {
                return Err(format!(
                    "{}: {} is given per GPU in {}{}: say which entry with --device (all, or a GPU's UUID)",
                    shown.display(),
                    f.key(),
                    listed(&own),
                    if f.registered(&old.all) {
                        " as well as in [all]"
                    } else {
                        ""
                    }
                ));
            }
            e => e.clone(),
        };
        let entry = &entry;
        let (limits, from) = match entry {
            Entry::All { .. } => (old.all, f.effective(&old.all)),
            Entry::Gpu(u) => {
                let l = old.limits_for(u32::MAX, u);
                (l, f.effective(&l))
            }
        };
        if !f.registered(&limits) {
            let what = match f {
                Field::Memory => "no memory quota",
                _ => "no compute share or ceiling",
            };
            let on = match entry {
                Entry::All { .. } => "for every GPU ([all])".to_string(),
                Entry::Gpu(u) => format!("on GPU {}", config::format_uuid(u)),
            };
            return Err(format!(
                "{label} has {what} {on}: its processes registered none, and cannot take one on while they run ({} {})",
                f.flag(),
                shown.display()
            ));
        }
        if from == Some(to) {
            continue;
        }
        let to_entry = match entry {
            Entry::All { .. } => config::LimitsEntry::All,
            Entry::Gpu(u) => config::LimitsEntry::Gpu(*u),
        };
        quota
            .set(to_entry, f.limit(), to)
            .map_err(|e| e.to_string())?;
        changes.push(Change {
            entry: entry.record_name(),
            field: f.key().to_string(),
            from,
            to,
        });
    }
    Ok(changes)
}
