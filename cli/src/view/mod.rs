//! The displays' view of the readings: `cuslice status` / `top` /
//! `exporter` show what the segments say, per GPU, per tenant and per
//! process, with NVML's view of each GPU where NVML is there. What is read
//! is read by `readings` (the segment files only, read-only mappings):
//! works without a GPU and without touching any running program, and
//! never writes a segment (the tenant entries of ended tenants are freed
//! by the shim, when a new tenant needs one: `GpuSegment::register`).
//!
//! A [`Viewer`] takes readings; each gives a [`Snapshot`] with, per
//! tenant, its share of the GPU over the time since the previous reading,
//! and what it runs. A tenant with no live process stays in the snapshots
//! (`live: false`) for the linger time (a minute by default) after it ended,
//! then is left out.
//!
//! Every string in a snapshot that a tenant wrote or could have written (a
//! container's name, pod, image and command from `container.json`, tenant
//! names in the GPU segment, command lines in `/proc`, file names and paths
//! in shared directories, what the watch found) is escaped by
//! [`clean`] where it is read, so that every printer (the table, the
//! details, `top`, the exporter, `--json`) shows only safe strings and none
//! can forget to. `--json` carries the same escaped strings, not the raw
//! ones: JSON escapes control characters but not the bidirectional
//! overrides, and `jq -r` prints its strings raw onto a terminal; a
//! consumer that needs a value as the tenant wrote it reads the record
//! itself (`<root>/containers/<id>/container.json`, root's).

mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use cuslice_core::gpu as coregpu;

pub use crate::readings::memory::Sources;
use crate::readings::procs::host_cmdline;
use crate::readings::segments::GpuRead;
use crate::readings::{Reading, Readings, hostname};
use cuslice_host::container::describe;
use cuslice_host::gpu::nvml::{GpuInfo, Nvml};
use cuslice_host::text::clean;
use cuslice_host::watch_state;
pub use types::{GpuView, HealthSource, Snapshot, TenantView, WatchView};

/// How long a tenant with no live process is still shown.
pub const DEFAULT_LINGER_SECONDS: f64 = 60.0;

/// A tenant on a GPU: (GPU UUID, tenant name, slice tag).
type Key = (String, String, u64);

/// A tenant's row on a GPU, and the segment files (device, inode) that
/// are its.
type Row = (TenantView, Vec<(u64, u64)>);

/// Takes readings, keeping what the next one needs: the previous reading
/// (for shares over the interval) and when each ended tenant was first
/// seen ended.
pub struct Viewer {
    src: Sources,
    readings: Readings,
    linger_ns: u64,
    prev: Option<Reading>,
    live_before: HashSet<Key>,
    ended: HashMap<Key, u64>,
    /// What each tenant ran when last seen live (an ended tenant's row
    /// keeps it: its processes and files are gone).
    last_runs: HashMap<Key, String>,
    /// Per tenant: what `gpu_percent` left out of its charge so far (ns;
    /// see `TenantView::gpu_seconds`).
    left_out: HashMap<Key, u64>,
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
        let bound = p.bound_ns - before.bound_before(p);
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

impl Viewer {
    /// `linger`: seconds a tenant with no live process stays listed.
    pub fn new(src: Sources, linger: f64) -> Viewer {
        Viewer {
            src,
            readings: Readings::new(Nvml::open()),
            linger_ns: (linger.clamp(0.0, 1e9) * 1e9) as u64,
            prev: None,
            live_before: HashSet::new(),
            ended: HashMap::new(),
            last_runs: HashMap::new(),
            left_out: HashMap::new(),
        }
    }

    /// Reads everything afresh; shares over the time since the previous
    /// call.
    pub fn read(&mut self) -> Snapshot {
        let now = self.readings.take(&self.src, self.prev.as_ref());
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
                        pids: pids.clone(),
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
                        demand_percent: Some(f64::from(t.demand_pm) / 10.0),
                        ..TenantView::default()
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
                            ..TenantView::default()
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
            watch: watch_state::read(self.src.layout()).map(|state| {
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
