use super::*;
use crate::gpu::bounds::{self, MAX_BURST_NS, MAX_SLICE_NS};

#[test]
fn a_latency_privilege_refills_at_half_the_share_up_to_its_budget() {
    let cap = LATENCY_PRIVILEGE_NS as i64;
    // Spent, at a 50 % share: a quarter of the wall time comes back.
    assert_eq!(privilege_refill(0, 40_000_000, 50), 10_000_000);
    // Never beyond the budget, however long it was idle.
    assert_eq!(privilege_refill(cap, 10_000_000_000, 50), cap);
    assert_eq!(privilege_refill(0, u64::MAX, 100), cap);
    // A debt (a synchronising call that ran long) is paid back first.
    assert_eq!(privilege_refill(-10_000_000, 40_000_000, 50), 0);
    // A share out of range counts as 1..=100; a corrupt debt is bounded.
    assert_eq!(privilege_refill(0, 200_000_000, 0), 1_000_000);
    assert_eq!(privilege_refill(i64::MIN, 0, 50), -cap * 50);
    // Over a long run: a tenant that spends its budget whenever it has
    // some is privileged at most half its share of the time.
    let (mut tokens, mut privileged) = (cap, 0u64);
    for _ in 0..10_000 {
        if tokens > 0 {
            tokens -= 1_000_000;
            privileged += 1_000_000;
        }
        tokens = privilege_refill(tokens, 1_000_000, 30);
    }
    let fraction = privileged as f64 / 1e10;
    assert!((0.15..0.153).contains(&fraction), "{fraction}");
}

#[test]
fn a_ceiling_waits_for_the_tokens_it_needs_at_its_rate() {
    // One token owed 3 ms at 20 %: 15 ms (and the token itself).
    assert_eq!(refill_wait(-3_000_000, 1, 20), 15_000_005);
    assert_eq!(refill_wait(1, 1, 20), 0, "there already");
    assert_eq!(refill_wait(i64::MIN, i64::MAX, 0), u64::MAX, "saturates");
    // A ceiling of 0 refills as the tightest (1 %), not never.
    assert_eq!(refill_wait(0, 1_000, 0), 100_000);
    assert_eq!(tokens_needed(false, 200), 1);
    assert_eq!(tokens_needed(true, 200), 200, "recharging: a burst");
    assert_eq!(ceiling_wait(100, i64::MIN, 1), None, "no ceiling");
    assert_eq!(ceiling_wait(50, 200, 200), None);
    assert_eq!(ceiling_wait(50, 199, 200), Some(2));
}

#[test]
fn one_rule_decides_heavy_and_light() {
    let window = |pm, saturated| Demand::Window {
        demand_pm: pm,
        share_pm: 500,
        saturated,
    };
    // A window: at its share heavy, under it light, held at 80 % of
    // it (or saturated) a heavy tenant stays heavy.
    assert_eq!(heavy_after(false, false, window(500, false)), Some(true));
    assert_eq!(heavy_after(false, false, window(499, true)), Some(false));
    assert_eq!(heavy_after(true, false, window(400, false)), Some(true));
    assert_eq!(heavy_after(true, false, window(399, false)), Some(false));
    assert_eq!(heavy_after(true, false, window(0, true)), Some(true));
    assert_eq!(
        heavy_after(false, true, window(500, false)),
        Some(true),
        "latency too"
    );
    // A busy stretch: heavy at HEAVY_BUSY_NS, says nothing before it,
    // nor for a latency tenant, nor when measured to run little.
    let busy = |ns, gpu| Demand::Busy { ns, gpu };
    assert_eq!(
        heavy_after(false, false, busy(HEAVY_BUSY_NS, None)),
        Some(true)
    );
    assert_eq!(
        heavy_after(true, false, busy(HEAVY_BUSY_NS - 1, None)),
        None
    );
    assert_eq!(heavy_after(false, true, busy(u64::MAX, None)), None);
    let ns = 4 * HEAVY_BUSY_NS;
    assert_eq!(
        heavy_after(false, false, busy(ns, Some((ns / 4, 1)))),
        Some(true)
    );
    assert_eq!(
        heavy_after(false, false, busy(ns, Some((ns / 4 - 1, 1)))),
        None
    );
    assert_eq!(
        heavy_after(false, false, busy(ns, Some((0, u64::MAX)))),
        Some(true)
    );
}

#[test]
fn a_holder_keeps_the_lease_until_it_dies_idles_or_overstays() {
    let now = 1_000_000_000;
    let deadline = now + SLICE;
    let keeps = |until| Holder::Keeps { until };
    assert_eq!(
        judge_holder(false, deadline, 0, now),
        keeps(deadline + GRACE_NS)
    );
    assert_eq!(
        judge_holder(true, deadline, 0, now),
        Holder::TakeOver {
            end: now,
            idled: false
        }
    );
    // Overstayed: kept through the grace, lost past it.
    let late = deadline + GRACE_NS;
    assert_eq!(
        judge_holder(false, deadline, 0, late),
        keeps(late + 1_000_000)
    );
    assert_eq!(
        judge_holder(false, deadline, 0, late + 1),
        Holder::TakeOver {
            end: late + 1,
            idled: false
        }
    );
    // Idle: until the hand-off; then lost, charged up to when it idled.
    let idle = now - IDLE_HANDOFF_NS / 2;
    assert_eq!(
        judge_holder(false, deadline, idle, now),
        keeps(idle + IDLE_HANDOFF_NS)
    );
    assert_eq!(
        judge_holder(false, deadline, idle, idle + IDLE_HANDOFF_NS),
        Holder::TakeOver {
            end: idle,
            idled: true
        }
    );
    assert_eq!(
        judge_holder(false, deadline, now + 1, now),
        keeps(deadline + GRACE_NS),
        "idle ahead: busy"
    );
    // A deadline no holder sets.
    let far = now + bounds::DEADLINE_AHEAD_NS;
    assert_eq!(judge_holder(false, far, 0, now), keeps(far + GRACE_NS));
    assert_eq!(
        judge_holder(false, far + 1, 0, now),
        Holder::TakeOver {
            end: now,
            idled: false
        }
    );
}

#[test]
fn a_holder_charged_little_saves_no_more_than_a_bucket_holds() {
    // Alone under a ceiling (half the wall time), charged a tenth of each slice, a
    // holder earns more than it spends: its bucket stops at what a
    // bucket holds (the bound the watchdog judges by), not beyond.
    let (g, a, t, p) = one_waiter("saved", 30);
    let e = g.tenant(t).expect("t");
    let t0 = 5_000_000_000;
    e.tokens.store(SLICE as i64, Ordering::Relaxed);
    e.tokens_at.store(t0, Ordering::Relaxed);
    assert!(matches!(
        a.try_acquire(p, t, t0, SLICE),
        Acquire::Granted { .. }
    ));
    a.end_wait(p, t);
    let mut now = t0;
    for _ in 0..4_000 {
        now += SLICE;
        assert!(!a.decide_release_measured(t, now, SLICE, 100_000));
        assert!(a.renew_measured(p, t, now, SLICE, 100_000).is_some());
    }
    let tokens = e.tokens.load(Ordering::Relaxed);
    assert!(bounds::tokens_in_bounds(tokens), "{tokens}");
    assert!(
        tokens > bounds::MAX_SAVED_NS as i64 - SLICE as i64,
        "{tokens}"
    );
}

const SLICE: u64 = 20_000_000;

/// A test's segment; its directory is removed when it is dropped.
struct Seg(GpuSegment);

impl std::ops::Deref for Seg {
    type Target = GpuSegment;
    fn deref(&self) -> &GpuSegment {
        &self.0
    }
}

