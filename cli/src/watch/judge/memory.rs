//! Memory: a slice's processes on a GPU over what it may hold there
//! (NVML's figures summed, against that plus a tolerance plus an
//! allowance per process), and which of them to kill: the newest first,
//! until the rest is allowed again.
//!
//! What a slice may hold: its quota; for one that may burst (`memory_max`
//! above its guarantee `memory`), its guarantee plus the burst the watch
//! granted it ([`grants`]), never more than the burst it publishes in the
//! GPU's memory pool (its own claim: it can only lower the figure). The
//! grant is decided from what root trusts alone: the GPU's memory as NVML
//! gives it, NVML's per-process figures, the guarantees of the quota files
//! and the watch's own record of its grants (its part of the history).
//! The pool is writable by every tenant: its capacity and the other
//! tenants' entries decide nothing here.

use std::collections::{BTreeMap, BTreeSet};

use cuslice_core::pool::LINGER_NS;

use super::verdict::{Case, Verdict, size, slice_key, view};
use crate::watch::config::WatchConfig;
use crate::watch::slices::SliceId;
use crate::watch::snapshot::{GpuSnap, ProcSnap, SliceSnap, Snapshot};
use crate::watch::tenant::memory_quota;
use cuslice_host::watch_state::Kind;

/// What memory leaves to the next pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Per slice and GPU index: the burst the watch granted it there
    /// (bytes past its guarantee).
    pub granted: BTreeMap<(SliceId, u32), u64>,
    /// Per slice and GPU index: when (CLOCK_MONOTONIC ns) a pass last saw
    /// a process of it there. Its guarantee counts for [`LINGER_NS`]
    /// after, as the pool keeps a tenant's entry after its last process.
    pub last_on: BTreeMap<(SliceId, u32), u64>,
    /// Per GPU index judged before: the slices whose guarantee the last
    /// pass counted there (one not in it is a late arrival).
    pub counted: BTreeMap<u32, BTreeSet<SliceId>>,
}

impl History {
    /// Forgets the slices that are gone.
    pub fn forget_gone(&mut self, snap: &Snapshot) {
        self.granted
            .retain(|(id, _), _| snap.slices.contains_key(id));
        self.last_on
            .retain(|(id, _), _| snap.slices.contains_key(id));
        for s in self.counted.values_mut() {
            s.retain(|id| snap.slices.contains_key(id));
        }
    }
}

/// What a slice that may burst may hold on a GPU this pass, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Its guarantee (`memory`).
    pub guarantee: u64,
    /// Its quota (`memory_max`).
    pub max: u64,
    /// The burst the watch grants it ([`grant`]).
    pub granted: u64,
    /// The burst it publishes in the pool (0: no entry).
    pub published: u64,
}

/// Which bound a slice is held to: what a finding says it broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Its quota (no burst).
    Quota,
    /// Its `memory_max`.
    MemoryMax,
    /// Its guarantee and the burst it publishes in the pool (less than the
    /// watch would grant: an under-reported burst).
    Published,
    /// Its guarantee and the burst the watch granted it.
    Granted,
}

impl Held {
    /// Its guarantee plus its granted burst, never past what it publishes
    /// nor its `memory_max`; always at least its guarantee.
    pub fn limit(&self) -> (u64, Bound) {
        let burst = self.granted.min(self.published);
        let l = self.guarantee.saturating_add(burst);
        if l >= self.max {
            (self.max.max(self.guarantee), Bound::MemoryMax)
        } else if self.published < self.granted {
            (l, Bound::Published)
        } else {
            (l, Bound::Granted)
        }
    }
}

/// The burst a slice is granted on a GPU this pass, of `burst` it holds
/// now (its use past its guarantee), `prev` the grant it had (None: none
/// yet), `first`: the watch's first pass on this GPU, `fits`: whether the
/// whole burst fits in the room NVML shows ([`fits`]). A first pass grants
/// what it finds (a watch started late cannot tell who came first); after
/// that a grant only shrinks to what is held (memory freed is given back)
/// and grows only into room.
pub fn grant(prev: Option<u64>, burst: u64, first: bool, fits: bool) -> u64 {
    if first {
        return burst;
    }
    let kept = prev.unwrap_or(0).min(burst);
    if burst > kept && fits { burst } else { kept }
}

