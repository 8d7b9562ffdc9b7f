//! `cuslice resize TARGET [--memory SIZE] [--compute PCT] [--compute-max
//! PCT] [--device all|UUID] [--grace DURATION]`: changes the limits of a
//! running slice (a container, a DRA claim, a `cuslice run` session).
//!
//! In this order, each through the host file layer (whole files renamed
//! into place, no link followed, modes kept):
//!
//! 1. the record of the resize, `resize.json` in the slice's directory
//!    (`host::resize`): what changed, when, the grace; first, so that a
//!    watch that sees the new quota file finds its record with it;
//! 2. the quota file the watch restores from, only the fields given
//!    changed, checked by the grammar the shim loads it with (a
//!    container's in its quota directory, which the OCI hook mounts at
//!    `/etc/cuslice`: the processes it starts from now on read the new
//!    file); for a DRA claim, then each of its containers' copies of it
//!    (what their shims read, likewise mounted), the same text;
//! 3. the memory segment's entries the new memory quota applies to (by
//!    UUID): admission and `cuMemGetInfo` read the entry, so running
//!    processes see the new quota at their next allocation or query;
//! 4. the slice's tenant entries in the GPU segments (share, ceiling),
//!    which every process's scheduler reads;
//! 5. where the OCI hook set the driver's own memory limit on a
//!    container's cgroup (`driver_memory_limit` "set: ..."), the new one,
//!    and the container's record.
//!
//! Steps 3 and 4 take the segment's whole-file lock, which a tenant can
//! take and keep (issue 41 H3: a kept lock hung the resize, the quota file
//! and record already written): each waits at most 2 s for it, then
//! writes all the same (a few atomic stores, sound without the lock: see
//! `Shm::with_flock_or_without`) and says so in one line naming the file
//! and the holder. Every step is applied, in this order, and the resize
//! exits 0.
//!
//! Who may: root for a container or a claim (their files are root's,
//! under the hook's root); root or the session's own user for a session
//! (its files are the user's: root resizes one as that user, so every file
//! written stays the user's and nothing the user could not write is
//! written).
//!
//! Which entry of the quota file a field is changed in: `--device all`
//! `[all]` (a GPU's own entry keeps its value), `--device UUID` that GPU's
//! entry (made where missing, from what `[all]` gave it). Without
//! `--device`: `[all]` where it gives the field and no GPU's own entry
//! does; the one GPU entry that gives it where `[all]` does not (a DRA
//! claim's file names its GPU by UUID); otherwise refused (say which with
//! `--device`). Refused too: a field given by index anywhere in the file (which
//! GPU an index is depends on each process's `CUDA_VISIBLE_DEVICES`; the
//! segments know GPUs by UUID), and a limit the slice's processes never
//! registered (a memory quota where it has none, a share where it has
//! none: they cannot take one on while they run).
//!
//! A container made by an older OCI hook had its quota file mounted as a
//! file (`<root>/containers/<id>/quota.toml`, `host::layout`): that file
//! is rewritten all the same (the watch and `status` read it), but the
//! container's mount still shows the file it was created with, so the
//! processes it starts later read the old quota until it is recreated;
//! the resize says so in a line.

mod apply;
mod plan;
mod target;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use cuslice_core::config;

use apply::{
    become_user, claim_containers, driver_limit, legacy_note, write_claim_copy, write_gpu_segments,
    write_segment,
};
use cuslice_host::discover::Places;
use cuslice_host::layout::{self, Layout, QUOTA_FILE, SliceKind};
use cuslice_host::resize::{self as record, ResizeRecord};
use cuslice_host::{container::short_id, text};
use plan::{Entry, given, plan};
use target::resolve;

#[derive(clap::Args)]
pub struct ResizeArgs {
    /// What to resize: a container (its id, or a unique prefix of it as
    /// `cuslice status` shows it, or `container:ID`), a Kubernetes DRA claim
    /// (`claim:UID`, or `claim:NAMESPACE/NAME`; an operator's override: the
    /// claim itself is immutable), or a `cuslice run` session (`run:PID`, or
    /// PID: its `cuslice run` process or any process of it).
    pub target: String,
    /// New memory quota per GPU: 4GiB, 4096MiB, 4g, 512m or bytes.
    #[arg(long)]
    pub memory: Option<String>,
    /// New guaranteed share of GPU time, percent (30 or 30%).
    #[arg(long)]
    pub compute: Option<String>,
    /// New ceiling on GPU time, percent.
    #[arg(long)]
    pub compute_max: Option<String>,
    /// Which entry of the quota file to change: `all` ([all], every GPU
    /// without an entry of its own) or a GPU's UUID (its own entry).
    /// Default: [all] where it alone gives the field, else the one GPU
    /// entry that gives it (a DRA claim's); several: say which.
    #[arg(long)]
    pub device: Option<String>,
    /// With --memory: how long `cuslice watch` leaves a tenant over its
    /// lowered quota to its shim (which refuses every new allocation above
    /// it at once) before its policy applies: 30s (default), 500ms, 2m, 0;
    /// at most 1h.
    #[arg(long)]
    pub grace: Option<String>,
    /// The hook's host directory, where containers and claims are.
    #[arg(long, default_value = layout::DEFAULT_ROOT)]
    pub root: PathBuf,
}

