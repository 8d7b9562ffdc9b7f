//! `cuslice watch`: the host watchdog. Every interval it reads NVML's
//! per-process device memory and SM utilization for every GPU, maps each
//! host PID to its slice (a container made through the OCI hook, or a
//! `cuslice run` session: `slices`), compares with the slice's quota file
//! and share, audits the segments, and acts by the host's policy
//! (`config`): report, kill or freeze. What it finds is one log line when
//! it starts, when something is done about it and when it ends, a counter
//! in the exporter and a row in `cuslice status` (`state`).
//!
//! A pass reads NVML (three calls per GPU), `/proc/<pid>/stat` of each
//! process NVML lists (more of `/proc` only for a process not seen
//! before), one directory listing for the containers, and the segments of
//! the slices with processes on a GPU (kept mapped between passes). It
//! spawns nothing.

pub mod checks;
pub mod config;
pub mod gpuseg;
pub mod procfs;
pub mod slices;
pub mod state;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuslice_core::config::{Config, format_uuid, parse_uuid};
use cuslice_core::gpu::{DEMAND_WINDOW_NS, GpuSegment, MAX_PROCS, PROC_FREE, monotonic_ns};
use cuslice_core::segment::{READY_STATE, Segment, UNLIMITED};

use crate::host::text::{self, LINE_MAX};
use crate::nvml::{DeviceHandle, Nvml};
use checks::{ComputeSeen, Seen, size};
use config::{Policy, WatchConfig};
use procfs::{ProcSource, Procfs};
use slices::{SliceId, Slices};
use state::{Count, FindingView, Kind, WatchState};

/// `cuslice watch`'s flags (they override the file).
#[derive(clap::Args)]
pub struct WatchArgs {
    /// Seconds between passes, or a duration like 200ms (default: the
    /// file's `interval`, else 1s).
    #[arg(long)]
    pub interval: Option<String>,
    /// What to do about a finding (default: the file's `policy`, else
    /// report).
    #[arg(long, value_enum)]
    pub policy: Option<Policy>,
    /// The watch's configuration file.
    #[arg(long, default_value = config::DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The hook's host directory (default: the file's `root`, else
    /// /run/cuslice).
    #[arg(long)]
    pub root: Option<PathBuf>,
}

static STOP: AtomicBool = AtomicBool::new(false);

/// How long after a GPU's segment was last found tampered with the compute
/// check only reports on that GPU (see `check_compute`): the forged values'
/// effect and the catch-up after their repair (measured on the fake GPU:
/// a tenant forged above its share for a while is then held back while the
/// others catch up, for a few seconds).
const TAMPER_QUIET: Duration = Duration::from_secs(10);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// One line of the log. The values from tenants in it were escaped where
/// they entered the watch (slice labels, segment tenant names, findings);
/// the whole line is escaped again (idempotent) and bounded, for the paths
/// from a session's environment and whatever a later message adds: one
/// call, one line, whatever it holds.
fn log(line: &str) {
    eprintln!("cuslice watch: {}", text::clean_to(line, LINE_MAX));
}

/// The key of a finding: what, whose, which GPU, which process.
type Key = (Kind, String, Option<u32>, Option<u32>);

struct Active {
    view: FindingView,
    seen: u64,
}

/// A segment kept mapped between passes, with the file it maps.
struct Mapped<T> {
    seg: T,
    id: (u64, u64),
    used: u64,
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Opens `path` with `open`, or reuses the mapping of the same file.
fn mapped<'a, T>(
    cache: &'a mut HashMap<PathBuf, Mapped<T>>,
    path: &Path,
    pass: u64,
    open: impl Fn(&Path) -> Result<T, String>,
) -> Option<Result<&'a T, String>> {
    let id = file_id(path)?;
    if cache.get(path).is_none_or(|m| m.id != id) {
        match open(path) {
            Ok(seg) => {
                cache.insert(
                    path.to_path_buf(),
                    Mapped {
                        seg,
                        id,
                        used: pass,
                    },
                );
            }
            Err(e) => {
                cache.remove(path);
                return Some(Err(e));
            }
        }
    }
    let m = cache.get_mut(path)?;
    m.used = pass;
    Some(Ok(&m.seg))
}