/// Whether a slice guaranteed `guarantee` holding `burst` past it fits
/// beside `others` (what the others hold or are guaranteed) in
/// `capacity` (NVML's figure; None: unknown, nothing fits), with `slack`
/// (the tolerance and per-process allowance a finding allows, so that
/// NVML's figures and the pool's accounting, which differ by a context's
/// memory, do not refuse a burst the pool gave).
pub fn fits(capacity: Option<u64>, guarantee: u64, burst: u64, others: u64, slack: u64) -> bool {
    capacity.is_some_and(|c| {
        guarantee.saturating_add(burst).saturating_add(others) <= c.saturating_add(slack)
    })
}

/// One holder of memory on a GPU, for the grants.
struct Holder<'a> {
    /// None: processes of no slice with a memory quota here (g = 0).
    id: Option<&'a SliceId>,
    /// Its guarantee here, where it counts (else 0).
    g: u64,
    /// What its processes hold (NVML).
    u: u64,
    /// Its guarantee is counted this pass and was not the pass before:
    /// a late arrival.
    new: bool,
}

impl Holder<'_> {
    /// What it takes from the room: its guarantee, or more if it holds
    /// more; `doubt`: a late arrival's guarantee left out (a burst taken in
    /// the same interval may have come first).
    fn takes(&self, doubt: bool) -> u64 {
        if doubt && self.new {
            self.u
        } else {
            self.g.max(self.u)
        }
    }
}

/// The grants on `gpu` this pass: for each slice that may burst there,
/// what it may hold ([`Held`]); updates `next`'s record.
///
/// Every slice whose quota covers the GPU counts its guarantee while it
/// holds it: a process of it is on the GPU, or was within [`LINGER_NS`]
/// (the pool keeps the guarantee of a tenant whose processes are gone as
/// long), or it has an entry in the GPU's pool (registered ahead of its
/// first process; an entry can only add a guarantee, never take one
/// away). A slice with only a quota file is not counted: the pool has not
/// counted it either, so a burst taken meanwhile is legal. Processes of
/// no slice with a memory quota here count what they hold.
pub fn grants(
    snap: &Snapshot,
    gpu: &GpuSnap,
    groups: &BTreeMap<&SliceId, Vec<&ProcSnap>>,
    prev: &History,
    next: &mut History,
    cfg: &WatchConfig,
) -> BTreeMap<SliceId, Held> {
    let idx = gpu.index;
    let first = !prev.counted.contains_key(&idx);
    let before = prev.counted.get(&idx);
    let used = |procs: &[&ProcSnap]| -> u64 {
        procs
            .iter()
            .filter_map(|p| p.used)
            .fold(0u64, u64::saturating_add)
    };
    let mut holders: Vec<Holder> = vec![];
    // Burst-able slices here: (id, guarantee, memory_max, processes).
    let mut borrowers: Vec<(&SliceId, u64, u64, usize)> = vec![];
    let mut counted = BTreeSet::new();
    let mut mine_u = 0u64;
    next.granted.retain(|(_, i), _| *i != idx);
    for (id, slice) in &snap.slices {
        let (Some(q), Some(uuid)) = (&slice.quota, &gpu.uuid_bytes) else {
            continue;
        };
        let (Some(quota), _) = memory_quota(q, idx, uuid) else {
            continue;
        };
        let g = q.limits_for(idx, uuid).memory.unwrap_or(quota).min(quota);
        let procs = groups.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let u = used(procs);
        mine_u = mine_u.saturating_add(u);
        let key = (id.clone(), idx);
        if !procs.is_empty() {
            next.last_on.insert(key.clone(), snap.now_ns);
        }
        let lingers = next
            .last_on
            .get(&key)
            .is_some_and(|t| snap.now_ns.saturating_sub(*t) < LINGER_NS);
        if !lingers {
            next.last_on.remove(&key);
        }
        let holds = lingers || slice.pool.contains_key(&idx);
        if holds {
            counted.insert(id.clone());
        }
        holders.push(Holder {
            id: Some(id),
            g: if holds { g } else { 0 },
            u,
            new: holds && !before.is_some_and(|b| b.contains(id)),
        });
        if g < quota {
            borrowers.push((id, g, quota, procs.len()));
        }
    }
    // Everything else on the GPU: processes of no slice, of several, of a
    // slice without a memory quota here.
    let rest = used(&gpu.procs.iter().collect::<Vec<_>>()).saturating_sub(mine_u);
    holders.push(Holder {
        id: None,
        g: 0,
        u: rest,
        new: false,
    });
    let mut out = BTreeMap::new();
    for (id, g, max, n) in borrowers {
        let mine = |h: &&Holder| h.id == Some(id);
        let u = holders.iter().find(mine).map_or(0, |h| h.u);
        let others = holders
            .iter()
            .filter(|h| h.id != Some(id))
            .map(|h| h.takes(true))
            .fold(0u64, u64::saturating_add);
        let burst = u.saturating_sub(g);
        let slack = cfg
            .memory_tolerance
            .saturating_add(cfg.process_allowance.saturating_mul(n as u64));
        let key = (id.clone(), idx);
        let granted = grant(
            prev.granted.get(&key).copied(),
            burst,
            first,
            fits(gpu.memory_total, g, burst, others, slack),
        );
        next.granted.insert(key, granted);
        let published = snap
            .slices
            .get(id)
            .and_then(|s| s.pool.get(&idx))
            .map_or(0, |p| p.burst);
        out.insert(
            id.clone(),
            Held {
                guarantee: g,
                max,
                granted,
                published,
            },
        );
    }
    next.counted.insert(idx, counted);
    out
}

