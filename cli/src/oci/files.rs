//! The host's files for a container under `--root`, every mode set here:
//! the segments made ([`make_segments`]' table), the quota file, record
//! and preload file written, the container's directory removed; and a
//! DRA claim's quota file, read.

use super::*;

/// The quota file the DRA plugin wrote for claim `uid`
/// (`<root>/claims/<uid>/quota.toml`) and its path for messages: a regular
/// file of root's, reached without following a link, checked the way the
/// shim will read it.
pub(super) fn claim_quota(root: &Path, uid: &str) -> Result<(String, PathBuf), String> {
    check_id(uid).map_err(|_| format!("claim {uid:?} is not a plain name"))?;
    let dir = Layout::new(root).open_claim(uid)?;
    let text = dir.read_file(QUOTA_FILE, config::MAX_FILE_BYTES)?;
    let path = dir.join(QUOTA_FILE);
    let cfg = config::parse_file(&path, &text).map_err(|e| e.to_string())?;
    if !cfg.has_limits() {
        return Err(format!(
            "{}: no limit in it: refusing to give the claim's container an unlimited GPU",
            path.display()
        ));
    }
    Ok((text, path))
}

/// The GPU segments this hook makes (UUIDs, as cuslice names them): for a
/// container with a compute share, every GPU NVML lists. The shim of a
/// container that runs as root makes a missing one itself; one that runs
/// as another user cannot (the GPU directory is root's), so without NVML
/// such a container is refused here, not at its first CUDA call.
pub(super) fn gpu_segments_to_make(
    cfg: &config::Config,
    user: &inroot::User,
) -> Result<Vec<String>, String> {
    if !cfg.has_compute() && !cfg.has_memory() {
        return Ok(vec![]);
    }
    let listed = cuslice_host::gpu::nvml::Nvml::open().and_then(|n| n.gpus());
    match listed {
        Ok(gpus) => gpus
            .iter()
            .map(|g| {
                config::parse_uuid(&g.uuid)
                    .map(|u| config::format_uuid(&u))
                    .map_err(|e| format!("NVML's GPU {} UUID {:?}: {e}", g.index, g.uuid))
            })
            .collect(),
        // Root's processes make them where they need them; so does a
        // process with a memory quota only, where NVML lists no GPU (no
        // driver: no GPU to hold; were the pool then out of its reach, its
        // cuInit says so in one line).
        Err(_) if user.uid == 0 || !cfg.has_compute() => Ok(vec![]),
        Err(e) => Err(format!(
            "cannot list the GPUs through NVML ({e}): the GPU segments of a container that runs as a user other than root ({}) must be made by this hook",
            user.describe()
        )),
    }
}

