//! What `cuslice watch` publishes for `cuslice status`, `top` and the
//! exporter: `<root>/watch/state.json`, replaced atomically after every
//! pass. A host file two commands share: its format, its writing (the
//! watch) and its reading (status) are here, so that neither command
//! imports the other.

use serde::{Deserialize, Serialize};

use crate::fs::Dir;
use crate::layout::{Layout, WATCH_DIR, WATCH_STATE};

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A slice's processes use more device memory than its quota.
    Memory,
    /// A GPU process of a slice that never registered with the shim.
    Unregistered,
    /// A slice takes markedly more GPU time than its share or ceiling.
    Compute,
    /// A memory segment's quota differs from the quota file's.
    MemorySegment,
    /// A per-GPU segment holds values no cuslice process writes.
    GpuSegment,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Unregistered => "unregistered",
            Kind::Compute => "compute",
            Kind::MemorySegment => "memory_segment",
            Kind::GpuSegment => "gpu_segment",
        }
    }
}

/// One finding as it is shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingView {
    pub kind: Kind,
    pub tenant: String,
    /// `container web-1 (0123456789ab)`, `cuslice run 4242 (python3 x.py)`,
    /// `GPU segment <path>`.
    pub slice: String,
    /// NVML's index of the GPU.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// A host PID.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The figure seen (`3.2 GiB`, `85%`), and the limit it is held to.
    pub figure: String,
    pub limit: String,
    /// The whole line (without the action).
    pub what: String,
    /// What was done last (`killed pid 4242`, `frozen for 5s`, `restored`,
    /// `reported`).
    pub action: String,
    pub since_unix: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Count {
    pub kind: Kind,
    pub tenant: String,
    /// Findings that started (each is counted once, however long it lasts).
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchState {
    pub pid: u32,
    /// False once the watch stopped (it writes that on its way out).
    pub running: bool,
    pub policy: String,
    pub repair: bool,
    pub interval_seconds: f64,
    pub started_unix: f64,
    pub last_pass_unix: f64,
    pub passes: u64,
    /// CPU time of the watch since it started (user + system), seconds.
    pub cpu_seconds: f64,
    /// What the last pass took, CPU time, seconds.
    pub last_pass_cpu_seconds: f64,
    pub slices: u32,
    pub gpu_processes: u32,
    pub findings: Vec<FindingView>,
    pub counts: Vec<Count>,
    /// What kept the last pass from seeing everything, one line each.
    pub errors: Vec<String>,
}

pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The most of the state file that is read.
const STATE_MAX: u64 = 16 << 20;

/// Writes `s` whole into the watch's directory `dir` (`<root>/watch`,
/// held open), mode 0644: a new file renamed over `state.json`, never
/// through a link (the layer's `replace_file`).
pub fn write(dir: &Dir, s: &WatchState) -> Result<(), String> {
    let text = serde_json::to_string_pretty(s)
        .map_err(|e| format!("{}: {e}", dir.join(WATCH_STATE).display()))?;
    Ok(dir.replace_file(WATCH_STATE, (text + "\n").as_bytes(), 0o644)?)
}

/// The state the watch under `layout` last wrote; None if there is none
/// (no watch ran) or it cannot be read. Read through the layer: the
/// watch's directory from the root without following a link, the file
/// not followed, never blocking, bounded.
pub fn read(layout: &Layout) -> Option<WatchState> {
    let dir = layout.open().and_then(|r| r.open_dir(WATCH_DIR)).ok()?;
    let text = dir.read_checked(WATCH_STATE, None, STATE_MAX).ok()?;
    serde_json::from_str(&text).ok()
}

impl FindingView {
    /// Escaped and bounded by [`text`](crate::text): a finding carries
    /// tenant names, container labels and paths from tenants.
    pub fn for_display(self) -> FindingView {
        use crate::text::{LINE_MAX, clean, clean_to};
        FindingView {
            tenant: clean(&self.tenant),
            slice: clean_to(&self.slice, LINE_MAX),
            figure: clean(&self.figure),
            limit: clean(&self.limit),
            what: clean_to(&self.what, LINE_MAX),
            action: clean_to(&self.action, LINE_MAX),
            ..self
        }
    }
}

impl WatchState {
    /// Every string escaped and bounded: what `cuslice status` reads back
    /// (the watch escaped them already; escaping is idempotent).
    pub fn for_display(self) -> WatchState {
        use crate::text::{LINE_MAX, clean, clean_to};
        WatchState {
            policy: clean(&self.policy),
            findings: self
                .findings
                .into_iter()
                .map(FindingView::for_display)
                .collect(),
            counts: self
                .counts
                .into_iter()
                .map(|c| Count {
                    tenant: clean(&c.tenant),
                    ..c
                })
                .collect(),
            errors: self.errors.iter().map(|e| clean_to(e, LINE_MAX)).collect(),
            ..self
        }
    }

    /// Whether the watch is up: running, and its last pass no older than
    /// three intervals (and two seconds).
    pub fn up(&self, now: f64) -> bool {
        self.running && now - self.last_pass_unix <= 3.0 * self.interval_seconds + 2.0
    }
}
