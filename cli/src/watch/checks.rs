//! The watch's judgements: pure functions from what a pass saw (a
//! [`Snapshot`]), what earlier passes left (a [`History`]: first
//! sightings, sustain counters, when a GPU segment was last found
//! tampered with, the slices serving a freeze) and the host's policy
//! ([`WatchConfig`]) to [`Verdict`]s. No I/O here: every rule is tested on
//! snapshots written by hand. What is done about a verdict is `act`'s.
//!
//! [`judge`] runs every check, in the order their findings are logged: per
//! GPU, per slice with processes on it, `unregistered` then `memory`, then
//! `compute` for the GPU; then `memory_segment` per slice; then
//! `gpu_segment` per GPU segment file.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;

use cuslice_core::config::{Config, format_size, format_uuid};
use cuslice_core::gpu::DEMAND_WINDOW_NS;
use cuslice_core::gpu::audit::Expected;
use cuslice_core::segment::{READY_STATE, UNLIMITED};

use super::config::WatchConfig;
use super::slices::{Slice, SliceId};
use super::snapshot::{
    GpuSegReading, GpuSnap, ProcSnap, Registration, SliceSnap, SlotReading, Snapshot,
};
use super::state::{FindingView, Kind};

/// How long after a GPU's segment was last found tampered with the compute
/// check only reports on that GPU: the forged values' effect and the
/// catch-up after their repair (measured on the fake GPU: a tenant forged
/// above its share for a while is then held back while the others catch
/// up, for a few seconds).
pub const TAMPER_QUIET_NS: u64 = 10_000_000_000;

/// The key of a finding: what, whose, which GPU, which process. A finding
/// lasts while some pass finds it again under its key.
pub type Key = (Kind, String, Option<u32>, Option<u32>);

/// What earlier passes leave to the next one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// (pid, start) -> the pass that first saw it unregistered.
    pub first_unregistered: HashMap<(u32, u64), u64>,
    /// (GPU uuid, slice) -> (time ns, throttled ns) of its tenant entry at
    /// the last pass (by slice: two slices may share a tenant name, each
    /// with an entry of its own).
    pub throttled: HashMap<(String, SliceId), (u64, u64)>,
    /// (slice, GPU index) -> passes in a row over its share / ceiling.
    pub sustain: HashMap<(SliceId, u32), u32>,
    /// (slice, GPU index) -> its GPU time (percent) in the last passes, as
    /// many as its ceiling is judged over ([`ceiling_passes`]), newest last.
    pub ceiling_runs: HashMap<(SliceId, u32), VecDeque<f64>>,
    /// GPU index -> when (CLOCK_MONOTONIC ns) its GPU segment was last
    /// found tampered with.
    pub tampered: HashMap<u32, u64>,
    /// The slices `freeze` stopped on a GPU, serving their time (the
    /// executor's, copied in before each pass is judged).
    pub frozen: HashSet<(SliceId, u32)>,
}

/// What a check concluded.
// A handful per pass, each moved once: not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// A finding, and what it is about for the policy.
    Found {
        key: Key,
        view: FindingView,
        case: Case,
    },
    /// A finding that stands without being judged this pass: the compute
    /// finding of a slice serving a freeze.
    Stands(Key),
    /// A GPU segment holding values no cuslice process writes: one
    /// finding per value (see [`gpu_segment_findings`]), one repair for
    /// them all.
    GpuSegment {
        path: std::path::PathBuf,
        gpu: u32,
        expected: Vec<Expected>,
        at_ns: u64,
        found: Vec<(String, String)>,
    },
    /// Something this pass could not see (a line of the state's errors).
    Unseen(String),
}

/// What a finding is about, for the policy (`act::decide`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Case {
    /// A process of a slice that never registered with the shim;
    /// `seen_before`: a pass before this one saw it so too.
    Unregistered {
        pid: u32,
        start: u64,
        seen_before: bool,
    },
    /// A slice over its memory quota on a GPU: the processes to kill,
    /// newest first; `certain`: the quota is the GPU's for sure (not given
    /// by an index NVML's need not match).
    Memory {
        kill: Vec<(u32, u64)>,
        certain: bool,
    },
    /// A slice over its share or ceiling on a GPU for `compute_sustain`
    /// passes: its processes there; `forged`: that GPU's segment was
    /// tampered with lately (the split may be forged).
    Compute {
        slice: SliceId,
        gpu: u32,
        pids: Vec<(u32, u64)>,
        certain: bool,
        forged: bool,
    },
    /// A memory segment entry whose limit (or state) differs from the
    /// quota file: what to put back; `uuid`: the GPU of this host it is
    /// (its state is put back too).
    MemorySegment {
        slice: SliceId,
        entry: usize,
        uuid: Option<[u8; 16]>,
        limit: u64,
        certain: bool,
    },
}

/// Judges a pass: every check, in order (see the module comment), from
/// `prev`; returns the verdicts and what this pass leaves to the next.
pub fn judge(snap: &Snapshot, prev: &History, cfg: &WatchConfig) -> (Vec<Verdict>, History) {
    let mut next = prev.clone();
    let mut out = vec![];
    if snap.pass.is_multiple_of(16) {
        next.first_unregistered
            .retain(|(pid, _), _| snap.nvml_pids.contains(pid));
    }
    for gpu in &snap.gpus {
        let groups = groups(gpu);
        for (id, procs) in &groups {
            let Some(slice) = snap.slices.get(*id) else {
                continue;
            };
            // Registration first: that a process went around the shim is
            // worth its own finding, whatever the memory check does to it.
            out.extend(unregistered(
                snap.pass,
                gpu,
                id,
                slice,
                procs,
                &mut next.first_unregistered,
            ));
            out.extend(memory(gpu, id, slice, procs, cfg));
        }
        out.extend(compute(snap, gpu, &groups, prev, &mut next, cfg));
    }
    for (id, slice) in &snap.slices {
        out.extend(memory_segment(snap, id, slice));
    }
    for r in &snap.gpu_segments {
        out.extend(gpu_segment(r, &mut next.tampered));
    }
    (out, next)
}

/// A GPU's processes by slice (in slice order, each in NVML's order): a
/// process outside any slice, or claimed by several alike, is no one's
/// and never judged.
pub fn groups(gpu: &GpuSnap) -> BTreeMap<&SliceId, Vec<&ProcSnap>> {
    let mut g: BTreeMap<&SliceId, Vec<&ProcSnap>> = BTreeMap::new();
    for p in &gpu.procs {
        if let Some(id) = p.owner.slice() {
            g.entry(id).or_default().push(p);
        }
    }
    g
}

/// Whether the shim registers a process of a slice with quota file `cfg`
/// that uses GPU `index` / `uuid`: in a slot of the memory segment where
/// the slice has a memory quota on any GPU, in an entry of this GPU's
/// segment where it has a share or ceiling here. A slice limited on other
/// GPUs only gives a process that uses this one nothing to register in.
pub fn registers(cfg: &Config, index: u32, uuid: &[u8; 16]) -> bool {
    cfg.has_memory() || cfg.tenant_spec(index, uuid).is_some()
}

/// The PIDs registered in `slots`: those of live processes (a dead
/// process's slot, not swept yet, registers nobody).
pub fn registered_pids(slots: &[SlotReading]) -> HashSet<u32> {
    slots.iter().filter(|s| s.alive).map(|s| s.pid).collect()
}

/// Whether a process is registered: its PID as it sees itself is in a live
/// slot, and it maps its slice's segments. The PID alone is not enough: a
/// process in a PID namespace of its own (`unshare -Urpf` needs no
/// privilege) sees itself as 1, or as whatever a registered sibling of
/// another namespace is.
pub fn is_registered(registered: &HashSet<u32>, r: &Registration) -> bool {
    registered.contains(&r.inner_pid) && r.maps_segment == Some(true)
}

/// The memory quota `cfg` gives GPU `index` / `uuid`, and whether that is
/// certain: a quota given by index is matched against NVML's index, which
/// need not be the CUDA index the container's processes used.
pub fn memory_quota(cfg: &Config, index: u32, uuid: &[u8; 16]) -> (Option<u64>, bool) {
    (
        cfg.limits_for(index, uuid).memory,
        memory_certain(cfg, uuid),
    )
}

/// Whether `cfg`'s memory quota for GPU `uuid` does not depend on an
/// index: given by UUID, or no quota is given by index.
fn memory_certain(cfg: &Config, uuid: &[u8; 16]) -> bool {
    cfg.by_uuid.get(uuid).is_some_and(|l| l.memory.is_some())
        || cfg.by_index.values().all(|l| l.memory.is_none())
}