/// The host's files for a container, every mode set here (never from the
/// umask), nothing reached through a link below `--root`:
///
/// | path under `--root` | mode | |
/// |---|---|---|
/// | `.` | 0700 | only root on the host reaches what is below |
/// | `gpu/` | 0755 | nobody but root makes a segment there |
/// | `gpu/<uuid>.seg` | 0666 | root's, made here (with a compute share): usable by a container of any user |
/// | `gpu/<uuid>.memory` | 0666 | the GPU's memory pool (`cuslice_core::pool`), likewise (with a memory quota) |
/// | `containers/`, `containers/<id>/` | 0700 | |
/// | `containers/<id>/segment/` | 0755 | |
/// | `containers/<id>/segment/memory.seg` | 0666 | root's, made here |
/// | `containers/<id>/etc/` | 0755 | mounted at `/etc/cuslice`: any user of the container reaches the quota file |
/// | `containers/<id>/etc/quota.toml` | 0444 | |
/// | `containers/<id>/container.json` | 0644 | |
/// | `ld.so.preload` | 0444 | |
/// | `hook.lock` | 0600 | the tenant check's lock ([`lock_root`]) |
///
/// The segments are world-writable files, but reached only through the
/// mounts of the containers they belong to: `--root` is root's alone.
pub(super) fn make_segments(
    a: &HookArgs,
    id: &str,
    cfg: &config::Config,
    gpus: &[String],
) -> Result<(), String> {
    use cuslice_host::fs::set_file_mode;
    use std::os::fd::BorrowedFd;
    // SAFETY: a segment's descriptor, live while the segment is.
    let fd_of = |raw: i32| unsafe { BorrowedFd::borrow_raw(raw) };
    let root = Dir::keep_root(&a.root, 0o700)?;
    let gpu = root.keep_dir(GPU_DIR, 0o755)?;
    for uuid in gpus {
        if cfg.has_compute() {
            let p = gpu.join(format!("{uuid}.seg"));
            let seg =
                cuslice_core::gpu::GpuSegment::open_or_create(&p).map_err(|e| e.to_string())?;
            set_file_mode(fd_of(seg.raw_fd()), &p, 0o666)?;
        }
        if cfg.has_memory() {
            let p = gpu.join(format!("{uuid}.memory"));
            let pool = cuslice_core::pool::Pool::open_or_create(&p).map_err(|e| e.to_string())?;
            set_file_mode(fd_of(pool.raw_fd()), &p, 0o666)?;
        }
    }
    let dir = root.keep_dir(CONTAINERS_DIR, 0o700)?.keep_dir(id, 0o700)?;
    let seg = match &a.claim {
        // The plugin's directory for the claim (checked a plain name).
        Some(uid) => root
            .keep_dir(CLAIMS_DIR, 0o700)?
            .keep_dir(uid, 0o700)?
            .keep_dir(SEGMENT_DIR, 0o755)?,
        None => dir.keep_dir(SEGMENT_DIR, 0o755)?,
    };
    if cfg.has_memory() {
        let p = seg.join(MEMORY_SEGMENT);
        let s = cuslice_core::segment::Segment::open_or_create(&p).map_err(|e| e.to_string())?;
        set_file_mode(fd_of(s.raw_fd()), &p, 0o666)?;
    }
    Ok(())
}

/// The container's quota file and record, and the preload file (the files
/// of [`make_segments`]' table that are not segments).
pub(super) fn write_records(
    a: &HookArgs,
    id: &str,
    quota: &str,
    meta: &ContainerMeta,
) -> Result<(), String> {
    let root = Dir::keep_root(&a.root, 0o700)?;
    let dir = root.keep_dir(CONTAINERS_DIR, 0o700)?.keep_dir(id, 0o700)?;
    // In a directory of its own, which is what is mounted (module
    // documentation). Read-only from its creation: written whole to a new
    // file of that mode, then renamed into place.
    dir.keep_dir(QUOTA_DIR, 0o755)?
        .replace_file(QUOTA_FILE, quota.as_bytes(), 0o444)?;
    // An older hook's quota file left in the directory (a container
    // created again under the same id without its poststop): the one in
    // the quota directory is the container's, and readers take that one
    // wherever the quota directory exists; removed, so that no other is
    // left to mistake for it.
    dir.remove(QUOTA_FILE)?;
    let text = serde_json::to_string(meta)
        .map_err(|e| format!("{}: {e}", dir.join(CONTAINER_RECORD).display()))?;
    dir.replace_file(CONTAINER_RECORD, (text + "\n").as_bytes(), 0o644)?;
    let want = format!("{}\n", "/usr/lib/cuslice/libcuslice.so");
    if !root.holds(PRELOAD_FILE, want.as_bytes(), 0o444) {
        // Renamed into place: a container that has it mounted keeps the
        // inode it has, never sees it empty.
        root.replace_file(PRELOAD_FILE, want.as_bytes(), 0o444)?;
    }
    Ok(())
}

/// Removes `<root>/containers/<id>` and everything in it through the
/// layer: the container's segment directory is the container's to write
/// (it is mounted there), so nothing in it is followed. Not there is fine.
pub(super) fn remove_container(layout: &Layout, id: &str) -> Result<(), String> {
    let dir = match layout.open().and_then(|r| r.open_dir(CONTAINERS_DIR)) {
        Ok(d) => d,
        Err(e) if e.not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    Ok(dir.remove(id)?)
}
