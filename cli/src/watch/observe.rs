//! The only part of a pass that reads the host: NVML (who is on which GPU,
//! with how much memory and SM time), `/proc` (whose each process is, and
//! what tells whether it registered with the shim) and the segments
//! (slots, tenant entries, memory quotas, each slice's own burst in the
//! GPUs' memory pools, the GPU segments' audit), into a
//! [`Snapshot`]. Nothing here judges or acts.
//!
//! A pass reads NVML (three calls per GPU, and its memory once; the
//! process listing, NVML's dearest call, only when it may have changed), `/proc/<pid>/stat` of each
//! process NVML lists (more of `/proc` only for a process not seen before,
//! or where the verdict depends on it), one directory listing for the
//! containers, and the segments of the slices (kept mapped between
//! passes). It spawns nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use cuslice_core::config::parse_uuid;
use cuslice_core::gpu::{GpuSegment, MAX_PROCS, PROC_FREE, monotonic_ns};
use cuslice_core::pool::Pool;
use cuslice_core::segment::Segment;

use super::gpuseg;
use super::procfs::{self, ProcSource, Procfs};
use super::slices::{Owner, SliceId, Slices};
use super::snapshot::{
    Device, GpuSegReading, GpuSnap, PoolReading, ProcSnap, Registration, SliceSnap, SlotReading,
    Snapshot, TenantReading,
};
use super::tenant;
use crate::host::layout::Layout;
use crate::host::nvml::{DeviceHandle, GpuProcess, Nvml, sample_period_us, sample_window_us};

/// At most this many passes between two listings of a GPU's processes
/// (in between, a listing is reused while the GPU's memory in use stays
/// the same to the byte).
const FULL_LIST_EVERY: u64 = 10;

/// A segment kept mapped between passes, with the file it maps.
struct Mapped<T> {
    seg: T,
    id: (u64, u64),
    used: u64,
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// A segment whose file can be truncated under its mapping.
trait Voidable {
    fn truncated(&self) -> bool;
}

impl Voidable for Segment {
    fn truncated(&self) -> bool {
        Segment::truncated(self)
    }
}

impl Voidable for GpuSegment {
    fn truncated(&self) -> bool {
        GpuSegment::truncated(self)
    }
}

impl Voidable for Pool {
    fn truncated(&self) -> bool {
        Pool::truncated(self)
    }
}

/// Opens `path` with `open`, or reuses the mapping of the same file
/// (never one whose file was truncated under it: that one reads zeros).
fn mapped<'a, T: Voidable>(
    cache: &'a mut HashMap<PathBuf, Mapped<T>>,
    path: &Path,
    pass: u64,
    open: impl Fn(&Path) -> Result<T, String>,
) -> Option<Result<&'a T, String>> {
    let id = file_id(path)?;
    if cache
        .get(path)
        .is_none_or(|m| m.id != id || m.seg.truncated())
    {
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

fn open_mem(p: &Path) -> Result<Segment, String> {
    Segment::open_read_only(p).map_err(|e| e.to_string())
}

fn open_pool(p: &Path) -> Result<Pool, String> {
    Pool::open_read_only(p).map_err(|e| e.to_string())
}

fn open_gpu(p: &Path) -> Result<GpuSegment, String> {
    GpuSegment::open_read_only(p).map_err(|e| e.to_string())
}

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
    procs: Vec<GpuProcess>,
    /// Each listed process's start time when listed (None: gone already):
    /// a PID reused since is not the process the listing names.
    starts: Vec<Option<u64>>,
}

/// What the watch reads, and what it keeps between passes to read less.
pub struct Observer {
    nvml: Nvml,
    devices: Vec<DeviceHandle>,
    root: PathBuf,
    pub slices: Slices,
    mem_segs: HashMap<PathBuf, Mapped<Segment>>,
    gpu_segs: HashMap<PathBuf, Mapped<GpuSegment>>,
    pools: HashMap<PathBuf, Mapped<Pool>>,
    /// Per GPU index: the last utilization time stamp NVML gave (us).
    last_sample: HashMap<u32, u64>,
    /// Per GPU index: NVML's sampling period as seen so far (µs).
    sample_period: HashMap<u32, u64>,
    /// Buffer sizes to start with, per GPU.
    caps: HashMap<u32, usize>,
    /// Per GPU index: the last process listing.
    listed: HashMap<u32, Listed>,
    /// Per GPU index: its memory as NVML gave it (it does not change).
    totals: HashMap<u32, u64>,
    /// (pid, start) -> its PID as it sees itself.
    inner: HashMap<(u32, u64), u32>,
    /// Processes (PID, start time) seen mapping their slice's segments.
    mapping: HashSet<(u32, u64)>,
}

