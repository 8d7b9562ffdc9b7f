//! `cuslice status` / `top`: what the segments say, per GPU, per tenant and
//! per process. Reads the segment files only (read-only mappings): works
//! without a GPU and without touching any running program.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cuslice_core::config::{self, format_uuid};
use cuslice_core::gpu::GpuSegment;
use cuslice_core::segment::{MAX_DEVICES, Segment, UNLIMITED};
use serde::Serialize;

/// Where to look.
#[derive(Debug, Clone)]
pub struct Sources {
    /// Directories of the per-GPU scheduling segments.
    pub gpu_dirs: Vec<PathBuf>,
    /// Memory segment files (one per container).
    pub memory: Vec<PathBuf>,
}

impl Sources {
    /// The defaults: `$CUSLICE_GPU_SEGMENT_DIR` or the config default; the
    /// memory segments given, else every `*/memory.seg` under the
    /// containers root, those of programs started by `cuslice run`
    /// (`$XDG_RUNTIME_DIR` or the temp dir), and the default segment
    /// directory's.
    pub fn resolve(
        gpu_dir: Option<PathBuf>,
        memory: Vec<PathBuf>,
        root: Option<PathBuf>,
    ) -> Sources {
        let gpu_dirs = match gpu_dir
            .or_else(|| std::env::var_os("CUSLICE_GPU_SEGMENT_DIR").map(PathBuf::from))
        {
            Some(d) => vec![d],
            // The hook's host directory (containers) and the local default.
            None => vec![
                PathBuf::from(HOOK_GPU_DIR),
                PathBuf::from(config::DEFAULT_GPU_SEGMENT_DIR),
            ],
        };
        let mut mem = memory;
        if mem.is_empty() {
            let root = root.unwrap_or_else(|| PathBuf::from(DEFAULT_CONTAINERS_ROOT));
            if let Ok(rd) = std::fs::read_dir(&root) {
                let mut v: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path().join("memory.seg"))
                    .filter(|p| p.is_file())
                    .collect();
                v.sort();
                mem.extend(v);
            }
            // Programs started by `cuslice run` (its private directories).
            let runs = std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir);
            if let Ok(rd) = std::fs::read_dir(&runs) {
                let mut v: Vec<PathBuf> = rd
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("cuslice-run-"))
                    .map(|e| e.path().join("segment").join("memory.seg"))
                    .filter(|p| p.is_file())
                    .collect();
                v.sort();
                mem.extend(v);
            }
            let local = Path::new(config::DEFAULT_SEGMENT_DIR).join("memory.seg");
            if local.is_file() {
                mem.push(local);
            }
        }
        Sources {
            gpu_dirs,
            memory: mem,
        }
    }
}

/// Where the runtime hook keeps one directory per container.
pub const DEFAULT_CONTAINERS_ROOT: &str = "/run/cuslice/containers";
/// Where the runtime hook keeps the host's per-GPU segments.
pub const HOOK_GPU_DIR: &str = "/run/cuslice/gpu";

#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub gpus: Vec<GpuView>,
    pub containers: Vec<ContainerView>,
    /// Segments that could not be read, one line each.
    pub errors: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct GpuView {
    pub uuid: String,
    pub segment: String,
    pub handovers: u64,
    pub tenants: Vec<TenantView>,
}

#[derive(Debug, Serialize)]
pub struct TenantView {
    pub name: String,
    pub share_percent: u32,
    /// None: no ceiling.
    pub ceiling_percent: Option<u32>,
    pub gpu_time_seconds: f64,
    pub throttled_seconds: f64,
    pub processes: u32,
    pub waiting: u32,
    pub last_active_seconds_ago: f64,
    /// "latency" or "standard".
    pub class: &'static str,
    /// "lease": competes for a saturated GPU through the lease; "free":
    /// under its share, launches freely.
    pub mode: &'static str,
    /// GPU time charged per wall time over the last demand window, percent.
    pub demand_percent: f64,
}

