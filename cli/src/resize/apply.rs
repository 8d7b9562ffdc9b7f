//! Applying a planned resize to what the slice's processes read: the
//! memory segment's entries, the GPUs' memory pools, the GPU segments'
//! tenant entries, the copies of a claim's quota file in its containers,
//! the driver's own memory limit; each segment and pool opened from its
//! directory's descriptor without following a link.

use std::path::Path;
use std::sync::atomic::Ordering;

use cuslice_core::config::{self, Config};
use cuslice_core::gpu::GpuSegment;
use cuslice_core::segment::{READY_STATE, UNLIMITED};

use super::target::Target;
use cuslice_host::container::short_id;
use cuslice_host::discover::{self, Found, Places, SESSION};
use cuslice_host::fs::Dir;
use cuslice_host::layout::{CONTAINER_RECORD, QUOTA_FILE};
use cuslice_host::text;

/// Makes this process the session's user for good: every file it writes
/// from now on is theirs, and it can write nothing they could not.
pub(super) fn become_user(uid: u32, gid: u32) -> Result<(), String> {
    // SAFETY: setgroups with no groups, setresgid/setresuid with plain
    // ids: no pointers but a null list of length 0.
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setresgid(gid, gid, gid) == 0
            && libc::setresuid(uid, uid, uid) == 0
    };
    if !ok {
        return Err(format!(
            "cannot become uid {uid} (gid {gid}), the session's user: {}",
            std::io::Error::last_os_error()
        ));
    }
    // A change of user makes the process undumpable, and its own
    // /proc/self/fd root's: the GPU segments are still reached there
    // (`write_gpu_segments`).
    // SAFETY: prctl(PR_SET_DUMPABLE, 1) takes no pointers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    Ok(())
}

/// Writes the new memory quota into the segment's entries it applies to
/// (by UUID; entries without a quota, or not registered, left alone).
/// Returns a line per entry written, and per GPU now over its quota; and
/// whether one is.
pub(super) fn write_segment(
    t: &Target,
    new: &Config,
    gpu_dir: &Path,
) -> Result<(Vec<String>, bool), String> {
    if !t.found.has_segment() {
        return Ok((
            vec![
                "memory segment: none yet (no process of it has used CUDA): its processes register the new quota".into(),
            ],
            false,
        ));
    }
    let owner = t.user.map(|(uid, _)| (uid, SESSION));
    let shown = t.found.paths.memory_segment();
    // From its directory held open, without following a link.
    let seg = t.found.segment(owner)?.open(true)?;
    let mut out = vec![];
    let mut over = false;
    for r in seg.raw_devices() {
        if r.state != READY_STATE || r.limit == UNLIMITED {
            continue;
        }
        let l = new.limits_for(u32::MAX, &r.uuid);
        let Some(want) = l.memory_limit() else {
            continue;
        };
        let uuid = config::format_uuid(&r.uuid);
        // A tenant keeping the segment's lock: root waits at most 2 s,
        // then writes all the same (`Segment::resize_device`), said.
        let kept = |b: Option<cuslice_core::shm::LockBusy>| {
            b.map(|mut b| {
                b.path = shown.clone();
                format!("memory segment: written without its lock: {b}")
            })
        };
        if want != r.limit {
            let busy = seg
                .resize_device(r.index, want)
                .map_err(|e| e.to_string())?;
            out.push(format!(
                "memory segment: GPU {uuid} quota {} (was {})",
                config::format_size(want),
                config::format_size(r.limit)
            ));
            out.extend(kept(busy));
        }
        // A tenant that may burst: its guarantee, here and in the GPU's
        // memory pool.
        let guarantee = l.memory.filter(|g| *g < want).unwrap_or(0);
        let had = seg
            .device(r.index)
            .map_or(0, |d| d.guarantee.load(Ordering::Acquire));
        if guarantee != had {
            let busy = seg
                .set_guarantee(r.index, guarantee)
                .map_err(|e| e.to_string())?;
            out.push(format!(
                "memory segment: GPU {uuid} guarantee {} (was {})",
                shown_guarantee(guarantee, want),
                shown_guarantee(had, r.limit)
            ));
            out.extend(kept(busy));
        }
        let used = seg.device_usage(r.index).map_or(r.used, |u| u.used);
        out.extend(write_pool(gpu_dir, new, &r.uuid, guarantee, want, used)?);
        if used > want {
            over = true;
            out.push(format!(
                "GPU {uuid}: {:.2} GiB in use, over the new quota: every new allocation above it is refused from now on",
                used as f64 / (1u64 << 30) as f64
            ));
        }
    }
    if seg.truncated() {
        return Err(format!(
            "{}: the file was truncated while it was written",
            shown.display()
        ));
    }
    Ok((out, over))
}