impl Observer {
    pub fn new(nvml: Nvml, devices: Vec<DeviceHandle>, root: &Path) -> Observer {
        Observer {
            nvml,
            devices,
            root: root.to_path_buf(),
            slices: Slices::new(root, procfs::ns_inode("/proc/self/ns/pid")),
            mem_segs: HashMap::new(),
            gpu_segs: HashMap::new(),
            pools: HashMap::new(),
            last_sample: HashMap::new(),
            sample_period: HashMap::new(),
            caps: HashMap::new(),
            listed: HashMap::new(),
            totals: HashMap::new(),
            inner: HashMap::new(),
            mapping: HashSet::new(),
        }
    }

    /// Finds the slices that came and went; returns what is to be logged
    /// about them (and about processes mapped since the last call).
    pub fn refresh(&mut self) -> Vec<String> {
        self.slices.refresh(&Procfs);
        std::mem::take(&mut self.slices.notes)
    }

    /// Pass `pass`'s snapshot.
    pub fn observe(&mut self, pass: u64) -> Snapshot {
        let mut snap = Snapshot {
            pass,
            devices: self
                .devices
                .iter()
                .map(|d| Device {
                    index: d.index,
                    uuid: d.uuid.clone(),
                })
                .collect(),
            ..Snapshot::default()
        };
        let devices = self.devices.clone();
        for d in &devices {
            if let Some(g) = self.list_gpu(d, pass, &mut snap) {
                snap.gpus.push(g);
            }
        }
        if pass.is_multiple_of(16) {
            let listed = &snap.nvml_pids;
            self.slices.prune(&listed.iter().copied().collect());
            self.inner.retain(|(pid, _), _| listed.contains(pid));
            self.mapping.retain(|(pid, _)| listed.contains(pid));
        }
        snap.now_ns = monotonic_ns();
        snap.now_unix = crate::host::resize::now_unix();
        self.read_slices(&mut snap);
        self.read_registrations(&mut snap);
        self.audit_gpu_segments(&mut snap);
        self.mem_segs.retain(|_, m| m.used + 8 > pass);
        self.gpu_segs.retain(|_, m| m.used + 8 > pass);
        self.pools.retain(|_, m| m.used + 8 > pass);
        snap
    }

    /// GPU `d`'s processes, with their memory, SM time and owner; None
    /// where NVML could not list them (the error is in `snap.errors`).
    fn list_gpu(&mut self, d: &DeviceHandle, pass: u64, snap: &mut Snapshot) -> Option<GpuSnap> {
        let cap = self.caps.get(&d.index).copied().unwrap_or(64);
        let last = self.last_sample.get(&d.index).copied().unwrap_or(0);
        let samples = match self.nvml.process_utilization(d, last, cap) {
            Ok(s) => s,
            Err(e) => {
                snap.errors.push(e);
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
        let used = self.nvml.memory_used(d);
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
            match self.nvml.processes(d, cap) {
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
                    snap.errors.push(e);
                    return None;
                }
            }
        };
        self.caps
            .insert(d.index, (procs.len().max(samples.len()) + 16).max(64));
        // SM time over the window: the samples times the period (see
        // `sample_period_us`).
        let period = sample_period_us(&samples, self.sample_period.get(&d.index).copied());
        self.sample_period.insert(d.index, period);
        // The window: from the last sampling instant of the previous pass
        // to this pass's last one (a first pass, or one after samples were
        // lost: the samples' own span).
        let (window, newest) = match sample_window_us(&samples, last, period) {
            Some((a, b)) => (b - a, Some(b)),
            None => (0, None),
        };
        if let Some(m) = newest {
            self.last_sample.insert(d.index, m.max(last));
        }
        // Per PID: the sum of its samples and how many.
        let mut sm: HashMap<u32, (u64, u64)> = HashMap::new();
        for s in &samples {
            let e = sm.entry(s.pid).or_default();
            e.0 += u64::from(s.sm.min(100));
            e.1 += 1;
        }
        let mean = |(sum, n): (u64, u64)| -> f64 {
            // Never below the plain mean's denominator: a window a little
            // short of its samples' periods (timestamps jitter) does not
            // inflate the figure.
            let span = window.max(n.max(1) * period);
            (sum * period) as f64 / span as f64
        };
        // Its memory: asked once (a GPU's memory does not change), and
        // again after a failure.
        let memory_total = match self.totals.get(&d.index) {
            Some(t) => Some(*t),
            None => match self.nvml.memory_total(d) {
                Ok(t) => {
                    self.totals.insert(d.index, t);
                    Some(t)
                }
                Err(e) => {
                    snap.errors.push(e);
                    None
                }
            },
        };
        let mut out = GpuSnap {
            index: d.index,
            uuid: d.uuid.clone(),
            uuid_bytes: parse_uuid(&d.uuid).ok(),
            memory_total,
            procs: vec![],
        };
        for p in procs {
            snap.nvml_pids.insert(p.pid);
            let Some((start, owner)) = self.slices.owner_of(&Procfs, p.pid) else {
                continue;
            };
            out.procs.push(ProcSnap {
                pid: p.pid,
                start,
                used: p.used,
                sm: sm.get(&p.pid).map(|&x| mean(x)),
                owner,
                registration: None,
            });
        }
        Some(out)
    }

