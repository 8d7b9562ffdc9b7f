//! What one pass of the watch saw, as plain data: built by `observe` (the
//! only part of a pass that reads NVML, `/proc` and the segments), judged
//! by `judge`. Nothing here does I/O, so a rule can be tested on a
//! snapshot written by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cuslice_core::config::Config;
use cuslice_core::gpu::audit::{Expected, Finding};
use cuslice_core::segment::RawDevice;

use super::slices::{Owner, SliceId};
use cuslice_host::resize::ResizeRecord;

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The pass that took it (the first is 1).
    pub pass: u64,
    /// CLOCK_MONOTONIC (ns) when the segments were read.
    pub now_ns: u64,
    /// CLOCK_REALTIME (s) then: what a resize's grace is measured in.
    pub now_unix: f64,
    /// Every GPU NVML names, listed this pass or not.
    pub devices: Vec<Device>,
    /// The GPUs whose processes NVML listed this pass.
    pub gpus: Vec<GpuSnap>,
    /// Every PID NVML listed, on any GPU (gone since or not).
    pub nvml_pids: BTreeSet<u32>,
    /// The slices the watch knows.
    pub slices: BTreeMap<SliceId, SliceSnap>,
    /// Every GPU segment file there is (the hook's directory's and each
    /// session's, per GPU), in the order they are audited.
    pub gpu_segments: Vec<GpuSegReading>,
    /// What kept this pass from seeing everything (NVML calls that
    /// failed), one line each.
    pub errors: Vec<String>,
}

/// A GPU as NVML names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// NVML's index.
    pub index: u32,
    /// `GPU-xxxxxxxx-...`.
    pub uuid: String,
}

/// One GPU's processes.
#[derive(Debug, Clone)]
pub struct GpuSnap {
    pub index: u32,
    pub uuid: String,
    /// The UUID parsed (None: one cuslice cannot parse; such a GPU is not
    /// judged).
    pub uuid_bytes: Option<[u8; 16]>,
    /// Its memory, bytes, as NVML gives it (None: NVML could not tell):
    /// the capacity the memory rule grants bursts from, never the pool's
    /// tenant-writable `capacity`.
    pub memory_total: Option<u64>,
    /// The processes NVML lists on it that still run (a PID with no
    /// `/proc/<pid>/stat` is left out), in NVML's order.
    pub procs: Vec<ProcSnap>,
}

/// One process on one GPU.
#[derive(Debug, Clone)]
pub struct ProcSnap {
    /// Host PID.
    pub pid: u32,
    /// Its start time (with the PID, names the process).
    pub start: u64,
    /// Device memory NVML says it uses on this GPU (None: NVML cannot tell).
    pub used: Option<u64>,
    /// The mean of its SM utilization samples since the last pass,
    /// percent (None: no sample).
    pub sm: Option<f64>,
    /// Whose it is.
    pub owner: Owner,
    /// What tells whether it registered with the shim; None where that was
    /// not looked at: outside a slice, or in one where the shim would not
    /// register it on this GPU (`tenant::registers`).
    pub registration: Option<Registration>,
}

/// The evidence of a process's registration with the shim. Only what can
/// change the verdict is read (`tenant::is_registered`): the segment
/// mapping where its PID is in a live slot, the exiting flag where the
/// registration is not proven (and then after the slots were read, so that
/// a process that gave its slot back on its way out is seen exiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// Its PID as it sees itself (the last `NSpid`).
    pub inner_pid: u32,
    /// Whether it maps one of its slice's segment files (None: not looked
    /// at, its inner PID is in no live slot).
    pub maps_segment: Option<bool>,
    /// Whether the kernel marks it exiting (`PF_EXITING`; None: not looked
    /// at, it is registered).
    pub exiting: Option<bool>,
}

/// One slice and what its segments say.
#[derive(Debug, Clone, Default)]
pub struct SliceSnap {
    /// The tenant its processes register as.
    pub tenant: String,
    /// For messages: `container web-1 (0123456789ab)`, `DRA claim
    /// team-a/trainer (0b1c2d3e-000)`, `cuslice run 4242 (python3
    /// train.py)`.
    pub label: String,
    /// Its quota file, parsed (None: unreadable; not judged).
    pub quota: Option<Config>,
    /// The record of its last resize (None: none, or unreadable).
    pub resize: Option<ResizeRecord>,
    /// Its memory segment's path (None: no memory quota).
    pub mem_seg: Option<PathBuf>,
    /// The memory segment's device entries as they are, whatever their
    /// state (None: no memory segment, or it cannot be opened).
    pub mem_entries: Option<Vec<RawDevice>>,
    /// The process slots in use that name a process of it: its memory
    /// segment's, and its tenant's process entries in its GPU segments
    /// (read for a slice with processes on a GPU).
    pub slots: Vec<SlotReading>,
    /// Per GPU index it has processes on: its tenant's entry in that GPU's
    /// segment (absent: no such entry or segment).
    pub gpu_tenant: BTreeMap<u32, TenantReading>,
    /// Per GPU index NVML listed this pass (for a slice with a memory
    /// quota): its own entry in that GPU's memory pool (absent: no entry).
    pub pool: BTreeMap<u32, PoolReading>,
}

/// A tenant's own entry in a GPU's memory pool. The pool is writable by
/// every tenant: what it says is only ever the tenant's own claim, which
/// can lower what the watch lets it hold, never raise it. The other
/// entries and the pool's `capacity` are not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolReading {
    /// The burst it publishes: bytes it holds past its guarantee.
    pub burst: u64,
}

/// A process slot or entry in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotReading {
    /// The PID the registering process saw itself as.
    pub pid: u32,
    /// Whether the kernel's lock says its process is alive.
    pub alive: bool,
}

/// A tenant's entry in a GPU segment, what the compute check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantReading {
    /// Time its processes waited for the GPU, ns (a running total).
    pub throttled_ns: u64,
    /// Its last demand window's charged GPU time per wall time, per mille.
    pub demand_pm: u32,
    /// Its latest sign of activity, CLOCK_MONOTONIC ns.
    pub last_activity: u64,
}

/// One GPU segment file, audited read-only against the tenants the quota
/// files name (`core::gpu::audit`, which reads the segment's words and its
/// entries' locks).
#[derive(Debug, Clone)]
pub struct GpuSegReading {
    pub path: PathBuf,
    /// NVML's index of its GPU.
    pub gpu: u32,
    /// The tenants it is judged against (`tenant::expected_tenants`).
    pub expected: Vec<Expected>,
    /// CLOCK_MONOTONIC (ns) of the audit.
    pub at_ns: u64,
    /// What the audit found (core's findings, tenant names as the segment
    /// holds them: the judge escapes them where it words its findings),
    /// or why the file could not be read.
    pub found: Result<Vec<Finding>, String>,
}
