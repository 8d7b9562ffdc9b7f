//! The only part of a pass that reads the host: NVML (who is on which GPU,
//! with how much memory and SM time), `/proc` (whose each process is, and
//! what tells whether it registered with the shim) and the segments
//! (slots, tenant entries, memory quotas, each slice's own burst in the
//! GPUs' memory pools, the GPU segments' audit), into a
//! [`Snapshot`]. Nothing here judges or acts. NVML, the segments and the
//! process state are read through `crate::readings` (which `status`,
//! `top` and the exporter read through too), the slices through
//! `slices` and `procfs`.
//!
//! A pass reads NVML (three calls per GPU, and its memory once; the
//! process listing, NVML's dearest call, only when it may have changed), `/proc/<pid>/stat` of each
//! process NVML lists (more of `/proc` only for a process not seen before,
//! or where the verdict depends on it), one directory listing for the
//! containers, and the segments of the slices (kept mapped between
//! passes). It spawns nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use cuslice_core::config::parse_uuid;
use cuslice_core::gpu::monotonic_ns;
use cuslice_core::segment::Segment;

use super::gpuseg;
use super::procfs::{self, ProcSource, Procfs};
use super::slices::{Owner, SliceId, Slices};
use super::snapshot::{
    Device, GpuSegReading, GpuSnap, PoolReading, ProcSnap, Registration, SliceSnap, SlotReading,
    Snapshot, TenantReading,
};
use super::tenant;
use crate::readings::procs::exiting;
use crate::readings::segments::{entries, void_if_truncated};
use crate::readings::{Readings, fd_file_id};
use cuslice_host::gpu::nvml::{DeviceHandle, Nvml};
use cuslice_host::layout::Layout;

/// What the watch reads (through its [`Readings`], which keeps what saves
/// reads between passes), and what it keeps of its own: the slices, and
/// what it learnt of their processes.
pub struct Observer {
    readings: Readings,
    devices: Vec<DeviceHandle>,
    root: PathBuf,
    pub slices: Slices,
    /// Buffer sizes to start with, per GPU.
    caps: HashMap<u32, usize>,
    /// (pid, start) -> its PID as it sees itself.
    inner: HashMap<(u32, u64), u32>,
    /// Processes (PID, start time) seen mapping their slice's segments.
    mapping: HashSet<(u32, u64)>,
}

impl Observer {
    pub fn new(nvml: Nvml, devices: Vec<DeviceHandle>, root: &Path) -> Observer {
        Observer {
            readings: Readings::new(Ok(nvml)),
            devices,
            root: root.to_path_buf(),
            slices: Slices::new(root, procfs::ns_inode("/proc/self/ns/pid")),
            caps: HashMap::new(),
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
        snap.now_unix = cuslice_host::resize::now_unix();
        self.read_slices(&mut snap);
        self.read_registrations(&mut snap);
        self.audit_gpu_segments(&mut snap);
        self.readings.maps.forget_unused(pass);
        snap
    }

    /// GPU `d`'s processes, with their memory, SM time and owner; None
    /// where NVML could not list them (the error is in `snap.errors`).
    fn list_gpu(&mut self, d: &DeviceHandle, pass: u64, snap: &mut Snapshot) -> Option<GpuSnap> {
        let cap = self.caps.get(&d.index).copied().unwrap_or(64);
        let sampled = match self.readings.samples(d, cap) {
            Ok(s) => s,
            Err(e) => {
                snap.errors.push(e);
                self.readings.no_samples(d)
            }
        };
        // The last listing while it is provably current (see
        // `Listings::processes`).
        let procs = match self.readings.processes(d, pass, cap, &sampled) {
            Ok(p) => p,
            Err(e) => {
                snap.errors.push(e);
                return None;
            }
        };
        self.readings.keep_samples(d, &sampled);
        let samples = &sampled.samples;
        self.caps
            .insert(d.index, (procs.len().max(samples.len()) + 16).max(64));
        // SM time over the window: the samples times the period (see
        // `sample_period_us`). The window: from the last sampling instant
        // of the previous pass to this pass's last one (a first pass, or
        // one after samples were lost: the samples' own span).
        let period = sampled.period;
        let window = sampled.window.map_or(0, |(a, b)| b - a);
        // Per PID: the sum of its samples and how many.
        let mut sm: HashMap<u32, (u64, u64)> = HashMap::new();
        for s in samples {
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
        let memory_total = self
            .readings
            .memory_total(d)
            .map_err(|e| snap.errors.push(e))
            .ok();
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
                .and_then(|p| self.readings.maps.mem.get(p, pass))
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
                    if let Some(Ok(p)) = self.readings.maps.pools.get(&path, pass)
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
                    let Some(Ok(g)) = self.readings.maps.gpu.get(&path, pass) else {
                        continue;
                    };
                    let Some(t) = g
                        .tenants()
                        .into_iter()
                        .find(|t| t.name == s.tenant && t.tag == s.tag)
                    else {
                        continue;
                    };
                    out.slots
                        .extend(
                            entries(g, |i| i == t.index)
                                .into_iter()
                                .map(|e| SlotReading {
                                    pid: e.pid,
                                    alive: e.alive,
                                }),
                        );
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
        let mut files = vec![];
        let Some(s) = self.slices.get(id) else {
            return files;
        };
        if let Some(p) = &s.mem_seg
            && let Some(Ok(seg)) = self.readings.maps.mem.get(p, pass)
        {
            files.extend(fd_file_id(seg.raw_fd()));
        }
        let (tenant, tag, dir) = (s.tenant.clone(), s.tag, s.gpu_dir.clone());
        for d in &self.devices {
            let path = dir.join(format!("{}.seg", d.uuid));
            if let Some(Ok(g)) = self.readings.maps.gpu.get(&path, pass)
                && g.tenants().iter().any(|t| t.name == tenant && t.tag == tag)
            {
                files.extend(fd_file_id(g.raw_fd()));
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
                let found = match self.readings.maps.gpu.get(&path, snap.pass) {
                    Some(Ok(seg)) => {
                        let found = gpuseg::audit(seg, &expected, now);
                        // What it read past the file's new end was zeros:
                        // no findings from it, and no repair.
                        void_if_truncated(found, seg.truncated(), &path)
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