    /// Every slice: its quota file, its memory segment's entries; for one
    /// with processes on a GPU, the slots that name its processes and its
    /// tenant's entry in the GPU segments it uses.
    fn read_slices(&mut self, snap: &mut Snapshot) {
        let pass = snap.pass;
        let mut on_gpu: BTreeMap<SliceId, Vec<(u32, String)>> = BTreeMap::new();
        for g in &snap.gpus {
            for p in &g.procs {
                if let Some(id) = p.owner.slice() {
                    let v = on_gpu.entry(id.clone()).or_default();
                    if !v.iter().any(|(i, _)| *i == g.index) {
                        v.push((g.index, g.uuid.clone()));
                    }
                }
            }
        }
        for s in self.slices.all() {
            let mut out = SliceSnap {
                tenant: s.tenant.clone(),
                label: s.label.clone(),
                quota: s.quota.clone(),
                resize: s.resize.clone(),
                mem_seg: s.mem_seg.clone(),
                ..SliceSnap::default()
            };
            let mem = s
                .mem_seg
                .as_deref()
                .and_then(|p| mapped(&mut self.mem_segs, p, pass, open_mem))
                .and_then(Result::ok);
            if s.quota.is_some() {
                out.mem_entries = mem.map(Segment::raw_devices);
            }
            // Its own entry in the memory pool of each GPU NVML listed (a
            // slice with processes there or not: a guarantee registered
            // ahead of its first process holds too): the burst it
            // publishes. Only its own claim is read; the others' entries
            // and the pool's capacity are tenant-writable and decide
            // nothing (`judge::memory`).
            if s.quota.as_ref().is_some_and(|q| q.has_memory()) {
                for g in &snap.gpus {
                    let Some(u) = g.uuid_bytes else { continue };
                    let path = cuslice_core::pool::path(&s.gpu_dir, &u);
                    if let Some(Ok(p)) = mapped(&mut self.pools, &path, pass, open_pool)
                        && let Some(e) = p
                            .entries()
                            .into_iter()
                            .find(|e| e.name == s.tenant && e.tag == s.tag)
                    {
                        out.pool.insert(g.index, PoolReading { burst: e.burst });
                    }
                }
            }
            if let Some(gpus) = on_gpu.get(&s.id) {
                if let Some(seg) = mem {
                    out.slots
                        .extend(seg.processes().into_iter().map(|p| SlotReading {
                            pid: p.pid,
                            alive: p.alive,
                        }));
                }
                for d in &self.devices {
                    let path = s.gpu_dir.join(format!("{}.seg", d.uuid));
                    let Some(Ok(g)) = mapped(&mut self.gpu_segs, &path, pass, open_gpu) else {
                        continue;
                    };
                    let Some(t) = g
                        .tenants()
                        .into_iter()
                        .find(|t| t.name == s.tenant && t.tag == s.tag)
                    else {
                        continue;
                    };
                    for i in 0..MAX_PROCS {
                        let Some(e) = g.proc_entry(i) else { break };
                        if e.state.load(Ordering::Acquire) != PROC_FREE
                            && e.tenant.load(Ordering::Relaxed) as usize == t.index
                        {
                            out.slots.push(SlotReading {
                                pid: e.pid.load(Ordering::Relaxed),
                                alive: g.proc_alive(i),
                            });
                        }
                    }
                    if s.quota.is_some() && gpus.iter().any(|(i, _)| *i == d.index) {
                        out.gpu_tenant.insert(
                            d.index,
                            TenantReading {
                                throttled_ns: t.throttled_ns,
                                demand_pm: t.demand_pm,
                                last_activity: t.last_activity,
                            },
                        );
                    }
                }
            }
            snap.slices.insert(s.id.clone(), out);
        }
    }

