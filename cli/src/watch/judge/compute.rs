//! Compute: a slice that takes markedly more GPU time on a GPU than its
//! share while another slice with a share gets less than its own and
//! wants more, or more than its ceiling over whole on/off cycles of its
//! burst, for `compute_sustain` passes in a row. Its part of the history:
//! each tenant's throttled time at the last pass (what it waited since),
//! the GPU time of the last passes its ceiling is judged over, the passes
//! in a row each slice was over, and the slices serving a freeze. Whether
//! its GPU's segment was tampered with lately is the segments rule's
//! finding, given to it.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use cuslice_core::gpu::DEMAND_WINDOW_NS;

use super::verdict::{Case, Verdict, slice_key, view};
use crate::watch::config::WatchConfig;
use crate::watch::slices::SliceId;
use crate::watch::snapshot::{GpuSnap, ProcSnap, Snapshot, TenantReading};
use crate::watch::tenant::compute_certain;
use cuslice_host::watch_state::Kind;

/// How long after a GPU's segment was last found tampered with the compute
/// check only reports on that GPU: the forged values' effect and the
/// catch-up after their repair (measured on the fake GPU: a tenant forged
/// above its share for a while is then held back while the others catch
/// up, for a few seconds).
pub const TAMPER_QUIET_NS: u64 = 10_000_000_000;

/// What the compute check leaves to the next pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// (GPU uuid, slice) -> (time ns, throttled ns) of its tenant entry at
    /// the last pass (by slice: two slices may share a tenant name, each
    /// with an entry of its own).
    pub throttled: HashMap<(String, SliceId), (u64, u64)>,
    /// (slice, GPU index) -> passes in a row over its share / ceiling
    /// (restarted where the slice was acted on: `act::acted_on`).
    pub sustain: HashMap<(SliceId, u32), u32>,
    /// (slice, GPU index) -> its GPU time (percent) in the last passes, as
    /// many as its ceiling is judged over ([`ceiling_passes`]), newest last.
    pub ceiling_runs: HashMap<(SliceId, u32), VecDeque<f64>>,
    /// The slices `freeze` stopped on a GPU whose time is not up at the
    /// pass's time (what acting left: the executor's, given before each
    /// pass is judged).
    pub frozen: HashSet<(SliceId, u32)>,
}

/// Whether a GPU segment found tampered with at `tampered_ns` (None:
/// never) was so lately, at `now_ns`: within [`TAMPER_QUIET_NS`]. Whoever
/// can write the GPU segment (every tenant) can make a well-behaved tenant
/// take more than its share: by forging the shares, and by the catch-up
/// after they are restored.
pub fn tampered_lately(tampered_ns: Option<u64>, now_ns: u64) -> bool {
    tampered_ns.is_some_and(|t| now_ns.saturating_sub(t) < TAMPER_QUIET_NS)
}

/// A tenant's demand (percent) as it counts at `now_ns`: only while it is
/// current (its last activity within two demand windows) and it is not
/// `frozen`. A tenant rolls its demand window at its own launches, so one
/// that stopped (a data-loading phase, an idle service, a frozen slice)
/// keeps its last figure in the segment, and its neighbours rightly took
/// the time it left.
pub fn current_demand(t: &TenantReading, frozen: bool, now_ns: u64) -> Option<f64> {
    (!frozen && now_ns.saturating_sub(t.last_activity) <= 2 * DEMAND_WINDOW_NS)
        .then(|| f64::from(t.demand_pm.min(1000)) / 10.0)
}

/// The percent of the time since the last pass a tenant waited: its
/// running total of throttled time `throttled_ns` now (`now_ns`) against
/// `before`, (time, total) at the last pass; None where there is no
/// earlier figure, or it does not precede this one (unknown, not zero).
pub fn waited_percent(before: Option<(u64, u64)>, now_ns: u64, throttled_ns: u64) -> Option<f64> {
    before
        .filter(|(at, b)| now_ns > *at && throttled_ns >= *b)
        .map(|(at, b)| 100.0 * (throttled_ns - b) as f64 / (now_ns - at) as f64)
}

