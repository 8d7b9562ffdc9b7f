//! `cuslice status` / `top` / `exporter`: what the segments say, per GPU,
//! per tenant and per process, with NVML's view of each GPU where NVML is
//! there. Reads the segment files only (read-only mappings): works without a
//! GPU and without touching any running program, and never writes a
//! segment (the tenant entries of ended tenants are freed by the shim, when
//! a new tenant needs one: `GpuSegment::register`).
//!
//! An [`Observer`] takes readings; each gives a [`Snapshot`] with, per
//! tenant, its share of the GPU over the time since the previous reading,
//! and what it runs. A tenant with no live process stays in the snapshots
//! (`live: false`) for the linger time (a minute by default) after it ended,
//! then is left out.
//!
//! Every string in a snapshot that a tenant wrote or could have written (a
//! container's name, pod, image and command from `container.json`, tenant
//! names in the GPU segment, command lines in `/proc`, file names and paths
//! in shared directories, what the watch found) is escaped by
//! [`text::clean`] where it is read, so that every printer (the table, the
//! details, `top`, the exporter, `--json`) shows only safe strings and none
//! can forget to. `--json` carries the same escaped strings, not the raw
//! ones: JSON escapes control characters but not the bidirectional
//! overrides, and `jq -r` prints its strings raw onto a terminal; a
//! consumer that needs a value as the tenant wrote it reads the record
//! itself (`<root>/containers/<id>/container.json`, root's).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use cuslice_core::config::{self, format_uuid};
use cuslice_core::gpu::{self as coregpu, GpuSegment, MAX_PROCS, PROC_FREE};
use cuslice_core::segment::{MAX_DEVICES, Segment, UNLIMITED};
use serde::Serialize;

use crate::host::container::{self, ContainerMeta, command_line, describe, short_id};
use crate::host::discover::{self, Found, Places};
use crate::host::fs::{Dir, Kind};
use crate::host::health::view as health;
use crate::host::layout::{self, Layout, MEMORY_SEGMENT, QUOTA_FILE, SliceKind};
use crate::host::nvml::{DeviceHandle, GpuInfo, Nvml, sample_period_us, sample_window_us};
use crate::host::resize::{self, ResizeRecord};
use crate::host::text::{self, LINE_MAX, clean};
use crate::host::watch_state;

/// Where to look.
#[derive(Debug, Clone)]
pub struct Sources {
    /// Directories of the per-GPU scheduling segments.
    pub gpu_dirs: Vec<PathBuf>,
    /// Memory segment files given (`--memory-segment`): only those.
    memory: Vec<PathBuf>,
    /// Else: the slices (containers, DRA claims) under the hook's root, as
    /// `cuslice watch` finds them; and where `cuslice watch` last wrote its
    /// state (`<root>/watch/state.json`).
    places: Places,
}