/// `memory`: the slice's processes on this GPU over what it may hold
/// there (`held`, for a slice that may burst; else its quota), per
/// [`memory_over`].
pub fn memory(
    gpu: &GpuSnap,
    id: &SliceId,
    slice: &SliceSnap,
    procs: &[&ProcSnap],
    held: Option<&Held>,
    cfg: &WatchConfig,
) -> Option<Verdict> {
    let (Some(q), Some(uuid)) = (&slice.quota, &gpu.uuid_bytes) else {
        return None;
    };
    let (Some(quota), certain) = memory_quota(q, gpu.index, uuid) else {
        return None;
    };
    let (limit, bound) = held.map_or((quota, Bound::Quota), Held::limit);
    let seen: Vec<Seen> = procs
        .iter()
        .map(|p| Seen {
            pid: p.pid,
            start: p.start,
            used: p.used,
        })
        .collect();
    let over = memory_over(&seen, limit, cfg.memory_tolerance, cfg.process_allowance)?;
    let pids: Vec<String> = procs.iter().map(|p| p.pid.to_string()).collect();
    let what = format!(
        "{} pid{} {}: GPU {} memory {} > {} {} (+{} tolerance, +{} per process)",
        slice.label,
        if pids.len() == 1 { "" } else { "s" },
        pids.join(","),
        gpu.index,
        size(over.used),
        match bound {
            Bound::Quota => "quota",
            Bound::MemoryMax => "its memory_max",
            Bound::Published => "its guarantee and the burst it publishes in the GPU's memory pool",
            Bound::Granted =>
                "its guarantee and the burst the watch granted it (from the room NVML showed beside the others' guarantees)",
        },
        size(limit),
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
            size(limit),
            what,
        ),
        case: Case::Memory {
            kill: over.kill,
            certain,
        },
    })
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{History, judge};
    use super::*;
    use crate::watch::config::Policy;
    use crate::watch::slices::Owner;
    use crate::watch::snapshot::PoolReading;
    use cuslice_core::config::format_uuid;

    const M: u64 = 1 << 20;

    fn c() -> SliceId {
        SliceId::Container("ccc".into())
    }

    /// One slice on GPU 0: its id, its quota file, what its process holds
    /// (None: no process), the burst its pool entry publishes (None: no
    /// entry).
    type On<'a> = (SliceId, &'a str, Option<u64>, Option<u64>);

    /// Pass `pass` on GPU 0 of `total` bytes (NVML's figure): each slice's
    /// process (PID 10, 20, ... in `on`'s order, registered or not looked
    /// at) and pool entry.
    fn on_gpu(pass: u64, total: u64, on: &[On]) -> Snapshot {
        let mut procs = vec![];
        let mut slices = vec![];
        for (i, (id, q, used, pool)) in on.iter().enumerate() {
            let SliceId::Container(name) = id else {
                unreachable!()
            };
            let mut sl = slice(name, q);
            if let Some(burst) = pool {
                sl.pool.insert(0, PoolReading { burst: *burst });
            }
            slices.push((id.clone(), sl));
            if let Some(u) = used {
                let n = 10 * (i as u32 + 1);
                let mut p = process(n, 100 * u64::from(n), *u, Owner::Slice(id.clone()));
                p.registration = None;
                procs.push(p);
            }
        }
        let mut g = gpu(0, GPU0, procs);
        g.memory_total = Some(total);
        let mut s = snapshot(pass, vec![g], slices);
        s.now_ns = NOW + pass * 2 * SECOND;
        s
    }

    /// A memory finding's text and the processes it kills.
    type Finding = (String, Vec<(u32, u64)>);

    /// Judges `passes` in order from a watch that starts with the first;
    /// per pass, the memory findings' texts and what they kill.
    fn watch(passes: &[Snapshot]) -> Vec<Vec<Finding>> {
        let cfg = policy(Policy::Kill);
        let mut h = History::default();
        let mut out = vec![];
        for s in passes {
            let (v, next) = judge(s, &h, &cfg);
            h = next;
            out.push(
                v.iter()
                    .filter_map(|v| match v {
                        Verdict::Found {
                            view,
                            case: Case::Memory { kill, .. },
                            ..
                        } => Some((view.what.clone(), kill.clone())),
                        _ => None,
                    })
                    .collect(),
            );
        }
        out
    }

    const A: &str = "[all]\nmemory = \"20GiB\"\nmemory_max = \"100GiB\"\n";
    const B: &str = "[all]\nmemory = \"20GiB\"\n";
    const C: &str = "[all]\nmemory = \"80GiB\"\n";

    /// Issue 41 on a 140 GiB GPU: C guaranteed 80 GiB holds 1; A
    /// (20 GiB, up to 100) bursts to 59 GiB, all the room; B (20 GiB)
    /// registers after. A is not killed for B's late guarantee; A growing
    /// past the room once B's guarantee counts is found.
    #[test]
    fn a_burst_granted_before_a_late_arrival_is_never_found_and_one_taken_after_past_the_room_is() {
        let t = 140 * G;
        let seen = watch(&[
            on_gpu(
                1,
                t,
                &[(a(), A, Some(G), Some(0)), (c(), C, Some(G), Some(0))],
            ),
            on_gpu(
                2,
                t,
                &[
                    (a(), A, Some(59 * G), Some(39 * G)),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
            // B registers its guarantee in the pool, no process yet.
            on_gpu(
                3,
                t,
                &[
                    (a(), A, Some(59 * G), Some(39 * G)),
                    (b(), B, None, Some(0)),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
            // B's process comes.
            on_gpu(
                4,
                t,
                &[
                    (a(), A, Some(59 * G), Some(39 * G)),
                    (b(), B, Some(G), Some(0)),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
            // A grows by 1 GiB (its pool entry says so): no room with B's
            // guarantee counted.
            on_gpu(
                5,
                t,
                &[
                    (a(), A, Some(60 * G), Some(40 * G)),
                    (b(), B, Some(G), Some(0)),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
        ]);
        for (i, p) in seen[..4].iter().enumerate() {
            assert!(p.is_empty(), "pass {}: {p:?}", i + 1);
        }
        assert_eq!(seen[4].len(), 1, "{seen:?}");
        assert_eq!(seen[4][0].1, vec![(10, 1000)]);
        assert!(
            seen[4][0].0.contains(
                "GPU 0 memory 60.0 GiB > its guarantee and the burst the watch granted it (from the room NVML showed beside the others' guarantees) 59.0 GiB"
            ),
            "{seen:?}"
        );
    }

    /// A burst taken in the same interval as a late arrival registered
    /// may have come first: it is granted. One taken an interval after is
    /// not.
    #[test]
    fn a_burst_taken_in_the_interval_a_late_arrival_registered_is_granted_and_one_after_is_not() {
        let t = 140 * G;
        let start = on_gpu(
            1,
            t,
            &[(a(), A, Some(G), Some(0)), (c(), C, Some(G), Some(0))],
        );
        let both = |pass| {
            on_gpu(
                pass,
                t,
                &[
                    (a(), A, Some(59 * G), Some(39 * G)),
                    (b(), B, None, Some(0)),
                    (c(), C, Some(G), Some(0)),
                ],
            )
        };
        let seen = watch(&[start.clone(), both(2), both(3)]);
        assert!(seen.iter().all(Vec::is_empty), "{seen:?}");
        let b_first = on_gpu(
            2,
            t,
            &[
                (a(), A, Some(G), Some(0)),
                (b(), B, None, Some(0)),
                (c(), C, Some(G), Some(0)),
            ],
        );
        let seen = watch(&[start, b_first, both(3)]);
        assert!(seen[1].is_empty(), "{seen:?}");
        assert_eq!(seen[2].len(), 1, "{seen:?}");
    }

    /// A borrower that frees gives its grant back: taking it again while
    /// a late arrival's guarantee counts is found.
    #[test]
    fn a_burst_freed_then_taken_again_past_a_late_arrivals_guarantee_is_found() {
        let t = 140 * G;
        let at = |pass, used, burst| {
            on_gpu(
                pass,
                t,
                &[
                    (a(), A, Some(used), Some(burst)),
                    (b(), B, Some(G), Some(0)),
                    (c(), C, Some(G), Some(0)),
                ],
            )
        };
        let seen = watch(&[
            on_gpu(
                1,
                t,
                &[(a(), A, Some(G), Some(0)), (c(), C, Some(G), Some(0))],
            ),
            on_gpu(
                2,
                t,
                &[
                    (a(), A, Some(59 * G), Some(39 * G)),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
            at(3, 59 * G, 39 * G),
            at(4, 49 * G, 29 * G),
            at(5, 59 * G, 39 * G),
        ]);
        assert!(seen[..4].iter().all(Vec::is_empty), "{seen:?}");
        assert_eq!(seen[4].len(), 1, "{seen:?}");
        assert!(
            seen[4][0]
                .0
                .contains("> its guarantee and the burst the watch granted it")
        );
        assert!(seen[4][0].0.contains(" 49.0 GiB "), "{seen:?}");
    }

    /// H2: a tenant forged the pool's capacity (2^62) and took 12 GiB
    /// beside a tenant guaranteed 8 GiB on a 16 GiB GPU. The pool's
    /// capacity is not in the snapshot at all: NVML's total decides.
    #[test]
    fn a_burst_past_nvmls_memory_less_the_others_guarantees_is_found_whatever_the_pool_says() {
        let q = "[all]\nmemory = \"1GiB\"\nmemory_max = \"16GiB\"\n";
        let eight = "[all]\nmemory = \"8GiB\"\n";
        let at = |pass, total, used, burst| {
            on_gpu(
                pass,
                total,
                &[
                    (a(), q, Some(used), Some(burst)),
                    (b(), eight, Some(G), Some(0)),
                ],
            )
        };
        let seen = watch(&[at(1, 16 * G, G, 0), at(2, 16 * G, 12 * G, 11 * G)]);
        assert!(seen[0].is_empty(), "{seen:?}");
        assert_eq!(seen[1].len(), 1, "{seen:?}");
        assert!(
            seen[1][0].0.contains(
                "GPU 0 memory 12.0 GiB > its guarantee and the burst the watch granted it (from the room NVML showed beside the others' guarantees) 1.0 GiB"
            ),
            "{seen:?}"
        );
        // On a GPU NVML says has 32 GiB, the same burst fits.
        let seen = watch(&[at(1, 32 * G, G, 0), at(2, 32 * G, 12 * G, 11 * G)]);
        assert!(seen.iter().all(Vec::is_empty), "{seen:?}");
        // NVML cannot tell the GPU's memory: no burst grows.
        let mut blind = at(2, 32 * G, 12 * G, 11 * G);
        blind.gpus[0].memory_total = None;
        let seen = watch(&[at(1, 32 * G, G, 0), blind]);
        assert_eq!(seen[1].len(), 1, "{seen:?}");
    }

    /// A tenant's burst in the pool is its own claim: publishing less than
    /// it holds is found, though the room would have it.
    #[test]
    fn a_burst_published_below_what_nvml_shows_is_found() {
        let q = "[all]\nmemory = \"1GiB\"\nmemory_max = \"4GiB\"\n";
        let at = |pass, used, burst| on_gpu(pass, 16 * G, &[(a(), q, Some(used), burst)]);
        let seen = watch(&[
            at(1, G, Some(0)),
            at(2, 3 * G, Some(2 * G)),
            at(3, 3 * G, Some(G)),
            // No entry in the pool: no burst published.
            at(4, 3 * G, None),
            // Within its guarantee, whatever the pool says.
            at(5, G, None),
        ]);
        assert!(seen[..2].iter().all(Vec::is_empty), "{seen:?}");
        assert!(
            seen[2][0].0.contains(
                "GPU 0 memory 3.0 GiB > its guarantee and the burst it publishes in the GPU's memory pool 2.0 GiB"
            ),
            "{seen:?}"
        );
        assert!(seen[3][0].0.contains("pool 1.0 GiB"), "{seen:?}");
        assert!(seen[4].is_empty(), "{seen:?}");
        // Past memory_max, granted or not: its memory_max.
        let seen = watch(&[at(1, 5 * G, Some(4 * G))]);
        assert!(
            seen[0][0].0.contains("> its memory_max 4.0 GiB"),
            "{seen:?}"
        );
    }

    /// A watch's first pass on a GPU cannot tell who came first: it grants
    /// each slice the burst it finds, and holds it to that after.
    #[test]
    fn the_first_pass_grants_the_bursts_it_finds() {
        let t = 140 * G;
        let at = |pass, used, burst| {
            on_gpu(
                pass,
                t,
                &[
                    (a(), A, Some(used), Some(burst)),
                    (b(), B, Some(G), Some(0)),
                    (c(), C, Some(G), Some(0)),
                ],
            )
        };
        let seen = watch(&[
            at(1, 59 * G, 39 * G),
            at(2, 59 * G, 39 * G),
            at(3, 60 * G, 40 * G),
        ]);
        assert!(seen[..2].iter().all(Vec::is_empty), "{seen:?}");
        assert_eq!(seen[2].len(), 1, "{seen:?}");
    }

    /// A guarantee counts once its slice holds it on the GPU: a process
    /// there (or one within the pool's linger), or an entry in the pool. A
    /// container whose quota file is all there is has not registered with
    /// the pool either: a burst taken meanwhile is legal.
    #[test]
    fn a_guarantee_counts_from_its_registration_and_through_the_linger() {
        let t = 140 * G;
        // B known from its quota file alone: A's burst is granted.
        let seen = watch(&[
            on_gpu(
                1,
                t,
                &[
                    (a(), A, Some(G), Some(0)),
                    (b(), B, None, None),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
            on_gpu(
                2,
                t,
                &[
                    (a(), A, Some(59 * G), Some(39 * G)),
                    (b(), B, None, None),
                    (c(), C, Some(G), Some(0)),
                ],
            ),
        ]);
        assert!(seen.iter().all(Vec::is_empty), "{seen:?}");
        // B's process went and its pool entry was deleted (by a tenant: the
        // file is everyone's): within the linger its guarantee counts.
        let mut gone = on_gpu(
            3,
            t,
            &[
                (a(), A, Some(59 * G), Some(39 * G)),
                (b(), B, None, None),
                (c(), C, Some(G), Some(0)),
            ],
        );
        let start = on_gpu(
            1,
            t,
            &[
                (a(), A, Some(G), Some(0)),
                (b(), B, Some(G), Some(0)),
                (c(), C, Some(G), Some(0)),
            ],
        );
        // Pass 2: B's process is gone, A holds only its guarantee.
        let mut quiet = gone.clone();
        quiet.pass = 2;
        quiet.now_ns = NOW + 4 * SECOND;
        quiet.gpus[0].procs[0].used = Some(G);
        // Pass 3: A bursts into B's guarantee, within the linger.
        let seen = watch(&[start.clone(), quiet.clone(), gone.clone()]);
        assert!(seen[1].is_empty(), "{seen:?}");
        assert_eq!(seen[2].len(), 1, "{seen:?}");
        // After the linger (B's process last seen in pass 1), it does not.
        gone.now_ns = NOW + 2 * SECOND + LINGER_NS;
        let seen = watch(&[start, quiet, gone]);
        assert!(seen.iter().all(Vec::is_empty), "{seen:?}");
    }

    #[test]
    fn a_grant_shrinks_to_what_is_held_and_grows_only_into_room() {
        assert_eq!(grant(None, 5, true, false), 5);
        assert_eq!(grant(Some(5), 3, false, true), 3);
        assert_eq!(grant(Some(3), 5, false, false), 3);
        assert_eq!(grant(Some(3), 5, false, true), 5);
        assert_eq!(grant(None, 5, false, false), 0);
        assert!(fits(Some(10), 2, 3, 5, 0));
        assert!(!fits(Some(10), 2, 3, 6, 0));
        assert!(fits(Some(10), 2, 3, 6, 1));
        assert!(!fits(None, 0, 0, 0, 0));
        assert!(!fits(Some(10), u64::MAX, 1, 0, 0));
    }

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

    #[test]
    fn memory_over_quota_names_the_newest_to_kill_and_whether_its_quota_is_certain() {
        let at = memory_at;
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
        // Within the quota and its allowances: nothing.
        let (v, _) = judge(
            &at("[all]\nmemory = \"3GiB\"\n"),
            &History::default(),
            &kill,
        );
        assert!(v.is_empty(), "{v:?}");
    }
}