/// A ceiling's window: `pct`, this pass's GPU time, added to `runs` (the
/// last passes', newest last), kept to the last `n`; their mean once there
/// are `n` of them (None before: a ceiling is judged over whole on/off
/// cycles of its burst, [`ceiling_passes`]).
pub fn ceiling_window(runs: &mut VecDeque<f64>, pct: f64, n: usize) -> Option<f64> {
    runs.push_back(pct);
    while runs.len() > n {
        runs.pop_front();
    }
    (runs.len() == n).then(|| runs.iter().sum::<f64>() / n as f64)
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
/// it is current ([`current_demand`]). A slice serving a freeze is not
/// judged: its finding stands. `tampered_ns`: when this GPU's segment was
/// last found tampered with (the finding is then only reported, see
/// [`tampered_lately`]).
pub fn compute(
    snap: &Snapshot,
    gpu: &GpuSnap,
    groups: &BTreeMap<&SliceId, Vec<&ProcSnap>>,
    prev: &History,
    next: &mut History,
    tampered_ns: Option<u64>,
    cfg: &WatchConfig,
) -> Vec<Verdict> {
    let Some(uuid) = &gpu.uuid_bytes else {
        return vec![];
    };
    let now = snap.now_ns;
    let interval = cfg.interval.as_nanos() as u64;
    let mut seen = vec![];
    let mut judged = vec![];
    for (id, procs) in groups {
        let Some(slice) = snap.slices.get(*id) else {
            continue;
        };
        let Some(q) = &slice.quota else { continue };
        let spec = q.tenant_spec(gpu.index, uuid);
        let t = slice.gpu_tenant.get(&gpu.index);
        let key = ((*id).clone(), gpu.index);
        let frozen = prev.frozen.contains(&key);
        let demand = t.and_then(|t| current_demand(t, frozen, now));
        // Time waited over the interval, from the running total.
        let waited = t.and_then(|t| {
            let before = next
                .throttled
                .insert((gpu.uuid.clone(), (*id).clone()), (now, t.throttled_ns));
            waited_percent(before, now, t.throttled_ns)
        });
        let gpu_percent = procs.iter().filter_map(|p| p.sm).fold(0.0, |a, b| a + b);
        let ceiling = spec.map(|s| (s.max, s.burst_ns)).filter(|(m, _)| *m < 100);
        let ceiling_percent = match ceiling {
            Some((m, burst)) => ceiling_window(
                next.ceiling_runs.entry(key).or_default(),
                gpu_percent,
                ceiling_passes(m, burst, interval),
            ),
            None => {
                next.ceiling_runs.remove(&key);
                None
            }
        };
        seen.push(ComputeSeen {
            tenant: slice.tenant.clone(),
            gpu_percent,
            share: spec.map(|s| s.share),
            ceiling: ceiling.map(|(m, _)| m),
            ceiling_percent,
            ceiling_slack: ceiling.map_or(0.0, |(m, burst)| ceiling_slack(m, burst, interval)),
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
    let forged = tampered_lately(tampered_ns, now);
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{History, judge};
    use super::*;
    use crate::watch::config::Policy;
    use cuslice_core::config::format_uuid;

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

    #[test]
    fn compute_is_found_only_over_compute_sustain_passes_in_a_row() {
        let cfg = policy(Policy::Kill);
        assert_eq!(cfg.compute_sustain, 2);
        // 75% against a 40% ceiling (+10, +10 for its bursts over one
        // 2 s pass): over, in every pass.
        let (v, h) = judge(&two_tenants(1, 75.0, true, 0, 0), &History::default(), &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(h.compute.sustain.get(&(a(), 0)), Some(&1));
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
        // A pass within the ceiling starts the count again.
        let (v, h) = judge(&two_tenants(3, 45.0, true, 0, 0), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(h.compute.sustain.get(&(a(), 0)), None);
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
        h.compute.frozen.insert((b(), 0));
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
        h.compute
            .throttled
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
            next.compute.throttled.get(&(format_uuid(&GPU0), b())),
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
        h.compute.frozen.insert((a(), 0));
        h.compute.sustain.insert((a(), 0), 1);
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
        assert_eq!(next.compute.sustain, h.compute.sustain);
    }

    #[test]
    fn the_history_compute_keeps_is_read_by_pure_rules() {
        // Tampered with 9 s ago: lately; 10 s: no longer; never: no.
        assert!(tampered_lately(Some(NOW - 9 * SECOND), NOW));
        assert!(!tampered_lately(Some(NOW - 10 * SECOND), NOW));
        assert!(!tampered_lately(None, NOW));
        // A demand counts while current and not frozen.
        let t = TenantReading {
            throttled_ns: 0,
            demand_pm: 1200,
            last_activity: NOW - DEMAND_WINDOW_NS,
        };
        assert_eq!(current_demand(&t, false, NOW), Some(100.0));
        assert_eq!(current_demand(&t, true, NOW), None);
        assert_eq!(current_demand(&t, false, NOW + 2 * DEMAND_WINDOW_NS), None);
        // 300 ms waited over a second; no earlier figure, or one that does
        // not precede: unknown.
        assert_eq!(
            waited_percent(Some((NOW - SECOND, SECOND)), NOW, SECOND + 300_000_000),
            Some(30.0)
        );
        assert_eq!(waited_percent(None, NOW, SECOND), None);
        assert_eq!(waited_percent(Some((NOW, 0)), NOW, SECOND), None);
        assert_eq!(
            waited_percent(Some((NOW - SECOND, 2 * SECOND)), NOW, SECOND),
            None
        );
        // A window of 3 passes: judged once it holds 3, the oldest left.
        let mut runs = VecDeque::new();
        assert_eq!(ceiling_window(&mut runs, 90.0, 3), None);
        assert_eq!(ceiling_window(&mut runs, 30.0, 3), None);
        assert_eq!(ceiling_window(&mut runs, 60.0, 3), Some(60.0));
        assert_eq!(ceiling_window(&mut runs, 0.0, 3), Some(30.0));
        assert_eq!(runs, [30.0, 60.0, 0.0]);
    }
}
