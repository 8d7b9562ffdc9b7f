//! What the segments say, read through cuslice-core's own types (never
//! through offsets of our own: the layout is core's).

use std::path::Path;
use std::sync::atomic::Ordering;

use cuslice_core::gpu::{GpuSegment, MAX_PROCS, PROC_FREE, TenantView};
use cuslice_core::segment::{MAX_DEVICES, ProcessUsage, Segment};

/// A container's memory accounting, over all its GPUs.
#[derive(Debug)]
pub struct Mem {
    pub used: u64,
    /// The highest peak of any GPU.
    pub peak: u64,
    /// The limit of the last GPU registered (the tests use one).
    pub limit: u64,
    /// Process slots in use (dead owners included until reclaimed).
    pub live: Vec<ProcessUsage>,
}

impl Mem {
    pub fn of_segment(seg: &Segment) -> Mem {
        let (mut used, mut peak, mut limit) = (0, 0, 0);
        for d in 0..MAX_DEVICES {
            if let Some(u) = seg.device_usage(d) {
                used += u.used;
                peak = peak.max(u.peak);
                limit = u.limit;
            }
        }
        Mem {
            used,
            peak,
            limit,
            live: seg.processes(),
        }
    }

    /// The memory segment at `path`, after reclaiming dead processes' slots
    /// if `reclaim`.
    pub fn read(path: &Path, reclaim: bool) -> Mem {
        let seg = Segment::open_or_create(path)
            .unwrap_or_else(|e| panic!("memory segment {}: {e}", path.display()));
        if reclaim {
            seg.reclaim_dead();
        }
        Mem::of_segment(&seg)
    }

    /// What process `pid`'s slot accounts, over all GPUs.
    pub fn of(&self, pid: u32) -> Option<u64> {
        self.live
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.used.iter().sum())
    }
}

/// A process entry of the GPU segment that is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcView {
    pub slot: usize,
    pub pid: u32,
    /// Its tenant's index.
    pub tenant: usize,
    pub waiting: bool,
}

/// What the GPU segment says: the lease and its holder, the process
/// entries in use, the tenants.
#[derive(Debug)]
pub struct GpuView {
    pub lease_slot: Option<usize>,
    pub lease_pid: Option<u32>,
    pub handovers: u64,
    pub procs: Vec<ProcView>,
    pub tenants: Vec<TenantView>,
}

impl GpuView {
    pub fn of(g: &GpuSegment) -> GpuView {
        let s = g.sched();
        let lease = s.lease.load(Ordering::Acquire);
        let procs: Vec<ProcView> = (0..MAX_PROCS)
            .filter_map(|i| {
                let p = g.proc_entry(i)?;
                (p.state.load(Ordering::Acquire) != PROC_FREE).then(|| ProcView {
                    slot: i,
                    pid: p.pid.load(Ordering::Acquire),
                    tenant: p.tenant.load(Ordering::Relaxed) as usize,
                    waiting: p.waiting.load(Ordering::Acquire) != 0,
                })
            })
            .collect();
        let lease_slot = (lease != 0).then(|| (lease - 1) as usize);
        GpuView {
            lease_slot,
            lease_pid: lease_slot
                .and_then(|i| procs.iter().find(|p| p.slot == i))
                .map(|p| p.pid),
            handovers: s.handovers.load(Ordering::Acquire),
            procs,
            tenants: g.tenants(),
        }
    }

    /// The process entry of `pid`, if it is registered.
    pub fn proc_of(&self, pid: u32) -> Option<&ProcView> {
        self.procs.iter().find(|p| p.pid == pid)
    }

    pub fn tenant(&self, name: &str) -> &TenantView {
        self.tenants
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tenant {name} in {self:?}"))
    }
}