/// Whether `cfg`'s compute share and ceiling for GPU `uuid` are certain: a
/// share or ceiling given by index is matched against NVML's index, which
/// need not be the GPU the tenant's processes call that index.
pub fn compute_certain(cfg: &Config, uuid: &[u8; 16]) -> bool {
    cfg.by_uuid
        .get(uuid)
        .is_some_and(|l| l.compute.is_some() || l.compute_max.is_some())
        || cfg
            .by_index
            .values()
            .all(|l| l.compute.is_none() && l.compute_max.is_none())
}

/// The tenants of `slices` (those whose GPU segment directory holds the
/// segment) that a GPU segment of GPU `index` / `uuid` is judged against:
/// each by its name and its slice's tag (its entry, whatever other slice
/// has the same name), with what its quota file gives it there. A share
/// given by index may be another GPU's: such a tenant is not judged (nor
/// "repaired").
pub fn expected_tenants<'a>(
    slices: impl Iterator<Item = &'a Slice>,
    index: u32,
    uuid: &[u8; 16],
) -> Vec<Expected> {
    slices
        .filter_map(|s| {
            let q = s.quota.as_ref().filter(|q| compute_certain(q, uuid))?;
            Some(Expected {
                name: s.tenant.clone(),
                tag: s.tag,
                spec: q.tenant_spec(index, uuid)?,
            })
        })
        .collect()
}