/// `--grace`: a duration as `--memory-wait` takes one ("30s", "500ms",
/// "2m", "0"; at most an hour), in seconds.
pub fn parse_grace(s: &str) -> Result<f64, String> {
    config::parse_wait(s)
        .map(|ms| ms as f64 / 1000.0)
        .map_err(|e| format!("--grace {s:?}: {e}"))
}

/// `cuslice resize`: what was done, a line each.
pub fn resize(a: &ResizeArgs) -> Result<Vec<String>, String> {
    let fields = given(a)?;
    let grace = match &a.grace {
        Some(g) => parse_grace(g)?,
        None => record::DEFAULT_GRACE_SECONDS,
    };
    let entry = Entry::parse(a.device.as_deref())?;
    let me = cuslice_host::sys::euid();
    let places = Places::new(Layout::new(&a.root));
    let t = resolve(&places, &a.target).map_err(|e| {
        if me != 0 && !a.target.starts_with("run:") {
            format!("{e} (resizing a container or a claim needs root: its files are root's)")
        } else {
            e
        }
    })?;
    let label = t.label.clone();
    if t.found.kind == SliceKind::Container
        && let Some(uid) = t.found.record().ok().flatten().and_then(|m| m.claim)
    {
        return Err(format!(
            "{label} is a container of DRA claim {}: resize the claim (claim:{}), whose quota all its containers share",
            text::clean(&short_id(&uid)),
            text::clean(&uid)
        ));
    }
    // A session's files are its user's: root writes them as that user
    // (`session` let no other user this far).
    if let Some((uid, gid)) = t.user
        && me == 0
        && uid != 0
    {
        become_user(uid, gid)?;
    }
    let dir = t.found.dir.as_ref().map_err(Clone::clone)?;
    // Where its quota file is: a container's in its quota directory (or
    // where an older hook put it), a claim's or a session's in its
    // directory.
    let quota = t.found.quota_file()?;
    let shown = quota.shown.clone();
    let text_before = t.found.quota_text()?;
    let mut quota_edit =
        config::QuotaEdit::parse(&shown, &text_before).map_err(|e| e.to_string())?;
    let changes = plan(&mut quota_edit, &entry, &fields, &shown, &label)?;
    if changes.is_empty() {
        return Ok(vec![format!(
            "{label}: nothing to change: {} already as given",
            shown.display()
        )]);
    }
    let comment = match quota_edit.comment() {
        Some(c) => format!("{c}; resized by `cuslice resize`"),
        None => "resized by `cuslice resize`".to_string(),
    };
    let (text_after, new) = quota_edit
        .render(&comment)
        .map_err(|e| format!("the resized quota file would not load: {e}"))?;
    let rec = ResizeRecord {
        at_unix: record::now_unix(),
        grace_seconds: grace,
        by_uid: me,
        changes,
    };
    let mut out = vec![format!("{label}: {}", rec.describe())];
    // A claim's containers: the copies of its quota file and the
    // driver's limits to write.
    let members = match t.found.kind {
        SliceKind::Claim => claim_containers(&places, &t.found.name),
        SliceKind::Container | SliceKind::Run => vec![],
    };
    // 1. The record, then 2. the quota file (its mode kept).
    rec.write(dir)?;
    let mode = quota
        .dir
        .stat(QUOTA_FILE)
        .map(|st| st.st_mode & 0o7777)
        .map_err(String::from)?;
    quota
        .dir
        .replace_file(QUOTA_FILE, text_after.as_bytes(), mode)?;
    out.push(format!("{}: written", shown.display()));
    if quota.legacy {
        out.push(legacy_note(&label));
    }
    // A claim's containers' copies, which their shims read.
    for m in &members {
        out.extend(write_claim_copy(m, &text_after)?);
    }
    let memory = rec.changes.iter().any(|c| c.field == "memory");
    let compute = rec.changes.iter().any(|c| c.field != "memory");
    // 3. The memory segment.
    let mut over = false;
    // The GPU segments and memory pools: the hook's for a container or a
    // claim, the session's own (as its file names it) for a session.
    let gpu_dir = match t.found.kind {
        SliceKind::Run => new.gpu_segment_dir.clone(),
        _ => places.layout().gpu_dir(),
    };
    if memory {
        let (lines, o) = write_segment(&t, &new, &gpu_dir)?;
        out.extend(lines);
        over = o;
    }
    // 4. The GPU segments.
    if compute {
        // Every GPU's where a share for all changed, else those named.
        let named: Vec<[u8; 16]> = rec
            .changes
            .iter()
            .filter(|c| c.field != "memory")
            .filter_map(|c| config::parse_uuid(c.entry.strip_prefix("device.")?).ok())
            .collect();
        let all = rec
            .changes
            .iter()
            .any(|c| c.field != "memory" && c.entry == record::ALL);
        out.extend(write_gpu_segments(
            &gpu_dir,
            &new,
            (!all).then_some(named.as_slice()),
        )?);
    }
    // 5. The driver's own limit on the containers' cgroups.
    if memory {
        let own = [t.found];
        let members = match own[0].kind {
            SliceKind::Container => &own[..],
            SliceKind::Claim | SliceKind::Run => &members[..],
        };
        for m in members {
            out.extend(driver_limit(m, &new)?);
        }
    }
    if over {
        out.push(format!(
            "grace: `cuslice watch` applies its policy to a GPU still over its lowered quota after {}s ({})",
            rec.grace_seconds,
            record::utc_time_of_day(rec.grace_until())
        ));
    }
    Ok(out)
}