impl Drop for Seg {
    fn drop(&mut self) {
        if let Some(d) = self.0.path.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn seg(name: &str) -> Seg {
    let d = std::env::temp_dir().join(format!("cuslice-gpu-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Seg(GpuSegment::open_or_create(&d.join("gpu.seg")).expect("open"))
}

/// Simulates busy tenants on a saturated GPU for `ms` of virtual time;
/// returns each tenant's share of the charged time, in percent.
fn simulate(shares: &[(u32, u32)], ms: u64) -> Vec<f64> {
    let g = seg(&format!(
        "sim-{}",
        shares
            .iter()
            .map(|s| s.0.to_string())
            .collect::<Vec<_>>()
            .join("-")
    ));
    // One "process" per tenant; process slots need real OFD locks, so
    // use separate open file descriptions.
    let extra: Vec<GpuSegment> = shares
        .iter()
        .map(|_| GpuSegment::open_or_create(&g.path).expect("open"))
        .collect();
    let mut ts = Vec::new();
    for (k, (share, max)) in shares.iter().enumerate() {
        let (t, _) = g
            .register_tenant(&format!("t{k}"), *share, *max, 0, 0)
            .expect("tenant");
        let p = extra[k].claim_proc(t, k as u32).expect("proc");
        extra[k].begin_wait(p, t, 0);
        ts.push((t, p));
    }
    let mut now = 0u64;
    let end = ms * 1_000_000;
    while now < end {
        let mut progressed = false;
        for (k, &(t, p)) in ts.iter().enumerate() {
            if let Acquire::Granted { deadline } = extra[k].try_acquire(p, t, now, SLICE) {
                extra[k].end_wait(p, t);
                now = deadline; // run a full slice
                extra[k].release(p, t, now);
                extra[k].begin_wait(p, t, now);
                progressed = true;
                break;
            }
        }
        if !progressed {
            now += 1_000_000; // everyone throttled: the GPU idles
        }
    }
    let used: Vec<u64> = ts
        .iter()
        .map(|&(t, _)| g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed))
        .collect();
    used.iter()
        .map(|&u| 100.0 * u as f64 / now as f64)
        .collect()
}

#[test]
fn busy_tenants_split_by_share() {
    let r = simulate(&[(30, 100), (70, 100)], 10_000);
    assert!(
        (r[0] - 30.0).abs() < 1.0 && (r[1] - 70.0).abs() < 1.0,
        "{r:?}"
    );
    let r = simulate(&[(20, 100), (30, 100), (50, 100)], 10_000);
    assert!(
        (r[0] - 20.0).abs() < 1.0 && (r[1] - 30.0).abs() < 1.0 && (r[2] - 50.0).abs() < 1.0,
        "{r:?}"
    );
}

#[test]
fn ceiling_holds_on_an_idle_gpu() {
    for cap in [10, 25, 50, 75] {
        let r = simulate(&[(cap, cap)], 20_000);
        assert!((r[0] - cap as f64).abs() < 1.0, "cap {cap}: {r:?}");
    }
}

#[test]
fn long_slices_under_a_high_ceiling_keep_their_tokens() {
    // 30 ms slices (three 10 ms kernels) under a 75 % ceiling: tokens
    // earned during the slice beyond the one-slice burst count.
    let g = seg("longslice");
    let (t, _) = g.register_tenant("t", 75, 75, 0, 0).expect("t");
    let a = GpuSegment::open_or_create(&g.path).expect("a");
    let p = a.claim_proc(t, 1).expect("p");
    a.begin_wait(p, t, 0);
    let (mut now, mut busy) = (0u64, 0u64);
    while now < 60_000_000_000 {
        match a.try_acquire(p, t, now, SLICE) {
            Acquire::Granted { .. } => {
                a.end_wait(p, t);
                loop {
                    now += 30_000_000;
                    busy += 30_000_000;
                    if a.decide_release(t, now, SLICE) {
                        break;
                    }
                    a.renew(p, t, now, SLICE).expect("renew");
                }
                a.release(p, t, now);
                a.begin_wait(p, t, now);
            }
            Acquire::Wait { until } => now = until,
        }
    }
    let pct = 100.0 * busy as f64 / now as f64;
    assert!((pct - 75.0).abs() < 1.0, "{pct}");
}

/// Busy tenants (share, max, burst ms) with renewals as the shim does
/// them: a holder runs slice after slice, renewing while
/// `decide_release` says it may. Returns each tenant's percent of the
/// time and its holds as (start, end) ns.
fn simulate_holds(
    name: &str,
    tenants: &[(u32, u32, u64)],
    ms: u64,
) -> (Vec<f64>, Vec<Vec<(u64, u64)>>) {
    let g = seg(name);
    let procs: Vec<GpuSegment> = tenants
        .iter()
        .map(|_| GpuSegment::open_or_create(&g.path).expect("open"))
        .collect();
    let mut ids = Vec::new();
    for (k, &(share, max, burst)) in tenants.iter().enumerate() {
        let (t, _) = g
            .register_tenant(&format!("t{k}"), share, max, burst * 1_000_000, 0)
            .expect("tenant");
        let p = procs[k].claim_proc(t, k as u32).expect("proc");
        procs[k].begin_wait(p, t, 0);
        ids.push((t, p));
    }
    let mut holds = vec![Vec::new(); tenants.len()];
    let mut busy = vec![0u64; tenants.len()];
    let (mut now, end) = (0u64, ms * 1_000_000);
    while now < end {
        let mut next = u64::MAX;
        let mut granted = None;
        for (k, &(t, p)) in ids.iter().enumerate() {
            match procs[k].try_acquire(p, t, now, SLICE) {
                Acquire::Granted { .. } => {
                    granted = Some(k);
                    break;
                }
                Acquire::Wait { until } => next = next.min(until),
            }
        }
        let Some(k) = granted else {
            now = next.max(now + 1);
            continue;
        };
        let (t, p) = ids[k];
        procs[k].end_wait(p, t);
        let start = now;
        loop {
            now += SLICE;
            if procs[k].decide_release(t, now, SLICE) {
                break;
            }
            procs[k].renew(p, t, now, SLICE).expect("renew");
        }
        procs[k].release(p, t, now);
        procs[k].begin_wait(p, t, now);
        busy[k] += now - start;
        holds[k].push((start, now));
    }
    (
        busy.iter()
            .map(|&b| 100.0 * b as f64 / now as f64)
            .collect(),
        holds,
    )
}

#[test]
fn a_ceiling_bound_tenant_runs_whole_bursts() {
    // 30 % ceiling, 200 ms burst: pauses until 200 ms of tokens are
    // saved (667 ms), holds while they last, tokens still accruing
    // (200 / (1 - 0.3) = 286 ms, in whole 20 ms slices): 30 % overall.
    // The first hold starts at once (no saving up first).
    let (pct, holds) = simulate_holds("burst", &[(30, 30, 200)], 60_000);
    let h = &holds[0];
    assert!(h[0].0 <= 1_000_000, "first hold at once: {}", h[0].0);
    assert!((pct[0] - 30.0).abs() < 0.5, "{pct:?}");
    for w in h[1..h.len() - 1].windows(2) {
        let (len, gap) = (w[0].1 - w[0].0, w[1].0 - w[0].1);
        assert!((280_000_000..=300_000_000).contains(&len), "hold {len} ns");
        assert!((620_000_000..=700_000_000).contains(&gap), "pause {gap} ns");
    }
    // A 10 % ceiling with the old one-slice burst (0): 20 ms holds.
    let (pct, holds) = simulate_holds("burst0", &[(10, 10, 0)], 20_000);
    assert!((pct[0] - 10.0).abs() < 0.5, "{pct:?}");
    assert!(
        holds[0][1..].iter().all(|&(a, b)| b - a <= 2 * SLICE),
        "{:?}",
        &holds[0][..4]
    );
}

#[test]
fn a_recharging_tenant_does_not_hold_up_others() {
    // A (50 % share, 50 % ceiling, 200 ms burst) and B (50 %, no
    // ceiling): while A saves up its burst, B has the GPU; the GPU is
    // never idle and A stays at its ceiling.
    let (pct, _) = simulate_holds("recharge", &[(50, 50, 200), (50, 100, 0)], 30_000);
    assert!(pct[0] <= 50.5 && pct[0] >= 45.0, "{pct:?}");
    assert!(pct[0] + pct[1] > 99.5, "{pct:?}");
}

#[test]
fn lone_tenant_without_ceiling_gets_everything() {
    let r = simulate(&[(30, 100)], 2_000);
    assert!(r[0] > 99.0, "{r:?}");
}

#[test]
fn a_returning_tenant_cannot_claim_back_idle_time() {
    let g = seg("return");
    let a = GpuSegment::open_or_create(&g.path).expect("a");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let (ta, _) = g.register_tenant("a", 30, 100, 0, 0).expect("a");
    let (tb, _) = g.register_tenant("b", 70, 100, 0, 0).expect("b");
    let pa = a.claim_proc(ta, 1).expect("pa");
    let pb = b.claim_proc(tb, 2).expect("pb");
    // A runs alone for 10 s.
    a.begin_wait(pa, ta, 0);
    let mut now = 0;
    assert!(matches!(
        a.try_acquire(pa, ta, now, SLICE),
        Acquire::Granted { .. }
    ));
    a.end_wait(pa, ta);
    while now < 10_000_000_000 {
        now += SLICE;
        assert!(!a.decide_release(ta, now, SLICE));
        a.renew(pa, ta, now, SLICE);
    }
    // B arrives: it must get the next slice, and then the split is
    // 30/70 from there on, not B-only until it "catches up".
    b.begin_wait(pb, tb, now);
    assert!(a.decide_release(ta, now, SLICE));
    a.release(pa, ta, now);
    a.begin_wait(pa, ta, now);
    assert!(matches!(
        a.try_acquire(pa, ta, now, SLICE),
        Acquire::Wait { .. }
    ));
    assert!(matches!(
        b.try_acquire(pb, tb, now, SLICE),
        Acquire::Granted { .. }
    ));
    let va = g.tenant(ta).expect("a").vtime.load(Ordering::Relaxed);
    let vb = g.tenant(tb).expect("b").vtime.load(Ordering::Relaxed);
    assert!(vb >= va, "B starts at A's virtual time ({vb} vs {va})");
}

#[test]
fn a_dead_holder_loses_the_lease_at_once() {
    let g = seg("dead");
    let (t, _) = g.register_tenant("t", 50, 100, 0, 0).expect("t");
    let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let pb = b.claim_proc(u, 2).expect("pb");
    {
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let pa = a.claim_proc(t, 1).expect("pa");
        a.begin_wait(pa, t, 0);
        assert!(matches!(
            a.try_acquire(pa, t, 0, SLICE),
            Acquire::Granted { .. }
        ));
    } // a dies holding the lease
    b.begin_wait(pb, u, 0);
    // Well before the deadline, but the holder is dead: taken over.
    assert!(matches!(
        b.try_acquire(pb, u, 1_000_000, SLICE),
        Acquire::Granted { .. }
    ));
    assert_eq!(
        g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
        1_000_000
    );
}

#[test]
fn a_dead_waiter_of_a_better_tenant_does_not_block() {
    let g = seg("deadwaiter");
    let (t, _) = g.register_tenant("t", 50, 100, 0, 0).expect("t");
    let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let pb = b.claim_proc(u, 2).expect("pb");
    // u has run more: t would win the next slice...
    g.tenant(u)
        .expect("u")
        .vtime
        .store(1_000_000_000, Ordering::Relaxed);
    {
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let pa = a.claim_proc(t, 1).expect("pa");
        a.begin_wait(pa, t, 0);
    } // ...but its only process dies while waiting.
    b.begin_wait(pb, u, 0);
    let mut now = SWEEP_NS + 1;
    let granted = (0..3).any(|_| {
        now += 1_000_000;
        matches!(b.try_acquire(pb, u, now, SLICE), Acquire::Granted { .. })
    });
    assert!(granted, "a dead waiter must not hold the GPU back");
    assert_eq!(g.tenant(t).expect("t").waiting.load(Ordering::Relaxed), 0);
}

#[test]
fn an_overstaying_live_holder_loses_it_after_the_grace() {
    let g = seg("overstay");
    let (t, _) = g.register_tenant("t", 50, 100, 0, 0).expect("t");
    let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
    let a = GpuSegment::open_or_create(&g.path).expect("a");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let pa = a.claim_proc(t, 1).expect("pa");
    let pb = b.claim_proc(u, 2).expect("pb");
    a.begin_wait(pa, t, 0);
    assert!(matches!(
        a.try_acquire(pa, t, 0, SLICE),
        Acquire::Granted { .. }
    ));
    b.begin_wait(pb, u, 0);
    assert!(matches!(
        b.try_acquire(pb, u, SLICE + GRACE_NS, SLICE),
        Acquire::Wait { .. }
    ));
    assert!(matches!(
        b.try_acquire(pb, u, SLICE + GRACE_NS + 1, SLICE),
        Acquire::Granted { .. }
    ));
    // Charged up to its deadline, no more.
    assert_eq!(
        g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
        SLICE
    );
    assert!(
        !a.release(pa, t, SLICE + GRACE_NS + 2),
        "the lease is no longer a's"
    );
}

#[test]
fn share_change_takes_effect() {
    let g = seg("change");
    let (t, old) = g.register_tenant("t", 30, 100, 0, 0).expect("t");
    assert_eq!(old, None);
    let (t2, old) = g.register_tenant("t", 60, 80, 0, 0).expect("t");
    assert_eq!((t2, old), (t, Some((30, 100))));
    assert_eq!(g.tenants()[0].share, 60);
    assert_eq!(g.tenants()[0].max, 80);
    assert_eq!(g.tenants()[0].name, "t");
}

// A hostile (or buggy) tenant can write anything into this segment:
// the values below must neither panic (debug builds check overflow)
// nor keep the lease from a waiting process once they stop changing.

/// A segment with tenant "t" (share 50, ceiling `max`) and one live
/// process of it waiting since 0: (observer, the process's open, t, p).
fn one_waiter(name: &str, max: u32) -> (Seg, GpuSegment, usize, usize) {
    let g = seg(&format!("hostile-{name}"));
    let (t, _) = g.register_tenant("t", 50, max, 0, 0).expect("t");
    let a = GpuSegment::open_or_create(&g.path).expect("a");
    let p = a.claim_proc(t, 1).expect("p");
    a.begin_wait(p, t, 0);
    (g, a, t, p)
}

/// When (simulated ns) `p` of `t` gets the lease trying from `from`,
/// sleeping until each `Wait`'s `until`; None if not within `limit`.
fn granted_at(a: &GpuSegment, p: usize, t: usize, from: u64, limit: u64) -> Option<u64> {
    let mut now = from;
    for _ in 0..100_000 {
        match a.try_acquire(p, t, now, SLICE) {
            Acquire::Granted { deadline } => {
                assert!(deadline <= now + SLICE, "deadline {deadline} at {now}");
                return Some(now);
            }
            Acquire::Wait { until } => now = until.max(now.saturating_add(1)),
        }
        if now > from + limit {
            return None;
        }
    }
    None
}

#[test]
fn a_corrupt_ceiling_bucket_neither_panics_nor_starves() {
    // tokens beyond what a bucket holds (bounds) restart at 0; a ceiling of 0 is the
    // tightest (1 %), not a bucket that never refills. Before: with a
    // ceiling of 0 or 1 % and tokens = i64::MIN, `now + wait` overflowed
    // (a panic in the launch gate); with 50 % the tenant waited 585
    // years.
    for max in [0u32, 1, 50] {
        for tokens in [i64::MIN, i64::MAX, -(bounds::MAX_DEBT_NS as i64) - 1] {
            let (g, a, t, p) = one_waiter(&format!("tokens-{max}-{tokens}"), 50);
            let e = g.tenant(t).expect("t");
            e.max.store(max, Ordering::Relaxed);
            e.tokens.store(tokens, Ordering::Relaxed);
            let at = granted_at(&a, p, t, 1_000_000_000, 1_000_000);
            assert!(
                at.is_some(),
                "max {max}, tokens {tokens}: no lease within 1 ms"
            );
            let left = e.tokens.load(Ordering::Relaxed);
            assert!(left.unsigned_abs() <= SLICE, "max {max}: tokens {left}");
        }
    }
    // A debt within the bound is honoured: 100 ms owed at 50 % is a
    // 200 ms wait.
    let (g, a, t, p) = one_waiter("debt", 50);
    g.tenant(t)
        .expect("t")
        .tokens
        .store(-100_000_000, Ordering::Relaxed);
    let at = granted_at(&a, p, t, 0, 1_000_000_000).expect("granted");
    assert!((200_000_000..=201_000_000).contains(&at), "{at}");
}

#[test]
fn a_bucket_clock_or_burst_out_of_range_does_not_starve() {
    // Refill time in the future (u64::MAX): restarted at now. Before,
    // the bucket never refilled again.
    let (g, a, t, p) = one_waiter("tokens-at", 50);
    let e = g.tenant(t).expect("t");
    e.tokens_at.store(u64::MAX, Ordering::Relaxed);
    let at = granted_at(&a, p, t, 1_000_000_000, 10_000_000).expect("granted");
    assert!(at <= 1_001_000_000, "{at}");
    assert!(e.tokens_at.load(Ordering::Relaxed) <= at);
    // Burst beyond MAX_BURST_NS while recharging: counts as one slice
    // (20 ms of tokens at 50 %: 40 ms). Before: it waited for i64::MAX.
    let (g, a, t, p) = one_waiter("burst", 50);
    let e = g.tenant(t).expect("t");
    e.burst_ns.store(u64::MAX, Ordering::Relaxed);
    e.recharging.store(1, Ordering::Relaxed);
    e.tokens_at.store(0, Ordering::Relaxed);
    let at = granted_at(&a, p, t, 0, 1_000_000_000).expect("granted");
    assert!((40_000_000..=41_000_000).contains(&at), "{at}");
    // The largest legitimate burst (10 s) is honoured as it is.
    let (g, a, t, p) = one_waiter("burst-max", 50);
    let e = g.tenant(t).expect("t");
    e.burst_ns.store(MAX_BURST_NS, Ordering::Relaxed);
    e.recharging.store(1, Ordering::Relaxed);
    e.tokens_at.store(0, Ordering::Relaxed);
    let at = granted_at(&a, p, t, 0, 30_000_000_000).expect("granted");
    assert!((20_000_000_000..=20_001_000_000).contains(&at), "{at}");
}

#[test]
fn a_deadline_no_slice_reaches_does_not_keep_the_lease() {
    // The lease names a live process that never launches, with a
    // deadline of u64::MAX. Before: every waiter waited for ever.
    let (g, a, t, p) = one_waiter("deadline", 100);
    let idle = GpuSegment::open_or_create(&g.path).expect("idle");
    let q = idle.claim_proc(t, 2).expect("q");
    let s = g.sched();
    s.lease.store(q as u32 + 1, Ordering::Release);
    s.slice_start.store(0, Ordering::Release);
    s.deadline.store(u64::MAX, Ordering::Release);
    assert_eq!(granted_at(&a, p, t, 5_000_000_000, 0), Some(5_000_000_000));
    // A legitimate deadline (one maximal slice ahead) is respected
    // until it and the grace have passed.
    s.lease.store(q as u32 + 1, Ordering::Release);
    s.deadline
        .store(6_000_000_000 + MAX_SLICE_NS, Ordering::Release);
    let at = granted_at(&a, p, t, 6_000_000_000, 2_000_000_000).expect("granted");
    assert_eq!(at, 6_000_000_000 + MAX_SLICE_NS + GRACE_NS + 1_000_000);
    // A lease naming our own slot with a garbage deadline: granted with
    // a deadline of at most one slice (checked in granted_at).
    s.lease.store(p as u32 + 1, Ordering::Release);
    s.deadline.store(u64::MAX, Ordering::Release);
    assert_eq!(granted_at(&a, p, t, 9_000_000_000, 0), Some(9_000_000_000));
}

#[test]
fn a_live_process_that_does_not_poll_does_not_hold_the_gpu_back() {
    // A live process of tenant u (its lock held) that never launches,
    // whose slot someone marked waiting, with u's virtual time the
    // smallest: t waits for it only while that mark looks fresh.
    let (g, a, t, p) = one_waiter("stale", 100);
    let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let q = b.claim_proc(u, 3).expect("q");
    b.begin_wait(q, u, 1_000_000_000);
    g.tenant(u).expect("u").vtime.store(0, Ordering::Relaxed);
    g.tenant(t)
        .expect("t")
        .vtime
        .store(1 << 40, Ordering::Relaxed);
    assert!(matches!(
        a.try_acquire(p, t, 1_000_000_000, SLICE),
        Acquire::Wait { .. }
    ));
    let later = 1_000_000_000 + WAITER_FRESH_NS + 1;
    assert!(matches!(
        a.try_acquire(p, t, later, SLICE),
        Acquire::Granted { .. }
    ));
}

#[test]
fn a_waiter_whose_entry_names_another_tenant_heals_it() {
    // Someone rewrote our own process entry to name tenant u (ahead of
    // us): polling must not make us u's live waiter, waiting on
    // ourselves for ever.
    let (g, a, t, p) = one_waiter("ownentry", 100);
    let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
    g.tenant(u).expect("u").vtime.store(0, Ordering::Relaxed);
    g.tenant(u).expect("u").waiting.store(1, Ordering::Relaxed);
    g.tenant(t)
        .expect("t")
        .vtime
        .store(1 << 40, Ordering::Relaxed);
    g.proc_entry(p)
        .expect("p")
        .tenant
        .store(u as u32, Ordering::Relaxed);
    assert!(granted_at(&a, p, t, 1_000_000_000, 10_000_000).is_some());
}

#[test]
fn waiting_counts_without_live_waiters_do_not_hold_the_gpu_back() {
    // Every other tenant entry claims waiters and the smallest virtual
    // time; process slots claim to be their live waiters (no process
    // holds their locks); the sweep time is in the future. Before: the
    // real tenant waited for ever.
    let (g, a, t, p) = one_waiter("phantoms", 100);
    let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
    g.tenant(t)
        .expect("t")
        .vtime
        .store(u64::MAX, Ordering::Relaxed);
    for i in (0..MAX_TENANTS).filter(|&i| i != t && i != u) {
        let o = g.tenant(i).expect("o");
        o.state.store(READY, Ordering::Release);
        o.name[0].store(i as u64 + 1, Ordering::Relaxed);
        o.waiting.store(u32::MAX, Ordering::Relaxed);
        o.procs.store(u32::MAX, Ordering::Relaxed);
        o.vtime.store(0, Ordering::Relaxed);
        o.max.store(100, Ordering::Relaxed);
    }
    let phantom =
        |k: usize| (k % MAX_TENANTS != t && k % MAX_TENANTS != u).then_some(k % MAX_TENANTS);
    for k in (0..MAX_PROCS).filter(|&k| k != p) {
        let Some(i) = phantom(k) else { continue };
        let e = g.proc_entry(k).expect("proc");
        e.state.store(PROC_LIVE, Ordering::Release);
        e.tenant.store(i as u32, Ordering::Relaxed);
        e.waiting.store(1, Ordering::Relaxed);
    }
    g.sched().swept_at.store(u64::MAX, Ordering::Relaxed);
    assert!(granted_at(&a, p, t, 1_000_000_000, 10_000_000).is_some());
    // A live waiter of a tenant ahead still goes first.
    let s = g.sched();
    s.lease.store(0, Ordering::Release);
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let q = b.claim_proc(u, 3).expect("q");
    g.tenant(u).expect("u").vtime.store(0, Ordering::Relaxed);
    b.begin_wait(q, u, 2_000_000_000);
    assert!(matches!(
        a.try_acquire(p, t, 2_000_000_000, SLICE),
        Acquire::Wait { .. }
    ));
    assert!(matches!(
        b.try_acquire(q, u, 2_000_000_000, SLICE),
        Acquire::Granted { .. }
    ));
}

#[test]
fn a_holder_charged_a_measured_part_of_its_hold_keeps_its_ceiling_longer() {
    // Alone under a ceiling, a launch-bound holder is charged what its
    // kernels ran of its hold (the limiter's measurement, in ppm): a
    // tenth of each slice here, well under its ceiling (its bucket
    // refills at half the wall time); charged whole (a ppm beyond the
    // whole is whole), the same hold spends it.
    let (g, a, t, p) = one_waiter("measured", 30);
    let e = g.tenant(t).expect("t");
    let used = || e.used_ns.load(Ordering::Relaxed);
    let t0 = 5_000_000_000;
    e.tokens.store(SLICE as i64, Ordering::Relaxed);
    e.tokens_at.store(t0, Ordering::Relaxed);
    assert!(matches!(
        a.try_acquire(p, t, t0, SLICE),
        Acquire::Granted { .. }
    ));
    a.end_wait(p, t);
    for k in 1..=10 {
        let now = t0 + k * SLICE;
        assert!(
            !a.decide_release_measured(t, now, SLICE, 100_000),
            "slice {k}"
        );
        assert!(a.renew_measured(p, t, now, SLICE, 100_000).is_some());
    }
    assert_eq!(used(), SLICE);
    // Twenty slices on without a charge: a tenth of them is under the
    // ceiling, all of them is not.
    let now = t0 + 30 * SLICE;
    assert!(!a.decide_release_measured(t, now, SLICE, 100_000));
    assert!(a.decide_release_measured(t, now, SLICE, 2 * WHOLE_PPM));
    assert!(a.release_measured(p, t, now, 2 * WHOLE_PPM));
    assert_eq!(used(), 21 * SLICE);
}

#[test]
fn a_corrupt_slice_start_does_not_inflate_a_charge() {
    // The holder charges itself from when it took the lease, not from
    // the shared slice_start. Before: slice_start = 0 charged it the
    // host's uptime (a debt of hours under a ceiling).
    let (g, a, t, p) = one_waiter("slice-start", 100);
    let e = g.tenant(t).expect("t");
    let s = g.sched();
    let used = || e.used_ns.load(Ordering::Relaxed);
    assert!(matches!(
        a.try_acquire(p, t, 5_000_000_000, SLICE),
        Acquire::Granted { .. }
    ));
    a.end_wait(p, t);
    s.slice_start.store(0, Ordering::Release);
    assert!(!a.decide_release(t, 5_000_000_000 + SLICE / 2, SLICE));
    assert!(a.renew(p, t, 5_000_000_000 + SLICE, SLICE).is_some());
    assert_eq!(used(), SLICE);
    s.slice_start.store(0, Ordering::Release);
    assert!(a.release(p, t, 5_000_000_000 + 2 * SLICE));
    assert_eq!(used(), 2 * SLICE);
    // A lease naming our slot that we never took: released, uncharged.
    s.lease.store(p as u32 + 1, Ordering::Release);
    assert!(a.release(p, t, 6_000_000_000));
    assert_eq!(used(), 2 * SLICE);
    // A waiter taking the lease from an overstaying holder charges it
    // at most one maximal slice.
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let q = b.claim_proc(t, 2).expect("q");
    b.begin_wait(q, t, 7_000_000_000);
    assert!(matches!(
        b.try_acquire(q, t, 7_000_000_000, SLICE),
        Acquire::Granted { .. }
    ));
    s.slice_start.store(0, Ordering::Release);
    a.begin_wait(p, t, 7_000_000_000);
    let at = 7_000_000_000 + SLICE + GRACE_NS + 1;
    assert!(matches!(
        a.try_acquire(p, t, at, SLICE),
        Acquire::Granted { .. }
    ));
    assert_eq!(used(), 2 * SLICE + MAX_SLICE_NS);
}

#[test]
fn tenant_entries_in_a_state_nobody_writes_are_free() {
    let g = seg("hostile-states");
    for i in 0..MAX_TENANTS {
        let t = g.tenant(i).expect("t");
        t.state.store(0xdead_beef ^ i as u32, Ordering::Relaxed);
        t.procs.store(u32::MAX, Ordering::Relaxed);
    }
    // Before: "all 32 tenant entries of this GPU are in use".
    let (t, old) = g.register_tenant("t", 30, 100, 0, 0).expect("registers");
    assert_eq!((t, old), (0, None));
    assert_eq!(g.tenants().len(), 1);
    // Entries that look registered and busy are not taken: a new tenant
    // is refused with one line (cuInit then fails closed).
    for i in 0..MAX_TENANTS {
        let e = g.tenant(i).expect("t");
        e.state.store(READY, Ordering::Relaxed);
        e.name[0].store(i as u64 + 1, Ordering::Relaxed);
        e.procs.store(1, Ordering::Relaxed);
    }
    let err = g.register_tenant("new", 30, 100, 0, 0).expect_err("full");
    assert!(
        err.0
            .ends_with("gpu.seg: all 32 tenant entries of this GPU are in use"),
        "{err}"
    );
}

#[test]
fn garbage_anywhere_never_panics() {
    // Random bytes over the whole body, or every word set to one
    // extreme value, then every operation a process does, at times
    // from 0 to u64::MAX / 2 (debug build: overflow panics).
    let g = seg("hostile-garbage");
    let a = GpuSegment::open_or_create(&g.path).expect("a");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let fills: Vec<Option<u64>> = vec![
        None,
        Some(0),
        Some(u64::MAX),
        Some(1 << 63),
        Some(0x0000_0002_0000_0002),
    ];
    for round in 0..60 {
        let fill = fills[round % fills.len()];
        for w in g.words() {
            w.store(fill.unwrap_or_else(&mut rnd), Ordering::Relaxed);
        }
        let now = [0, 1, GRACE_NS, 1 << 40, u64::MAX / 2][round % 5];
        let name = format!("t{}", round % 3);
        let Ok((t, _)) = a.register_tenant(&name, 50, 60, 200_000_000, now) else {
            continue;
        };
        let p = match a.claim_proc(t, 7) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        // Our own entries are garbage too from here on.
        for w in g.words() {
            w.store(fill.unwrap_or_else(&mut rnd), Ordering::Relaxed);
        }
        for k in 0..20u64 {
            let now = now + k * 3_000_000;
            a.begin_wait(p, t, now);
            if let Acquire::Granted { .. } = a.try_acquire(p, t, now, SLICE) {
                a.end_wait(p, t);
                if !a.decide_release(t, now + SLICE, SLICE) {
                    a.renew(p, t, now + SLICE, SLICE);
                }
                a.release(p, t, now + 2 * SLICE);
            }
            a.add_throttled(t, rnd());
            if k % 7 == 0 {
                for w in g.words().skip((rnd() % 4000) as usize).take(64) {
                    w.store(rnd(), Ordering::Relaxed);
                }
            }
        }
        let _ = a.tenants();
        a.reclaim_dead();
        // The free path and the latency class on the same garbage.
        let _ = a.route(t, now, SLICE);
        a.charge_free(t, rnd(), now);
        a.note_busy(t, rnd(), Some(rnd()), now);
        a.latency_stamp(t, rnd());
        a.latency_sync_begin(p, t, now);
        let _ = a.take_latency_hold(now);
        let _ = a.latency_present();
        a.latency_sync_end(p, t, now + 1);
        a.release_proc(p, now + 100 * SLICE);
    }
}

// ---- free launches, demand and the latency class ---------------------

const MS: u64 = 1_000_000;

/// A segment with tenant "t" (`share`, `max`, latency or not) and one
/// live process of it: (observer, the process's open, t, p).
fn tenant_with(name: &str, share: u32, max: u32, latency: bool) -> (Seg, GpuSegment, usize, usize) {
    let g = seg(&format!("free-{name}"));
    let spec = TenantSpec {
        share,
        max,
        burst_ns: 0,
        latency,
    };
    let (t, _) = g.register("t", 0, spec, 0).expect("t");
    let a = GpuSegment::open_or_create(&g.path).expect("a");
    let p = a.claim_proc(t, 1).expect("p");
    (g, a, t, p)
}

/// Another tenant, "other", with a live process waiting for the lease:
/// `t` is contended (heavy then means the lease). Returns the other's
/// segment handle, tenant and slot.
fn contender(g: &Seg) -> (GpuSegment, usize, usize) {
    let (o, _) = g.register_tenant("other", 50, 100, 0, 0).expect("other");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let q = b.claim_proc(o, 2).expect("q");
    b.begin_wait(q, o, 0);
    (b, o, q)
}

/// Charges `pct` % of each demand window for `windows` windows from
/// `from`; returns the time after.
fn load(a: &GpuSegment, t: usize, pct: u64, from: u64, windows: u64) -> u64 {
    let mut now = from;
    for _ in 0..windows {
        for _ in 0..10 {
            now += DEMAND_WINDOW_NS / 10;
            a.charge_free(t, DEMAND_WINDOW_NS / 10 * pct / 100, now);
        }
    }
    now
}

#[test]
fn a_tenant_under_its_share_launches_freely_and_one_over_it_through_the_lease() {
    let (g, a, t, _) = tenant_with("share", 50, 100, false);
    let _other = contender(&g);
    assert_eq!(
        a.route(t, 0, SLICE),
        Route::Free,
        "a new tenant starts free"
    );
    let now = load(&a, t, 30, 0, 3);
    assert_eq!(a.route(t, now, SLICE), Route::Free, "30 % of a 50 % share");
    assert_eq!(g.tenants()[0].demand_pm, 300);
    let now = load(&a, t, 60, now, 2);
    assert_eq!(
        a.route(t, now, SLICE),
        Route::Lease,
        "60 % is over its share"
    );
    assert!(g.tenants()[0].heavy);
    // Exactly at its share is at its share: heavy (not `>`).
    let (g, a, t, _) = tenant_with("share-edge", 50, 100, false);
    let _other = contender(&g);
    let now = load(&a, t, 50, 0, 2);
    assert_eq!(g.tenants()[0].demand_pm, 500);
    assert_eq!(a.route(t, now, SLICE), Route::Lease, "50 % of a 50 % share");
    let (g, a, t, _) = tenant_with("share-under", 50, 100, false);
    let _other = contender(&g);
    let now = load(&a, t, 49, 0, 2);
    assert_eq!(a.route(t, now, SLICE), Route::Free, "49 % of a 50 % share");
}

#[test]
fn a_heavy_tenant_alone_launches_freely_and_through_the_lease_once_contended() {
    // Arbitrating a GPU nobody else wants only costs the tenant (its
    // queue bounded, its passes charged): alone it launches as without
    // cuslice, heavy or not; a ceiling still needs the lease.
    let (g, a, t, _) = tenant_with("alone", 30, 100, false);
    let now = load(&a, t, 90, 0, 2);
    assert!(g.tenants()[0].heavy, "90 % on a 30 % share");
    assert_eq!(a.route(t, now, SLICE), Route::Free, "alone");
    assert!(a.free_alone(t, now), "long free passes");
    let (b, o, q) = contender(&g);
    assert!(!a.free_alone(t, now));
    assert_eq!(a.route(t, now, SLICE), Route::Lease, "another tenant waits");
    b.end_wait(q, o);
    assert_eq!(a.route(t, now, SLICE), Route::Free, "it stopped waiting");
    // Another tenant that had GPU time in its window contends too.
    b.charge_free(o, MS, now);
    assert_eq!(a.route(t, now + MS, SLICE), Route::Lease);
    // ... until it has been idle for two windows (nothing rolls its
    // window any more).
    let later = now + 3 * DEMAND_WINDOW_NS;
    let now = load(&a, t, 90, later, 1);
    assert_eq!(a.route(t, now, SLICE), Route::Free);
    // With a ceiling, alone: the lease (which waits for tokens).
    let (g, a, t, _) = tenant_with("alone-ceil", 30, 50, false);
    let now = load(&a, t, 90, 0, 2);
    assert!(g.tenants()[0].heavy);
    assert_eq!(a.route(t, now, SLICE), Route::Lease);
    assert!(!a.free_alone(t, now), "a ceiling keeps free passes short");
}

#[test]
fn a_tenant_held_at_its_share_stays_heavy_and_one_well_under_it_is_light_again() {
    let (g, a, t, p) = tenant_with("hyst", 30, 100, false);
    let _other = contender(&g);
    let e = g.tenant(t).expect("t");
    e.heavy.store(1, Ordering::Relaxed);
    // Held at its share by the lease: stays heavy (no flapping).
    let now = load(&a, t, 30, 0, 5);
    assert_eq!(a.route(t, now, SLICE), Route::Lease);
    // Under 80 % of its share but it waited for the lease: still heavy.
    a.begin_wait(p, t, now);
    let now = load(&a, t, 20, now, 1);
    assert_eq!(a.route(t, now, SLICE), Route::Lease);
    a.end_wait(p, t);
    // Under 80 % of its share, not waiting: light.
    let now = load(&a, t, 20, now, 2);
    assert_eq!(a.route(t, now, SLICE), Route::Free);
    // Heavy, then idle for a while: light again at its next launch.
    e.heavy.store(1, Ordering::Relaxed);
    assert_eq!(a.route(t, now + 5 * DEMAND_WINDOW_NS, SLICE), Route::Free);
}

#[test]
fn an_idle_holder_loses_the_lease_to_a_waiter_charged_up_to_when_it_went_idle() {
    let (g, a, t, p) = tenant_with("idle", 50, 100, false);
    let (b, o, q) = contender(&g);
    b.end_wait(q, o);
    a.begin_wait(p, t, 0);
    assert!(matches!(
        a.try_acquire(p, t, 0, SLICE),
        Acquire::Granted { .. }
    ));
    a.end_wait(p, t);
    b.begin_wait(q, o, MS);
    // Busy holder: the waiter waits for its slice.
    assert!(matches!(
        b.try_acquire(q, o, MS, SLICE),
        Acquire::Wait { .. }
    ));
    // It went idle at 2 ms, with a waiter: the waiter is told to come
    // back when the hand-off is due, and takes it then.
    assert!(a.mark_holder_idle(p, 2 * MS), "someone waits");
    match b.try_acquire(q, o, 2 * MS + 10_000, SLICE) {
        Acquire::Wait { until } => assert_eq!(until, 2 * MS + IDLE_HANDOFF_NS),
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        b.try_acquire(q, o, 2 * MS + IDLE_HANDOFF_NS, SLICE),
        Acquire::Granted { .. }
    ));
    // Charged the 2 ms it used, not its slice.
    assert_eq!(
        g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
        2 * MS
    );
    assert!(!a.mark_holder_busy(p, 4 * MS), "it lost the lease");
    // A holder back to work within the hand-off time keeps it, and
    // is not charged the gap.
    b.end_wait(q, o);
    assert!(b.release(q, o, 5 * MS));
    a.begin_wait(p, t, 6 * MS);
    assert!(matches!(
        a.try_acquire(p, t, 6 * MS, SLICE),
        Acquire::Granted { .. }
    ));
    a.end_wait(p, t);
    a.mark_holder_idle(p, 7 * MS);
    assert!(a.mark_holder_busy(p, 7 * MS + IDLE_HANDOFF_NS / 2));
    b.begin_wait(q, o, 8 * MS);
    assert!(matches!(
        b.try_acquire(q, o, 8 * MS + IDLE_HANDOFF_NS, SLICE),
        Acquire::Wait { .. }
    ));
    assert!(a.release(p, t, 10 * MS));
    assert_eq!(
        g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
        2 * MS + 4 * MS - IDLE_HANDOFF_NS / 2
    );
}

#[test]
fn a_heavy_tenant_that_idled_holding_the_lease_is_light_again_after_a_window() {
    // A service made heavy once (a long start) waits for the lease at
    // every request, and goes idle holding it. Waiting alone is no
    // evidence it saturates the GPU: under its share, it is light after
    // one window. A tenant that waited and used all it was given is
    // held at its share: it stays heavy.
    let (g, a, t, p) = tenant_with("idled", 50, 100, false);
    let (b, o, q) = contender(&g);
    g.tenant(t).expect("t").heavy.store(1, Ordering::Relaxed);
    let mut now = 0;
    for _ in 0..2 * (DEMAND_WINDOW_NS / (10 * MS)) {
        // A request every 10 ms: waits, holds 1 ms, goes idle, loses it.
        b.end_wait(q, o);
        a.begin_wait(p, t, now);
        assert!(matches!(
            a.try_acquire(p, t, now, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(p, t);
        a.mark_holder_idle(p, now + MS);
        b.begin_wait(q, o, now + MS);
        assert!(matches!(
            b.try_acquire(q, o, now + MS + IDLE_HANDOFF_NS, SLICE),
            Acquire::Granted { .. }
        ));
        b.release(q, o, now + 9 * MS);
        now += 10 * MS;
    }
    assert_eq!(a.route(t, now, SLICE), Route::Free, "light again");
    // The same waits with full use of each slice: stays heavy.
    let (g, a, t, p) = tenant_with("full", 30, 100, false);
    let _other = contender(&g);
    g.tenant(t).expect("t").heavy.store(1, Ordering::Relaxed);
    a.begin_wait(p, t, 0);
    let now = load(&a, t, 20, 0, 1);
    assert_eq!(a.route(t, now, SLICE), Route::Lease, "it waited, used all");
}

#[test]
fn work_in_flight_without_a_break_makes_a_standard_tenant_heavy_at_once() {
    let (g, a, t, _) = tenant_with("busy", 50, 100, false);
    let _other = contender(&g);
    a.note_busy(t, HEAVY_BUSY_NS - 1, None, MS);
    assert_eq!(a.route(t, MS, SLICE), Route::Free);
    a.note_busy(t, HEAVY_BUSY_NS, None, MS);
    assert_eq!(a.route(t, 2 * MS, SLICE), Route::Lease);
    // A latency tenant's long request is no reason to lose its class.
    let (_, b, u, _) = tenant_with("busy-lat", 50, 100, true);
    b.note_busy(u, 10 * HEAVY_BUSY_NS, None, MS);
    assert_eq!(b.route(u, MS, SLICE), Route::Free);
}

#[test]
fn work_in_flight_that_ran_little_on_the_gpu_is_not_saturating() {
    // One competitor: the fair time-slice share is half the stretch, a
    // saturating process runs at least half of that (250 per mille).
    let (g, a, t, _) = tenant_with("decode", 50, 100, false);
    let _other = contender(&g);
    let stretch = 4 * HEAVY_BUSY_NS;
    // A decode loop: in flight all along, its kernels ran 5 %.
    a.note_busy(t, stretch, Some(stretch / 20), MS);
    assert_eq!(a.route(t, MS, SLICE), Route::Free, "launch-bound: light");
    // Just under the bar, then at it.
    a.note_busy(t, stretch, Some(stretch / 4 - 1_000), MS);
    assert_eq!(a.route(t, MS, SLICE), Route::Free);
    a.note_busy(t, stretch, Some(stretch / 4), MS);
    assert_eq!(
        a.route(t, 2 * MS, SLICE),
        Route::Lease,
        "time-sliced saturator"
    );
    // With three competitors the bar is an eighth of the stretch.
    let (h, b, u, _) = tenant_with("decode4", 50, 100, false);
    let _others: Vec<_> = ["o1", "o2", "o3"]
        .iter()
        .map(|n| {
            let (o, _) = h.register_tenant(n, 10, 100, 0, 0).expect("o");
            let c = GpuSegment::open_or_create(&h.path).expect("c");
            let q = c.claim_proc(o, 3).expect("q");
            c.begin_wait(q, o, 0);
            (c, o, q)
        })
        .collect();
    assert_eq!(b.competitors(u, MS), 3);
    assert_eq!(b.competition(u, MS), (3, 0), "three, none heavy");
    b.note_busy(u, stretch, Some(stretch / 8 - 1_000), MS);
    assert_eq!(b.route(u, MS, SLICE), Route::Free);
    b.note_busy(u, stretch, Some(stretch / 8), MS);
    assert_eq!(b.route(u, 2 * MS, SLICE), Route::Lease);
    // Seen by one of the others, once the decode tenant was charged
    // GPU time (it competes): three, one heavy.
    b.charge_free(u, MS, 2 * MS);
    let (c, o, _) = &_others[0];
    assert_eq!(c.competition(*o, 2 * MS), (3, 1));
}

#[test]
fn what_nothing_measured_is_charged_and_counted_apart_per_process() {
    // The charge is the same either way (shares and ceilings count it);
    // the process entry counts the part that is an upper bound, for
    // status to check against NVML, and a new process starts at 0.
    let (g, a, t, p) = tenant_with("bound", 50, 30, false);
    let used = |g: &GpuSegment| g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed);
    let bound =
        |g: &GpuSegment, p: usize| g.proc_entry(p).expect("p").bound_ns.load(Ordering::Relaxed);
    let tokens = || g.tenant(t).expect("t").tokens.load(Ordering::Relaxed);
    let before = tokens();
    a.charge_free(t, 2 * MS, MS);
    a.charge_bound(p, t, 3 * MS, 2 * MS);
    assert_eq!(used(&g), 5 * MS);
    assert_eq!(bound(&g, p), 3 * MS);
    assert_eq!(before - tokens(), 5 * MS as i64, "the ceiling counts both");
    // One charge counts at most a slice's worth, as every free charge.
    a.charge_bound(p, t, 10 * MAX_SLICE_NS, 3 * MS);
    assert_eq!(bound(&g, p), 3 * MS + MAX_SLICE_NS);
    a.release_proc(p, 4 * MS);
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    let q = b.claim_proc(t, 2).expect("q");
    assert_eq!(bound(&g, q), 0);
}

#[test]
fn a_ceiling_applies_to_free_launches() {
    // Standard tenant, 20 % ceiling: free while it has tokens, through
    // the lease (which waits for tokens) without.
    let (g, a, t, _) = tenant_with("ceil", 20, 20, false);
    assert_eq!(
        a.route(t, 0, SLICE),
        Route::Lease,
        "the bucket starts empty"
    );
    assert_eq!(a.route(t, 10 * MS, SLICE), Route::Free);
    a.charge_free(t, 5 * MS, 10 * MS);
    assert_eq!(a.route(t, 10 * MS, SLICE), Route::Lease);
    assert!(g.tenant(t).expect("t").tokens.load(Ordering::Relaxed) < 0);
    // A latency tenant out of tokens is throttled until it has one, not
    // sent to the lease (where it would wait for others' slices).
    let (_, b, u, _) = tenant_with("ceil-lat", 20, 20, true);
    match b.route(u, 0, SLICE) {
        Route::Throttle { until } => assert!((100_000..=MS).contains(&until), "{until}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(b.route(u, 10 * MS, SLICE), Route::Free);
    b.charge_free(u, 5 * MS, 10 * MS);
    match b.route(u, 10 * MS, SLICE) {
        // 2 ms saved by then, 5 ms charged: 3 ms of debt (and one
        // token to earn) at 20 %, 15 ms.
        Route::Throttle { until } => assert_eq!(until, 10 * MS + 15 * MS + 5),
        r => panic!("{r:?}"),
    }
}

#[test]
fn others_hold_back_while_a_latency_tenant_has_work_in_flight() {
    let (g, a, l, p) = tenant_with("hold", 50, 100, true);
    let (s, _) = g.register_tenant("std", 50, 100, 0, 0).expect("std");
    let b = GpuSegment::open_or_create(&g.path).expect("b");
    b.claim_proc(s, 2).expect("q");
    assert!(b.latency_present());
    assert_eq!(b.take_latency_hold(MS), None, "nothing in flight yet");
    // A launch: in flight for one linger.
    a.latency_stamp(l, MS + LATENCY_LINGER_NS);
    assert_eq!(b.take_latency_hold(MS), Some(MS + LATENCY_LINGER_NS));
    assert_eq!(b.take_latency_hold(MS + LATENCY_LINGER_NS), None);
    // A synchronising call: until it returns (however long, up to the
    // cap), then one linger.
    a.latency_sync_begin(p, l, 2 * MS);
    assert!(b.take_latency_hold(2 * MS + 5 * MS).is_some());
    let sleeper = g.sched().lat_waiters.fetch_add(1, Ordering::Relaxed);
    assert!(a.latency_sync_end(p, l, 8 * MS), "sleepers are woken");
    g.sched().lat_waiters.store(sleeper, Ordering::Relaxed);
    assert_eq!(
        b.take_latency_hold(8 * MS),
        Some(8 * MS + LATENCY_SYNC_TAIL_NS)
    );
    assert_eq!(b.take_latency_hold(9 * MS), None);
    // Two threads in calls: the first to return does not end it.
    a.latency_sync_begin(p, l, 10 * MS);
    a.latency_sync_begin(p, l, 10 * MS);
    a.latency_sync_end(p, l, 11 * MS);
    assert!(b.take_latency_hold(12 * MS).is_some());
    a.latency_sync_end(p, l, 12 * MS);
    assert_eq!(b.take_latency_hold(13 * MS), None);
    // Never past the cap, even if the call does not return.
    a.latency_sync_begin(p, l, 20 * MS);
    assert!(
        b.take_latency_hold(20 * MS + LATENCY_SYNC_CAP_NS - 1)
            .is_some()
    );
    assert_eq!(b.take_latency_hold(20 * MS + LATENCY_SYNC_CAP_NS), None);
}

#[test]
fn a_latency_tenant_over_its_share_holds_nobody_back() {
    let (g, a, l, _) = tenant_with("over", 20, 100, true);
    let _other = contender(&g);
    let now = load(&a, l, 50, 0, 2);
    assert!(g.tenants()[0].heavy, "50 % of GPU time on a 20 % share");
    assert!(!a.latency_privileged(l));
    assert!(!a.latency_present());
    a.latency_stamp(l, now + LATENCY_LINGER_NS);
    assert_eq!(a.take_latency_hold(now), None);
    assert_eq!(a.route(l, now, SLICE), Route::Lease);
}

#[test]
fn a_latency_process_that_dies_in_a_synchronising_call_holds_nobody_back() {
    let (g, _live, l, _) = tenant_with("died", 50, 100, true);
    {
        let d = GpuSegment::open_or_create(&g.path).expect("d");
        let q = d.claim_proc(l, 9).expect("q");
        d.latency_sync_begin(q, l, MS);
    } // dies inside the call (its slot lock goes with its descriptor)
    let obs = GpuSegment::open_or_create(&g.path).expect("obs");
    assert!(
        obs.take_latency_hold(2 * MS).is_some(),
        "in flight until swept"
    );
    assert_eq!(obs.reclaim_dead(), 1);
    assert_eq!(g.tenant(l).expect("l").in_sync.load(Ordering::Relaxed), 0);
    // Its stamp (the call's cap) still lies ahead, but nothing renews
    // it and the live process of the tenant is not in a call: the
    // tenant's next call ends it.
    assert!(obs.latency_present(), "the tenant's other process lives");
    assert!(obs.take_latency_hold(3 * MS).is_some());
    assert_eq!(
        obs.take_latency_hold(MS + LATENCY_SYNC_CAP_NS),
        None,
        "bounded by the cap"
    );
    drop(_live);
    obs.reclaim_dead();
    assert!(!obs.latency_present(), "no live latency process");
    assert_eq!(obs.take_latency_hold(3 * MS), None);
}

#[test]
fn latency_values_nobody_writes_hold_nobody_back() {
    let (g, a, l, _) = tenant_with("corrupt", 50, 100, true);
    let s = g.sched();
    // A stamp or a hint an hour ahead: no call sets that.
    g.tenant(l)
        .expect("l")
        .active_until
        .store(u64::MAX, Ordering::Relaxed);
    s.lat_until.store(u64::MAX, Ordering::Relaxed);
    assert_eq!(a.take_latency_hold(MS), None);
    assert_eq!(
        s.lat_until.load(Ordering::Relaxed),
        0,
        "the stale hint is cleared"
    );
    // A class no cuslice writes is a standard tenant.
    g.tenant(l).expect("l").class.store(7, Ordering::Relaxed);
    assert!(!a.latency_present());
    // A demand window starting in the future restarts.
    let e = g.tenant(l).expect("l");
    e.win_start.store(u64::MAX, Ordering::Relaxed);
    e.win_used.store(u64::MAX, Ordering::Relaxed);
    assert_eq!(a.route(l, MS, SLICE), Route::Free);
    assert_eq!(e.win_start.load(Ordering::Relaxed), MS);
    let now = load(&a, l, 10, MS, 2);
    assert_eq!(a.route(l, now, SLICE), Route::Free);
}