/// The name of a slice in finding keys.
pub fn slice_key(id: &SliceId) -> String {
    match id {
        SliceId::Container(c) => format!("container:{c}"),
        SliceId::Claim(uid) => format!("claim:{uid}"),
        SliceId::Run { pid, start } => format!("run:{pid}:{start}"),
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

/// `unregistered`: each process of the slice on this GPU that is not
/// registered, where the shim would have registered it. Reported at once;
/// `seen_before` (what `kill` needs) only from the second pass in a row
/// that sees it: a process that exits normally gives its slot back before
/// the driver has torn its context down, and NVML lists it until then. A
/// process the kernel marks exiting is skipped (and forgotten).
pub fn unregistered(
    pass: u64,
    gpu: &GpuSnap,
    id: &SliceId,
    slice: &SliceSnap,
    procs: &[&ProcSnap],
    first_seen: &mut HashMap<(u32, u64), u64>,
) -> Vec<Verdict> {
    let (Some(cfg), Some(uuid)) = (&slice.quota, &gpu.uuid_bytes) else {
        return vec![];
    };
    if !registers(cfg, gpu.index, uuid) {
        return vec![];
    }
    let reg = registered_pids(&slice.slots);
    let mut out = vec![];
    for p in procs {
        let Some(r) = &p.registration else { continue };
        if is_registered(&reg, r) || r.exiting == Some(true) {
            first_seen.remove(&(p.pid, p.start));
            continue;
        }
        let first = *first_seen.entry((p.pid, p.start)).or_insert(pass);
        let what = format!(
            "{} pid {}: uses GPU {} ({}) but never registered with the shim",
            slice.label,
            p.pid,
            gpu.index,
            p.used.map_or_else(|| "memory unknown".to_string(), size)
        );
        out.push(Verdict::Found {
            key: (
                Kind::Unregistered,
                slice_key(id),
                Some(gpu.index),
                Some(p.pid),
            ),
            view: view(
                Kind::Unregistered,
                &slice.tenant,
                &slice.label,
                Some(gpu.index),
                Some(p.pid),
                p.used.map_or_else(|| "-".into(), size),
                "registered".into(),
                what,
            ),
            case: Case::Unregistered {
                pid: p.pid,
                start: p.start,
                seen_before: first < pass,
            },
        });
    }
    out
}

/// `memory`: the slice's processes on this GPU over its quota there
/// ([`memory_over`]).
pub fn memory(
    gpu: &GpuSnap,
    id: &SliceId,
    slice: &SliceSnap,
    procs: &[&ProcSnap],
    cfg: &WatchConfig,
) -> Option<Verdict> {
    let (Some(q), Some(uuid)) = (&slice.quota, &gpu.uuid_bytes) else {
        return None;
    };
    let (Some(quota), certain) = memory_quota(q, gpu.index, uuid) else {
        return None;
    };
    let seen: Vec<Seen> = procs
        .iter()
        .map(|p| Seen {
            pid: p.pid,
            start: p.start,
            used: p.used,
        })
        .collect();
    let over = memory_over(&seen, quota, cfg.memory_tolerance, cfg.process_allowance)?;
    let pids: Vec<String> = procs.iter().map(|p| p.pid.to_string()).collect();
    let what = format!(
        "{} pid{} {}: GPU {} memory {} > quota {} (+{} tolerance, +{} per process)",
        slice.label,
        if pids.len() == 1 { "" } else { "s" },
        pids.join(","),
        gpu.index,
        size(over.used),
        size(quota),
        size(cfg.memory_tolerance),
        size(cfg.process_allowance)
    );
    Some(Verdict::Found {
        key: (Kind::Memory, slice_key(id), Some(gpu.index), None),
        view: view(
            Kind::Memory,
            &slice.tenant,
            &slice.label,
            Some(gpu.index),
            None,
            size(over.used),
            size(quota),
            what,
        ),
        case: Case::Memory {
            kill: over.kill,
            certain,
        },
    })
}

/// The longest a ceiling is judged over (a 1 % ceiling with a 10 s burst
/// would otherwise ask for minutes of passes).
pub const MAX_CEILING_WINDOW_NS: u64 = 60_000_000_000;

/// How many passes a ceiling is judged over: two on/off cycles of a tenant
/// the shim holds to ceiling `max` % with a burst of `burst_ns`. Such a
/// tenant saves up `burst_ns`, then runs at full speed until that is spent
/// (`burst / (1 - max)`), and pauses until it is saved up again
/// (`burst / max`): within a cycle it is over its ceiling, then idle; over
/// whole cycles, at it. Judged pass by pass with passes shorter than a
/// cycle, a well-behaved tenant would be found over in its stretches.
pub fn ceiling_passes(max: u32, burst_ns: u64, interval_ns: u64) -> usize {
    let c = u64::from(max.clamp(1, 99));
    let burst = burst_ns.max(1_000_000);
    let cycle = burst.saturating_mul(100) / (100 - c) + burst.saturating_mul(100) / c;
    let window = cycle.saturating_mul(2).min(MAX_CEILING_WINDOW_NS);
    window.div_ceil(interval_ns.max(1)).max(1) as usize
}

/// `compute`: the slices on this GPU over their ceiling, or over their
/// share while another wants more ([`compute_over`]), for
/// `compute_sustain` passes in a row. A tenant's demand counts only while
/// it is current (a launch within two demand windows) and it is not
/// frozen: a tenant rolls its demand window at its own launches, so one
/// that stopped (a data-loading phase, an idle service, a frozen slice)
/// keeps its last figure in the segment, and its neighbours rightly took
/// the time it left. A slice serving a freeze is not judged: its finding
/// stands.
pub fn compute(
    snap: &Snapshot,
    gpu: &GpuSnap,
    groups: &BTreeMap<&SliceId, Vec<&ProcSnap>>,
    prev: &History,
    next: &mut History,
    cfg: &WatchConfig,
) -> Vec<Verdict> {
    let Some(uuid) = &gpu.uuid_bytes else {
        return vec![];
    };
    let now = snap.now_ns;
    let mut seen = vec![];
    let mut judged = vec![];
    for (id, procs) in groups {
        let Some(slice) = snap.slices.get(*id) else {
            continue;
        };
        let Some(q) = &slice.quota else { continue };
        let spec = q.tenant_spec(gpu.index, uuid);
        let t = slice.gpu_tenant.get(&gpu.index);
        let frozen = prev.frozen.contains(&((*id).clone(), gpu.index));
        let demand = t
            .filter(|t| !frozen && now.saturating_sub(t.last_activity) <= 2 * DEMAND_WINDOW_NS)
            .map(|t| f64::from(t.demand_pm.min(1000)) / 10.0);
        // Time waited over the interval, from the running total.
        let waited = t.and_then(|t| {
            let key = (gpu.uuid.clone(), (*id).clone());
            let before = next.throttled.insert(key, (now, t.throttled_ns));
            before
                .filter(|(at, b)| now > *at && t.throttled_ns >= *b)
                .map(|(at, b)| 100.0 * (t.throttled_ns - b) as f64 / (now - at) as f64)
        });
        let gpu_percent = procs.iter().filter_map(|p| p.sm).fold(0.0, |a, b| a + b);
        let ceiling = spec.map(|s| (s.max, s.burst_ns)).filter(|(m, _)| *m < 100);
        // A ceiling is judged over whole on/off cycles of its burst: the
        // mean of the last `ceiling_passes` passes, once there are as many.
        let ceiling_percent = ceiling.and_then(|(m, burst)| {
            let n = ceiling_passes(m, burst, cfg.interval.as_nanos() as u64);
            let runs = next
                .ceiling_runs
                .entry(((*id).clone(), gpu.index))
                .or_default();
            runs.push_back(gpu_percent);
            while runs.len() > n {
                runs.pop_front();
            }
            (runs.len() == n).then(|| runs.iter().sum::<f64>() / n as f64)
        });
        if ceiling.is_none() {
            next.ceiling_runs.remove(&((*id).clone(), gpu.index));
        }
        seen.push(ComputeSeen {
            tenant: slice.tenant.clone(),
            gpu_percent,
            share: spec.map(|s| s.share),
            ceiling: ceiling.map(|(m, _)| m),
            ceiling_percent,
            ceiling_slack: ceiling.map_or(0.0, |(m, burst)| {
                ceiling_slack(m, burst, cfg.interval.as_nanos() as u64)
            }),
            waited_percent: waited,
            demand_percent: demand,
        });
        judged.push((*id, slice, procs, compute_certain(q, uuid)));
    }
    // A slice whose processes left this GPU starts its ceiling window anew.
    next.ceiling_runs
        .retain(|(id, g), _| *g != gpu.index || groups.contains_key(id));
    let over: HashMap<usize, (String, f64)> =
        compute_over(&seen, cfg.compute_margin, cfg.compute_wait)
            .into_iter()
            .map(|(i, why, pct)| (i, (why, pct)))
            .collect();
    let mut out = vec![];
    for (i, (id, slice, procs, certain)) in judged.into_iter().enumerate() {
        let key = (id.clone(), gpu.index);
        let finding = (Kind::Compute, slice_key(id), Some(gpu.index), None);
        if prev.frozen.contains(&key) {
            out.push(Verdict::Stands(finding));
            continue;
        }
        let Some((why, figure)) = over.get(&i) else {
            next.sustain.remove(&key);
            continue;
        };
        let n = next.sustain.entry(key).or_insert(0);
        *n += 1;
        if *n < cfg.compute_sustain {
            continue;
        }
        // Whoever can write the GPU segment (every tenant) can make a
        // well-behaved tenant take more than its share: by forging the
        // shares, and by the catch-up after they are restored.
        let forged = prev
            .tampered
            .get(&gpu.index)
            .is_some_and(|t| now.saturating_sub(*t) < TAMPER_QUIET_NS);
        let s = &seen[i];
        out.push(Verdict::Found {
            key: finding,
            view: view(
                Kind::Compute,
                &slice.tenant,
                &slice.label,
                Some(gpu.index),
                None,
                format!("{figure:.0}%"),
                format!(
                    "share {}%{}",
                    s.share.unwrap_or(100),
                    s.ceiling
                        .map_or(String::new(), |c| format!(", ceiling {c}%"))
                ),
                format!(
                    "{}: GPU {} {why}, {} passes in a row",
                    slice.label, gpu.index, cfg.compute_sustain
                ),
            ),
            case: Case::Compute {
                slice: id.clone(),
                gpu: gpu.index,
                pids: procs.iter().map(|p| (p.pid, p.start)).collect(),
                certain,
                forged,
            },
        });
    }
    out
}

/// `memory_segment`: every device entry of the slice's memory segment a
/// process may be admitting against, whatever its state word or UUID say
/// (a tenant that raised its limit could otherwise hide the raise by
/// writing either: the shim keeps using the entry it registered), whose
/// limit differs from what the quota file gives that GPU, or (a GPU of
/// this host) whose state word was overwritten.
pub fn memory_segment(snap: &Snapshot, id: &SliceId, slice: &SliceSnap) -> Vec<Verdict> {
    let (Some(cfg), Some(path), Some(entries)) = (&slice.quota, &slice.mem_seg, &slice.mem_entries)
    else {
        return vec![];
    };
    let mut out = vec![];
    for r in entries {
        let uuid = format_uuid(&r.uuid);
        let tampered = r.state != READY_STATE;
        let (gpu, q, certain) = match snap.devices.iter().find(|d| d.uuid == uuid) {
            Some(d) => {
                let (q, certain) = memory_quota(cfg, d.index, &r.uuid);
                (Some(d.index), q, certain)
            }
            // A UUID no GPU of this host has (a byte flipped, or a device
            // NVML does not list, such as a MIG instance): judged by what
            // the file gives that UUID, when that does not depend on an
            // index.
            None => (
                None,
                cfg.limits_for(u32::MAX, &r.uuid).memory,
                memory_certain(cfg, &r.uuid),
            ),
        };
        let (have, want) = (r.limit, q.unwrap_or(UNLIMITED));
        if have == want && !(tampered && gpu.is_some()) {
            continue;
        }
        // Sizes that differ but round alike are shown in bytes (a raise
        // of 1 MiB on 8 GiB reads "8.0 GiB" otherwise).
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
            None => format!(
                "entry {} ({}, no GPU of this host)",
                r.index,
                format_uuid(&r.uuid)
            ),
        };
        let state = if tampered {
            " in an entry whose state word was overwritten"
        } else {
            ""
        };
        let what = format!(
            "{}: memory segment {} says {entry} quota {}{state}, its quota file {}",
            slice.label,
            path.display(),
            shown(have),
            shown(want)
        );
        out.push(Verdict::Found {
            key: (
                Kind::MemorySegment,
                slice_key(id),
                gpu.or(Some(1000 + r.index as u32)),
                None,
            ),
            view: view(
                Kind::MemorySegment,
                &slice.tenant,
                &slice.label,
                gpu,
                None,
                shown(have),
                shown(want),
                what,
            ),
            case: Case::MemorySegment {
                slice: id.clone(),
                entry: r.index,
                uuid: gpu.is_some().then_some(r.uuid),
                limit: want,
                certain,
            },
        });
    }
    out
}

/// `gpu_segment`: a GPU segment the audit found values in that no
/// cuslice process writes; remembers when, per GPU (the compute check
/// only reports on that GPU for a while, see [`TAMPER_QUIET_NS`]). A
/// segment that could not be read is a line of the state's errors.
pub fn gpu_segment(r: &GpuSegReading, tampered: &mut HashMap<u32, u64>) -> Option<Verdict> {
    match &r.found {
        Err(e) => Some(Verdict::Unseen(e.clone())),
        Ok(found) if found.is_empty() => None,
        Ok(found) => {
            tampered.insert(r.gpu, r.at_ns);
            Some(Verdict::GpuSegment {
                path: r.path.clone(),
                gpu: r.gpu,
                expected: r.expected.clone(),
                at_ns: r.at_ns,
                found: found.clone(),
            })
        }
    }
}

/// The findings of a GPU segment at `path` (GPU `gpu`): one per tenant
/// entry (or the scheduler words, `-`) and kind of value, which starts,
/// is restored, and ends when the segment is found right again.
pub fn gpu_segment_findings(
    path: &Path,
    gpu: u32,
    found: &[(String, String)],
) -> Vec<(Key, FindingView)> {
    let label = format!("GPU segment {}", path.display());
    found
        .iter()
        .map(|(tenant, what)| {
            let kind = what.rsplit_once(" (").map_or("", |(_, k)| k);
            (
                (
                    Kind::GpuSegment,
                    format!("{}:{tenant}:{kind}", path.display()),
                    Some(gpu),
                    None,
                ),
                view(
                    Kind::GpuSegment,
                    tenant,
                    &label,
                    Some(gpu),
                    None,
                    what.clone(),
                    "-".into(),
                    format!("{label}: {what}"),
                ),
            )
        })
        .collect()
}

/// One process of a slice on one GPU, as NVML sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub pid: u32,
    /// Its start time (with the PID, names the process).
    pub start: u64,
    /// Device memory NVML says it uses (None: NVML cannot tell).
    pub used: Option<u64>,
}

/// A slice over its memory quota on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryOver {
    pub used: u64,
    pub quota: u64,
    /// Quota + tolerance + allowance per process listed: what is allowed.
    pub allowed: u64,
    /// What `kill` kills, newest first, until what is left is allowed
    /// (PID, start time).
    pub kill: Vec<(u32, u64)>,
}

