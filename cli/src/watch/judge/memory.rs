//! Memory: a slice's processes on a GPU over its quota there (NVML's
//! figures summed, against the quota plus a tolerance plus an allowance
//! per process), and which of them to kill: the newest first, until the
//! rest is allowed again. Nothing carried between passes.

use super::verdict::{Case, Verdict, size, slice_key, view};
use crate::host::watch_state::Kind;
use crate::watch::config::WatchConfig;
use crate::watch::slices::SliceId;
use crate::watch::snapshot::{GpuSnap, PoolReading, ProcSnap, SliceSnap};
use crate::watch::tenant::memory_quota;

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
    // A tenant that may burst past its guarantee is held to what it
    // publishes in the GPU's memory pool, its guarantee plus its burst
    // (less, if it under-reports, than what its processes hold), and never
    // to more than the GPU's memory less every other tenant's guarantee
    // and burst (a burst it wrote there itself, past the room the pool had,
    // takes nothing from anyone): always to at least its guarantee.
    let l = q.limits_for(gpu.index, uuid);
    let held = l.memory.filter(|g| *g < quota).map(|g| {
        let p = slice.pool.get(&gpu.index).copied().unwrap_or(PoolReading {
            published: g,
            room: u64::MAX,
        });
        p.published.min(p.room).max(g).min(quota)
    });
    let quota = held.unwrap_or(quota);
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
        "{} pid{} {}: GPU {} memory {} > {} {} (+{} tolerance, +{} per process)",
        slice.label,
        if pids.len() == 1 { "" } else { "s" },
        pids.join(","),
        gpu.index,
        size(over.used),
        if held.is_some() {
            "its guarantee and the burst it holds in the GPU's memory pool"
        } else {
            "quota"
        },
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
    use cuslice_core::config::format_uuid;

    const M: u64 = 1 << 20;

    /// A tenant that may burst is held to its published guarantee and
    /// burst, and never past the GPU's memory less the others' (a burst it
    /// forged in the pool); always allowed its guarantee.
    #[test]
    fn a_bursting_tenant_is_held_to_its_published_burst_and_to_the_room_the_others_leave() {
        let cfg = policy(Policy::Report);
        let q = "[all]\nmemory = \"1GiB\"\nmemory_max = \"4GiB\"\n";
        let judge_at = |used: u64, published: u64, room: u64| {
            let mut sl = slice("a", q);
            if published > 0 {
                sl.pool.insert(0, PoolReading { published, room });
            }
            let g = gpu(
                0,
                GPU0,
                vec![process(
                    7,
                    70,
                    used,
                    crate::watch::slices::Owner::Slice(a()),
                )],
            );
            let procs: Vec<&ProcSnap> = g.procs.iter().collect();
            memory(&g, &a(), &sl, &procs, &cfg)
                .into_iter()
                .collect::<Vec<_>>()
        };
        // Honest: 2.5 GiB held, 3 GiB published, room for 3.5.
        assert!(judge_at(5 * G / 2, 3 * G, 7 * G / 2).is_empty());
        // Under-reported: 2.5 GiB held, 1.5 published.
        let v = judge_at(5 * G / 2, 3 * G / 2, 7 * G / 2);
        assert_eq!(v.len(), 1, "{v:?}");
        // Forged: 3 GiB published, but the others leave room for 2.
        let v = judge_at(5 * G / 2, 3 * G, 2 * G);
        assert_eq!(v.len(), 1, "{v:?}");
        // Guaranteed memory is always allowed, whatever the pool says.
        assert!(judge_at(G, G / 2, G / 2).is_empty());
        // No entry in the pool: held to its guarantee.
        assert_eq!(judge_at(2 * G, 0, 0).len(), 1);
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