    /// The segment files (device, inode) a registered process of slice
    /// `id` maps: its memory segment and the GPU segments that hold its
    /// tenant's entry (its name and slice tag).
    fn segment_files(&mut self, id: &SliceId, pass: u64) -> Vec<(u64, u64)> {
        let id_of = |fd: i32| {
            // SAFETY: a segment's descriptor, live while the segment is.
            let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            crate::host::sys::fstat(b)
                .ok()
                .map(|st| (st.st_dev, st.st_ino))
        };
        let mut files = vec![];
        let Some(s) = self.slices.get(id) else {
            return files;
        };
        if let Some(p) = &s.mem_seg
            && let Some(Ok(seg)) = mapped(&mut self.mem_segs, p, pass, open_mem)
        {
            files.extend(id_of(seg.raw_fd()));
        }
        let (tenant, tag, dir) = (s.tenant.clone(), s.tag, s.gpu_dir.clone());
        for d in &self.devices {
            let path = dir.join(format!("{}.seg", d.uuid));
            if let Some(Ok(g)) = mapped(&mut self.gpu_segs, &path, pass, open_gpu)
                && g.tenants().iter().any(|t| t.name == tenant && t.tag == tag)
            {
                files.extend(id_of(g.raw_fd()));
            }
        }
        files
    }

    /// For each process the shim would have registered
    /// (`tenant::registers`): its PID as it sees itself, then what can
    /// still change the verdict (see [`Registration`]), read after the
    /// slots.
    fn read_registrations(&mut self, snap: &mut Snapshot) {
        let pass = snap.pass;
        let mut files: HashMap<SliceId, Vec<(u64, u64)>> = HashMap::new();
        for g in &mut snap.gpus {
            let Some(uuid) = g.uuid_bytes else { continue };
            for p in &mut g.procs {
                let Owner::Slice(id) = &p.owner else { continue };
                let Some(slice) = snap.slices.get(id) else {
                    continue;
                };
                let Some(cfg) = &slice.quota else { continue };
                if !tenant::registers(cfg, g.index, &uuid) {
                    continue;
                }
                let reg = tenant::registered_pids(&slice.slots);
                let inner = *self
                    .inner
                    .entry((p.pid, p.start))
                    .or_insert_with(|| Procfs.inner_pid(p.pid).unwrap_or(p.pid));
                let mut r = Registration {
                    inner_pid: inner,
                    maps_segment: None,
                    exiting: None,
                };
                if reg.contains(&inner) {
                    // Cached once true: the shim keeps its segments mapped
                    // for its life.
                    let maps = self.mapping.contains(&(p.pid, p.start)) || {
                        let f = match files.get(id) {
                            Some(f) => f.clone(),
                            None => {
                                let f = self.segment_files(id, pass);
                                files.insert(id.clone(), f.clone());
                                f
                            }
                        };
                        procfs::maps_any(p.pid, &f)
                    };
                    if maps {
                        self.mapping.insert((p.pid, p.start));
                    }
                    r.maps_segment = Some(maps);
                }
                if !tenant::is_registered(&reg, &r) {
                    r.exiting = Some(exiting(p.pid));
                }
                p.registration = Some(r);
            }
        }
    }

    /// The GPU segments (the hook's directory's, then each session's, per
    /// GPU), audited read-only against the tenants the quota files name.
    fn audit_gpu_segments(&mut self, snap: &mut Snapshot) {
        let mut dirs: Vec<PathBuf> = vec![Layout::new(&self.root).gpu_dir()];
        for s in self.slices.all() {
            if !dirs.contains(&s.gpu_dir) {
                dirs.push(s.gpu_dir.clone());
            }
        }
        let now = monotonic_ns();
        for dir in dirs {
            for d in &self.devices {
                let path = dir.join(format!("{}.seg", d.uuid));
                if !path.exists() {
                    continue;
                }
                let Ok(uuid) = parse_uuid(&d.uuid) else {
                    continue;
                };
                let expected = tenant::expected_tenants(
                    self.slices.all().filter(|s| s.gpu_dir == dir),
                    d.index,
                    &uuid,
                );
                let found = match mapped(&mut self.gpu_segs, &path, snap.pass, open_gpu) {
                    Some(Ok(seg)) => {
                        let found = gpuseg::audit(seg, &expected, now);
                        if seg.truncated() {
                            // What it read past the file's new end was
                            // zeros: no findings from it, and no repair.
                            Err(format!(
                                "{}: the file was truncated while it was read",
                                path.display()
                            ))
                        } else {
                            Ok(found)
                        }
                    }
                    Some(Err(e)) => Err(e),
                    None => continue,
                };
                snap.gpu_segments.push(GpuSegReading {
                    path,
                    gpu: d.index,
                    expected,
                    at_ns: now,
                    found,
                });
            }
        }
    }
}