/// Memory: the processes' NVML figures summed, against the quota plus the
/// tolerance plus an allowance per process. The processes to kill are the
/// newest first, until the rest (with its own allowance) is allowed again.
pub fn memory_over(
    procs: &[Seen],
    quota: u64,
    tolerance: u64,
    per_process: u64,
) -> Option<MemoryOver> {
    let allowed_for = |n: usize| {
        quota
            .saturating_add(tolerance)
            .saturating_add(per_process.saturating_mul(n as u64))
    };
    let counted: Vec<&Seen> = procs.iter().filter(|p| p.used.is_some()).collect();
    let used: u64 = counted
        .iter()
        .map(|p| p.used.unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    let allowed = allowed_for(counted.len());
    if used <= allowed {
        return None;
    }
    let mut newest: Vec<&Seen> = counted.clone();
    newest.sort_by_key(|p| std::cmp::Reverse((p.start, p.pid)));
    let mut left = used;
    let mut n = counted.len();
    let mut kill = vec![];
    for p in newest {
        if left <= allowed_for(n) {
            break;
        }
        kill.push((p.pid, p.start));
        left = left.saturating_sub(p.used.unwrap_or(0));
        n -= 1;
    }
    Some(MemoryOver {
        used,
        quota,
        allowed,
        kill,
    })
}

/// One slice on one GPU, for the compute check.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeSeen {
    pub tenant: String,
    /// Its processes' SM utilization summed (NVML), percent.
    pub gpu_percent: f64,
    /// Its share and ceiling on this GPU (None: none configured).
    pub share: Option<u32>,
    pub ceiling: Option<u32>,
    /// Its GPU time over the passes its ceiling is judged over
    /// ([`ceiling_passes`]), percent (None: no ceiling, or fewer passes
    /// seen yet: the ceiling is not judged).
    pub ceiling_percent: Option<f64>,
    /// Points over the ceiling a tenant held to it can show over that
    /// window ([`ceiling_slack`]), allowed beside the margin.
    pub ceiling_slack: f64,
    /// Percent of the interval its processes waited for the GPU (from the
    /// GPU segment's throttled time; None: unknown).
    pub waited_percent: Option<f64>,
    /// What it asked of the GPU: its last demand window's charged GPU time
    /// per wall time, percent (from the GPU segment; None: unknown). A
    /// tenant crowded out by one that launches around its limiter never
    /// waits for cuslice's lease (the GPU time-slices between them), but
    /// asks for more than it gets.
    pub demand_percent: Option<f64>,
}

/// How far over its ceiling, in points, a tenant the shim holds exactly to
/// ceiling `max` % with a burst of `burst_ns` can show over the window it
/// is judged over ([`ceiling_passes`] of `interval_ns`): its stretches at
/// full speed do not line up with the window. A stretch runs
/// `burst / (1 - c)`, a cycle `burst / (c (1 - c))`; a window of `W` holds
/// whole cycles plus a part, and the part can be all stretch: at most
/// `c (1 - c) cycle / W` over `c` (12.5 points at 50 % over two cycles).
/// Seen on the fake driver: 60 % for a tenant held to 50 %, reported 1 run
/// in 6 with the margin alone.
pub fn ceiling_slack(max: u32, burst_ns: u64, interval_ns: u64) -> f64 {
    let c = f64::from(max.clamp(1, 99)) / 100.0;
    let burst = burst_ns.max(1_000_000) as f64;
    let cycle = burst / (1.0 - c) + burst / c;
    let window = ceiling_passes(max, burst_ns, interval_ns) as f64 * interval_ns.max(1) as f64;
    (100.0 * c * (1.0 - c) * cycle / window).min(100.0 * (1.0 - c))
}

/// The slices (indices into `seen`) that take markedly more GPU time than
/// they may, why, and the figure judged: over their ceiling by more than
/// `margin` points (over the ceiling's window), or
/// over their share by more than `margin` while another slice with a share
/// got less than its own and wanted more: it waited at least `wait` percent
/// of the interval, or asked for at least its share.
pub fn compute_over(seen: &[ComputeSeen], margin: u32, wait: u32) -> Vec<(usize, String, f64)> {
    let m = f64::from(margin);
    let mut out = vec![];
    for (i, s) in seen.iter().enumerate() {
        if let (Some(c), Some(pct)) = (s.ceiling.filter(|c| *c < 100), s.ceiling_percent)
            && pct > f64::from(c) + m + s.ceiling_slack
        {
            let slack = if s.ceiling_slack > 0.0 {
                format!(", +{:.0} for its bursts", s.ceiling_slack)
            } else {
                String::new()
            };
            out.push((
                i,
                format!("GPU time {pct:.0}% > ceiling {c}% (+{margin} points{slack})"),
                pct,
            ));
            continue;
        }
        let Some(share) = s.share else { continue };
        if s.gpu_percent <= f64::from(share) + m {
            continue;
        }
        let victim = seen.iter().enumerate().find_map(|(j, o)| {
            let os = f64::from(o.share?);
            if j == i || o.gpu_percent >= os {
                return None;
            }
            if let Some(w) = o.waited_percent.filter(|w| *w >= f64::from(wait)) {
                return Some((o, format!("waited {w:.0}% of the interval")));
            }
            // Asked for its share and got some time, only less: a tenant
            // that got none is idle or stopped, whatever its figure says.
            o.demand_percent
                .filter(|d| *d >= os && o.gpu_percent > 0.0)
                .map(|d| (o, format!("asked for {d:.0}%")))
        });
        if let Some((v, wanted)) = victim {
            out.push((
                i,
                format!(
                    "GPU time {:.0}% > share {share}% (+{margin} points) while {} got {:.0}% of its {}% and {wanted}",
                    s.gpu_percent,
                    v.tenant,
                    v.gpu_percent,
                    v.share.unwrap_or(0),
                ),
                s.gpu_percent,
            ));
        }
    }
    out
}