/// A guarantee as status shows it: none below the quota is the quota.
fn shown_guarantee(g: u64, limit: u64) -> String {
    config::format_size(if g == 0 { limit } else { g })
}

/// Writes the slice's new guarantee and most into its entry in the GPU
/// `uuid`'s memory pool in `gpu_dir` (no entry: none of its processes
/// uses that GPU; they join with the new values; an entry lingering after
/// its last process keeps the new guarantee for the rest of its linger).
/// Use past a lowered guarantee becomes burst there at once, whether the
/// pool had room or not: the operator's resize is what the host goes by.
fn write_pool(
    gpu_dir: &Path,
    new: &Config,
    uuid: &[u8; 16],
    guarantee: u64,
    limit: u64,
    used: u64,
) -> Result<Vec<String>, String> {
    let Ok(d) = Dir::open(gpu_dir) else {
        return Ok(vec![]);
    };
    let file = cuslice_core::pool::path(Path::new(""), uuid);
    if d.stat(&file).is_err() {
        return Ok(vec![]);
    }
    let shown = gpu_dir.join(&file);
    // From the directory held open, without following a link.
    let pool = d
        .open_segment(&file, true)
        .map_err(|e| discover::open_failed(&e, &shown, "GPU memory pool"))
        .and_then(|fd| cuslice_core::pool::Pool::from_fd(fd, &shown).map_err(|e| e.to_string()))?;
    let (name, tag) = (new.tenant_name(), new.slice_tag());
    let Some(v) = pool
        .entries()
        .into_iter()
        .find(|e| e.name == name && e.tag == tag)
    else {
        return Ok(vec![]);
    };
    let g = if guarantee == 0 { limit } else { guarantee };
    // A lingering entry (no process) holds no burst: its memory went with
    // its processes, whatever the segment still counts of them.
    let need = if v.procs == 0 {
        0
    } else {
        used.saturating_sub(g)
    };
    // A raised guarantee is reserved as far as the pool has room, the
    // rest pending (never over-admitted); without the pool's lock.
    // The room counted against NVML's memory, not the file's.
    let capacity = cuslice_host::gpu::nvml::Nvml::open()
        .and_then(|n| {
            let text = config::format_uuid(uuid);
            let d = n
                .devices()?
                .into_iter()
                .find(|d| config::parse_uuid(&d.uuid).is_ok_and(|u| u == *uuid))
                .ok_or_else(|| format!("NVML lists no GPU {text}"))?;
            n.memory_total(&d)
        })
        .unwrap_or(0);
    pool.resize_entry(v.index, g, limit, need, capacity);
    Ok((v.guarantee != g)
        .then(|| {
            format!(
                "GPU memory pool {}: guarantee {} (was {})",
                shown.display(),
                config::format_size(g),
                config::format_size(v.guarantee)
            )
        })
        .into_iter()
        .collect())
}

/// Writes the new share and ceiling into the slice's tenant entries in
/// the GPU segments of `gpu_dir` (of every GPU, or of `only`'s). A GPU
/// whose segment holds no entry of the tenant is left alone: none of its
/// processes uses it.
pub(super) fn write_gpu_segments(
    gpu_dir: &Path,
    new: &Config,
    only: Option<&[[u8; 16]]>,
) -> Result<Vec<String>, String> {
    let Ok(d) = Dir::open(gpu_dir) else {
        return Ok(vec![format!(
            "GPU segments: none in {} yet: its processes register the new share",
            gpu_dir.display()
        )]);
    };
    let (name, tag) = (new.tenant_name(), new.slice_tag());
    let mut out = vec![];
    for file in d.list().map_err(String::from)? {
        let Some(stem) = Path::new(&file)
            .file_stem()
            .filter(|_| Path::new(&file).extension().is_some_and(|x| x == "seg"))
        else {
            continue;
        };
        let Ok(uuid) = config::parse_uuid(&stem.to_string_lossy()) else {
            continue;
        };
        if only.is_some_and(|o| !o.contains(&uuid)) {
            continue;
        }
        let Some(spec) = new.tenant_spec(u32::MAX, &uuid) else {
            continue;
        };
        // From the directory held open, without following a link.
        let shown = gpu_dir.join(&file);
        let g = d
            .open_segment(&file, true)
            .map_err(|e| discover::open_failed(&e, &shown, "GPU segment"))
            .and_then(|fd| GpuSegment::from_fd(fd, &shown).map_err(|e| e.to_string()))?;
        // Only the slice's own entry, never a new one; the segment's
        // lock waited for at most 2 s, then written without it, said.
        let (found, busy) = g.update_tenant(&name, tag, spec);
        let Some((_, before)) = found else {
            continue;
        };
        if g.truncated() {
            return Err(format!(
                "{}: the file was truncated while it was written",
                shown.display()
            ));
        }
        if let Some((share, max)) = before {
            out.push(format!(
                "GPU segment {}: share {}% ceiling {} (was {share}% {})",
                shown.display(),
                spec.share,
                ceiling(spec.max),
                ceiling(max)
            ));
        }
        if let Some(mut b) = busy {
            b.path = shown;
            out.push(format!("GPU segment: written without its lock: {b}"));
        }
    }
    Ok(out)
}