#[derive(Debug, Serialize)]
pub struct ContainerView {
    pub segment: String,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

#[derive(Debug, Serialize)]
pub struct DeviceView {
    pub uuid: String,
    /// None: no quota (usage is still counted).
    pub limit_bytes: Option<u64>,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    pub refused: u64,
}

#[derive(Debug, Serialize)]
pub struct ProcessView {
    pub pid: u32,
    pub alive: bool,
    pub started_unix: u64,
    /// GPU UUID -> bytes.
    pub used_bytes: BTreeMap<String, u64>,
}

/// Reads every segment the sources name.
pub fn snapshot(src: &Sources) -> Snapshot {
    let mut snap = Snapshot {
        gpus: vec![],
        containers: vec![],
        errors: vec![],
    };
    let now = cuslice_core::gpu::monotonic_ns();
    let mut gpu_files: Vec<PathBuf> = src
        .gpu_dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    gpu_files.sort();
    for path in gpu_files {
        match GpuSegment::open_read_only(&path) {
            Ok(g) => snap.gpus.push(GpuView {
                uuid: path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                segment: path.display().to_string(),
                handovers: g
                    .sched()
                    .handovers
                    .load(std::sync::atomic::Ordering::Relaxed),
                tenants: g
                    .tenants()
                    .into_iter()
                    .map(|t| TenantView {
                        name: t.name,
                        share_percent: t.share,
                        ceiling_percent: (t.max < 100).then_some(t.max),
                        gpu_time_seconds: t.used_ns as f64 / 1e9,
                        throttled_seconds: t.throttled_ns as f64 / 1e9,
                        processes: t.procs,
                        waiting: t.waiting,
                        last_active_seconds_ago: now.saturating_sub(t.last_active) as f64 / 1e9,
                        class: if t.latency { "latency" } else { "standard" },
                        mode: if t.heavy { "lease" } else { "free" },
                        demand_percent: f64::from(t.demand_pm) / 10.0,
                    })
                    .collect(),
            }),
            Err(e) => snap.errors.push(e.to_string()),
        }
    }
    for path in &src.memory {
        match Segment::open_read_only(path) {
            Ok(s) => {
                let mut uuids = BTreeMap::new();
                let mut devices = vec![];
                for d in 0..MAX_DEVICES {
                    if let Some(u) = s.device_usage(d) {
                        let uuid = format_uuid(&u.uuid);
                        uuids.insert(d, uuid.clone());
                        devices.push(DeviceView {
                            uuid,
                            limit_bytes: (u.limit != UNLIMITED).then_some(u.limit),
                            used_bytes: u.used,
                            peak_bytes: u.peak,
                            refused: u.refused,
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
                snap.containers.push(ContainerView {
                    segment: path.display().to_string(),
                    devices,
                    processes,
                });
            }
            Err(e) => snap.errors.push(e.to_string()),
        }
    }
    snap
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The human table. `prev` (from the previous refresh) adds each tenant's
/// GPU share over the interval.
pub fn render(s: &Snapshot, prev: Option<(&Snapshot, f64)>) -> String {
    let mut out = String::new();
    if s.gpus.is_empty() && s.containers.is_empty() {
        out.push_str("no cuslice segments found\n");
    }
    for g in &s.gpus {
        out.push_str(&format!("GPU {}  ({} hand-overs)\n", g.uuid, g.handovers));
        out.push_str(&format!(
            "  {:<24} {:>6} {:>8} {:>8} {:>6} {:>12} {:>12} {:>6} {:>6} {:>10}{}\n",
            "tenant",
            "share",
            "ceiling",
            "class",
            "mode",
            "gpu time",
            "throttled",
            "procs",
            "wait",
            "idle for",
            if prev.is_some() { "   now" } else { "" }
        ));
        for t in &g.tenants {
            let now_pct = prev.and_then(|(p, dt)| {
                let before = p
                    .gpus
                    .iter()
                    .find(|x| x.uuid == g.uuid)?
                    .tenants
                    .iter()
                    .find(|x| x.name == t.name)?;
                Some(100.0 * (t.gpu_time_seconds - before.gpu_time_seconds) / dt)
            });
            out.push_str(&format!(
                "  {:<24} {:>5}% {:>8} {:>8} {:>6} {:>11.1}s {:>11.1}s {:>6} {:>6} {:>9.1}s{}\n",
                t.name,
                t.share_percent,
                t.ceiling_percent
                    .map(|c| format!("{c}%"))
                    .unwrap_or_else(|| "-".into()),
                t.class,
                t.mode,
                t.gpu_time_seconds,
                t.throttled_seconds,
                t.processes,
                t.waiting,
                t.last_active_seconds_ago,
                now_pct.map(|p| format!(" {p:>5.1}%")).unwrap_or_default()
            ));
        }
    }
    for c in &s.containers {
        out.push_str(&format!("container segment {}\n", c.segment));
        for d in &c.devices {
            out.push_str(&format!(
                "  GPU {}  memory {} / {}  (peak {}, refused {})\n",
                d.uuid,
                gib(d.used_bytes),
                d.limit_bytes.map(gib).unwrap_or_else(|| "no quota".into()),
                gib(d.peak_bytes),
                d.refused
            ));
        }
        for p in &c.processes {
            let used: Vec<String> = p.used_bytes.values().map(|b| gib(*b)).collect();
            out.push_str(&format!(
                "    pid {:<8} {:<5} {}\n",
                p.pid,
                if p.alive { "live" } else { "dead" },
                if used.is_empty() {
                    "-".to_string()
                } else {
                    used.join(", ")
                }
            ));
        }
    }
    for e in &s.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}