/// A size for messages: `3.2 GiB`, `640 MiB`.
pub fn size(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / GIB)
    } else if b >= 1 << 20 {
        format!("{:.0} MiB", b as f64 / MIB)
    } else {
        format_size(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn seen(pid: u32, start: u64, used: u64) -> Seen {
        Seen {
            pid,
            start,
            used: Some(used),
        }
    }

    #[test]
    fn memory_within_quota_and_tolerance_is_no_finding() {
        let p = [seen(1, 10, 600 * M), seen(2, 20, 400 * M)];
        assert_eq!(memory_over(&p, 1024 * M, 0, 0), None);
        // 1 MiB over: within a 64 MiB tolerance, not within none.
        let p = [seen(1, 10, 600 * M), seen(2, 20, 425 * M)];
        assert_eq!(memory_over(&p, 1024 * M, 64 * M, 0), None);
        assert!(memory_over(&p, 1024 * M, 0, 0).is_some());
        // The allowance is per process listed.
        assert_eq!(memory_over(&p, 1024 * M, 0, M), None);
        // A process NVML cannot measure counts for nothing.
        let p = [
            seen(1, 10, 600 * M),
            Seen {
                pid: 3,
                start: 5,
                used: None,
            },
        ];
        assert_eq!(memory_over(&p, 600 * M, 0, 0), None);
    }

    #[test]
    fn memory_kills_the_newest_first_until_allowed() {
        // Quota 1 GiB; the oldest holds 600 MiB, a middle one 300 MiB, the
        // newest 2 GiB: killing the newest is enough.
        let p = [
            seen(30, 300, 2048 * M),
            seen(10, 100, 600 * M),
            seen(20, 200, 300 * M),
        ];
        let o = memory_over(&p, 1024 * M, 64 * M, 0).expect("over");
        assert_eq!(o.used, 2948 * M);
        assert_eq!(o.allowed, 1088 * M);
        assert_eq!(o.kill, vec![(30, 300)]);
        // The newest is small: it goes, then the next newest, until under.
        let p = [
            seen(30, 300, 10 * M),
            seen(10, 100, 600 * M),
            seen(20, 200, 900 * M),
        ];
        let o = memory_over(&p, 1024 * M, 0, 0).expect("over");
        assert_eq!(o.kill, vec![(30, 300), (20, 200)]);
        // Same start time: the higher PID is taken as the newer.
        let p = [seen(7, 5, 600 * M), seen(8, 5, 600 * M)];
        assert_eq!(
            memory_over(&p, 1024 * M, 0, 0).expect("over").kill,
            vec![(8, 5)]
        );
    }

    fn cs(
        t: &str,
        pct: f64,
        share: Option<u32>,
        ceiling: Option<u32>,
        waited: Option<f64>,
    ) -> ComputeSeen {
        ComputeSeen {
            tenant: t.into(),
            gpu_percent: pct,
            share,
            ceiling,
            ceiling_percent: ceiling.map(|_| pct),
            ceiling_slack: 0.0,
            waited_percent: waited,
            demand_percent: None,
        }
    }

    #[test]
    fn compute_over_a_ceiling_always_and_over_a_share_only_while_others_wait() {
        // Over its 40% ceiling by more than the margin.
        let v = compute_over(&[cs("a", 55.0, Some(40), Some(40), None)], 10, 10);
        assert_eq!(
            v,
            vec![(
                0,
                "GPU time 55% > ceiling 40% (+10 points)".to_string(),
                55.0
            )]
        );
        assert!(compute_over(&[cs("a", 49.0, Some(40), Some(40), None)], 10, 10).is_empty());
        // Its ceiling's window not seen whole yet: the ceiling is not
        // judged (over this pass alone, it may be in a stretch).
        let mut early = cs("a", 100.0, Some(40), Some(40), None);
        early.ceiling_percent = None;
        assert!(compute_over(&[early], 10, 10).is_empty());
        // Over its share with nobody waiting: work-conserving, fine.
        let idle = [
            cs("a", 90.0, Some(30), None, Some(0.0)),
            cs("b", 5.0, Some(70), None, Some(0.0)),
        ];
        assert!(compute_over(&idle, 10, 10).is_empty());
        // b waits 40% of the interval and gets 10% of its 70%: a is held.
        let v = compute_over(
            &[
                cs("a", 90.0, Some(30), None, Some(0.0)),
                cs("b", 10.0, Some(70), None, Some(40.0)),
            ],
            10,
            10,
        );
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, 0);
        assert!(
            v[0].1.starts_with(
                "GPU time 90% > share 30% (+10 points) while b got 10% of its 70% and waited 40%"
            ),
            "{}",
            v[0].1
        );
        // b waits but gets its share: a is not held.
        assert!(
            compute_over(
                &[
                    cs("a", 45.0, Some(30), None, Some(0.0)),
                    cs("b", 75.0, Some(70), None, Some(40.0)),
                ],
                10,
                10
            )
            .is_empty()
        );
        // b never waits for the lease (the GPU time-slices between them: a
        // launches around its limiter) but asks for 100% and gets 45% of
        // its 70%: a is held; asking for less than its share, it is not.
        let asked = |d: f64| {
            let mut b = cs("b", 45.0, Some(70), None, Some(0.0));
            b.demand_percent = Some(d);
            compute_over(&[cs("a", 55.0, Some(20), None, Some(0.0)), b], 10, 10)
        };
        let v = asked(100.0);
        assert_eq!(
            v,
            vec![(
                0,
                "GPU time 55% > share 20% (+10 points) while b got 45% of its 70% and asked for 100%"
                    .to_string(),
                55.0
            )]
        );
        assert!(asked(40.0).is_empty());
        // No share configured: nothing to hold it to.
        assert!(compute_over(&[cs("a", 100.0, None, None, None)], 10, 10).is_empty());
    }

    // ---- The checks on snapshots written by hand ----

    use crate::watch::config::Policy;
    use crate::watch::slices::Owner;
    use crate::watch::snapshot::{Device, TenantReading};
    use cuslice_core::segment::RawDevice;
    use std::path::PathBuf;

    const G: u64 = 1 << 30;
    const GPU0: [u8; 16] = [0xa0; 16];
    const GPU1: [u8; 16] = [0xa1; 16];
    const SECOND: u64 = 1_000_000_000;
    /// The snapshots' clock (CLOCK_MONOTONIC, ns).
    const NOW: u64 = 1000 * SECOND;

    fn quota(text: &str) -> Config {
        cuslice_core::config::parse_file(Path::new("quota.toml"), text).expect("quota file")
    }

    fn a() -> SliceId {
        SliceId::Container("aaa".into())
    }

    fn b() -> SliceId {
        SliceId::Container("bbb".into())
    }

    fn slice(tenant: &str, q: &str) -> SliceSnap {
        SliceSnap {
            tenant: tenant.into(),
            label: format!("container {tenant}"),
            quota: Some(quota(q)),
            mem_seg: Some(PathBuf::from(format!(
                "/run/cuslice/containers/{tenant}/segment/memory.seg"
            ))),
            ..SliceSnap::default()
        }
    }

    /// A process of `owner` using `used` bytes, that never registered
    /// (its PID as it sees itself is its host PID, in no slot).
    fn process(pid: u32, start: u64, used: u64, owner: Owner) -> ProcSnap {
        ProcSnap {
            pid,
            start,
            used: Some(used),
            sm: None,
            owner,
            registration: Some(Registration {
                inner_pid: pid,
                maps_segment: None,
                exiting: Some(false),
            }),
        }
    }

    fn gpu(index: u32, uuid: [u8; 16], procs: Vec<ProcSnap>) -> GpuSnap {
        GpuSnap {
            index,
            uuid: format_uuid(&uuid),
            uuid_bytes: Some(uuid),
            procs,
        }
    }

    fn snapshot(pass: u64, gpus: Vec<GpuSnap>, slices: Vec<(SliceId, SliceSnap)>) -> Snapshot {
        Snapshot {
            pass,
            now_ns: NOW,
            devices: [(0, GPU0), (1, GPU1)]
                .iter()
                .map(|(index, u)| Device {
                    index: *index,
                    uuid: format_uuid(u),
                })
                .collect(),
            nvml_pids: gpus
                .iter()
                .flat_map(|g| g.procs.iter().map(|p| p.pid))
                .collect(),
            gpus,
            slices: slices.into_iter().collect(),
            ..Snapshot::default()
        }
    }

    /// Passes of 2 s: one pass spans the window of a 40 % ceiling with the
    /// default burst (`ceiling_passes`), so that a ceiling is judged pass
    /// by pass where a test is about something else.
    fn policy(p: Policy) -> WatchConfig {
        WatchConfig {
            policy: p,
            interval: std::time::Duration::from_secs(2),
            ..WatchConfig::default()
        }
    }

    /// The cases found, in order (findings that stand, unseen parts and
    /// GPU segments left out).
    fn cases(v: &[Verdict]) -> Vec<&Case> {
        v.iter()
            .filter_map(|v| match v {
                Verdict::Found { case, .. } => Some(case),
                _ => None,
            })
            .collect()
    }

    const MEM_1G: &str = "[all]\nmemory = \"1GiB\"\n";

    #[test]
    fn an_unregistered_process_is_reported_at_once_and_acted_on_only_when_seen_in_two_passes_in_a_row()
     {
        let cfg = policy(Policy::Kill);
        let at = |pass, registered: bool| {
            let mut s = slice("a", MEM_1G);
            if registered {
                s.slots.push(SlotReading {
                    pid: 7,
                    alive: true,
                });
            }
            let mut p = process(7, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 7,
                maps_segment: registered.then_some(true),
                exiting: (!registered).then_some(false),
            });
            snapshot(pass, vec![gpu(0, GPU0, vec![p])], vec![(a(), s)])
        };
        let (v, h) = judge(&at(1, false), &History::default(), &cfg);
        assert_eq!(
            cases(&v),
            [&Case::Unregistered {
                pid: 7,
                start: 70,
                seen_before: false
            }]
        );
        // Found, logged, not killed: the first sighting.
        assert_eq!(
            crate::watch::act::decide(&v[0], &cfg),
            crate::watch::act::Action::Report
        );
        let Verdict::Found { key, view, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(
            key,
            &(
                Kind::Unregistered,
                "container:aaa".to_string(),
                Some(0),
                Some(7)
            )
        );
        assert_eq!(
            view.what,
            "container a pid 7: uses GPU 0 (512 MiB) but never registered with the shim"
        );
        // Seen again in the next pass: killed.
        let (v, h) = judge(&at(2, false), &h, &cfg);
        assert_eq!(
            cases(&v),
            [&Case::Unregistered {
                pid: 7,
                start: 70,
                seen_before: true
            }]
        );
        assert_eq!(
            crate::watch::act::decide(&v[0], &cfg),
            crate::watch::act::Action::KillProcess { pid: 7, start: 70 }
        );
        // Registered in between: the next sighting is a first one again.
        let (v, h) = judge(&at(3, true), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert!(h.first_unregistered.is_empty());
        let (v, _) = judge(&at(4, false), &h, &cfg);
        assert_eq!(
            cases(&v),
            [&Case::Unregistered {
                pid: 7,
                start: 70,
                seen_before: false
            }]
        );
    }

    #[test]
    fn a_process_the_kernel_marks_exiting_is_skipped() {
        // It gave its slot back on its way out; NVML lists it until the
        // driver lets go of its context.
        let cfg = policy(Policy::Kill);
        let at = |pass, exiting| {
            let mut p = process(7, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 7,
                maps_segment: None,
                exiting: Some(exiting),
            });
            snapshot(
                pass,
                vec![gpu(0, GPU0, vec![p])],
                vec![(a(), slice("a", MEM_1G))],
            )
        };
        let (v, h) = judge(&at(1, false), &History::default(), &cfg);
        assert_eq!(cases(&v).len(), 1);
        let (v, h) = judge(&at(2, true), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        // Forgotten, too: not "seen before" if it shows up again.
        assert!(h.first_unregistered.is_empty());
    }

    #[test]
    fn a_dead_slots_pid_does_not_count_as_registered() {
        let cfg = policy(Policy::Report);
        let at = |alive| {
            let mut s = slice("a", MEM_1G);
            // A slot not swept yet, of a process that died; the PID is
            // this one's (PIDs are reused, and namespaces repeat them).
            s.slots.push(SlotReading { pid: 7, alive });
            let mut p = process(7, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 7,
                maps_segment: Some(true),
                exiting: Some(false),
            });
            snapshot(1, vec![gpu(0, GPU0, vec![p])], vec![(a(), s)])
        };
        assert!(judge(&at(true), &History::default(), &cfg).0.is_empty());
        let (v, _) = judge(&at(false), &History::default(), &cfg);
        assert!(
            matches!(cases(&v)[..], [Case::Unregistered { pid: 7, .. }]),
            "{v:?}"
        );
    }

    #[test]
    fn a_pid_in_a_live_slot_is_registered_only_if_the_process_maps_its_slices_segments() {
        // `unshare -Urpf`: the process sees itself as 1, as a registered
        // sibling in another namespace does.
        let cfg = policy(Policy::Report);
        let at = |maps| {
            let mut s = slice("a", MEM_1G);
            s.slots.push(SlotReading {
                pid: 1,
                alive: true,
            });
            let mut p = process(4242, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 1,
                maps_segment: Some(maps),
                exiting: Some(false),
            });
            snapshot(1, vec![gpu(0, GPU0, vec![p])], vec![(a(), s)])
        };
        assert!(judge(&at(true), &History::default(), &cfg).0.is_empty());
        let (v, _) = judge(&at(false), &History::default(), &cfg);
        assert!(
            matches!(cases(&v)[..], [Case::Unregistered { pid: 4242, .. }]),
            "{v:?}"
        );
    }

    #[test]
    fn registration_is_judged_only_where_the_shim_registers() {
        // No memory quota anywhere, a share on GPU 1 only: a process on
        // GPU 0 has nothing to register in.
        let cfg = policy(Policy::Kill);
        let q = format!("[device.\"{}\"]\ncompute = 30\n", format_uuid(&GPU1));
        let at = |g: u32, uuid| {
            let p = process(7, 70, G / 2, Owner::Slice(a()));
            snapshot(1, vec![gpu(g, uuid, vec![p])], vec![(a(), slice("a", &q))])
        };
        assert!(judge(&at(0, GPU0), &History::default(), &cfg).0.is_empty());
        let (v, _) = judge(&at(1, GPU1), &History::default(), &cfg);
        assert!(
            matches!(cases(&v)[..], [Case::Unregistered { pid: 7, .. }]),
            "{v:?}"
        );
        // What the snapshot looked at follows the same rule.
        assert!(!registers(&quota(&q), 0, &GPU0));
        assert!(registers(&quota(&q), 1, &GPU1));
        assert!(registers(&quota(MEM_1G), 0, &GPU0));
    }

    #[test]
    fn a_process_claimed_by_several_slices_alike_or_by_none_is_never_judged() {
        // Containers a and b share a PID namespace (and nothing tells
        // which a process is): once every such process went to the first
        // record, and the watch killed a well-behaved process of b.
        let cfg = policy(Policy::Kill);
        let mut ambiguous = process(7, 70, 3 * G, Owner::Ambiguous(vec![a(), b()]));
        ambiguous.registration = None;
        let mut outside = process(8, 80, 3 * G, Owner::Nobody);
        outside.registration = None;
        let s = snapshot(
            2,
            vec![gpu(0, GPU0, vec![ambiguous, outside])],
            vec![(a(), slice("a", MEM_1G)), (b(), slice("b", MEM_1G))],
        );
        let mut h = History::default();
        h.first_unregistered.insert((7, 70), 1);
        let (v, _) = judge(&s, &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert!(groups(&s.gpus[0]).is_empty());
    }

    #[test]
    fn memory_over_quota_kills_the_newest_and_a_quota_given_by_index_is_never_acted_on() {
        let at = |q: &str| {
            let mut old = process(10, 100, 600 << 20, Owner::Slice(a()));
            let mut new = process(20, 200, 2 * G, Owner::Slice(a()));
            for p in [&mut old, &mut new] {
                p.registration = None;
            }
            snapshot(
                1,
                vec![gpu(0, GPU0, vec![old, new])],
                vec![(a(), slice("a", q))],
            )
        };
        let kill = policy(Policy::Kill);
        let (v, _) = judge(&at(MEM_1G), &History::default(), &kill);
        assert_eq!(
            cases(&v),
            [&Case::Memory {
                kill: vec![(20, 200)],
                certain: true
            }]
        );
        let Verdict::Found { view, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(
            view.what,
            "container a pids 10,20: GPU 0 memory 2.6 GiB > quota 1.0 GiB (+64 MiB tolerance, +64 MiB per process)"
        );
        use crate::watch::act::{Action, decide};
        assert_eq!(decide(&v[0], &kill), Action::KillNewest(vec![(20, 200)]));
        // Stopping a process gives no memory back: reported under freeze.
        assert_eq!(decide(&v[0], &policy(Policy::Freeze)), Action::Report);
        assert_eq!(decide(&v[0], &policy(Policy::Report)), Action::Report);
        // By UUID: this GPU's for sure. By index: NVML's index need not
        // be the GPU the container calls so.
        let by_uuid = format!("[device.\"{}\"]\nmemory = \"1GiB\"\n", format_uuid(&GPU0));
        let (v, _) = judge(&at(&by_uuid), &History::default(), &kill);
        assert!(matches!(
            cases(&v)[..],
            [Case::Memory { certain: true, .. }]
        ));
        let (v, _) = judge(
            &at("[device.0]\nmemory = \"1GiB\"\n"),
            &History::default(),
            &kill,
        );
        assert!(matches!(
            cases(&v)[..],
            [Case::Memory { certain: false, .. }]
        ));
        assert_eq!(
            decide(&v[0], &kill),
            Action::Hold("not acted on: the quota file gives this quota by index".into())
        );
        // Within the quota and its allowances: nothing.
        let (v, _) = judge(
            &at("[all]\nmemory = \"3GiB\"\n"),
            &History::default(),
            &kill,
        );
        assert!(v.is_empty(), "{v:?}");
    }

    /// Slice a (share 20, ceiling 40 where `ceiling`) at `a_pct` of the
    /// GPU, slice b (share 70) at 45% asking for `demand` per mille, last
    /// active `idle` ago.
    fn two_tenants(pass: u64, a_pct: f64, ceiling: bool, demand: u32, idle: u64) -> Snapshot {
        let mut pa = process(10, 100, G / 4, Owner::Slice(a()));
        pa.sm = Some(a_pct);
        pa.registration = None;
        let mut pb = process(20, 200, G / 4, Owner::Slice(b()));
        pb.sm = Some(45.0);
        pb.registration = None;
        let mut sa = slice(
            "a",
            if ceiling {
                "[all]\ncompute = 20\ncompute_max = 40\n"
            } else {
                "[all]\ncompute = 20\n"
            },
        );
        sa.gpu_tenant.insert(0, TenantReading::default());
        let mut sb = slice("b", "[all]\ncompute = 70\n");
        sb.gpu_tenant.insert(
            0,
            TenantReading {
                throttled_ns: 0,
                demand_pm: demand,
                last_activity: NOW - idle,
            },
        );
        snapshot(
            pass,
            vec![gpu(0, GPU0, vec![pa, pb])],
            vec![(a(), sa), (b(), sb)],
        )
    }

    #[test]
    fn compute_is_found_only_over_compute_sustain_passes_in_a_row() {
        let cfg = policy(Policy::Kill);
        assert_eq!(cfg.compute_sustain, 2);
        // 75% against a 40% ceiling (+10, +10 for its bursts over one
        // 2 s pass): over, in every pass.
        let (v, h) = judge(&two_tenants(1, 75.0, true, 0, 0), &History::default(), &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(h.sustain.get(&(a(), 0)), Some(&1));
        let (v, h) = judge(&two_tenants(2, 75.0, true, 0, 0), &h, &cfg);
        assert!(
            matches!(&cases(&v)[..], [Case::Compute { slice, gpu: 0, pids, certain: true, forged: false }]
                if *slice == a() && pids == &[(10, 100)]),
            "{v:?}"
        );
        let Verdict::Found { view, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(
            view.what,
            "container a: GPU 0 GPU time 75% > ceiling 40% (+10 points, +10 for its bursts), 2 passes in a row"
        );
        assert_eq!(
            (view.figure.as_str(), view.limit.as_str()),
            ("75%", "share 20%, ceiling 40%")
        );
        use crate::watch::act::{Action, decide};
        assert_eq!(decide(&v[0], &cfg), Action::KillSlice(vec![(10, 100)]));
        // A pass within the ceiling starts the count again.
        let (v, h) = judge(&two_tenants(3, 45.0, true, 0, 0), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(h.sustain.get(&(a(), 0)), None);
        let (v, _) = judge(&two_tenants(4, 75.0, true, 0, 0), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        // Three passes where the configuration says so.
        let three = WatchConfig {
            compute_sustain: 3,
            ..cfg
        };
        let mut h = History::default();
        for pass in 1..=3 {
            let (v, next) = judge(&two_tenants(pass, 75.0, true, 0, 0), &h, &three);
            assert_eq!(v.is_empty(), pass < 3, "pass {pass}: {v:?}");
            h = next;
        }
    }

    #[test]
    fn a_ceiling_is_judged_over_two_cycles_of_its_burst() {
        // Two cycles of a tenant held to its ceiling (run the burst at full
        // speed, pause until it is saved up again): 50% with 200 ms, 400 +
        // 400 ms; 10%, 222 + 2000 ms; a 1% ceiling with a 10 s burst is
        // capped at a minute.
        assert_eq!(ceiling_passes(50, 200_000_000, 250_000_000), 7);
        assert_eq!(ceiling_passes(50, 200_000_000, 2_000_000_000), 1);
        assert_eq!(ceiling_passes(10, 200_000_000, 1_000_000_000), 5);
        assert_eq!(ceiling_passes(1, 10_000_000_000, 1_000_000_000), 60);
    }

    #[test]
    fn a_ceilings_slack_is_what_its_bursts_can_show_over_its_window() {
        // 50 %, 200 ms burst: cycles of 800 ms, judged over 7 passes of
        // 250 ms: 0.25 * 800 / 1750 = 11.4 points.
        let s = ceiling_slack(50, 200_000_000, 250_000_000);
        assert!((s - 11.43).abs() < 0.01, "{s}");
        // Whole passes of 2 s, one of them: never more than 1 - c.
        assert!((ceiling_slack(50, 200_000_000, 2_000_000_000) - 10.0).abs() < 0.01);
        assert!(ceiling_slack(90, 10_000_000_000, 1_000_000_000) <= 10.0);
        // Held to 50 % and seen at 60 % over its window: within; a tenant
        // around the limiter at 80 %: over.
        let mut held = cs("a", 60.0, Some(20), Some(50), None);
        held.ceiling_slack = s;
        assert!(compute_over(&[held.clone()], 10, 10).is_empty());
        held.ceiling_percent = Some(80.0);
        assert_eq!(
            compute_over(&[held], 10, 10)[0].1,
            "GPU time 80% > ceiling 50% (+10 points, +11 for its bursts)"
        );
        assert_eq!(ceiling_passes(40, 200_000_000, 2_000_000_000), 1);
        // Passes of 250 ms at a 50% ceiling: a well-behaved tenant runs
        // two passes at full speed and pauses two, again and again: never
        // found. One at 80% all along is, once a window is seen.
        let cfg = WatchConfig {
            interval: std::time::Duration::from_millis(250),
            ..policy(Policy::Kill)
        };
        let with = |pass: u64, pct: f64| {
            let mut s = two_tenants(pass, pct, true, 0, 0);
            let sa = s.slices.get_mut(&a()).expect("a");
            sa.quota = Some(quota("[all]\ncompute = 20\ncompute_max = 50\n"));
            s
        };
        let mut h = History::default();
        for pass in 1..=40 {
            let pct = if pass % 4 < 2 { 100.0 } else { 0.0 };
            let (v, next) = judge(&with(pass, pct), &h, &cfg);
            assert!(v.is_empty(), "pass {pass}: {v:?}");
            h = next;
        }
        let mut h = History::default();
        let mut found = None;
        for pass in 1..=10 {
            let (v, next) = judge(&with(pass, 80.0), &h, &cfg);
            if !v.is_empty() && found.is_none() {
                found = Some(pass);
            }
            h = next;
        }
        assert_eq!(found, Some(8), "judged from pass 7, sustained at 8");
    }

    #[test]
    fn a_demand_counts_only_while_it_is_current_and_its_tenant_is_not_frozen() {
        // a takes 55% on a share of 20; b (share 70) gets 45% and never
        // waits for the lease, but asks for all of the GPU.
        let cfg = WatchConfig {
            compute_sustain: 1,
            ..policy(Policy::Kill)
        };
        let window = cuslice_core::gpu::DEMAND_WINDOW_NS;
        let current = two_tenants(1, 55.0, false, 1000, window);
        let (v, _) = judge(&current, &History::default(), &cfg);
        let Verdict::Found { view, .. } = &v[0] else {
            panic!("{v:?}")
        };
        assert!(
            view.what
                .ends_with("while b got 45% of its 70% and asked for 100%, 1 passes in a row"),
            "{}",
            view.what
        );
        // b's last launch was three windows ago: its figure is stale (an
        // idle service keeps its last demand in the segment).
        let stale = two_tenants(1, 55.0, false, 1000, 3 * window);
        assert!(judge(&stale, &History::default(), &cfg).0.is_empty());
        // b is frozen: what it asked before is no demand now.
        let mut h = History::default();
        h.frozen.insert((b(), 0));
        let (v, _) = judge(&current, &h, &cfg);
        assert!(cases(&v).is_empty(), "{v:?}");
    }

    #[test]
    fn the_time_a_tenant_waited_is_its_throttled_time_since_the_last_pass() {
        let cfg = WatchConfig {
            compute_sustain: 1,
            ..policy(Policy::Report)
        };
        let at = |throttled| {
            let mut s = two_tenants(2, 55.0, false, 0, 0);
            s.slices
                .get_mut(&b())
                .expect("b")
                .gpu_tenant
                .get_mut(&0)
                .expect("entry")
                .throttled_ns = throttled;
            s
        };
        // The last pass, a second ago, saw 1 s throttled.
        let mut h = History::default();
        h.throttled
            .insert((format_uuid(&GPU0), b()), (NOW - SECOND, SECOND));
        // 400 ms more: b waited 40% of the interval.
        let (v, next) = judge(&at(SECOND + 400_000_000), &h, &cfg);
        let Verdict::Found { view, .. } = &v[0] else {
            panic!("{v:?}")
        };
        assert!(
            view.what.contains("and waited 40% of the interval"),
            "{}",
            view.what
        );
        assert_eq!(
            next.throttled.get(&(format_uuid(&GPU0), b())),
            Some(&(NOW, SECOND + 400_000_000))
        );
        // 50 ms: under `compute_wait` (10%).
        assert!(judge(&at(SECOND + 50_000_000), &h, &cfg).0.is_empty());
        // No earlier figure: unknown, not zero.
        assert!(
            judge(&at(SECOND + 400_000_000), &History::default(), &cfg)
                .0
                .is_empty()
        );
    }

    #[test]
    fn a_frozen_slices_compute_finding_stands_without_being_judged() {
        let cfg = policy(Policy::Freeze);
        let mut h = History::default();
        h.frozen.insert((a(), 0));
        h.sustain.insert((a(), 0), 1);
        let (v, next) = judge(&two_tenants(5, 75.0, true, 0, 0), &h, &cfg);
        assert_eq!(
            v,
            [Verdict::Stands((
                Kind::Compute,
                "container:aaa".into(),
                Some(0),
                None
            ))]
        );
        assert_eq!(next.sustain, h.sustain);
    }

    #[test]
    fn compute_on_a_gpu_whose_segment_was_tampered_with_lately_is_reported_only() {
        use crate::watch::act::{Action, decide};
        let cfg = WatchConfig {
            compute_sustain: 1,
            ..policy(Policy::Kill)
        };
        let at = |ago: u64| {
            let mut h = History::default();
            h.tampered.insert(0, NOW - ago);
            let (v, _) = judge(&two_tenants(1, 75.0, true, 0, 0), &h, &cfg);
            assert_eq!(v.len(), 1, "{v:?}");
            decide(&v[0], &cfg)
        };
        assert_eq!(
            at(9 * SECOND),
            Action::Hold(
                "not acted on: GPU 0's segment was tampered with within 10s (the split may be forged)"
                    .into()
            )
        );
        assert_eq!(at(11 * SECOND), Action::KillSlice(vec![(10, 100)]));
        // Another GPU's tamper says nothing about this one.
        let mut h = History::default();
        h.tampered.insert(1, NOW);
        let (v, _) = judge(&two_tenants(1, 75.0, true, 0, 0), &h, &cfg);
        assert!(matches!(
            cases(&v)[..],
            [Case::Compute { forged: false, .. }]
        ));
    }

    #[test]
    fn a_share_given_by_index_is_reported_only_in_every_policy() {
        use crate::watch::act::{Action, decide};
        let cfg = WatchConfig {
            compute_sustain: 1,
            ..policy(Policy::Report)
        };
        let mut s = two_tenants(1, 75.0, true, 0, 0);
        s.slices.get_mut(&a()).expect("a").quota =
            Some(quota("[device.0]\ncompute = 20\ncompute_max = 40\n"));
        let (v, _) = judge(&s, &History::default(), &cfg);
        assert!(matches!(
            cases(&v)[..],
            [Case::Compute { certain: false, .. }]
        ));
        for p in [Policy::Report, Policy::Kill, Policy::Freeze] {
            assert_eq!(
                decide(&v[0], &policy(p)),
                Action::Hold(
                    "not acted on: the quota file gives this share or ceiling by index".into()
                )
            );
        }
    }

    #[test]
    fn a_compute_finding_not_acted_on_stands_and_one_acted_on_must_last_again() {
        use crate::watch::act::{acted_on, decide};
        // Judge, decide and leave to the next pass, as the watch does; the
        // passes in which the slice's compute finding is found.
        let found_in = |q: &str, p: Policy| {
            let cfg = policy(p);
            let mut h = History::default();
            let mut found = vec![];
            for pass in 1..=5 {
                let mut s = two_tenants(pass, 75.0, true, 0, 0);
                s.slices.get_mut(&a()).expect("a").quota = Some(quota(q));
                let (v, mut next) = judge(&s, &h, &cfg);
                for v in &v {
                    if let Verdict::Found { case, .. } = v {
                        acted_on(&mut next, case, &decide(v, &cfg));
                        found.push(pass);
                    }
                }
                h = next;
            }
            found
        };
        let by_uuid = format!(
            "[device.\"{}\"]\ncompute = 20\ncompute_max = 40\n",
            format_uuid(&GPU0)
        );
        let by_index = "[device.0]\ncompute = 20\ncompute_max = 40\n";
        // Reported, or not acted on: found in every pass once sustained.
        assert_eq!(found_in(&by_uuid, Policy::Report), [2, 3, 4, 5]);
        assert_eq!(found_in(by_index, Policy::Kill), [2, 3, 4, 5]);
        // Killed: it must last two passes again (here the fake slice
        // lives on).
        assert_eq!(found_in(&by_uuid, Policy::Kill), [2, 4]);
    }

    fn entry(index: usize, uuid: [u8; 16], state: u32, limit: u64) -> RawDevice {
        RawDevice {
            index,
            state,
            uuid,
            limit,
            used: 0,
        }
    }

    #[test]
    fn a_memory_segments_entries_are_held_to_the_quota_file_whatever_their_state_or_uuid() {
        use crate::watch::act::{Action, decide};
        let cfg = policy(Policy::Report);
        let at = |q: &str, e: RawDevice| {
            let mut s = slice("a", q);
            s.mem_entries = Some(vec![e]);
            judge(
                &snapshot(1, vec![], vec![(a(), s)]),
                &History::default(),
                &cfg,
            )
            .0
        };
        // As the file says: nothing.
        assert!(at(MEM_1G, entry(0, GPU0, READY_STATE, G)).is_empty());
        // Raised: put back, with its UUID and state.
        let v = at(MEM_1G, entry(0, GPU0, READY_STATE, 2 * G));
        assert_eq!(
            cases(&v),
            [&Case::MemorySegment {
                slice: a(),
                entry: 0,
                uuid: Some(GPU0),
                limit: G,
                certain: true
            }]
        );
        let Verdict::Found { key, view, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(key.2, Some(0));
        assert_eq!(
            view.what,
            "container a: memory segment /run/cuslice/containers/a/segment/memory.seg says GPU 0 quota 2.0 GiB, its quota file 1.0 GiB"
        );
        assert_eq!(
            decide(&v[0], &cfg),
            Action::RestoreQuota {
                slice: a(),
                entry: 0,
                uuid: Some(GPU0),
                limit: G
            }
        );
        let no_repair = WatchConfig {
            repair: false,
            ..cfg.clone()
        };
        assert_eq!(decide(&v[0], &no_repair), Action::Report);
        // The right limit, its state word overwritten (the shim keeps
        // admitting against it): found too.
        let v = at(MEM_1G, entry(0, GPU0, READY_STATE + 7, G));
        let Verdict::Found { view, .. } = &v[0] else {
            panic!("{v:?}")
        };
        assert!(
            view.what.ends_with(
                "says GPU 0 quota 1073741824 bytes in an entry whose state word was overwritten, its quota file 1073741824 bytes"
            ),
            "{}",
            view.what
        );
        // A UUID byte flipped: no GPU of this host; held to what the file
        // gives every GPU, its UUID left as it is.
        let mut flipped = GPU0;
        flipped[15] ^= 1;
        let v = at(MEM_1G, entry(3, flipped, READY_STATE, 100 * G));
        assert_eq!(
            cases(&v),
            [&Case::MemorySegment {
                slice: a(),
                entry: 3,
                uuid: None,
                limit: G,
                certain: true
            }]
        );
        let Verdict::Found { key, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(key.2, Some(1003));
        // A quota given by index: reported, never restored.
        let v = at(
            "[device.0]\nmemory = \"1GiB\"\n",
            entry(0, GPU0, READY_STATE, 2 * G),
        );
        assert_eq!(
            decide(&v[0], &cfg),
            Action::Hold("not restored (the quota file gives it by index)".into())
        );
    }

    #[test]
    fn a_tampered_gpu_segment_is_a_finding_per_value_repaired_at_once_and_marks_its_gpu() {
        use crate::watch::act::{Action, decide};
        let cfg = policy(Policy::Report);
        let path = PathBuf::from("/run/cuslice/gpu/GPU-x.seg");
        let reading = |found| GpuSegReading {
            path: path.clone(),
            gpu: 1,
            expected: vec![],
            at_ns: NOW,
            found,
        };
        let what = "tenant a: share 90, its quota file 30 (tenant-config)".to_string();
        let mut s = snapshot(1, vec![], vec![]);
        s.gpu_segments = vec![
            reading(Ok(vec![])),
            reading(Ok(vec![("a".into(), what.clone())])),
            reading(Err("cannot open".into())),
        ];
        let (v, h) = judge(&s, &History::default(), &cfg);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[1], Verdict::Unseen("cannot open".into()));
        assert_eq!(h.tampered, HashMap::from([(1, NOW)]));
        assert_eq!(
            decide(&v[0], &cfg),
            Action::RepairGpuSegment {
                path: path.clone(),
                expected: vec![],
                at_ns: NOW
            }
        );
        let no_repair = WatchConfig {
            repair: false,
            ..cfg
        };
        assert_eq!(decide(&v[0], &no_repair), Action::Report);
        let f = gpu_segment_findings(&path, 1, &[("a".into(), what.clone())]);
        assert_eq!(
            f[0].0,
            (
                Kind::GpuSegment,
                "/run/cuslice/gpu/GPU-x.seg:a:tenant-config)".to_string(),
                Some(1),
                None
            )
        );
        assert_eq!(
            f[0].1.what,
            format!("GPU segment {}: {what}", path.display())
        );
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(640 << 20), "640 MiB");
    }
}