/// Sends `sig` to process `pid` if it is still the one that started at
/// `start` (a pidfd, so that a PID reused meanwhile is never signalled).
fn signal(pid: u32, start: u64, sig: libc::c_int) -> Result<(), String> {
    // SAFETY: pidfd_open(pid, 0) has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(format!("pid {pid}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the syscall just returned this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if Procfs.stat(pid).map(|s| s.start) != Some(start) {
        return Err(format!("pid {pid}: gone"));
    }
    // SAFETY: pidfd_send_signal on our pidfd, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r != 0 {
        return Err(format!("pid {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The memory quota `cfg` gives GPU `index` / `uuid`, and whether that is
/// certain: a quota given by index is matched against NVML's index, which
/// need not be the CUDA index the container's processes used.
fn memory_quota(cfg: &Config, index: u32, uuid: &[u8; 16]) -> (Option<u64>, bool) {
    let certain = cfg.by_uuid.get(uuid).is_some_and(|l| l.memory.is_some())
        || cfg.by_index.values().all(|l| l.memory.is_none());
    (cfg.limits_for(index, uuid).memory, certain)
}

/// Whether `cfg`'s compute share and ceiling for GPU `uuid` are certain: a
/// share or ceiling given by index is matched against NVML's index, which
/// need not be the GPU the tenant's processes call that index.
fn compute_certain(cfg: &Config, uuid: &[u8; 16]) -> bool {
    cfg.by_uuid
        .get(uuid)
        .is_some_and(|l| l.compute.is_some() || l.compute_max.is_some())
        || cfg
            .by_index
            .values()
            .all(|l| l.compute.is_none() && l.compute_max.is_none())
}

fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage into a valid struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// At most this many passes between two listings of a GPU's processes
/// (in between, a listing is reused while the GPU's memory in use stays
/// the same to the byte).
const FULL_LIST_EVERY: u64 = 10;

/// Whether process `pid` is exiting (`PF_EXITING` in the flags of
/// `/proc/<pid>/stat`): it gave its registration back and the driver has
/// not torn its context down yet.
fn exiting(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.get(s.rfind(')')? + 2..)?;
            // After the name: state ppid pgrp session tty_nr tpgid flags.
            rest.split(' ').nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|f| f & PF_EXITING != 0)
}

/// A GPU's process listing and the memory in use when it was taken.
struct Listed {
    used: u64,
    pass: u64,
    procs: Vec<crate::nvml::GpuProcess>,
    /// Each listed process's start time when listed (None: gone already):
    /// a PID reused since is not the process the listing names.
    starts: Vec<Option<u64>>,
}

/// A slice frozen by `freeze`: its processes and when they are let go.
struct Frozen {
    pids: Vec<(u32, u64)>,
    until: Instant,
}

pub struct Watch {
    cfg: WatchConfig,
    nvml: Nvml,
    devices: Vec<DeviceHandle>,
    slices: Slices,
    pass: u64,
    active: BTreeMap<Key, Active>,
    counts: BTreeMap<(Kind, String), u64>,
    mem_segs: HashMap<PathBuf, Mapped<Segment>>,
    gpu_segs: HashMap<PathBuf, Mapped<GpuSegment>>,
    /// Per GPU index: the last utilization time stamp NVML gave (us).
    last_sample: HashMap<u32, u64>,
    /// Buffer sizes to start with, per GPU.
    caps: HashMap<u32, usize>,
    /// Per GPU index: the last process listing.
    listed: HashMap<u32, Listed>,
    /// (pid, start) -> the pass that first saw it unregistered.
    unregistered: HashMap<(u32, u64), u64>,
    /// (GPU uuid, tenant) -> (time ns, throttled ns) at the last pass.
    throttled: HashMap<(String, String), (u64, u64)>,
    /// (slice, GPU index) -> passes in a row over its share / ceiling.
    sustain: HashMap<(SliceId, u32), u32>,
    frozen: HashMap<(SliceId, u32), Frozen>,
    /// Per GPU index: when its GPU segment was last found tampered with.
    tampered: HashMap<u32, Instant>,
    /// (pid, start) -> its PID as it sees itself.
    inner: HashMap<(u32, u64), u32>,
    /// Processes (PID, start time) seen mapping their slice's segments.
    mapping: HashSet<(u32, u64)>,
    started: f64,
    last_pass: f64,
    last_cpu: f64,
    errors: Vec<String>,
    gpu_processes: u32,
    state_path: PathBuf,
}

/// Everything a pass needs about one slice's processes on one GPU.
struct Group {
    id: SliceId,
    procs: Vec<Seen>,
    sm: f64,
}

impl Watch {
    fn found(&mut self, key: Key, view: FindingView, action: Option<String>) {
        // Findings name tenants and hold paths and labels from them: escaped
        // once, here, for the log, the state file and `cuslice status`.
        let mut view = view.for_display();
        let action = action.map(|a| text::clean_to(&a, LINE_MAX));
        let pass = self.pass;
        match self.active.get_mut(&key) {
            Some(a) => {
                a.seen = pass;
                // New evidence under the same key (a quota raised again,
                // another way, before the finding ended) is said again:
                // a description that kept the first evidence would hide it.
                let changed = view.what != a.view.what;
                if changed {
                    a.view.what = view.what;
                }
                match action {
                    Some(act) if changed || act != a.view.action => {
                        log(&format!("{}: {act}", a.view.what));
                        a.view.action = act;
                    }
                    None if changed => log(&format!("{}: {}", a.view.what, a.view.action)),
                    _ => {}
                }
                a.view.figure = view.figure;
            }
            None => {
                let act = action.unwrap_or_else(|| "reported".into());
                log(&format!("{}: {act}", view.what));
                *self
                    .counts
                    .entry((view.kind, view.tenant.clone()))
                    .or_insert(0) += 1;
                view.action = act;
                view.since_unix = state::now_unix();
                self.active.insert(key, Active { view, seen: pass });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn view(
        kind: Kind,
        tenant: &str,
        slice: &str,
        gpu: Option<u32>,
        pid: Option<u32>,
        figure: String,
        limit: String,
        what: String,
    ) -> FindingView {
        FindingView {
            kind,
            tenant: tenant.to_string(),
            slice: slice.to_string(),
            gpu,
            pid,
            figure,
            limit,
            what,
            action: String::new(),
            since_unix: 0.0,
        }
    }

    fn kill_all(&self, pids: &[(u32, u64)], sig: libc::c_int) -> Vec<u32> {
        pids.iter()
            .filter(|(pid, start)| signal(*pid, *start, sig).is_ok())
            .map(|(pid, _)| *pid)
            .collect()
    }

    fn inner_pid(&mut self, pid: u32, start: u64) -> u32 {
        *self
            .inner
            .entry((pid, start))
            .or_insert_with(|| Procfs.inner_pid(pid).unwrap_or(pid))
    }

    /// One pass.
    pub fn pass(&mut self) {
        let t0 = Instant::now();
        self.pass += 1;
        let pass = self.pass;
        self.errors.clear();
        self.slices.refresh(&Procfs);
        for n in std::mem::take(&mut self.slices.notes) {
            log(&n);
        }
        self.thaw(false);

        // NVML: who is on which GPU, with how much memory and SM time.
        let mut per_gpu: Vec<(DeviceHandle, Option<u32>, Vec<Group>)> = vec![];
        let mut nvml_pids = HashSet::new();
        let devices = self.devices.clone();
        for d in devices {
            let cap = self.caps.get(&d.index).copied().unwrap_or(64);
            let last = self.last_sample.get(&d.index).copied().unwrap_or(0);
            let samples = match self.nvml.process_utilization(&d, last, cap) {
                Ok(s) => s,
                Err(e) => {
                    self.errors.push(e);
                    vec![]
                }
            };
            // Listing the processes is NVML's dearest call (about 20 ms of
            // CPU with 64 processes on an H100, measured): the last listing
            // is reused while it is provably current, and taken again when
            // the GPU's memory in use moved (a process started, ended,
            // allocated or freed), a listed process ended, a process the
            // listing lacks ran kernels, or `FULL_LIST_EVERY` passes went
            // by. What a reuse can miss until the next full listing: a
            // process that starts in the same interval in which listed
            // processes free (without ending) exactly what it takes, and
            // then neither allocates nor launches.
            let used = self.nvml.memory_used(&d);
            let current = match (self.listed.get(&d.index), used) {
                (Some(l), Some(u)) => {
                    l.used == u
                        && pass - l.pass < FULL_LIST_EVERY
                        && l.procs
                            .iter()
                            .zip(&l.starts)
                            .all(|(p, st)| Procfs.stat(p.pid).map(|x| x.start) == *st)
                        && samples
                            .iter()
                            .all(|s| l.procs.iter().any(|p| p.pid == s.pid))
                }
                _ => false,
            };
            let procs = if current {
                self.listed[&d.index].procs.clone()
            } else {
                match self.nvml.processes(&d, cap) {
                    Ok(p) => {
                        if let Some(u) = used {
                            self.listed.insert(
                                d.index,
                                Listed {
                                    used: u,
                                    pass,
                                    starts: p
                                        .iter()
                                        .map(|q| Procfs.stat(q.pid).map(|x| x.start))
                                        .collect(),
                                    procs: p.clone(),
                                },
                            );
                        }
                        p
                    }
                    Err(e) => {
                        self.listed.remove(&d.index);
                        self.errors.push(e);
                        continue;
                    }
                }
            };
            self.caps
                .insert(d.index, (procs.len().max(samples.len()) + 16).max(64));
            if let Some(m) = samples.iter().map(|s| s.time_us).max() {
                self.last_sample.insert(d.index, m.max(last));
            }
            // Per PID, the mean of its samples since the last pass.
            let mut sm: HashMap<u32, (u64, u64)> = HashMap::new();
            for s in &samples {
                let e = sm.entry(s.pid).or_default();
                e.0 += u64::from(s.sm.min(100));
                e.1 += 1;
            }
            let util = self.nvml.device_utilization(&d);
            let mut groups: BTreeMap<SliceId, Group> = BTreeMap::new();
            for p in procs {
                nvml_pids.insert(p.pid);
                let Some((start, Some(id))) = self.slices.slice_of(&Procfs, p.pid) else {
                    continue;
                };
                let g = groups.entry(id.clone()).or_insert_with(|| Group {
                    id,
                    procs: vec![],
                    sm: 0.0,
                });
                if let Some((sum, n)) = sm.get(&p.pid) {
                    g.sm += *sum as f64 / (*n).max(1) as f64;
                }
                g.procs.push(Seen {
                    pid: p.pid,
                    start,
                    used: p.used,
                });
            }
            per_gpu.push((d, util, groups.into_values().collect()));
        }
        self.gpu_processes = nvml_pids.len() as u32;
        if pass.is_multiple_of(16) {
            self.slices.prune(&nvml_pids);
            self.inner.retain(|(pid, _), _| nvml_pids.contains(pid));
            self.mapping.retain(|(pid, _)| nvml_pids.contains(pid));
            self.unregistered
                .retain(|(pid, _), _| nvml_pids.contains(pid));
        }

        for (d, _util, groups) in &per_gpu {
            for g in groups {
                // Registration first: a process the memory check kills is
                // exiting by the time it would be looked at, and is then
                // skipped as a normal exit would be; that it went around
                // the shim is worth its own finding.
                self.check_registered(d, g);
                self.check_memory(d, g);
            }
            self.check_compute(d, groups);
        }
        self.check_memory_segments();
        self.audit_gpu_segments();

        // Findings not seen in this pass have ended.
        let ended: Vec<Key> = self
            .active
            .iter()
            .filter(|(_, a)| a.seen != pass)
            .map(|(k, _)| k.clone())
            .collect();
        for k in ended {
            if let Some(a) = self.active.remove(&k) {
                log(&format!("{}: ended", a.view.what));
            }
        }
        self.mem_segs.retain(|_, m| m.used + 8 > pass);
        self.gpu_segs.retain(|_, m| m.used + 8 > pass);
        self.last_pass = state::now_unix();
        let _ = t0;
    }

    fn check_memory(&mut self, d: &DeviceHandle, g: &Group) {
        let Some(slice) = self.slices.get(&g.id) else {
            return;
        };
        let Some(cfg) = &slice.quota else { return };
        let Ok(uuid) = parse_uuid(&d.uuid) else {
            return;
        };
        let (Some(quota), certain) = memory_quota(cfg, d.index, &uuid) else {
            return;
        };
        let c = &self.cfg;
        let Some(over) =
            checks::memory_over(&g.procs, quota, c.memory_tolerance, c.process_allowance)
        else {
            return;
        };
        let pids: Vec<String> = g.procs.iter().map(|p| p.pid.to_string()).collect();
        let what = format!(
            "{} pid{} {}: GPU {} memory {} > quota {} (+{} tolerance, +{} per process)",
            slice.label,
            if pids.len() == 1 { "" } else { "s" },
            pids.join(","),
            d.index,
            size(over.used),
            size(quota),
            size(c.memory_tolerance),
            size(c.process_allowance)
        );
        let (tenant, label) = (slice.tenant.clone(), slice.label.clone());
        let action = match self.cfg.policy {
            // A quota given by index is matched against NVML's index, which
            // need not be the GPU the container's processes call that index:
            // reported, never acted on.
            Policy::Kill if !certain => {
                Some("not acted on: the quota file gives this quota by index".to_string())
            }
            Policy::Kill => {
                let killed = self.kill_all(&over.kill, libc::SIGKILL);
                Some(if killed.is_empty() {
                    "nothing left to kill".to_string()
                } else {
                    format!(
                        "killed pid {}",
                        killed
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
            }
            _ => None,
        };
        let v = Self::view(
            Kind::Memory,
            &tenant,
            &label,
            Some(d.index),
            None,
            size(over.used),
            size(quota),
            what,
        );
        self.found(
            (Kind::Memory, slice_key(&g.id), Some(d.index), None),
            v,
            action,
        );
    }

    /// The PIDs (as each process sees itself) registered with the shim for
    /// slice `id`: live slots of its memory segment, live process entries
    /// of its tenant in its GPU segments; and those segment files (device,
    /// inode), which a registered process maps.
    fn registered(&mut self, id: &SliceId) -> (HashSet<u32>, Vec<(u64, u64)>) {
        let mut out = HashSet::new();
        let mut files = vec![];
        let id_of = |fd: i32| {
            // SAFETY: a segment's descriptor, live while the segment is.
            let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            crate::inroot::fstat(b)
                .ok()
                .map(|st| (st.st_dev, st.st_ino))
        };
        let pass = self.pass;
        let Some(slice) = self.slices.get(id) else {
            return (out, files);
        };
        if let Some(p) = &slice.mem_seg
            && let Some(Ok(seg)) = mapped(&mut self.mem_segs, p, pass, |p| {
                Segment::open_read_only(p).map_err(|e| e.to_string())
            })
        {
            out.extend(
                seg.processes()
                    .into_iter()
                    .filter(|p| p.alive)
                    .map(|p| p.pid),
            );
            files.extend(id_of(seg.raw_fd()));
        }
        let tenant = slice.tenant.clone();
        let dir = slice.gpu_dir.clone();
        for d in &self.devices {
            let path = dir.join(format!("{}.seg", d.uuid));
            if let Some(Ok(g)) = mapped(&mut self.gpu_segs, &path, pass, |p| {
                GpuSegment::open_read_only(p).map_err(|e| e.to_string())
            }) {
                let Some(t) = g.tenants().into_iter().find(|t| t.name == tenant) else {
                    continue;
                };
                files.extend(id_of(g.raw_fd()));
                for i in 0..MAX_PROCS {
                    let Some(e) = g.proc_entry(i) else { break };
                    if e.state.load(Ordering::Acquire) != PROC_FREE
                        && e.tenant.load(Ordering::Relaxed) as usize == t.index
                        && g.proc_alive(i)
                    {
                        out.insert(e.pid.load(Ordering::Relaxed));
                    }
                }
            }
        }
        (out, files)
    }

    /// Whether host process `pid` maps one of `files` (cached once true:
    /// the shim keeps its segments mapped for its life).
    fn maps_segment(&mut self, pid: u32, start: u64, files: &[(u64, u64)]) -> bool {
        if self.mapping.contains(&(pid, start)) {
            return true;
        }
        let yes = procfs::maps_any(pid, files);
        if yes {
            self.mapping.insert((pid, start));
        }
        yes
    }

    fn check_registered(&mut self, d: &DeviceHandle, g: &Group) {
        let Some(slice) = self.slices.get(&g.id) else {
            return;
        };
        let Ok(uuid) = parse_uuid(&d.uuid) else {
            return;
        };
        // What the shim registers a process in: a slot of the memory
        // segment where the slice has a memory quota on any GPU, an entry
        // of this GPU's segment where it has a share or ceiling here. A
        // slice limited on other GPUs only gives a process that uses this
        // one nothing to register in.
        let Some(cfg) = slice.quota.as_ref() else {
            return;
        };
        if !cfg.has_memory() && cfg.tenant_spec(d.index, &uuid).is_none() {
            return;
        }
        let (tenant, label) = (slice.tenant.clone(), slice.label.clone());
        let (reg, files) = self.registered(&g.id);
        let pass = self.pass;
        for p in &g.procs {
            // Registered: its PID as it sees itself is in a live slot, and
            // it maps the slice's segments. The PID alone is not enough: a
            // process in a PID namespace of its own (`unshare -Urpf` needs
            // no privilege) sees itself as 1, or as whatever a registered
            // sibling of another namespace is.
            let inner = self.inner_pid(p.pid, p.start);
            let registered = reg.contains(&inner) && self.maps_segment(p.pid, p.start, &files);
            if registered || exiting(p.pid) {
                self.unregistered.remove(&(p.pid, p.start));
                continue;
            }
            // Reported at once, acted on only when seen in two passes in a
            // row: a process that exits normally gives its slot back before
            // the driver has torn its context down, and NVML lists it until
            // then (skipped above once the kernel marks it exiting).
            let first = *self.unregistered.entry((p.pid, p.start)).or_insert(pass);
            let what = format!(
                "{label} pid {}: uses GPU {} ({}) but never registered with the shim",
                p.pid,
                d.index,
                p.used.map_or_else(|| "memory unknown".to_string(), size)
            );
            let action = (self.cfg.policy == Policy::Kill && first < pass).then(|| {
                match signal(p.pid, p.start, libc::SIGKILL) {
                    Ok(()) => "killed".to_string(),
                    Err(e) => format!("not killed: {e}"),
                }
            });
            let v = Self::view(
                Kind::Unregistered,
                &tenant,
                &label,
                Some(d.index),
                Some(p.pid),
                p.used.map_or_else(|| "-".into(), size),
                "registered".into(),
                what,
            );
            self.found(
                (
                    Kind::Unregistered,
                    slice_key(&g.id),
                    Some(d.index),
                    Some(p.pid),
                ),
                v,
                action,
            );
        }
    }

    fn check_compute(&mut self, d: &DeviceHandle, groups: &[Group]) {
        let Ok(uuid) = parse_uuid(&d.uuid) else {
            return;
        };
        let now = monotonic_ns();
        let pass = self.pass;
        let mut seen = vec![];
        let mut ids = vec![];
        let mut uncertain = HashSet::new();
        for g in groups {
            let Some(slice) = self.slices.get(&g.id) else {
                continue;
            };
            let Some(cfg) = &slice.quota else { continue };
            let spec = cfg.tenant_spec(d.index, &uuid);
            if !compute_certain(cfg, &uuid) {
                uncertain.insert(g.id.clone());
            }
            // Time waited over the interval, and what it asked of the GPU
            // (its last demand window), from the GPU segment.
            let tenant = slice.tenant.clone();
            let path = slice.gpu_dir.join(format!("{}.seg", d.uuid));
            let view = mapped(&mut self.gpu_segs, &path, pass, |p| {
                GpuSegment::open_read_only(p).map_err(|e| e.to_string())
            })
            .and_then(Result::ok)
            .and_then(|s| s.tenants().into_iter().find(|t| t.name == tenant));
            let thr = view.as_ref().map(|t| t.throttled_ns);
            // Its demand counts only while it is current: a tenant rolls its
            // demand window at its own launches, so one that stopped (a
            // data-loading phase, an idle service, a frozen slice) keeps its
            // last figure in the segment, and its neighbours rightly took the
            // time it left.
            let frozen = self.frozen.contains_key(&(g.id.clone(), d.index));
            let demand = view
                .as_ref()
                .filter(|t| !frozen && now.saturating_sub(t.last_activity) <= 2 * DEMAND_WINDOW_NS)
                .map(|t| f64::from(t.demand_pm.min(1000)) / 10.0);
            let waited = thr.and_then(|now_thr| {
                let key = (d.uuid.clone(), tenant.clone());
                let before = self.throttled.insert(key, (now, now_thr));
                before
                    .filter(|(t, b)| now > *t && now_thr >= *b)
                    .map(|(t, b)| 100.0 * (now_thr - b) as f64 / (now - t) as f64)
            });
            seen.push(ComputeSeen {
                tenant,
                gpu_percent: g.sm,
                share: spec.map(|s| s.share),
                ceiling: spec.map(|s| s.max).filter(|m| *m < 100),
                waited_percent: waited,
                demand_percent: demand,
            });
            ids.push(g);
        }
        let over: HashMap<usize, String> =
            checks::compute_over(&seen, self.cfg.compute_margin, self.cfg.compute_wait)
                .into_iter()
                .collect();
        for (i, g) in ids.iter().enumerate() {
            let key = (g.id.clone(), d.index);
            if self.frozen.contains_key(&key) {
                // Still serving its time: the finding stands.
                if let Some(a) =
                    self.active
                        .get_mut(&(Kind::Compute, slice_key(&g.id), Some(d.index), None))
                {
                    a.seen = pass;
                }
                continue;
            }
            let Some(why) = over.get(&i) else {
                self.sustain.remove(&key);
                continue;
            };
            let n = self.sustain.entry(key.clone()).or_insert(0);
            *n += 1;
            if *n < self.cfg.compute_sustain {
                continue;
            }
            let Some(slice) = self.slices.get(&g.id) else {
                continue;
            };
            let (tenant, label) = (slice.tenant.clone(), slice.label.clone());
            let what = format!(
                "{label}: GPU {} {why}, {} passes in a row",
                d.index, self.cfg.compute_sustain
            );
            let pids: Vec<(u32, u64)> = g.procs.iter().map(|p| (p.pid, p.start)).collect();
            // Whoever can write the GPU segment (every tenant) can make a
            // well-behaved tenant take more than its share: by forging the
            // shares, and by the catch-up after they are restored. Shortly
            // after a tampered segment, the finding is reported only.
            let forged = self
                .tampered
                .get(&d.index)
                .is_some_and(|t| t.elapsed() < TAMPER_QUIET);
            let action = match self.cfg.policy {
                _ if uncertain.contains(&g.id) => Some(
                    "not acted on: the quota file gives this share or ceiling by index".to_string(),
                ),
                _ if forged => Some(format!(
                    "not acted on: GPU {}'s segment was tampered with within {}s (the split may be forged)",
                    d.index,
                    TAMPER_QUIET.as_secs()
                )),
                Policy::Report => None,
                Policy::Kill => {
                    let k = self.kill_all(&pids, libc::SIGKILL);
                    Some(format!(
                        "killed pid {}",
                        k.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                    ))
                }
                Policy::Freeze => {
                    let k = self.kill_all(&pids, libc::SIGSTOP);
                    self.frozen.insert(
                        key.clone(),
                        Frozen {
                            pids: pids.clone(),
                            until: Instant::now() + self.cfg.freeze,
                        },
                    );
                    Some(format!(
                        "froze pid {} for {}s",
                        k.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                        self.cfg.freeze.as_secs()
                    ))
                }
            };
            if !forged && self.cfg.policy != Policy::Report {
                // Acted on: it must last `compute_sustain` passes again.
                self.sustain.remove(&key);
            }
            let v = Self::view(
                Kind::Compute,
                &tenant,
                &label,
                Some(d.index),
                None,
                format!("{:.0}%", seen[i].gpu_percent),
                format!(
                    "share {}%{}",
                    seen[i].share.unwrap_or(100),
                    seen[i]
                        .ceiling
                        .map_or(String::new(), |c| format!(", ceiling {c}%"))
                ),
                what,
            );
            self.found(
                (Kind::Compute, slice_key(&g.id), Some(d.index), None),
                v,
                action,
            );
        }
    }

    /// Lets frozen slices go once their time is up (all of them: `all`).
    fn thaw(&mut self, all: bool) {
        let now = Instant::now();
        let due: Vec<(SliceId, u32)> = self
            .frozen
            .iter()
            .filter(|(_, f)| all || f.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(f) = self.frozen.remove(&k) {
                let woke = self.kill_all(&f.pids, libc::SIGCONT);
                let label = self
                    .slices
                    .get(&k.0)
                    .map_or_else(|| slice_key(&k.0), |s| s.label.clone());
                log(&format!(
                    "{label}: GPU {}: let pid {} go on",
                    k.1,
                    woke.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
        }
    }

    /// A memory segment whose per-GPU quota differs from the quota file's
    /// (a process of the container raised its own quota): reported, and
    /// restored from the file (with `repair`).
    fn check_memory_segments(&mut self) {
        let pass = self.pass;
        let slices: Vec<(SliceId, String, String, Config, PathBuf)> = self
            .slices
            .all()
            .filter_map(|s| {
                Some((
                    s.id.clone(),
                    s.tenant.clone(),
                    s.label.clone(),
                    s.quota.clone()?,
                    s.mem_seg.clone()?,
                ))
            })
            .collect();
        for (id, tenant, label, cfg, path) in slices {
            let Some(Ok(seg)) = mapped(&mut self.mem_segs, &path, pass, |p| {
                Segment::open_read_only(p).map_err(|e| e.to_string())
            }) else {
                continue;
            };
            // Every entry a process may be admitting against, whatever its
            // state word or UUID say: a tenant that raised its limit could
            // otherwise hide the raise by writing either (the shim keeps
            // using the entry it registered).
            let mut wrong = vec![];
            for r in seg.raw_devices() {
                let uuid = format_uuid(&r.uuid);
                let tampered = r.state != READY_STATE;
                let (gpu, q, certain) = match self.devices.iter().find(|d| d.uuid == uuid) {
                    Some(d) => {
                        let (q, certain) = memory_quota(&cfg, d.index, &r.uuid);
                        (Some(d.index), q, certain)
                    }
                    // A UUID no GPU of this host has (a byte flipped, or a
                    // device NVML does not list, such as a MIG instance):
                    // judged by what the file gives that UUID, when that
                    // does not depend on an index.
                    None => {
                        let certain = cfg.by_uuid.get(&r.uuid).is_some_and(|l| l.memory.is_some())
                            || cfg.by_index.values().all(|l| l.memory.is_none());
                        (None, cfg.limits_for(u32::MAX, &r.uuid).memory, certain)
                    }
                };
                let want = q.unwrap_or(UNLIMITED);
                if r.limit != want || (tampered && gpu.is_some()) {
                    wrong.push((r.index, gpu, r.limit, want, certain, tampered, r.uuid));
                }
            }
            for (i, gpu, have, want, certain, tampered, uuid) in wrong {
                // Sizes that differ but round alike are shown in bytes
                // (a raise of 1 MiB on 8 GiB reads "8.0 GiB" otherwise).
                let exact = size(have) == size(want);
                let shown = |l: u64| {
                    if l == UNLIMITED {
                        "none".to_string()
                    } else if exact {
                        format!("{l} bytes")
                    } else {
                        size(l)
                    }
                };
                let entry = match gpu {
                    Some(g) => format!("GPU {g}"),
                    None => format!("entry {i} ({}, no GPU of this host)", format_uuid(&uuid)),
                };
                let state = if tampered {
                    " in an entry whose state word was overwritten"
                } else {
                    ""
                };
                let what = format!(
                    "{label}: memory segment {} says {entry} quota {}{state}, its quota file {}",
                    path.display(),
                    shown(have),
                    shown(want)
                );
                let action = if !self.cfg.repair {
                    None
                } else if !certain {
                    Some("not restored (the quota file gives it by index)".to_string())
                } else {
                    // Only a file the slice's own user could write (a
                    // session's file must be what `cuslice run` wrote).
                    let target = self.slices.get(&id).map_or_else(
                        || Err("the slice is gone".to_string()),
                        slices::Slice::open_mem_seg_for_repair,
                    );
                    Some(
                        match target.and_then(|t| {
                            restore_limit(t.path(), i, gpu.is_some().then_some(&uuid), want)
                        }) {
                            Ok(()) => "restored".to_string(),
                            Err(e) => format!("not restored: {e}"),
                        },
                    )
                };
                let v = Self::view(
                    Kind::MemorySegment,
                    &tenant,
                    &label,
                    gpu,
                    None,
                    shown(have),
                    shown(want),
                    what,
                );
                self.found(
                    (
                        Kind::MemorySegment,
                        slice_key(&id),
                        gpu.or(Some(1000 + i as u32)),
                        None,
                    ),
                    v,
                    action,
                );
            }
        }
    }

    /// The per-GPU segments: audited (and repaired) against the tenants the
    /// quota files name.
    fn audit_gpu_segments(&mut self) {
        let mut dirs: Vec<PathBuf> = vec![self.cfg.root.join("gpu")];
        for s in self.slices.all() {
            if !dirs.contains(&s.gpu_dir) {
                dirs.push(s.gpu_dir.clone());
            }
        }
        let now = monotonic_ns();
        let devices = self.devices.clone();
        for dir in dirs {
            for d in &devices {
                let path = dir.join(format!("{}.seg", d.uuid));
                if !path.exists() {
                    continue;
                }
                let Ok(uuid) = parse_uuid(&d.uuid) else {
                    continue;
                };
                let expected: Vec<gpuseg::Expected> = self
                    .slices
                    .all()
                    .filter(|s| s.gpu_dir == dir)
                    .filter_map(|s| {
                        // A share given by index may be another GPU's: such
                        // a tenant is not judged (nor "repaired") here.
                        let q = s.quota.as_ref().filter(|q| compute_certain(q, &uuid))?;
                        Some(gpuseg::Expected {
                            name: s.tenant.clone(),
                            spec: q.tenant_spec(d.index, &uuid)?,
                        })
                    })
                    .collect();
                let pass = self.pass;
                let a = match mapped(&mut self.gpu_segs, &path, pass, |p| {
                    GpuSegment::open_read_only(p).map_err(|e| e.to_string())
                }) {
                    Some(Ok(seg)) => gpuseg::audit(seg, &path, &expected, now, self.cfg.repair),
                    Some(Err(e)) => {
                        self.errors.push(e);
                        continue;
                    }
                    None => continue,
                };
                if let Some(e) = a.error {
                    self.errors.push(format!("{}: {e}", path.display()));
                }
                let label = format!("GPU segment {}", path.display());
                let action = a.repaired.then(|| "restored".to_string());
                if !a.findings.is_empty() {
                    self.tampered.insert(d.index, Instant::now());
                }
                for (tenant, what) in a.findings {
                    let v = Self::view(
                        Kind::GpuSegment,
                        &tenant,
                        &label,
                        Some(d.index),
                        None,
                        what.clone(),
                        "-".into(),
                        format!("{label}: {what}"),
                    );
                    // One finding per tenant entry (or the scheduler
                    // words) and kind of value: it starts, is restored,
                    // and ends when the segment is found right again.
                    let kind = what.rsplit_once(" (").map_or("", |(_, k)| k).to_string();
                    self.found(
                        (
                            Kind::GpuSegment,
                            format!("{}:{tenant}:{kind}", path.display()),
                            Some(d.index),
                            None,
                        ),
                        v,
                        action.clone(),
                    );
                }
            }
        }
    }

    fn state(&self, running: bool) -> WatchState {
        WatchState {
            pid: std::process::id(),
            running,
            policy: self.cfg.policy.name().into(),
            repair: self.cfg.repair,
            interval_seconds: self.cfg.interval.as_secs_f64(),
            started_unix: self.started,
            last_pass_unix: self.last_pass,
            passes: self.pass,
            cpu_seconds: cpu_seconds(),
            last_pass_cpu_seconds: self.last_cpu,
            slices: self.slices.all().count() as u32,
            gpu_processes: self.gpu_processes,
            findings: self.active.values().map(|a| a.view.clone()).collect(),
            counts: self
                .counts
                .iter()
                .map(|((kind, tenant), n)| Count {
                    kind: *kind,
                    tenant: tenant.clone(),
                    count: *n,
                })
                .collect(),
            errors: self.errors.clone(),
        }
    }
}

/// Writes GPU entry `dev`'s quota of the memory segment at `path` (a
/// plain store: admissions read the limit under the entry's lock, so the
/// next one sees it).
/// Puts entry `dev` of the memory segment at `path` back: its limit, and
/// with `uuid` (a GPU of this host) its READY state too.
fn restore_limit(
    path: &Path,
    dev: usize,
    uuid: Option<&[u8; 16]>,
    limit: u64,
) -> Result<(), String> {
    let seg = Segment::open_existing(path).map_err(|e| e.to_string())?;
    if seg.restore_device(dev, uuid, limit) {
        Ok(())
    } else {
        Err("no such device entry".into())
    }
}

fn slice_key(id: &SliceId) -> String {
    match id {
        SliceId::Container(c) => format!("container:{c}"),
        SliceId::Run { pid, start } => format!("run:{pid}:{start}"),
    }
}

/// Takes the host's watch lock, `<root>/watch/lock`, for the life of the
/// process; the error names the PID that holds it.
fn lock(root: &Path) -> Result<std::fs::File, String> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = root.join("watch");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let holder = s.trim();
        return Err(format!(
            "another cuslice watch{} holds {}: one runs per host",
            if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            },
            path.display()
        ));
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}

/// `cuslice watch`: runs until SIGTERM / SIGINT.
pub fn run(a: WatchArgs) -> Result<(), String> {
    let explicit = a.config.as_os_str() != config::DEFAULT_CONFIG;
    let mut cfg = config::load(&a.config, explicit)?;
    if let Some(i) = &a.interval {
        cfg.interval = config::parse_duration(i).map_err(|e| format!("--interval: {e}"))?;
    }
    if let Some(p) = a.policy {
        cfg.policy = p;
    }
    if let Some(r) = a.root {
        cfg.root = r;
    }
    let nvml = Nvml::open().map_err(|e| {
        format!(
            "watch: cannot load NVML ({e}): it needs the NVIDIA driver's libnvidia-ml.so.1; set CUSLICE_REAL_NVML to its path"
        )
    })?;
    nvml.check_per_process().map_err(|e| {
        format!("watch: this NVML cannot list processes ({e}); set CUSLICE_REAL_NVML to a newer libnvidia-ml.so.1")
    })?;
    let devices = nvml.devices().map_err(|e| format!("watch: {e}"))?;
    let _lock = lock(&cfg.root).map_err(|e| format!("watch: {e}"))?;
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe { libc::signal(sig, on_stop as *const () as libc::sighandler_t) };
    }
    log(&format!(
        "pid {}, {} GPU{}, {}",
        std::process::id(),
        devices.len(),
        if devices.len() == 1 { "" } else { "s" },
        cfg.describe()
    ));
    let state_path = state::state_path(&cfg.root);
    let mut w = Watch {
        slices: Slices::new(&cfg.root, procfs::ns_inode("/proc/self/ns/pid")),
        cfg,
        nvml,
        devices,
        pass: 0,
        active: BTreeMap::new(),
        counts: BTreeMap::new(),
        mem_segs: HashMap::new(),
        gpu_segs: HashMap::new(),
        last_sample: HashMap::new(),
        caps: HashMap::new(),
        listed: HashMap::new(),
        unregistered: HashMap::new(),
        throttled: HashMap::new(),
        sustain: HashMap::new(),
        frozen: HashMap::new(),
        tampered: HashMap::new(),
        inner: HashMap::new(),
        mapping: HashSet::new(),
        started: state::now_unix(),
        last_pass: 0.0,
        last_cpu: 0.0,
        errors: vec![],
        gpu_processes: 0,
        state_path,
    };
    let mut next = Instant::now();
    let mut said: Option<String> = None;
    let notify = Notify::from_env();
    let mut ready = false;
    while !STOP.load(Ordering::Relaxed) {
        let c0 = cpu_seconds();
        w.pass();
        w.last_cpu = cpu_seconds() - c0;
        // systemd: ready after the first pass, then one keep-alive per
        // pass, so that a watch stuck in a pass (a hung NVML call, a
        // blocked read) is restarted (`WatchdogSec=` in the unit).
        if let Some(n) = &notify {
            n.send(if ready {
                "WATCHDOG=1"
            } else {
                "READY=1\nWATCHDOG=1"
            });
            ready = true;
        }
        let e = w.errors.join("; ");
        if !e.is_empty() && said.as_deref() != Some(e.as_str()) {
            log(&e);
        }
        said = Some(e);
        if let Err(e) = state::write(&w.state_path, &w.state(true)) {
            log(&e);
        }
        next += w.cfg.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while !STOP.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
        }
    }
    if let Some(n) = &notify {
        n.send("STOPPING=1");
    }
    w.thaw(true);
    let _ = state::write(&w.state_path, &w.state(false));
    log("stopped");
    Ok(())
}

/// systemd's notification socket (`NOTIFY_SOCKET`: a path, or `@name` for
/// an abstract socket), where the unit is `Type=notify`.
struct Notify {
    sock: std::os::unix::net::UnixDatagram,
    addr: std::os::unix::net::SocketAddr,
}

impl Notify {
    fn from_env() -> Option<Notify> {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let v = std::env::var_os("NOTIFY_SOCKET")?;
        let b = std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str());
        let addr = match b.first() {
            Some(b'@') => SocketAddr::from_abstract_name(&b[1..]),
            Some(b'/') => SocketAddr::from_pathname(Path::new(&v)),
            _ => {
                log(&format!(
                    "NOTIFY_SOCKET={}: not a path or @name; systemd is not told",
                    v.to_string_lossy()
                ));
                return None;
            }
        };
        let sock = UnixDatagram::unbound();
        match (addr, sock) {
            (Ok(addr), Ok(sock)) => Some(Notify { sock, addr }),
            (Err(e), _) | (_, Err(e)) => {
                log(&format!(
                    "NOTIFY_SOCKET={}: {e}; systemd is not told",
                    v.to_string_lossy()
                ));
                None
            }
        }
    }

    /// Best effort: a lost datagram costs at most one keep-alive.
    fn send(&self, msg: &str) {
        let _ = self.sock.send_to_addr(msg.as_bytes(), &self.addr);
    }
}