fn ceiling(max: u32) -> String {
    if max >= 100 {
        "none".into()
    } else {
        format!("{max}%")
    }
}

/// The line a resize adds for a container made by an older OCI hook
/// (`label`), whose quota file is mounted as a file.
pub(super) fn legacy_note(label: &str) -> String {
    format!(
        "note: {label} was made by an older cuslice oci-hook, which mounted its quota file as a file: the processes it starts from now on still read the quota it was created with (its memory segment holds them to the new memory quota, with a warning; `cuslice watch` puts back their share); recreate the container for them to read the new file"
    )
}

/// Writes `text` (the claim's resized quota file) over the copy of it in
/// the claim's container `ctr` (its quota directory, mounted at
/// `/etc/cuslice`: what the container's processes started from now on
/// read), its mode kept. The lines to show.
pub(super) fn write_claim_copy(ctr: &Found, text: &str) -> Result<Vec<String>, String> {
    let q = ctr.quota_file()?;
    // The mode the OCI hook gives a container's quota file.
    q.dir.replace_file(QUOTA_FILE, text.as_bytes(), 0o444)?;
    let label = format!("container {}", text::clean(&short_id(&ctr.name)));
    let mut out = vec![format!(
        "{}: written ({label}'s copy of the claim's quota file)",
        q.shown.display()
    )];
    if q.legacy {
        out.push(legacy_note(&label));
    }
    Ok(out)
}

/// The containers whose records name claim `uid`.
pub(super) fn claim_containers(places: &Places, uid: &str) -> Vec<Found> {
    places
        .containers()
        .into_iter()
        .filter(|f| {
            f.record()
                .ok()
                .flatten()
                .is_some_and(|m| m.claim.as_deref() == Some(uid))
        })
        .collect()
}

/// Where the OCI hook set the driver's own memory limit on a container's
/// cgroup (its record says `set: ... on <cgroup>`), sets the new quota
/// there on every GPU it applies to (as the hook does) and writes what
/// became of it into the record. A line saying what was done; Err only
/// where the record cannot be read or written (a driver that refuses is
/// said in the line and the record, as by the hook: the shim enforces the
/// quota either way).
pub(super) fn driver_limit(ctr: &Found, new: &Config) -> Result<Option<String>, String> {
    let Ok(d) = ctr.dir.as_ref() else {
        return Ok(None);
    };
    let text = d.read_checked(
        CONTAINER_RECORD,
        Some((cuslice_host::sys::euid(), "our")),
        cuslice_host::container::RECORD_MAX,
    )?;
    let shown = ctr.paths.record().unwrap_or_default();
    // As JSON values: a field this version does not know is kept.
    let mut rec: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a container record: {e}", shown.display()))?;
    let Some(cgroup) = rec
        .get("driver_memory_limit")
        .and_then(|v| v.as_str())
        .and_then(|s| s.strip_prefix("set: "))
        .and_then(|s| s.split_once(" on "))
        .map(|(_, dir)| dir.to_string())
    else {
        return Ok(None);
    };
    let outcome = cuslice_host::gpu::nvml::Nvml::open()
        .and_then(|nvml| nvml.set_quota_limits(new, &cgroup))
        .unwrap_or_else(|e| format!("failed: {e}"));
    rec["driver_memory_limit"] = serde_json::Value::String(outcome.clone());
    let json = serde_json::to_string(&rec).map_err(|e| e.to_string())?;
    d.replace_file(CONTAINER_RECORD, (json + "\n").as_bytes(), 0o644)?;
    Ok(Some(format!(
        "driver memory limit of {}: {}",
        text::clean(&short_id(&ctr.name)),
        text::clean(&outcome)
    )))
}
