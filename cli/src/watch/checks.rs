//! The findings' arithmetic, on figures already gathered: no I/O here.

use cuslice_core::config::format_size;

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

/// The slices (indices into `seen`) that take markedly more GPU time than
/// they may, and why: over their ceiling by more than `margin` points, or
/// over their share by more than `margin` while another slice with a share
/// got less than its own and wanted more: it waited at least `wait` percent
/// of the interval, or asked for at least its share.
pub fn compute_over(seen: &[ComputeSeen], margin: u32, wait: u32) -> Vec<(usize, String)> {
    let m = f64::from(margin);
    let mut out = vec![];
    for (i, s) in seen.iter().enumerate() {
        if let Some(c) = s.ceiling.filter(|c| *c < 100)
            && s.gpu_percent > f64::from(c) + m
        {
            out.push((
                i,
                format!(
                    "GPU time {:.0}% > ceiling {c}% (+{margin} points)",
                    s.gpu_percent
                ),
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
            vec![(0, "GPU time 55% > ceiling 40% (+10 points)".to_string())]
        );
        assert!(compute_over(&[cs("a", 49.0, Some(40), Some(40), None)], 10, 10).is_empty());
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
                    .to_string()
            )]
        );
        assert!(asked(40.0).is_empty());
        // No share configured: nothing to hold it to.
        assert!(compute_over(&[cs("a", 100.0, None, None, None)], 10, 10).is_empty());
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(640 << 20), "640 MiB");
    }
}