impl Sources {
    /// The GPU segment directory given, else `$CUSLICE_GPU_SEGMENT_DIR`,
    /// else both the hook's and the shim's default; the memory segments
    /// given, else (found afresh at every reading, see
    /// [`memory_files`](Self::memory_files)) those under the containers
    /// root given (and the claims beside it) or the hook's root.
    pub fn resolve(
        gpu_dir: Option<PathBuf>,
        memory: Vec<PathBuf>,
        root: Option<PathBuf>,
    ) -> Sources {
        let gpu_dirs = match gpu_dir.or_else(|| {
            // Empty counts as unset, as for the shim.
            std::env::var_os("CUSLICE_GPU_SEGMENT_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
        }) {
            Some(d) => vec![d],
            // The hook's host directory (containers) and the local default.
            None => vec![
                Layout::default().gpu_dir(),
                PathBuf::from(config::DEFAULT_GPU_SEGMENT_DIR),
            ],
        };
        let places = match root {
            Some(r) => Places::with_containers_dir(&r),
            None => Places::new(Layout::default()),
        };
        Sources {
            gpu_dirs,
            memory,
            places,
        }
    }

    /// The memory segments: those given, else the slices' as the host
    /// file layer's discovery finds them (`host::discover`, which the
    /// watch uses too): every container's under the containers root,
    /// every DRA claim's beside it, those of programs started by `cuslice
    /// run` (in `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else /tmp); and the
    /// default segment directory's. Looked for at every reading: `top` and
    /// the exporter see containers come and go. Below the directory listed
    /// no link is followed, and a segment is listed only where it is a
    /// regular file itself.
    fn memory_files(&self) -> Vec<MemFile> {
        if !self.memory.is_empty() {
            return self.memory.iter().map(|p| MemFile::given(p)).collect();
        }
        let slices = self
            .places
            .containers()
            .into_iter()
            .chain(self.places.claims())
            // Programs started by `cuslice run` (its private directories,
            // where `run` puts them from this environment: the layout's
            // run base).
            .chain(discover::runs_in(&layout::run_base_here()));
        let mut mem: Vec<MemFile> = slices
            .filter(Found::has_segment)
            .map(MemFile::Slice)
            .collect();
        // Where a process without a quota file keeps its segment: the
        // shim's `CUSLICE_SEGMENT_DIR` (empty counts as unset), else the
        // default.
        let local = std::env::var_os("CUSLICE_SEGMENT_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from(config::DEFAULT_SEGMENT_DIR), PathBuf::from)
            .join(MEMORY_SEGMENT);
        let local = MemFile::given(&local);
        if local.is_segment() {
            mem.push(local);
        }
        mem
    }
}

/// The names in the directory at `path` (a place given, or the layout's:
/// links on the way to it followed), none if it cannot be listed.
fn listed(path: &Path) -> Vec<std::ffi::OsString> {
    Dir::open(path).and_then(|d| d.list()).unwrap_or_default()
}

/// A memory segment to read. Everything above it is opened through the
/// host file layer, no link followed; the segment itself by core's `shm`
/// through its directory's descriptor (its last component not followed,
/// never blocking). Its quota file and record are in the directory above
/// its own.
#[derive(Debug)]
enum MemFile {
    /// A slice's, found by the discovery: `segment/memory.seg` in its
    /// directory, read as the discovery reads a slice of its kind.
    Slice(Found),
    /// One named on the command line (or the local default): `rel` below
    /// `base` (as given: links on the way to it followed).
    Given { base: PathBuf, rel: PathBuf },
}

impl MemFile {
    #[cfg(test)]
    fn at(base: &Path, rel: PathBuf) -> MemFile {
        MemFile::Given {
            base: base.to_path_buf(),
            rel,
        }
    }

    /// A segment named on the command line (or the local default): below
    /// the directory above its own, as given.
    fn given(path: &Path) -> MemFile {
        let up = path.parent().and_then(Path::parent);
        let (base, rel) = match up.and_then(|u| Some((u, path.strip_prefix(u).ok()?))) {
            Some((u, rel)) if !u.as_os_str().is_empty() => (u.to_path_buf(), rel.to_path_buf()),
            _ => (PathBuf::from("."), path.to_path_buf()),
        };
        MemFile::Given { base, rel }
    }

    /// Its path, as opened and shown.
    fn path(&self) -> PathBuf {
        match self {
            MemFile::Slice(f) => f.paths.memory_segment(),
            MemFile::Given { base, rel } => base.join(rel),
        }
    }

    /// Whether it is there: a regular file itself, every directory on the
    /// way below `base` a directory itself (a link is not followed).
    fn is_segment(&self) -> bool {
        match self {
            MemFile::Slice(f) => f.has_segment(),
            MemFile::Given { .. } => self.find().is_some_and(|st| Kind::File.matches(st.st_mode)),
        }
    }

    /// Whether it is not there (went away since it was found).
    fn gone(&self) -> bool {
        match self {
            MemFile::Slice(f) => !f.has_segment(),
            MemFile::Given { .. } => self.find().is_none(),
        }
    }

    fn find(&self) -> Option<libc::stat> {
        let MemFile::Given { base, rel } = self else {
            return None;
        };
        let base = Dir::open(base).ok()?;
        base.open_path_beneath(rel).ok().map(|(_, st)| st)
    }

    /// Its own directory, opened through the layer (no link on the way
    /// below `base`), held by what is returned, and the path to open the
    /// segment by while it is held: so that the directory checked is the
    /// one read (a run directory's owner could swap a link in between
    /// otherwise).
    fn pinned(&self) -> Result<(Box<dyn std::fmt::Debug>, PathBuf), String> {
        let (base, rel) = match self {
            MemFile::Slice(f) => {
                let seg = f.segment(None)?;
                let via = seg.path().to_path_buf();
                return Ok((Box::new(seg), via));
            }
            MemFile::Given { base, rel } => (base, rel),
        };
        let (Some(dir), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(format!(
                "{}: not a segment file's path",
                self.path().display()
            ));
        };
        let d = Dir::open(base)
            .and_then(|b| b.open_dir_beneath(dir))
            .map_err(|e| e.to_string())?;
        let via = PathBuf::from(format!("/proc/self/fd/{}", d.as_fd().as_raw_fd())).join(name);
        Ok((Box::new(d), via))
    }
}

/// How long a tenant with no live process is still shown.
pub const DEFAULT_LINGER_SECONDS: f64 = 60.0;

#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub hostname: String,
    /// The time since the previous reading, over which `gpu_percent` and
    /// `throttled_percent` are measured; None for a first reading.
    pub interval_seconds: Option<f64>,
    /// How long a tenant with no live process is still listed.
    pub linger_seconds: f64,
    /// Why there is no NVML information (None: NVML answered).
    pub nvml_error: Option<String>,
    pub gpus: Vec<GpuView>,
    pub containers: Vec<ContainerView>,
    /// Segments that could not be read, one line each.
    pub errors: Vec<String>,
    /// What `cuslice watch` last published (None: no watch ran here).
    pub watch: Option<WatchView>,
    /// The GPU health source whose judgement was read, or why each GPU's
    /// health is this reading's own look (None: no NVML, no health).
    pub health: Option<HealthSource>,
}

/// Whose judgement `GpuView::health` is ([`health::view`]).
#[derive(Debug, Serialize)]
pub struct HealthSource {
    /// The source last published (None: none ever did here).
    pub source: Option<health::SourceView>,
    /// Why the health is this reading's look alone (None: the source's
    /// was read).
    pub note: Option<String>,
}

/// `cuslice watch`'s state, and whether it is up now (its last pass no
/// older than three intervals).
#[derive(Debug, Serialize)]
pub struct WatchView {
    pub up: bool,
    pub last_pass_seconds_ago: f64,
    #[serde(flatten)]
    pub state: watch_state::WatchState,
}

#[derive(Debug, Serialize)]
pub struct GpuView {
    pub uuid: String,
    /// NVML's index, name, memory and utilization (None without NVML, or
    /// for a GPU NVML does not list).
    pub index: Option<u32>,
    pub name: Option<String>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub utilization_percent: Option<u32>,
    /// The GPU segment (None: no tenant with a compute share uses it).
    pub segment: Option<String>,
    pub handovers: u64,
    /// Why some tenant's upper bound could not be checked against NVML's
    /// per-process time (None: every one was, or NVML is not there at all:
    /// `Snapshot::nvml_error`).
    pub process_time_error: Option<String>,
    /// Its health: healthy, degraded or unhealthy, why and since when, the
    /// health source's judgement or this reading's look, whichever is worse
    /// (None without NVML, or for a GPU it does not list).
    pub health: Option<health::GpuView>,
    pub tenants: Vec<TenantView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TenantView {
    pub name: String,
    /// Its slice's tag (see `gpu::layout::Tenant::name`), not shown: two
    /// slices given one tenant name are two rows (each its own entry of
    /// the GPU segment, its own memory segment).
    #[serde(skip)]
    pub tag: u64,
    /// Some process of the tenant is alive (proved by its segment lock).
    pub live: bool,
    /// What it runs, for display: the container's name, pod and image
    /// (from its runtime's annotations), else the container's command, else
    /// the command line of its first live process (when that process is in
    /// this PID namespace), else its PIDs.
    pub runs: String,
    /// What the OCI hook recorded, for a container.
    pub container: Option<ContainerMeta>,
    /// Its live processes, as each saw its own PID (its container's PID
    /// namespace for a container).
    pub pids: Vec<u32>,
    /// How many (`pids.len()`).
    pub processes: u32,
    /// Device memory its processes hold on this GPU (None: no memory
    /// segment of it was found).
    pub memory_used_bytes: Option<u64>,
    /// Its quota on this GPU (None: none): with a guarantee below it, its
    /// `memory_max`.
    pub memory_limit_bytes: Option<u64>,
    /// What it is guaranteed on this GPU, where that is below its quota
    /// (`memory` under a `memory_max`; None: the quota is all of it).
    pub memory_guarantee_bytes: Option<u64>,
    /// The part of its guarantee still lent out to others' bursts on this
    /// GPU (its entry in the GPU's memory pool; None: no entry there):
    /// taken back as the borrowers free.
    pub memory_pending_bytes: Option<u64>,
    /// What it holds past its guarantee on this GPU, as its entry in the
    /// GPU's memory pool says (a borrower; None: no entry there).
    pub memory_burst_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub memory_refused: Option<u64>,
    /// Guaranteed share of GPU time (None: no compute share on this GPU).
    pub share_percent: Option<u32>,
    /// None: no ceiling.
    pub ceiling_percent: Option<u32>,
    /// "latency" or "standard" (None: no compute share).
    pub class: Option<&'static str>,
    /// "lease": competes for a saturated GPU through the lease; "free":
    /// under its share, launches freely.
    pub mode: Option<&'static str>,
    /// GPU time charged to it since it registered.
    pub gpu_time_seconds: Option<f64>,
    /// `gpu_time_seconds` less what `gpu_percent` left out of the charge
    /// (NVML's check of its upper bounds) over the intervals this observer
    /// saw: a counter whose rate is `gpu_percent` (the exporter's
    /// `cuslice_compute_gpu_seconds_total`).
    pub gpu_seconds: Option<f64>,
    /// Time its processes waited for the GPU (summed over processes).
    pub throttled_seconds: Option<f64>,
    /// Its GPU time over the interval, percent of the interval: its share
    /// of the GPU just now. What it was charged (`charged_percent`), except
    /// that the part charged as an upper bound (`unmeasured_percent`) counts
    /// per process at most what NVML's per-process samples give that
    /// process over the interval: alone on a GPU, nothing measures what a
    /// process's kernels run, and a launch-bound loop is charged its wall
    /// time in flight (25-33 % for ~4 % of kernel time); NVML's samples are
    /// close to the truth there, and overstate a process only where the GPU
    /// time-slices between processes (where the charge is measured).
    pub gpu_percent: Option<f64>,
    /// GPU time charged to it over the interval, percent: what its share
    /// and ceiling count.
    pub charged_percent: Option<f64>,
    /// Of `charged_percent`, what was charged as an upper bound: wall time
    /// in flight of its processes while nothing measured their kernels.
    pub unmeasured_percent: Option<f64>,
    /// Of `gpu_percent`, what is still such an upper bound: NVML could not
    /// check it (no NVML, no per-process samples, or no NVML process found
    /// for the tenant's process; `GpuView::process_time_error` says why
    /// where NVML failed).
    pub unverified_percent: Option<f64>,
    /// Time its processes waited over the interval, percent of the interval
    /// (summed over processes: two waiting all along make 200).
    pub throttled_percent: Option<f64>,
    pub waiting: u32,
    pub last_active_seconds_ago: Option<f64>,
    /// For a tenant with no live process: since when (None while live).
    pub ended_seconds_ago: Option<f64>,
    /// GPU time charged per wall time over its last demand window, percent.
    pub demand_percent: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ContainerView {
    pub segment: String,
    /// The tenant its processes register as (its quota file's `tenant`).
    pub tenant: String,
    /// Its quota file's slice tag (not shown): with `tenant`, the GPU
    /// segment entry that is its.
    #[serde(skip)]
    pub tag: u64,
    pub container: Option<ContainerMeta>,
    /// Its last resize (`cuslice resize`), while its quota file still
    /// holds what that resize wrote.
    pub resize: Option<ResizeRecord>,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    pub uuid: String,
    /// None: no quota (usage is still counted).
    pub limit_bytes: Option<u64>,
    /// The guarantee below the quota (None: none).
    pub guarantee_bytes: Option<u64>,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    pub refused: u64,
    /// Over a quota its last resize lowered: the seconds left of the
    /// resize's grace before `cuslice watch` applies its policy (0: over).
    pub grace_left_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessView {
    pub pid: u32,
    pub alive: bool,
    pub started_unix: u64,
    /// GPU UUID -> bytes.
    pub used_bytes: BTreeMap<String, u64>,
}

/// One GPU segment, read.
struct GpuRead {
    uuid: String,
    path: PathBuf,
    /// (device, inode) of the file, to find the processes that map it.
    file: Option<(u64, u64)>,
    handovers: u64,
    /// Each tenant with the PIDs of its live processes.
    tenants: Vec<(coregpu::TenantView, Vec<u32>)>,
    /// The live process entries.
    procs: Vec<ProcRead>,
    /// NVML's time for the entries whose upper-bound charge grew since
    /// the previous reading. Err: why NVML cannot say.
    nvml: Result<NvmlTimes, String>,
}

/// NVML's per-process SM time over its own window: from its newest sample
/// at the previous reading to its newest now.
#[derive(Debug, Default)]
struct NvmlTimes {
    /// The window (ns; 0: no sample since, NVML says nothing yet).
    window_ns: u64,
    /// Per process entry (slot): the SM time of the process behind it
    /// over the window (ns; absent: NVML lists no process found to be it).
    by_slot: HashMap<usize, u64>,
}

/// A live process entry of a GPU segment.
#[derive(Debug, Clone, Copy)]
struct ProcRead {
    slot: usize,
    tenant: usize,
    /// As the process sees itself.
    pid: u32,
    /// GPU time charged for it as an upper bound so far (`Proc::bound_ns`).
    bound_ns: u64,
}

/// One memory segment, read.
struct MemRead {
    view: ContainerView,
    /// Why its resize record could not be read (a line of the errors).
    resize_error: Option<String>,
    file: Option<(u64, u64)>,
    /// What runs there where no container record says more: `container
    /// <id>` (the hook's layout) or `DRA claim <uid>` (the DRA plugin's).
    origin: Option<String>,
}

/// Everything read at one time.
struct Reading {
    at: u64,
    gpus: Vec<GpuRead>,
    mems: Vec<MemRead>,
    /// Per GPU UUID, the entries of its memory pools (one per GPU segment
    /// directory).
    pools: Vec<(String, Vec<cuslice_core::pool::EntryView>)>,
    nvml: Result<Vec<GpuInfo>, String>,
    /// Every GPU's health (None without NVML).
    health: Option<health::View>,
    errors: Vec<String>,
}

/// A tenant on a GPU: (GPU UUID, tenant name, slice tag).
type Key = (String, String, u64);

/// A tenant's row on a GPU, and the segment files (device, inode) that
/// are its.
type Row = (TenantView, Vec<(u64, u64)>);

/// Takes readings, keeping what the next one needs: the previous reading
/// (for shares over the interval) and when each ended tenant was first
/// seen ended.
pub struct Observer {
    src: Sources,
    nvml: Result<Nvml, String>,
    linger_ns: u64,
    prev: Option<Reading>,
    live_before: HashSet<Key>,
    ended: HashMap<Key, u64>,
    /// What each tenant ran when last seen live (an ended tenant's row
    /// keeps it: its processes and files are gone).
    last_runs: HashMap<Key, String>,
    /// Per GPU (UUID): NVML's newest per-process sample time stamp seen
    /// (µs) and its sampling period (µs).
    sampled: HashMap<String, (u64, u64)>,
    /// Per tenant: what `gpu_percent` left out of its charge so far (ns;
    /// see `TenantView::gpu_seconds`).
    left_out: HashMap<Key, u64>,
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// (device, inode) of the file behind `raw` (a segment's descriptor):
/// the file read, whatever its name leads to by now.
fn fd_file_id(raw: i32) -> Option<(u64, u64)> {
    // SAFETY: a segment's descriptor, live while the segment is (the
    // caller holds it).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    crate::host::sys::fstat(fd)
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let n = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// What owns a memory segment: its tenant name and slice tag, what the
/// hook recorded, where it comes from (see [`segment_owner`]).
type Owner = ((String, u64), Option<ContainerMeta>, Option<String>);

/// The tenant of the memory segment `seg` (`<dir>/segment/memory.seg`):
/// the `tenant` and slice tag of its quota file (`<dir>/etc/quota.toml`
/// for a container, `<dir>/quota.toml` for a container of an older hook,
/// a DRA claim or a `cuslice run` session: `host::layout`), else the name the shim derives from
/// the segment directory (and no slice); what the hook recorded in a
/// container's `<dir>/container.json`; and where it comes from (a
/// container, a DRA claim).
fn segment_owner(seg: &MemFile) -> Owner {
    let path = seg.path();
    let seg_dir = path.parent().unwrap_or(Path::new("/"));
    let default = || (config::default_tenant(seg_dir), 0);
    let tenant = |q: Result<config::Config, String>| {
        q.map(|c| (c.tenant_name(), c.slice_tag()))
            .unwrap_or_else(|_| default())
    };
    let ((name, tag), meta, origin) = match seg {
        // Read as the watch reads a slice of its kind (`host::discover`):
        // a container's and a claim's files ours, a session's its user's,
        // no record in a session's directory.
        MemFile::Slice(f) => {
            let id = clean(&f.name);
            let origin = match f.kind {
                SliceKind::Container => Some(format!("container {}", short_id(&id))),
                SliceKind::Claim => {
                    // The pods the claim is reserved for, from the
                    // plugin's record.
                    let pods: Vec<String> = f
                        .claim_record()
                        .map(|r| r.pods.iter().take(4).map(|p| clean(p)).collect())
                        .unwrap_or_default();
                    Some(if pods.is_empty() {
                        format!("DRA claim {}", short_id(&id))
                    } else {
                        format!("pod {} (DRA claim {})", pods.join(", "), short_id(&id))
                    })
                }
                SliceKind::Run => None,
            };
            let meta = f.record().ok().flatten();
            (tenant(f.quota()), meta, origin)
        }
        // A segment named on the command line, or the local default
        // (/dev/shm/cuslice, where any user may plant files beside it):
        // its quota file the directory's owner's, a record ours.
        MemFile::Given { base, rel } => {
            let up = rel.parent().and_then(Path::parent);
            let owner = up.and_then(|u| Dir::open(base).ok()?.open_dir_beneath(u).ok());
            let uid = owner
                .as_ref()
                .and_then(|d| crate::host::sys::fstat(d.as_fd()).ok())
                .map(|st| st.st_uid);
            let q = match (&owner, uid) {
                (Some(d), Some(uid)) => {
                    let whose = Some((uid, "the directory's"));
                    // Whatever slice's it is, its quota file is where the
                    // layout has a container's: in its quota directory
                    // where it has one (a claim's or a session's never
                    // has), else beside its segment directory.
                    layout::open_quota_dir(d, SliceKind::Container, whose).and_then(|q| {
                        container::read_quota(q.dir.as_fd(), &q.dir.join(QUOTA_FILE), whose)
                    })
                }
                _ => Err(String::new()),
            };
            let ours = Some((crate::host::sys::euid(), "our"));
            let meta = owner
                .as_ref()
                .and_then(|d| container::read_record(d, ours).ok().flatten());
            (tenant(q), meta, None)
        }
    };
    ((clean(&name), tag), meta.map(|m| m.for_display()), origin)
}

fn read_gpu(path: &Path) -> Result<GpuRead, String> {
    let g = GpuSegment::open_read_only(path).map_err(|e| e.to_string())?;
    let mut pids: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    let mut procs = vec![];
    for i in 0..MAX_PROCS {
        let Some(p) = g.proc_entry(i) else { break };
        // Liveness from the entry's lock, not from the counters: only the
        // shim sweeps dead processes, and observers write nothing.
        if p.state.load(Ordering::Acquire) != PROC_FREE && g.proc_alive(i) {
            let r = ProcRead {
                slot: i,
                tenant: p.tenant.load(Ordering::Relaxed) as usize,
                pid: p.pid.load(Ordering::Relaxed),
                bound_ns: p.bound_ns.load(Ordering::Relaxed),
            };
            pids.entry(r.tenant).or_default().push(r.pid);
            procs.push(r);
        }
    }
    Ok(GpuRead {
        // A file in a directory every tenant can write.
        uuid: path
            .file_stem()
            .map(|s| clean(&s.to_string_lossy()))
            .unwrap_or_default(),
        path: path.to_path_buf(),
        file: fd_file_id(g.raw_fd()),
        handovers: g.sched().handovers.load(Ordering::Relaxed),
        tenants: g
            .tenants()
            .into_iter()
            .map(|mut t| {
                let p = pids.remove(&t.index).unwrap_or_default();
                // Written by the tenant itself.
                t.name = clean(&t.name);
                (t, p)
            })
            .collect(),
        procs,
        nvml: Ok(NvmlTimes::default()),
    })
    .and_then(|r| void_if_truncated(r, g.truncated(), path))
}

/// A reading of a segment that was truncated while it was read holds
/// zeros where the file was: an error, not figures.
fn void_if_truncated<T>(r: T, truncated: bool, path: &Path) -> Result<T, String> {
    if truncated {
        Err(format!(
            "{}: the file was truncated while it was read",
            path.display()
        ))
    } else {
        Ok(r)
    }
}

/// A slice's last resize, while its quota file holds what it wrote, and
/// for each GPU over a quota it lowered the grace left; or why its record
/// could not be read.
fn resized(mem: &MemFile, devices: &mut [DeviceView]) -> (Option<ResizeRecord>, Option<String>) {
    let MemFile::Slice(f) = mem else {
        return (None, None);
    };
    let mut r = match f.resize() {
        Ok(Some(r)) => r,
        Ok(None) => return (None, None),
        Err(e) => return (None, Some(e)),
    };
    let Some(q) = f.quota().ok().filter(|q| r.applies_to(q)) else {
        return (None, None);
    };
    // A session's record is its user's: what it says is shown escaped.
    for c in &mut r.changes {
        c.entry = clean(&c.entry);
        c.field = clean(&c.field);
    }
    let now = resize::now_unix();
    for d in devices.iter_mut() {
        let over = d.limit_bytes.is_some_and(|l| d.used_bytes > l);
        if let (true, Ok(uuid)) = (over, config::parse_uuid(&d.uuid)) {
            d.grace_left_seconds = r.grace_on(&q, &uuid).map(|until| (until - now).max(0.0));
        }
    }
    (Some(r), None)
}

fn read_mem(mem: &MemFile) -> Result<MemRead, String> {
    let path = &mem.path();
    // Through its pinned directory (the file itself is opened without
    // following a link by core).
    let (_dir, via) = mem.pinned()?;
    let s = Segment::open_read_only(&via).map_err(|e| {
        e.to_string()
            .replace(&*via.to_string_lossy(), &path.to_string_lossy())
    })?;
    let mut uuids = BTreeMap::new();
    let mut devices = vec![];
    for d in 0..MAX_DEVICES {
        if let Some(u) = s.device_usage(d) {
            let uuid = format_uuid(&u.uuid);
            uuids.insert(d, uuid.clone());
            devices.push(DeviceView {
                uuid,
                limit_bytes: (u.limit != UNLIMITED).then_some(u.limit),
                guarantee_bytes: (u.guarantee != 0 && u.guarantee < u.limit).then_some(u.guarantee),
                used_bytes: u.used,
                peak_bytes: u.peak,
                refused: u.refused,
                grace_left_seconds: None,
            });
        }
    }
    let processes = s
        .processes()
        .into_iter()
        .map(|p| ProcessView {
            pid: p.pid,
            alive: p.alive,
            started_unix: p.started,
            used_bytes: p
                .used
                .iter()
                .enumerate()
                .filter(|(_, b)| **b > 0)
                .map(|(d, b)| {
                    (
                        uuids
                            .get(&d)
                            .cloned()
                            .unwrap_or_else(|| format!("device-{d}")),
                        *b,
                    )
                })
                .collect(),
        })
        .collect();
    let ((tenant, tag), container, origin) = segment_owner(mem);
    void_if_truncated((), s.truncated(), path)?;
    let (resize, resize_error) = resized(mem, &mut devices);
    Ok(MemRead {
        resize_error,
        view: ContainerView {
            segment: clean(&path.display().to_string()),
            tenant,
            tag,
            container,
            resize,
            devices,
            processes,
        },
        file: fd_file_id(s.raw_fd()),
        origin,
    })
}

/// The command line of process `pid` of this PID namespace, if it is one
/// of the tenant's: it must hold one of `files` (a segment of the tenant)
/// open. A PID from another namespace (a container's) names another
/// process here, or none, and is not taken for it.
fn host_cmdline(pid: u32, files: &[(u64, u64)]) -> Option<String> {
    if !holds_open(pid, files) {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!args.is_empty()).then(|| clean(&command_line(&args)))
}

/// Whether process `pid` of this PID namespace holds one of `files` open
/// among its first `MAX_FDS` descriptors (the shim opens its segments
/// early; a process that opens a million files costs a reading no more).
fn holds_open(pid: u32, files: &[(u64, u64)]) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|rd| {
        rd.flatten()
            .take(crate::host::proc::MAX_FDS)
            .any(|e| file_id(&e.path()).is_some_and(|f| files.contains(&f)))
    })
}

/// What entry `p` had charged as an upper bound at reading `before` (0:
/// not there then, or another process in its slot).
fn bound_before(before: &GpuRead, p: &ProcRead) -> u64 {
    before
        .procs
        .iter()
        .find(|q| q.slot == p.slot && q.pid == p.pid)
        .map_or(0, |q| q.bound_ns.min(p.bound_ns))
}

/// A tenant's GPU time over an interval (ns): see `TenantView`.
#[derive(Debug, Clone, Copy)]
struct Times {
    gpu: u64,
    charged: u64,
    unmeasured: u64,
    unverified: u64,
}

/// Tenant `t`'s times between readings `before` and `g` of one GPU
/// segment, `dt` ns apart, `charged` ns having been charged to it
/// meanwhile: each of its processes' upper-bound charge counts at most
/// NVML's time for it (over NVML's window, scaled to the interval: the
/// samples come every ~1/6 s, and a window of whole periods keeps a
/// saturating process at 100 % where the interval holds 2.5 of them).
fn interval_times(
    g: &GpuRead,
    before: &GpuRead,
    t: &coregpu::TenantView,
    dt: u64,
    charged: u64,
) -> Times {
    let (mut unmeasured, mut cut, mut unverified) = (0u64, 0u64, 0u64);
    let nvml = g.nvml.as_ref().ok().filter(|n| n.window_ns > 0);
    for p in g.procs.iter().filter(|p| p.tenant == t.index) {
        let bound = p.bound_ns - bound_before(before, p);
        unmeasured += bound;
        let over_dt = nvml.and_then(|n| {
            n.by_slot.get(&p.slot).map(|&ns| {
                (u128::from(ns) * u128::from(dt) / u128::from(n.window_ns)).min(u128::from(dt))
                    as u64
            })
        });
        match over_dt {
            Some(ns) => cut += bound.saturating_sub(ns),
            None => unverified += bound,
        }
    }
    // A process that ended meanwhile took its count along; what the
    // entries say never exceeds what was charged.
    let unmeasured = unmeasured.min(charged);
    let cut = cut.min(unmeasured);
    Times {
        gpu: charged - cut,
        charged,
        unmeasured,
        unverified: unverified.min(unmeasured - cut),
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Observer {
    /// `linger`: seconds a tenant with no live process stays listed.
    pub fn new(src: Sources, linger: f64) -> Observer {
        Observer {
            src,
            nvml: Nvml::open(),
            linger_ns: (linger.clamp(0.0, 1e9) * 1e9) as u64,
            prev: None,
            live_before: HashSet::new(),
            ended: HashMap::new(),
            last_runs: HashMap::new(),
            sampled: HashMap::new(),
            left_out: HashMap::new(),
        }
    }

    /// NVML's SM time over the interval since the previous reading of the
    /// processes behind `g`'s entries whose upper-bound charge grew (see
    /// `GpuRead::nvml_ns`). A process NVML lists is behind an entry if it
    /// sees itself by the entry's PID, holds `g`'s segment open and, where
    /// status knows memory segments of the entry's tenant (`mem_files`, by
    /// tenant name and slice tag), one of those; an entry two processes could be behind
    /// (containers of one tenant each with its PID 1) is left unchecked.
    fn nvml_times(
        &mut self,
        g: &GpuRead,
        devices: &Result<Vec<DeviceHandle>, String>,
        mem_files: &HashMap<(String, u64), Vec<(u64, u64)>>,
    ) -> Result<NvmlTimes, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        let d = devices
            .as_ref()
            .map_err(Clone::clone)?
            .iter()
            .find(|d| d.uuid == g.uuid)
            .ok_or_else(|| format!("NVML lists no GPU {}", g.uuid))?;
        let seen = self.sampled.get(&g.uuid).copied();
        let last = seen.map_or(0, |s| s.0);
        let samples = nvml.process_utilization(d, last, 64)?;
        let period = sample_period_us(&samples, seen.map(|s| s.1));
        let newest = samples
            .iter()
            .map(|s| s.time_us)
            .max()
            .unwrap_or(0)
            .max(last);
        self.sampled.insert(g.uuid.clone(), (newest, period));
        // The first look only finds where NVML's samples stand.
        let Some(before) = seen
            .filter(|_| last > 0)
            .and(self.prev.as_ref())
            .and_then(|p| p.gpus.iter().find(|x| x.uuid == g.uuid))
        else {
            return Ok(NvmlTimes::default());
        };
        let grew: Vec<&ProcRead> = g
            .procs
            .iter()
            .filter(|p| p.bound_ns > bound_before(before, p))
            .collect();
        // Periods lost from NVML's buffer are not taken for idle: scaling
        // what is there can only overstate a process, and an upper bound
        // is never raised.
        let window_ns = sample_window_us(&samples, last, period)
            .map_or(0, |(a, b)| (b - a).saturating_mul(1000));
        if grew.is_empty() || window_ns == 0 {
            return Ok(NvmlTimes::default());
        }
        let mut busy: HashMap<u32, u64> = HashMap::new();
        for s in &samples {
            *busy.entry(s.pid).or_default() += u64::from(s.sm.min(100)) * period * 10;
        }
        let seg: Vec<(u64, u64)> = g.file.into_iter().collect();
        // Each listed process with the PID it sees itself by.
        let listed: Vec<(u32, Option<u32>)> = nvml
            .processes(d, 64)?
            .iter()
            .map(|h| (h.pid, crate::host::proc::inner_pid(h.pid)))
            .collect();
        let mut out = HashMap::new();
        for p in grew {
            let mem = g
                .tenants
                .iter()
                .find(|(t, _)| t.index == p.tenant)
                .and_then(|(t, _)| mem_files.get(&(t.name.clone(), t.tag)));
            let behind: Vec<u32> = listed
                .iter()
                .filter(|&&(h, inner)| {
                    inner == Some(p.pid)
                        && holds_open(h, &seg)
                        && mem.is_none_or(|m| holds_open(h, m))
                })
                .map(|&(h, _)| h)
                .collect();
            if let [h] = behind[..] {
                out.insert(p.slot, busy.get(&h).copied().unwrap_or(0));
            }
        }
        Ok(NvmlTimes {
            window_ns,
            by_slot: out,
        })
    }

    fn take(&mut self) -> Reading {
        let mut errors = vec![];
        let mut gpu_files: Vec<PathBuf> = self
            .src
            .gpu_dirs
            .iter()
            .flat_map(|d| listed(d).into_iter().map(move |n| d.join(n)))
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .collect();
        gpu_files.sort();
        let mut gpus = vec![];
        for p in gpu_files {
            match read_gpu(&p) {
                Ok(g) => gpus.push(g),
                Err(e) => errors.push(text::clean_to(&e, LINE_MAX)),
            }
        }
        let mut pools = vec![];
        let mut pool_files: Vec<PathBuf> = self
            .src
            .gpu_dirs
            .iter()
            .flat_map(|d| listed(d).into_iter().map(move |n| d.join(n)))
            .filter(|p| p.extension().is_some_and(|x| x == "memory"))
            .collect();
        pool_files.sort();
        for p in pool_files {
            match cuslice_core::pool::Pool::open_read_only(&p) {
                Ok(pool) => pools.push((
                    p.file_stem()
                        .map(|s| clean(&s.to_string_lossy()))
                        .unwrap_or_default(),
                    pool.entries(),
                )),
                Err(e) => errors.push(text::clean_to(&e.to_string(), LINE_MAX)),
            }
        }
        let mut mems = vec![];
        let given = !self.src.memory.is_empty();
        for m in self.src.memory_files() {
            match read_mem(&m) {
                Ok(mut m) => {
                    errors.extend(m.resize_error.take().map(|e| text::clean_to(&e, LINE_MAX)));
                    mems.push(m);
                }
                // A segment found by looking that went away meanwhile (its
                // container or program ended) is no error.
                Err(_) if !given && m.gone() => {}
                Err(e) => errors.push(text::clean_to(&e, LINE_MAX)),
            }
        }
        let nvml = match &self.nvml {
            Ok(n) => n.gpus(),
            Err(e) => Err(e.clone()),
        };
        let devices = match &self.nvml {
            Ok(n) => n.devices(),
            Err(e) => Err(e.clone()),
        };
        let mut mem_files: HashMap<(String, u64), Vec<(u64, u64)>> = HashMap::new();
        for m in &mems {
            if let Some(f) = m.file {
                mem_files
                    .entry((m.view.tenant.clone(), m.view.tag))
                    .or_default()
                    .push(f);
            }
        }
        for g in &mut gpus {
            g.nvml = self.nvml_times(g, &devices, &mem_files);
        }
        let health = match (&self.nvml, &devices) {
            (Ok(n), Ok(d)) => Some(health::view(
                self.src.places.layout(),
                n,
                d,
                watch_state::now_unix(),
            )),
            _ => None,
        };
        Reading {
            at: coregpu::monotonic_ns(),
            gpus,
            mems,
            pools,
            nvml,
            health,
            errors,
        }
    }

    /// Reads everything afresh; shares over the time since the previous
    /// call.
    pub fn read(&mut self) -> Snapshot {
        let now = self.take();
        let snap = self.view(&now);
        self.live_before = snap
            .gpus
            .iter()
            .flat_map(|g| {
                g.tenants
                    .iter()
                    .filter(|t| t.live)
                    .map(|t| (g.uuid.clone(), t.name.clone(), t.tag))
            })
            .collect();
        self.prev = Some(now);
        snap
    }

    fn view(&mut self, r: &Reading) -> Snapshot {
        let prev = self.prev.as_ref();
        let dt = prev.map(|p| r.at.saturating_sub(p.at)).filter(|d| *d > 0);
        let nvml_gpus: &[GpuInfo] = r.nvml.as_deref().unwrap_or(&[]);
        // GPUs: NVML's by index, then any other a segment names.
        let mut order: Vec<String> = nvml_gpus.iter().map(|g| g.uuid.clone()).collect();
        let mut others = BTreeSet::new();
        for g in &r.gpus {
            others.insert(g.uuid.clone());
        }
        for m in &r.mems {
            for d in &m.view.devices {
                others.insert(d.uuid.clone());
            }
        }
        for u in others {
            if !order.contains(&u) {
                order.push(u);
            }
        }

        let mut seen: HashSet<Key> = HashSet::new();
        let mut gpus = vec![];
        for uuid in order {
            let info = nvml_gpus.iter().find(|g| g.uuid == uuid);
            let seg = r.gpus.iter().find(|g| g.uuid == uuid);
            // By name and slice tag: two slices of one name are two rows.
            let mut rows: BTreeMap<(String, u64), Row> = BTreeMap::new();
            if let Some(g) = seg {
                let gpu_before = prev.and_then(|p| p.gpus.iter().find(|x| x.uuid == uuid));
                for (t, pids) in &g.tenants {
                    let before = gpu_before
                        .and_then(|x| {
                            x.tenants
                                .iter()
                                .find(|(y, _)| y.name == t.name && y.tag == t.tag)
                        })
                        .map(|(y, _)| y);
                    let rate = |now_ns: u64, then_ns: u64| {
                        dt.filter(|_| now_ns >= then_ns)
                            .map(|d| 100.0 * (now_ns - then_ns) as f64 / d as f64)
                    };
                    let times = before
                        .zip(gpu_before)
                        .zip(dt)
                        .filter(|((b, _), _)| t.used_ns >= b.used_ns)
                        .map(|((b, gb), d)| interval_times(g, gb, t, d, t.used_ns - b.used_ns));
                    let pct = |ns: u64| dt.map(|d| 100.0 * ns as f64 / d as f64);
                    let key = (uuid.clone(), t.name.clone(), t.tag);
                    if before.is_some_and(|b| t.used_ns < b.used_ns) {
                        // Its entry was taken afresh: so is the count.
                        self.left_out.remove(&key);
                    }
                    let left_out = self.left_out.entry(key).or_default();
                    *left_out += times.map_or(0, |x| x.charged - x.gpu);
                    let view = TenantView {
                        name: t.name.clone(),
                        tag: t.tag,
                        live: false,
                        runs: String::new(),
                        container: None,
                        pids: pids.clone(),
                        processes: 0,
                        memory_used_bytes: None,
                        memory_limit_bytes: None,
                        memory_guarantee_bytes: None,
                        memory_pending_bytes: None,
                        memory_burst_bytes: None,
                        memory_peak_bytes: None,
                        memory_refused: None,
                        share_percent: Some(t.share),
                        ceiling_percent: (t.max < 100).then_some(t.max),
                        class: Some(if t.latency { "latency" } else { "standard" }),
                        mode: Some(if t.heavy { "lease" } else { "free" }),
                        gpu_time_seconds: Some(secs(t.used_ns)),
                        gpu_seconds: Some(secs(t.used_ns.saturating_sub(*left_out))),
                        throttled_seconds: Some(secs(t.throttled_ns)),
                        gpu_percent: times.and_then(|x| pct(x.gpu)),
                        charged_percent: times.and_then(|x| pct(x.charged)),
                        unmeasured_percent: times.and_then(|x| pct(x.unmeasured)),
                        unverified_percent: times.and_then(|x| pct(x.unverified)),
                        throttled_percent: before
                            .and_then(|b| rate(t.throttled_ns, b.throttled_ns)),
                        waiting: t.waiting,
                        last_active_seconds_ago: Some(secs(r.at.saturating_sub(t.last_active))),
                        ended_seconds_ago: None,
                        demand_percent: Some(f64::from(t.demand_pm) / 10.0),
                    };
                    rows.insert(
                        (t.name.clone(), t.tag),
                        (view, g.file.into_iter().collect()),
                    );
                }
            }
            for m in &r.mems {
                let Some(d) = m.view.devices.iter().find(|d| d.uuid == uuid) else {
                    continue;
                };
                let key = (m.view.tenant.clone(), m.view.tag);
                let (row, files) = rows.entry(key).or_insert_with(|| {
                    (
                        TenantView {
                            name: m.view.tenant.clone(),
                            tag: m.view.tag,
                            live: false,
                            runs: String::new(),
                            container: None,
                            pids: vec![],
                            processes: 0,
                            memory_used_bytes: None,
                            memory_limit_bytes: None,
                            memory_guarantee_bytes: None,
                            memory_pending_bytes: None,
                            memory_burst_bytes: None,
                            memory_peak_bytes: None,
                            memory_refused: None,
                            share_percent: None,
                            ceiling_percent: None,
                            class: None,
                            mode: None,
                            gpu_time_seconds: None,
                            gpu_seconds: None,
                            throttled_seconds: None,
                            gpu_percent: None,
                            charged_percent: None,
                            unmeasured_percent: None,
                            unverified_percent: None,
                            throttled_percent: None,
                            waiting: 0,
                            last_active_seconds_ago: None,
                            ended_seconds_ago: None,
                            demand_percent: None,
                        },
                        vec![],
                    )
                });
                // A tenant name and slice shared by several memory
                // segments (quota files written by hand, or by an older
                // hook that wrote no slice): their usage and their quotas
                // add up.
                let add = |a: Option<u64>, b: u64| Some(a.unwrap_or(0).saturating_add(b));
                row.memory_used_bytes = add(row.memory_used_bytes, d.used_bytes);
                row.memory_peak_bytes = add(row.memory_peak_bytes, d.peak_bytes);
                row.memory_refused = add(row.memory_refused, d.refused);
                if let Some(l) = d.limit_bytes {
                    row.memory_limit_bytes = add(row.memory_limit_bytes, l);
                }
                if let Some(g) = d.guarantee_bytes {
                    row.memory_guarantee_bytes = add(row.memory_guarantee_bytes, g);
                }
                for p in m.view.processes.iter().filter(|p| p.alive) {
                    if !row.pids.contains(&p.pid) {
                        row.pids.push(p.pid);
                    }
                }
                if row.container.is_none() {
                    row.container = m.view.container.clone();
                }
                if row.runs.is_empty()
                    && row.container.is_none()
                    && let Some(o) = &m.origin
                {
                    row.runs = o.clone();
                }
                files.extend(m.file);
            }
            // What the GPU's memory pools say of each tenant: the part of
            // its guarantee still lent out, its burst (the tenant's own
            // entry, tenant-writable: shown, not judged).
            for (row, _) in rows.values_mut() {
                for (_, entries) in r.pools.iter().filter(|(u, _)| *u == uuid) {
                    if let Some(e) = entries
                        .iter()
                        .find(|e| clean(&e.name) == row.name && e.tag == row.tag)
                    {
                        row.memory_pending_bytes = Some(e.pending);
                        row.memory_burst_bytes = Some(e.burst);
                    }
                }
            }
            let mut tenants = vec![];
            for (_, (mut t, files)) in rows {
                t.pids.sort_unstable();
                t.processes = t.pids.len() as u32;
                t.live = !t.pids.is_empty();
                if let Some(c) = &t.container {
                    t.runs = describe(c);
                } else if t.runs.is_empty() {
                    t.runs = t
                        .pids
                        .iter()
                        .find_map(|p| host_cmdline(*p, &files))
                        .or_else(|| t.pids.first().map(|p| format!("pid {p}")))
                        .unwrap_or_else(|| "-".into());
                }
                let key = (uuid.clone(), t.name.clone(), t.tag);
                seen.insert(key.clone());
                if t.live {
                    self.ended.remove(&key);
                    self.last_runs.insert(key.clone(), t.runs.clone());
                } else {
                    if t.runs == "-"
                        && let Some(r) = self.last_runs.get(&key)
                    {
                        t.runs = r.clone();
                    }
                    // Seen live by this observer: it ended now. Otherwise
                    // its last sign of activity is the best guess (none
                    // for a tenant with only memory: long ago).
                    let last = seg
                        .and_then(|g| {
                            g.tenants
                                .iter()
                                .find(|(x, _)| x.name == t.name && x.tag == t.tag)
                        })
                        .map_or(0, |(x, _)| x.last_activity);
                    let since = *self.ended.entry(key.clone()).or_insert_with(|| {
                        if self.live_before.contains(&key) {
                            r.at
                        } else {
                            last
                        }
                    });
                    let ago = r.at.saturating_sub(since);
                    if ago > self.linger_ns {
                        continue;
                    }
                    t.ended_seconds_ago = Some(secs(ago));
                }
                tenants.push(t);
            }
            gpus.push(GpuView {
                uuid: uuid.clone(),
                index: info.map(|g| g.index),
                name: info.map(|g| g.name.clone()).filter(|n| !n.is_empty()),
                memory_used_bytes: info.and_then(|g| g.memory_used),
                memory_total_bytes: info.and_then(|g| g.memory_total),
                utilization_percent: info.and_then(|g| g.utilization),
                segment: seg.map(|g| clean(&g.path.display().to_string())),
                handovers: seg.map_or(0, |g| g.handovers),
                // Said where it matters: NVML is there (else `nvml_error`
                // says why not) and some charge could not be checked.
                process_time_error: seg
                    .filter(|_| r.nvml.is_ok())
                    .filter(|_| tenants.iter().any(|t| t.unverified_percent > Some(0.0)))
                    .map(|g| match &g.nvml {
                        Err(e) => e.clone(),
                        Ok(n) if n.window_ns == 0 => {
                            "NVML gave no new sample over the interval".into()
                        }
                        Ok(_) => "NVML lists no process found to be it (another PID \
                                  namespace, or two candidates)"
                            .into(),
                    }),
                health: r.health.as_ref().and_then(|h| h.gpu(&uuid)).cloned(),
                tenants,
            });
        }
        // Forget tenants that are gone from the segments.
        self.ended.retain(|k, _| seen.contains(k));
        self.left_out.retain(|k, _| seen.contains(k));
        self.last_runs.retain(|k, _| seen.contains(k));
        Snapshot {
            hostname: hostname(),
            interval_seconds: dt.map(secs),
            linger_seconds: secs(self.linger_ns),
            nvml_error: r.nvml.as_ref().err().cloned(),
            gpus,
            containers: r.mems.iter().map(|m| m.view.clone()).collect(),
            errors: r.errors.clone(),
            health: r.health.as_ref().map(|h| HealthSource {
                source: h.source.clone(),
                note: h.note.clone(),
            }),
            watch: watch_state::read(self.src.places.layout()).map(|state| {
                let now = watch_state::now_unix();
                WatchView {
                    up: state.up(now),
                    last_pass_seconds_ago: (now - state.last_pass_unix).max(0.0),
                    state: state.for_display(),
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment found in a run directory whose owner then swaps the
    /// segment's directory for a link to another slice's (a race an
    /// attacker's review won 20 times in 80): the reading goes through the
    /// directory that was checked, or fails; it never shows the other's.
    #[test]
    fn a_segment_is_read_through_the_directory_checked_not_one_swapped_in() {
        let t = std::env::temp_dir().join(format!("cuslice-status-pin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let make = |dir: &Path, limit: u64| {
            std::fs::create_dir_all(dir).expect("mkdir");
            let s = Segment::open_or_create(&dir.join(MEMORY_SEGMENT)).expect("segment");
            s.register_device(&[7; 16], limit).expect("device");
        };
        make(&t.join("run/segment"), 1 << 30);
        make(&t.join("victim/segment"), 7_777_777_777);
        let mem = MemFile::at(&t, PathBuf::from("run/segment").join(MEMORY_SEGMENT));
        assert!(mem.is_segment());
        // Read while pinned: the directory checked is the one read, even
        // with the swap made between the open of the directory and of the
        // file.
        let (dir, via) = mem.pinned().expect("pinned");
        std::fs::rename(t.join("run/segment"), t.join("run/old")).expect("move away");
        std::os::unix::fs::symlink(t.join("victim/segment"), t.join("run/segment")).expect("link");
        let s = Segment::open_read_only(&via).expect("through the pinned directory");
        assert_eq!(s.device_usage(0).map(|u| u.limit), Some(1 << 30));
        drop(dir);
        // After the swap, a new reading refuses the link.
        let e = read_mem(&mem).err().expect("a link on the way is refused");
        assert!(e.contains("symlink") || e.contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&t);
    }
}
