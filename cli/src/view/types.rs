//! What the displays show (`cuslice status` and `--json`, `top`, the
//! exporter): a [`Snapshot`] per reading, per GPU its tenants' rows. Plain
//! data, made by [`Viewer::read`](super::Viewer::read) from what
//! `readings` read; every string in it escaped where it was read.

use serde::Serialize;

use crate::readings::memory::ContainerView;
use cuslice_host::container::ContainerMeta;
use cuslice_host::gpu::health::view as health;
use cuslice_host::watch_state;

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

/// One tenant's row on a GPU. The default is the row with nothing known
/// (the start of every row the view makes).
#[derive(Debug, Clone, Default, Serialize)]
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
