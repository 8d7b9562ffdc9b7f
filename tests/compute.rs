//! Compute shares on the fake driver's simulated GPU (one context at a time,
//! time-sliced between contexts with work, like a GPU without MPS): caps on
//! an idle GPU, splits between tenants, work conservation, a tenant killed
//! mid-slice, 8 tenants, a share change while running, CUDA graph
//! launches, and co-location (light tenants and the latency class).

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::{Host, Spin};

/// Starts `spin ARGS ahead` on `h`'s fake GPU under `quota` (None:
/// without the shim's limits). Ahead: it keeps a batch queued while it
/// waits for the one before, as a training loop keeps its GPU fed: the
/// shares and ceilings below are about tenants that saturate the GPU, and
/// a tenant that drained its queue at every batch left the GPU idle (or
/// to the others) whenever a loaded test machine kept it off the CPU.
fn spin(h: &Host, quota: Option<&Path>, args: &[&str]) -> Child {
    let mut args = args.to_vec();
    args.push("ahead");
    h.spawn("spin", quota, &args, &[])
}

/// A spin run's result, once it has finished (a hung tenant fails the test
/// after 60 s instead of hanging CI).
fn finish(c: Child) -> Spin {
    let out = common::output_by("spin", c, Instant::now() + Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Spin::parse(&stdout)
}

fn assert_near(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 3.0,
        "{what}: got {got:.1} %, want {want} ± 3"
    );
}

#[test]
fn a_ceiling_holds_on_an_idle_gpu() {
    // Achieved fraction of the uncapped rate (the same loop without the
    // shim's limits), as the benchmark on a real GPU measures it. A short
    // burst (20 ms), so that 2.5 s hold many on/off periods. The uncapped
    // loop is the capped one's twin, on a fake GPU of its own at the same
    // time: a loaded machine slows both alike (measured one after the
    // other, a busy moment under one of them moved the ratio by 13
    // points).
    for (cap, kernel) in [(25, "1000000"), (50, "200000")] {
        let tw = Twin::new(&format!("cap{cap}"));
        let q = tw.sliced.quota(
            &format!("cap{cap}"),
            "compute_burst_ms = 20",
            &format!("compute_max = {cap}"),
        );
        let (pc, pn) = tw.spawn("spin", &q, &["2.5", kernel, "4", "ahead"], &[]);
        let (s, native) = (finish(pc), finish(pn));
        let what = format!("cap {cap}% with {kernel} ns kernels");
        if native.fraction() >= 90.0 {
            assert_near(&what, 100.0 * s.fraction() / native.fraction(), cap as f64);
        } else {
            // A machine too busy to keep even the uncapped twin's GPU fed
            // (seen at 60 % under a load of 15 on 2 cores): the ratio is
            // no longer the ceiling's (the twin's shortfall inflates it).
            // What still holds: the ceiling is never passed, and the
            // capped loop gets a fair part of what the machine let its
            // twin have. The ± 3 figure is the GPU benchmark's
            // (scripts/gpu/bench_compute.py, section cap).
            assert!(
                s.fraction() <= cap as f64 + 3.0,
                "{what}: {:.1} % of the GPU, over the ceiling (its twin {:.1} %)",
                s.fraction(),
                native.fraction()
            );
            assert!(
                s.fraction() >= 0.5 * native.fraction().min(cap as f64),
                "{what}: {:.1} % of the GPU, its twin {:.1} %",
                s.fraction(),
                native.fraction()
            );
        }
    }
}

#[test]
fn two_and_three_tenants_split_by_share() {
    let h = Host::new("compute", "split");
    let a = h.quota("a", "", "compute = 30");
    let b = h.quota("b", "", "compute = 70");
    let (pa, pb) = (
        spin(&h, Some(&a), &["3", "1000000", "4"]),
        spin(&h, Some(&b), &["3", "1000000", "4"]),
    );
    let (sa, sb) = (finish(pa), finish(pb));
    let total = sa.fraction() + sb.fraction();
    // (As eight_tenants_get_their_shares: a CPU-starved machine cannot
    // keep even an unlimited fake GPU quite full; 94 % seen beside 4 busy
    // processes.)
    assert!(total > 90.0, "the GPU stays busy: {total:.1}");
    assert_near("tenant a (30)", 100.0 * sa.fraction() / total, 30.0);
    assert_near("tenant b (70)", 100.0 * sb.fraction() / total, 70.0);

    let h = Host::new("compute", "split3");
    let qs: Vec<PathBuf> = [("x", 20), ("y", 30), ("z", 50)]
        .iter()
        .map(|(n, s)| h.quota(n, "", &format!("compute = {s}")))
        .collect();
    let ps: Vec<Child> = qs
        .iter()
        .map(|q| spin(&h, Some(q), &["3", "1000000", "4"]))
        .collect();
    let ss: Vec<Spin> = ps.into_iter().map(finish).collect();
    let total: f64 = ss.iter().map(Spin::fraction).sum();
    for (s, want) in ss.iter().zip([20.0, 30.0, 50.0]) {
        assert_near(
            &format!("tenant at {want}"),
            100.0 * s.fraction() / total,
            want,
        );
    }
}

#[test]
fn idle_share_is_lent_and_returned() {
    // A alone, then B beside it; A's twin without the shim runs alone on
    // a GPU of its own at the same time (the same load on the machine).
    let tw = Twin::new("conserve");
    let a = tw.sliced.quota("a", "", "compute = 30");
    let b = tw.sliced.quota("b", "", "compute = 70");
    let (pa, pn) = tw.spawn("spin", &a, &["4", "1000000", "4", "ahead"], &[]);
    std::thread::sleep(Duration::from_millis(1000));
    let pb = spin(&tw.sliced, Some(&b), &["1.5", "1000000", "4"]);
    let (sa, sn, sb) = (finish(pa), finish(pn), finish(pb));
    // The windows are placed by B's start in A's run (its `S` line), not
    // by the test's sleep: a loaded machine starts either late.
    let b0 = sa.at(sb.start);
    assert!(
        b0 >= 500.0,
        "B started {b0:.0} ms into A's run: too early to see A alone"
    );
    // Alone, A gets the whole GPU although its share is 30 % (the GPU
    // figure is >= 95 %; on the fake, with the 3-point tolerance:
    // 92 %), or, on a CPU-starved machine that cannot keep even an
    // unlimited fake GPU full, 60 % of what its twin gets (the shim's CPU
    // per launch counts there: 72 % beside a twin's 88 % seen under 4 busy
    // processes), and 40 % (held to its share, A would get 30 %).
    let to = (b0 - 100.0).min(900.0);
    let alone = sa.fraction_between(100.0, to);
    let twin = sn.fraction_between(sn.at(sa.start) + 100.0, sn.at(sa.start) + to);
    assert!(
        alone >= 92.0 || alone >= (0.6 * twin).max(40.0),
        "A alone: {alone:.1}, its twin without the shim {twin:.1}"
    );
    // Once B runs (from its start, for 1.5 s), A is back near 30 %.
    let with_b = sa.fraction_between(b0 + 400.0, b0 + 1400.0);
    assert!(with_b <= 33.0, "A with B: {with_b:.1}\n{}", sa.stdout);
}

#[test]
fn a_tenant_killed_mid_slice_loses_the_gpu() {
    // B's twin without the shim runs alone on a GPU of its own at the
    // same time (the same load on the machine).
    let tw = Twin::new("kill");
    let h = &tw.sliced;
    let a = h.quota("a", "", "compute = 50");
    let b = h.quota("b", "", "compute = 50");
    let mut pa = spin(h, Some(&a), &["10", "5000000", "2"]);
    let (pb, pn) = tw.spawn("spin", &b, &["5", "1000000", "4", "ahead"], &[]);
    std::thread::sleep(Duration::from_millis(1000));
    pa.kill().expect("kill -9");
    let _ = pa.wait();
    let killed = cuslice_core::gpu::monotonic_ns() as f64 / 1e6;
    let (sb, sn) = (finish(pb), finish(pn));
    // After the kill B has the GPU to itself (the lease of the dead holder
    // is taken over at once; its queued kernels finish within ~10 ms):
    // from 500 ms after the kill in B's run (however late a loaded machine
    // made it), for 1.3 s.
    let k = sb.at(killed);
    assert!(
        k + 1800.0 <= sb.wall,
        "A was killed {k:.0} ms into B's run of {:.0} ms",
        sb.wall
    );
    let after = sb.fraction_between(k + 500.0, k + 1800.0);
    let twin = sn.fraction_between(sn.at(killed) + 500.0, sn.at(killed) + 1800.0);
    // >= 90 %; or, on a CPU-starved machine that cannot keep even an
    // unlimited fake GPU full, 80 % of what its twin got then (the shim's
    // CPU per launch counts there), and 60 % (held to its share behind a
    // dead holder, B would get 50 % or nothing).
    assert!(
        after >= 90.0 || after >= (0.8 * twin).max(60.0),
        "B after A's death: {after:.1}, its twin without the shim {twin:.1}\n{}",
        sb.stdout
    );
}

#[test]
fn eight_tenants_get_their_shares() {
    let h = Host::new("compute", "eight");
    let shares = [5, 5, 10, 10, 10, 15, 20, 25];
    let qs: Vec<PathBuf> = shares
        .iter()
        .enumerate()
        .map(|(i, s)| h.quota(&format!("t{i}"), "", &format!("compute = {s}")))
        .collect();
    let ps: Vec<Child> = qs
        .iter()
        .map(|q| spin(&h, Some(q), &["4", "500000", "4"]))
        .collect();
    let ss: Vec<Spin> = ps.into_iter().map(finish).collect();
    let total: f64 = ss.iter().map(Spin::fraction).sum();
    assert!(total > 90.0, "the GPU stays busy: {total:.1}");
    for (s, want) in ss.iter().zip(shares) {
        assert_near(
            &format!("tenant at {want}"),
            100.0 * s.fraction() / total,
            want as f64,
        );
    }
}

#[test]
fn a_share_change_takes_effect_while_running() {
    let h = Host::new("compute", "change");
    let a = h.quota("a", "", "compute = 50");
    let b = h.quota("b", "", "compute = 50");
    let pa = spin(&h, Some(&a), &["5", "1000000", "4"]);
    let pb = spin(&h, Some(&b), &["5", "1000000", "4"]);
    std::thread::sleep(Duration::from_millis(1500));
    // The operator lowers B to 20 %: a process of B starting with the new
    // quota file updates the tenant's share for everyone.
    let b2 = h.quota("b", "", "compute = 20");
    let asked = cuslice_core::gpu::monotonic_ns() as f64 / 1e6;
    // Its run only registers the new share; what it changes is judged
    // below.
    finish(spin(&h, Some(&b2), &["0.05", "1000", "1"]));
    let changed = cuslice_core::gpu::monotonic_ns() as f64 / 1e6;
    let (sa, sb) = (finish(pa), finish(pb));
    // The windows in each run's own time, placed by when the change was
    // made (the test's clock), not by the test's sleep: on a loaded
    // machine either run may have started late.
    let before = |s: &Spin| s.fraction_between(300.0, (s.at(asked) - 100.0).min(1400.0));
    let after = |s: &Spin| {
        let c = s.at(changed);
        s.fraction_between(c + 700.0, (c + 2300.0).min(s.wall - 100.0))
    };
    assert!(
        sa.at(changed) + 1500.0 <= sa.wall && sa.at(asked) >= 700.0,
        "the change came {:.0} to {:.0} ms into A's run of {:.0} ms",
        sa.at(asked),
        sa.at(changed),
        sa.wall
    );
    // The split's accuracy is two_and_three_tenants_split_by_share's (3
    // points); this test's point is the change: A's part rises by most of
    // the 21.4 points the shares make it (50 -> 71.4 on an idle machine;
    // beside 4 busy processes and other builds two spins drift: 41.6
    // before, 61.7 after seen), by 10 at least (a change that never took
    // effect: none).
    let (fa, fb) = (before(&sa), before(&sb));
    let was = 100.0 * fa / (fa + fb);
    let (fa, fb) = (after(&sa), after(&sb));
    let now = 100.0 * fa / (fa + fb);
    assert!(
        (was - 50.0).abs() <= 10.0 && now - was >= 10.0,
        "A before {was:.1} % (50), after B drops to 20 {now:.1} % ({:.1})",
        100.0 * 50.0 / 70.0
    );
}

#[test]
fn graph_launches_are_limited_like_kernels() {
    let h = Host::new("compute", "graph");
    let native = finish(spin(&h, None, &["1", "1000000", "4", "graph"]));
    let q = h.quota("g", "compute_burst_ms = 20", "compute_max = 25");
    let s = finish(spin(&h, Some(&q), &["2.5", "1000000", "4", "graph"]));
    assert_near(
        "graph replay under a 25 % ceiling",
        100.0 * s.fraction() / native.fraction(),
        25.0,
    );
}

#[test]
fn a_ceiling_bound_tenant_runs_in_long_stretches() {
    // By default (200 ms burst) a tenant held back by its 50 % ceiling has
    // the GPU for stretches of ~400 ms and pauses as long (so that a real
    // GPU's clocks settle as under sustained load); with a 20 ms burst the
    // stretches are ~40 ms. Progress lines come every 100 ms of running.
    let h = Host::new("compute", "stretch");
    let shape = |top: &str, name: &str| {
        let q = h.quota(name, top, "compute_max = 50");
        let s = finish(spin(&h, Some(&q), &["4", "1000000", "4"]));
        let longest_pause = s
            .samples
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .fold(0.0, f64::max);
        // The largest share of the GPU between two progress lines at least
        // 300 ms apart.
        let best_300 = s
            .samples
            .iter()
            .enumerate()
            .filter_map(|(i, &(t, b))| {
                let &(t2, b2) = s.samples[i..].iter().find(|x| x.0 >= t + 300.0)?;
                Some(100.0 * (b2 - b) / (t2 - t))
            })
            .fold(0.0, f64::max);
        (s.fraction(), longest_pause, best_300)
    };
    let (frac, pause, best) = shape("", "long");
    assert!(pause >= 300.0, "default burst: longest pause {pause:.0} ms");
    assert!(
        best >= 85.0,
        "default burst: best 300 ms window {best:.1} %"
    );
    assert!(
        (frac - 50.0).abs() <= 8.0,
        "default burst: {frac:.1} % overall"
    );
    let (frac, pause, best) = shape("compute_burst_ms = 20", "short");
    assert!(pause < 250.0, "20 ms burst: longest pause {pause:.0} ms");
    assert!(best < 75.0, "20 ms burst: best 300 ms window {best:.1} %");
    assert_near("20 ms burst overall", frac, 50.0);
}

// ---- co-location ----------------------------------------------------------

/// A finished ping run (tests/apps/ping.c): latency from each request's due
/// time, in ms.
#[derive(Debug)]
struct Ping {
    p50: f64,
    p99: f64,
    // Not compared, but shown with the rest in the failure messages (Debug),
    // which dead-code analysis does not count as a read.
    #[allow(dead_code)]
    max: f64,
    served: u32,
    due: u32,
    /// The requests due from 250 ms on: p99 (ms) and how many.
    tail_p99: f64,
    #[allow(dead_code)]
    tail_n: u32,
}

fn finish_ping(c: Child) -> Ping {
    ping_result(&common::output_by(
        "ping",
        c,
        Instant::now() + Duration::from_secs(60),
    ))
}

/// The result lines of a ping or decode run that has ended.
fn ping_result(out: &std::process::Output) -> Ping {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = stdout
        .lines()
        .find(|l| l.starts_with("L "))
        .unwrap_or_else(|| panic!("no result line: {stdout}"));
    let v: Vec<f64> = l[2..]
        .split_whitespace()
        .map(|x| x.parse().expect("number"))
        .collect();
    let t: Vec<f64> = stdout
        .lines()
        .find(|l| l.starts_with("T "))
        .map(|l| {
            l[2..]
                .split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect()
        })
        .unwrap_or_else(|| vec![0.0; 4]);
    Ping {
        p50: v[0] / 1e3,
        p99: v[1] / 1e3,
        max: v[2] / 1e3,
        served: v[3] as u32,
        due: v[4] as u32,
        tail_p99: t[1] / 1e3,
        tail_n: t[3] as u32,
    }
}

/// Requests of 0.5 ms on the GPU every 10 ms for `secs`.
const PING: [&str; 3] = ["3", "10000", "500000"];
/// A request's own kernel (PING's third argument), ms.
const PING_KERNEL_MS: f64 = 0.5;

/// The fake GPU's time-slice between contexts for a test's processes,
/// set explicitly: the latency bounds below are derived from it.
fn slice(ns: u64) -> (&'static str, String) {
    ("FAKE_CUDA_TIMESLICE_NS", ns.to_string())
}

/// Latency tests compare against a twin: the same programs started at the
/// same moments on a second fake GPU of their own (another host), without
/// the shim's limits. Both see the same load on the test machine (CPU
/// time, wake-ups), which a 2-core CI machine running other tests adds to
/// every latency; what the shim adds shows as the difference.
struct Twin {
    sliced: Host,
    native: Host,
}

impl Twin {
    fn new(name: &str) -> Twin {
        Twin {
            sliced: Host::new("compute", name),
            native: Host::new("compute", &format!("{name}-native")),
        }
    }

    /// Starts `app ARGS` on both GPUs: under `quota` on the sliced one,
    /// without limits on the native one.
    fn spawn(
        &self,
        app: &str,
        quota: &Path,
        args: &[&str],
        env: &[(&'static str, String)],
    ) -> (Child, Child) {
        let env: Vec<(&'static str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        (
            self.sliced.spawn(app, Some(quota), args, &env),
            self.native.spawn(app, None, args, &env),
        )
    }
}

/// What a latency may exceed its reference by: the noise between two runs
/// of the same program side by side on a loaded machine, 3 ms and a
/// quarter of the reference (under 2 busy processes on 2 cores the twins'
/// p99 differed by up to ~1.5 ms; under 4, one of three whole-suite runs
/// saw a latency tenant's p99 0.4 ms over a 2 ms allowance: a descheduled
/// request or two). Waiting for another tenant's lease (a 20 ms slice and
/// its drain) or a 50 ms time-slice, the regressions these tests guard
/// against, costs far more.
fn noise(reference: f64) -> f64 {
    3.0 + reference / 4.0
}

/// What process `pid` did with CUPTI, from the fake's lines in the call
/// log.
#[derive(Debug, Default)]
struct CuptiCalls {
    /// Times recording was switched on (successful enables).
    on: u32,
    /// Kernel records taken out by flushes.
    records: u64,
    /// Kernels launched.
    launched: u64,
    /// Successful callback registrations, and detaches (`cuptiFinalize`).
    registered: u32,
    finalized: u32,
    /// Detaches that dropped the program's own subscription or profiler
    /// session (`subscriber_lost=1` / `profiler_lost=1` on the fake's line).
    lost: u32,
    /// The registrations, enables and detaches in order: `R`, `E`, `F`;
    /// and `S` for the program's own successful `cuptiSubscribe` or
    /// `cuptiProfilerInitialize`.
    order: String,
}

/// What process `pid` did with CUPTI, from the fake's lines in the call
/// log `log`.
fn cupti_calls(log: &Path, pid: u32) -> CuptiCalls {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let me = format!("{pid} ");
    let mut c = CuptiCalls::default();
    for l in text.lines().filter(|l| l.starts_with(&me)) {
        let ok = l.ends_with("-> 0");
        if l.contains(" cuLaunchKernel") && ok {
            c.launched += 1;
        }
        if l.contains(" cuptiActivityEnable kind=") && ok {
            c.on += 1;
            c.order.push('E');
        }
        if l.contains(" cuptiActivityRegisterCallbacks ") && ok {
            c.registered += 1;
            c.order.push('R');
        }
        if l.contains(" cuptiFinalize ") && ok {
            c.finalized += 1;
            c.order.push('F');
            if l.contains(" subscriber_lost=1") || l.contains(" profiler_lost=1") {
                c.lost += 1;
            }
        }
        if (l.contains(" cuptiSubscribe ")
            || l.contains(" cuptiSubscribe_v2 ")
            || l.contains(" cuptiProfilerInitialize "))
            && ok
        {
            c.order.push('S');
        }
        if l.contains(" cuptiActivityFlushAll ") {
            c.records += l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("records="))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no record count in {l:?}"));
        }
    }
    c
}

/// What process `pid` recorded, from the fake's lines in the call log
/// `log`: (times recording was switched on, kernel records taken out,
/// kernels launched).
fn recorded(log: &Path, pid: u32) -> (u32, u64, u64) {
    let c = cupti_calls(log, pid);
    (c.on, c.records, c.launched)
}

#[test]
fn two_light_tenants_are_not_delayed() {
    // Two services at 50/50, each far under its share: both launch freely,
    // as without cuslice (before: each waited for the other's 20 ms slice).
    // Guaranteed: each one's p99 is within noise of the same pair's
    // without cuslice, measured at the same time; and without load, within
    // its own kernel, the other's when they collide, and a slice of noise.
    //
    // And neither records its kernels all along (issue #19: recording
    // costs every launch): their wall time in flight, an upper bound of
    // their GPU time, is far under their shares, so what their kernels ran
    // cannot change a thing. Both see the GPU shared (each loads CUPTI);
    // a few probes each at most (a request held up for 10 ms by a loaded
    // test machine is a busy stretch worth measuring: 2 seen beside 4 busy
    // processes on 2 cores), recording at most a fifth of their kernels
    // (recorded all along: every kernel).
    let tw = Twin::new("two-light");
    let qa = tw.sliced.quota("a", "", "compute = 50");
    let qb = tw.sliced.quota("b", "", "compute = 50");
    let log = tw.sliced.dir.join("calls.log");
    let env = [
        slice(2_000_000),
        ("FAKE_CUDA_LOG", log.display().to_string()),
    ];
    let (a, na) = tw.spawn("ping", &qa, &PING, &env);
    let (b, nb) = tw.spawn("ping", &qb, &PING, &env);
    let pids = [a.id(), b.id()];
    let native = [finish_ping(na), finish_ping(nb)];
    for (name, p) in [("a", finish_ping(a)), ("b", finish_ping(b))] {
        assert_eq!(p.served, p.due, "{name}: every request served: {p:?}");
        let reference = native.iter().map(|n| n.p99).fold(0.0, f64::max);
        assert!(
            p.p99 <= reference + noise(reference),
            "{name}: {p:?}, without cuslice {native:?}"
        );
    }
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    for pid in pids {
        assert!(
            calls.contains(&format!("{pid} cuptiActivityRegisterCallbacks ")),
            "{pid} saw the GPU shared and loaded CUPTI"
        );
        let (on, records, launched) = recorded(&log, pid);
        assert!(
            on <= 3 && records * 5 <= launched && launched >= u64::from(native[0].due),
            "{pid} recorded {records} of {launched} kernels, switched on {on} times"
        );
    }
}

#[test]
fn a_light_tenant_beside_a_saturating_one_waits_at_most_a_kernel_and_a_time_slice() {
    // A light tenant (standard class) launches at once and waits only for
    // the driver's time-slicing, as without cuslice (before: for the
    // trainer's 20 ms slice and its drain). Two drivers: a 2 ms
    // time-slice beside 5 ms trainer kernels (requests every 10 ms), and
    // an 8 ms one beside 2 ms kernels (requests every 20 ms: the driver
    // switches at the first kernel boundary past the slice, so a request
    // can wait a whole slice, and one every 10 ms would come faster than
    // the driver serves it). Guaranteed: its p99 is within noise of the
    // bound the driver's model gives (one trainer kernel + one time-slice
    // + its own kernel), or of the same pair's without cuslice measured at
    // the same time if load pushes that higher; and the trainer keeps the
    // GPU.
    for (slice_ns, kernel_ns, period_us) in [
        (2_000_000u64, 5_000_000u64, 10_000u64),
        (8_000_000, 2_000_000, 20_000),
    ] {
        let what = format!("slice {slice_ns} ns, trainer kernels {kernel_ns} ns");
        let tw = Twin::new(&format!("light-heavy-{slice_ns}"));
        let qt = tw.sliced.quota("trainer", "", "compute = 50");
        let qs = tw.sliced.quota("service", "", "compute = 50");
        let env = [slice(slice_ns)];
        // Trainers keep 50 ms queued.
        let depth = (50_000_000 / kernel_ns).to_string();
        let (t, nt) = tw.spawn("spin", &qt, &["3.5", &kernel_ns.to_string(), &depth], &env);
        std::thread::sleep(Duration::from_millis(300));
        let (p, np) = tw.spawn("ping", &qs, &["3", &period_us.to_string(), "500000"], &env);
        let (p, np) = (finish_ping(p), finish_ping(np));
        let (st, _) = (finish(t), finish(nt));
        assert_eq!(p.served, p.due, "{what}: {p:?}, without cuslice {np:?}");
        let model = (kernel_ns + slice_ns) as f64 / 1e6 + PING_KERNEL_MS;
        let reference = model.max(np.p99);
        assert!(
            p.p99 <= reference + noise(reference),
            "{what}: one kernel + a time-slice ({model} ms): {p:?}, without cuslice {np:?}"
        );
        assert!(
            st.fraction() >= 80.0,
            "{what}: the trainer keeps the GPU: {:.1} %",
            st.fraction()
        );
    }
}

#[test]
fn a_service_made_heavy_by_its_start_passes_freely_again_within_a_window() {
    // The bimodal collapse seen on an H200 (issue #19): a service whose
    // start kept work in flight for over 50 ms beside a trainer (context,
    // libraries, a first large request: here one 80 ms kernel) turned
    // heavy; from then on each request waited for the lease, and a heavy
    // tenant that had waited stayed heavy, so it never came back: p99
    // 44 ms for the rest of the run where a native pair has 3 ms. Whether
    // a start took that long depended on the start offset and the host.
    // Now a tenant is held back only on evidence it saturates the GPU: the
    // service, back under its share, launches freely again and waits only
    // for the driver's time-slicing, as its twin that started light does.
    // Guaranteed: from 250 ms on, its p99 is within noise of one trainer
    // kernel + a time-slice + its own kernel (the driver's 2 ms slice, set
    // here), or of the same pair's without cuslice at the same time.
    const KERNEL_MS: f64 = 5.0;
    const SLICE_NS: u64 = 2_000_000;
    let tw = Twin::new("heavy-start");
    let qt = tw.sliced.quota("trainer", "", "compute = 50");
    let qs = tw.sliced.quota("service", "", "compute = 50");
    let env = [slice(SLICE_NS)];
    let (t, nt) = tw.spawn("spin", &qt, &["4.5", "5000000", "10"], &env);
    std::thread::sleep(Duration::from_millis(300));
    let (p, np) = tw.spawn("ping", &qs, &["3", "10000", "500000", "80000000"], &env);
    let (p, np) = (finish_ping(p), finish_ping(np));
    let (st, _) = (finish(t), finish(nt));
    assert_eq!(p.served, p.due, "{p:?}");
    // Its start was over its share: it may be held through the lease for
    // a window or two (100 ms each), not longer.
    let model = KERNEL_MS + SLICE_NS as f64 / 1e6 + PING_KERNEL_MS;
    let reference = model.max(np.tail_p99);
    assert!(
        p.tail_p99 <= reference + noise(reference),
        "from 250 ms on, one kernel + a time-slice ({model} ms), as if it had started light: {p:?}, without cuslice {np:?}"
    );
    assert!(
        st.fraction() >= 80.0,
        "the trainer keeps the GPU: {:.1} %",
        st.fraction()
    );
}

#[test]
fn a_latency_tenant_waits_only_for_the_kernel_that_is_running() {
    // A 50 ms time-slice (all processes of the fake GPU), 2 ms trainer
    // kernels. A standard light tenant may wait for the trainer's whole
    // time-slice; a latency tenant only for the kernel running when its
    // request arrives: the trainer keeps one kernel queued at a time while
    // a latency tenant is live, and holds back while its work is in flight.
    // Guaranteed: the latency tenant's p99 is within noise of the same
    // service alone on a GPU of its own at the same time plus one trainer
    // kernel, far under the slice; the standard one waits for a good part
    // of the slice, more than twice as long.
    const KERNEL_MS: f64 = 2.0;
    const SLICE_NS: u64 = 50_000_000;
    let tw = Twin::new("latency");
    let env = [slice(SLICE_NS)];
    let qt = tw.sliced.quota("trainer", "", "compute = 50");
    let ql = tw.sliced.quota("svc", "latency = true", "compute = 50");
    let qs = tw.sliced.quota("std-svc", "", "compute = 50");
    let envs: Vec<(&'static str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let solo = finish(tw.sliced.spawn("spin", None, &["1", "2000000", "8"], &envs));

    let t = tw
        .sliced
        .spawn("spin", Some(&qt), &["3.5", "2000000", "8"], &envs);
    std::thread::sleep(Duration::from_millis(300));
    // The reference: the same service alone (no trainer) on the twin GPU.
    let (lat, alone) = tw.spawn("ping", &ql, &PING, &env);
    let (lat, alone) = (finish_ping(lat), finish_ping(alone));
    let st = finish(t);
    assert_eq!(lat.served, lat.due, "{lat:?}");
    let reference = alone.p99 + KERNEL_MS;
    assert!(
        lat.p99 <= reference + noise(alone.p99),
        "the running kernel + its own: {lat:?}, alone {alone:?}"
    );
    let kept = 100.0 * st.fraction() / solo.fraction();
    assert!(
        kept >= 70.0,
        "the trainer keeps most of its throughput: {kept:.1} %"
    );

    // The same service in the standard class waits for the time-slice.
    let t = tw
        .sliced
        .spawn("spin", Some(&qt), &["3.5", "2000000", "8"], &envs);
    std::thread::sleep(Duration::from_millis(300));
    let std_ = finish_ping(tw.sliced.spawn("ping", Some(&qs), &PING, &envs));
    let _ = finish(t);
    assert!(
        std_.p99 >= SLICE_NS as f64 / 1e6 / 5.0 && std_.p99 > 2.0 * lat.p99,
        "standard {std_:?} vs latency {lat:?}"
    );
}

#[test]
fn a_trainer_beside_a_latency_tenant_is_charged_about_what_its_kernels_ran() {
    // Beside a latency tenant a trainer keeps a short queue: short passes,
    // then a wait for its own kernel. Its kernels run while it waits, so
    // the wait is work in flight. Charged only its passes, it was charged
    // 13 % of its GPU time (here; an H200 trainer beside a latency decode
    // server: never through the lease, never measured), shown and
    // scheduled as a light tenant.
    let h = Host::new("compute", "shallow-charge");
    let qt = h.quota("trainer", "", "compute = 50");
    let ql = h.quota("svc", "latency = true", "compute = 50");
    let env = [slice(2_000_000)];
    let envs: Vec<(&'static str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The service first: the trainer never runs alone (it would start
    // heavy, and go through the lease, charged its slices).
    let svc = h.spawn("ping", Some(&ql), &PING, &envs);
    std::thread::sleep(Duration::from_millis(200));
    let t = h.spawn("spin", Some(&qt), &["2.5", "2000000", "8"], &envs);
    let svc = finish_ping(svc);
    let st = finish(t);
    assert_eq!(svc.served, svc.due, "{svc:?}");
    let used = used_ns(&h, "trainer") as f64 / 1e6;
    assert!(
        used >= 0.7 * st.busy && used <= 1.5 * st.busy + 100.0,
        "charged {used:.0} ms for {:.0} ms its kernels ran",
        st.busy
    );
}

#[test]
fn a_latency_tenant_over_its_share_holds_nobody_back() {
    // A "latency" tenant that saturates the GPU (a 2 ms request every 2 ms)
    // on a 10 % share beside a trainer on 90 %: it is charged like anyone,
    // turns heavy, and the split follows the shares.
    // (Were it still privileged, it would hold the trainer back for most
    // of every request: the trainer would get well under half.)
    let h = Host::new("compute", "latency-greedy");
    let qt = h.quota("trainer", "", "compute = 90");
    let ql = h.quota("greedy", "latency = true", "compute = 10");
    let solo = finish(spin(&h, None, &["1.5", "1000000", "4"]));
    let t = spin(&h, Some(&qt), &["3", "1000000", "4"]);
    let g = h.spawn("ping", Some(&ql), &["3", "2000", "2000000"], &[]);
    let st = finish(t);
    let _ = finish_ping(g);
    let after = 100.0 * st.fraction_between(1000.0, 2900.0) / solo.fraction();
    assert!(
        after >= 75.0,
        "trainer at 90 %: {after:.1} % of its solo rate\n{}",
        st.stdout
    );
}

#[test]
fn a_launch_bound_latency_tenant_spends_its_privilege_and_goes_on_unheld() {
    // The latency class's privilege (others hold back while its work is in
    // flight) costs the others the wall time its work is in flight, not
    // its kernels' GPU time: a decode loop in flight ~95 % of the time
    // runs kernels ~3 % of it. Privileged however long it was in flight,
    // such a tenant on a 50 % share left a trainer on the other 50 % a
    // tenth of its solo rate (on an H200, a decode server left a trainer
    // 41-63 %). Charged its wall time in flight instead, it turned heavy
    // and went through the lease, where it stayed (on an H200: p99 2.4 s
    // against 0.35 s without cuslice, the trainer at 64 %). Its privilege
    // is a budget of wall time (up to 20 ms at once, refilled at half its
    // share) and its share is charged its kernels' GPU time: the privilege
    // spent, it launches as a standard tenant would. Guaranteed: the
    // trainer keeps at least half its solo rate, the decode loop never
    // takes the lease, did use its privilege and serves as many requests
    // as its twin without cuslice. (Privileged time charged against its
    // share as wall time: 59 leases, 67 of 150 served, p99 1.7 s; now: 0,
    // 150, 28 ms, the trainer at 80 %, on an idle 2-core machine.)
    let tw = Twin::new("latency-decode");
    let qt = tw.sliced.quota("trainer", "", "compute = 60");
    let ql = tw.sliced.quota("decode", "latency = true", "compute = 40");
    let solo = finish(spin(&tw.sliced, None, &["1.5", "1000000", "4"]));
    let (t, nt) = tw.spawn("spin", &qt, &["3", "1000000", "4", "ahead"], &[]);
    // A request every 20 ms: 4 tokens of 16 kernels of 10 us, 300 us of
    // host time before each launch (~19 ms in flight per request). Its twin
    // beside a twin trainer without cuslice, at the same time: a decoder
    // starved of CPU (it busy-waits ~95 % of a core) falls behind its
    // schedule either way.
    let (d, nd) = tw.spawn(
        "decode",
        &ql,
        &["3", "20000", "4", "16", "10000", "300000"],
        &[("CUSLICE_LOG", "info".to_string())],
    );
    let st = finish(t);
    let _ = finish(nt);
    let out = common::output_by("decode", d, Instant::now() + Duration::from_secs(60));
    let p = ping_result(&out);
    let np = finish_ping(nd);
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    let line = report
        .lines()
        .find(|l| l.contains("passes launching freely"))
        .unwrap_or_else(|| panic!("no exit report: {report}"));
    let after = 100.0 * st.fraction_between(1000.0, 2900.0) / solo.fraction();
    assert!(
        after >= 50.0,
        "trainer at 60 %: {after:.1} % of its solo rate ({p:?}, {line})\n{}",
        st.stdout
    );
    assert!(
        line.contains(" 0 holding the lease") && !line.contains("(0 privileged)"),
        "privileged for a while, never through the lease: {line} ({p:?})"
    );
    assert!(
        p.served * 10 >= np.served * 9,
        "serves its requests as without cuslice: {p:?}, without cuslice {np:?} ({line})"
    );
}

/// The GPU time charged to `tenant` so far.
fn used_ns(h: &Host, tenant: &str) -> u64 {
    common::GpuView::of(&h.gpu()).tenant(tenant).used_ns
}

/// A launch-bound decode loop beside a saturating trainer (5 ms kernels,
/// 10 queued, the fake's 2 ms time-slice), both at 50 %: each request is 12
/// tokens of 4 kernels of 20 us with 100 us of host work between launches
/// and a synchronisation per token, one every 80 ms. Its kernels wait for
/// the trainer's, so a request is in flight ~55 ms (two thirds of the time,
/// without a break) while its kernels run 1.2 %. Returns (its result, GPU time charged to
/// it, whether it was ever seen heavy, the trainer's fraction, its PID).
fn decode_beside_trainer(h: &Host, extra: &[(&'static str, &str)]) -> (Ping, u64, bool, f64, u32) {
    let mut extra = extra.to_vec();
    extra.push(("FAKE_CUDA_TIMESLICE_NS", "2000000"));
    let extra = &extra[..];
    let qt = h.quota("trainer", "", "compute = 50");
    let qd = h.quota("decode", "", "compute = 50");
    let t = h.spawn("spin", Some(&qt), &["3.5", "5000000", "10"], extra);
    std::thread::sleep(Duration::from_millis(300));
    let d = h.spawn(
        "decode",
        Some(&qd),
        &["2.5", "80000", "12", "4", "20000", "100000"],
        extra,
    );
    let pid = d.id();
    let g = h.gpu();
    let mut heavy = false;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2400) {
        let v = common::GpuView::of(&g);
        heavy |= v.tenants.iter().any(|t| t.name == "decode" && t.heavy);
        std::thread::sleep(Duration::from_millis(5));
    }
    let used = used_ns(h, "decode");
    let p = finish_ping(d);
    let st = finish(t);
    (p, used, heavy, st.fraction(), pid)
}

/// `decode_beside_trainer` on a host of its own (`name`), with the fake's
/// call log and `extra`: the decode loop charged about its kernels
/// (`charged_its_kernels`); its results, what it was charged (ns) and its
/// CUPTI calls.
fn metered_decode(name: &str, extra: &[(&'static str, &str)]) -> (Ping, u64, CuptiCalls) {
    let h = Host::new("compute", name);
    let log = h.dir.join("calls.log");
    let logged = log.display().to_string();
    let mut env = vec![("FAKE_CUDA_LOG", logged.as_str())];
    env.extend_from_slice(extra);
    let (p, used, heavy, trainer, pid) = decode_beside_trainer(&h, &env);
    charged_its_kernels(&p, used, heavy, trainer);
    (p, used, cupti_calls(&log, pid))
}

/// `decode_beside_trainer`'s decode loop, metered: every request served,
/// charged about its kernels' time (0.9-3x, plus 50 ms), never heavy, the
/// trainer keeping the GPU.
fn charged_its_kernels(p: &Ping, used: u64, heavy: bool, trainer: f64) {
    assert_eq!(p.served, p.due, "{p:?}");
    let kernels_ns = u64::from(p.served) * 48 * 20_000;
    assert!(
        used >= kernels_ns * 9 / 10 && used <= kernels_ns * 3 + 50_000_000,
        "charged {} ms for {} ms of kernels",
        used as f64 / 1e6,
        kernels_ns as f64 / 1e6
    );
    assert!(!heavy, "a launch-bound tenant is never heavy: {p:?}");
    assert!(trainer >= 80.0, "the trainer keeps the GPU: {trainer:.1} %");
}

#[test]
fn a_launch_bound_tenant_is_charged_what_its_kernels_ran_and_launches_freely() {
    // Issue #19: charged its wall time in flight, a decode loop beside a
    // trainer was treated as saturating (heavy, through the lease); from
    // kernel records (the fake's CUPTI, exact on its timeline) it is
    // charged its kernels' time and stays light.
    //
    // Recording costs every launch, so the decode loop is measured in
    // probes: recording switched on again and again, its records a small
    // fraction of its kernels (the rest charged at the probes' ratio of
    // GPU time to time in flight), and still charged about its kernels.
    let (p, used, c) = metered_decode("decode-meter", &[]);
    let (on, records, launched) = (c.on, c.records, c.launched);
    assert!(launched >= u64::from(p.served) * 48, "{launched} launches");
    assert!(
        on >= 2 && records * 2 <= launched,
        "probes: recording on {on} times, {records} records of {launched} kernels"
    );

    // The same pair without the meter: charged its time in flight, many
    // times its kernels' time, and held through the lease.
    let h = Host::new("compute", "decode-wall");
    let (_, wall, heavy, _, _) = decode_beside_trainer(&h, &[("CUSLICE_CUPTI", "off")]);
    assert!(
        wall >= 10 * used.max(1),
        "in flight {} ms vs measured {} ms",
        wall as f64 / 1e6,
        used as f64 / 1e6
    );
    assert!(heavy, "charged its time in flight, it looks saturating");
}

#[test]
fn when_kernel_records_stop_coming_the_meter_gives_up_and_charges_time_in_flight_again() {
    // Another CUPTI client can take the records (a profiler attached
    // later, CUPTI's callbacks replaced): the meter's probes then see none
    // while the process launches. A probe without records measures a
    // ratio of 0 (charged nothing until the next), so after two such
    // probes in a row the meter gives up for good, says why, and the
    // process is charged its wall time in flight again: never a process
    // charged nothing for the rest of its run.
    let h = Host::new("compute", "decode-silent");
    let extra = [
        ("FAKE_CUDA_TIMESLICE_NS", "2000000"),
        ("FAKE_CUPTI_FAIL", "silent"),
    ];
    let qt = h.quota("trainer", "", "compute = 50");
    let qd = h.quota("decode", "", "compute = 50");
    let t = h.spawn("spin", Some(&qt), &["6.5", "5000000", "10"], &extra);
    std::thread::sleep(Duration::from_millis(300));
    // As decode_beside_trainer's loop, for 6 s: time for the two silent
    // probes (about a second apart) and a long stretch charged after them.
    let mut env = extra.to_vec();
    env.push(("CUSLICE_LOG", "info"));
    let d = h.spawn(
        "decode",
        Some(&qd),
        &["6", "80000", "12", "4", "20000", "100000"],
        &env,
    );
    let out = common::output_by("decode", d, Instant::now() + Duration::from_secs(60));
    let used = used_ns(&h, "decode");
    finish(t);
    let p = ping_result(&out);
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report.contains("GPU time meter stops (no kernel records while the process launches"),
        "the meter says it gave up: {report}"
    );
    let kernels_ns = u64::from(p.served) * 48 * 20_000;
    assert!(
        used >= 5 * kernels_ns,
        "charged its time in flight after giving up: {} ms for {} ms of kernels",
        used as f64 / 1e6,
        kernels_ns as f64 / 1e6
    );
}

#[test]
fn the_meter_detaches_cupti_after_each_probe_and_attaches_again_for_the_next() {
    // CUPTI left attached once its activity API was used slows every
    // launch of a decode loop (~8-11 % on an H100, recording off); by
    // default the meter detaches it (cuptiFinalize) once each probe's
    // records are in, and registers its callbacks again before the next
    // probe. Measured as attached: charged about its kernels' time, never
    // heavy.
    let (_, _, c) = metered_decode("decode-detach", &[]);
    assert!(
        c.on >= 2 && c.records > 0,
        "recorded in 2 probes or more: {c:?}"
    );
    // Detached after every probe that ended before the exit (the last may
    // be cut short by it), registered again before every probe: R E, then
    // F R E per probe, and an F at the end unless the exit came first.
    assert!(
        c.finalized + 1 >= c.on && c.finalized <= c.on && c.registered == c.on,
        "one detach per completed probe, one registration per probe: {c:?}"
    );
    let body = c.order.strip_prefix("RE").unwrap_or("?");
    let body = body.strip_suffix('F').unwrap_or(body);
    assert!(
        body.as_bytes().chunks(3).all(|x| x == b"FRE"),
        "each enable after the first preceded by a detach and a registration: {c:?}"
    );
}

#[test]
fn a_program_that_replays_cuda_graphs_never_has_cupti_detached_nor_is_probed_alone() {
    // On an H200, a graph-replayed matmul loop alone under a 30 % ceiling,
    // probed while it held the lease and detached after each probe
    // (cuptiFinalize), died with "unspecified launch failure" in 2 of 7
    // runs (NVIDIA's CUPTI 12.4 U1 notes fix "a crash when cuptiFinalize
    // is used for applications using CUDA Graph"). A process that has
    // launched a graph keeps CUPTI attached between probes, and alone
    // under a ceiling is charged its hold without probes.
    //
    // Beside a trainer: probed as any decode loop, charged its kernels,
    // never detached (R E, then E per probe).
    let (_, _, c) = metered_decode("decode-graph", &[("DECODE_GRAPH", "1")]);
    assert!(c.on >= 2 && c.records > 0, "probed: {c:?}");
    assert_eq!(
        (c.finalized, c.registered),
        (0, 1),
        "CUPTI never detached from a program replaying graphs: {c:?}"
    );
    // The same loop without a graph is detached after its probes (the
    // default; `the_meter_detaches_cupti_...` checks the order).
    let (_, _, plain) = metered_decode("decode-graph-none", &[]);
    assert!(plain.finalized >= 1, "{plain:?}");

    // Alone under a ceiling: no probe at all (a decode loop without a
    // graph is probed there: `a_ceiling_holds_a_launch_bound_loop_...`).
    let h = Host::new("compute", "decode-graph-ceiling");
    let q = h.quota("decode", "", "compute_max = 30");
    let log = h.dir.join("calls.log");
    let logged = log.display().to_string();
    let args = ["2.5", "10000", "12", "4", "20000", "100000"];
    let child = h.spawn(
        "decode",
        Some(&q),
        &args,
        &[("DECODE_GRAPH", "1"), ("FAKE_CUDA_LOG", logged.as_str())],
    );
    let pid = child.id();
    let out = common::output_by("decode", child, Instant::now() + Duration::from_secs(60));
    assert!(out.status.success(), "decode: {out:?}");
    let alone = cupti_calls(&log, pid);
    assert!(
        alone.launched > 0 && alone.on == 0 && alone.finalized == 0,
        "alone under a ceiling, a program replaying graphs is not probed: {alone:?}"
    );
    let (capped, _) = decode_alone(&h, Some(&q), &[("FAKE_CUDA_LOG", logged.as_str())]);
    assert!(capped.served > 0);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| !l.starts_with(&format!("{pid} ")) && l.contains(" cuptiActivityEnable kind=")),
        "the same loop without a graph is probed alone under the ceiling"
    );
}

/// The times (CLOCK_MONOTONIC ms) at which the meter switched recording on,
/// from its debug lines in `report`.
fn probe_times(report: &str) -> Vec<f64> {
    report
        .lines()
        .filter_map(|l| l.split("GPU time meter on at ").nth(1))
        .map(|r| {
            r.split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("no time in {r:?}"))
        })
        .collect()
}

/// CLOCK_MONOTONIC now, ms (the clock of the shim's debug lines).
fn monotonic_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// A decode loop (`decode_beside_trainer`'s, for `seconds`) beside a
/// trainer, metered, its debug lines kept: its output, what it was charged,
/// (CLOCK_MONOTONIC ms, whether the decode tenant was heavy) every 5 ms,
/// and the trainer's fraction of the GPU. With `second_trainer_at`, a
/// second trainer (another tenant) starts that long after the decode
/// loop, at the CLOCK_MONOTONIC ms returned last.
fn decode_probed(
    name: &str,
    seconds: &str,
    extra: &[(&'static str, &str)],
    second_trainer_at: Option<Duration>,
) -> (
    std::process::Output,
    u64,
    Vec<(f64, bool)>,
    f64,
    Option<f64>,
) {
    let h = Host::new("compute", name);
    let mut env = vec![("FAKE_CUDA_TIMESLICE_NS", "2000000")];
    let qt = h.quota("trainer", "", "compute = 50");
    let qd = h.quota("decode", "", "compute = 50");
    let t = h.spawn("spin", Some(&qt), &["9", "5000000", "10"], &env);
    std::thread::sleep(Duration::from_millis(300));
    env.push(("CUSLICE_LOG", "debug"));
    env.extend_from_slice(extra);
    let d = h.spawn(
        "decode",
        Some(&qd),
        &[seconds, "80000", "12", "4", "20000", "100000"],
        &env,
    );
    let g = h.gpu();
    let mut seen = Vec::new();
    let (begin, mut second) = (Instant::now(), None);
    let deadline = begin + Duration::from_secs(8);
    while Instant::now() < deadline {
        let v = common::GpuView::of(&g);
        let heavy = v.tenants.iter().any(|t| t.name == "decode" && t.heavy);
        seen.push((monotonic_ms(), heavy));
        if second.is_none() && second_trainer_at.is_some_and(|at| begin.elapsed() >= at) {
            let q2 = h.quota("trainer2", "", "compute = 50");
            let at = monotonic_ms();
            second = Some((
                h.spawn("spin", Some(&q2), &["3", "5000000", "10"], &env[..1]),
                at,
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = common::output_by("decode", d, Instant::now() + Duration::from_secs(60));
    let used = used_ns(&h, "decode");
    let trainer = finish(t).fraction();
    let second_at = second.map(|(c, at)| {
        finish(c);
        at
    });
    (out, used, seen, trainer, second_at)
}

#[test]
fn a_steady_decode_loop_is_probed_less_and_less_often() {
    // Each probe costs a launch-bound loop's requests time (on an H100,
    // the requests a probe fell in took ~10-25 % longer): once two probes
    // in a row measured the same ratio, the meter rests twice as long
    // before the next, up to 3.6 s, and the loop is still charged about
    // its kernels' time.
    let (out, used, seen, trainer, _) = decode_probed("decode-steady", "7", &[], None);
    let report = String::from_utf8_lossy(&out.stderr);
    let heavy = seen.iter().any(|&(_, heavy)| heavy);
    charged_its_kernels(&ping_result(&out), used, heavy, trainer);
    let on = probe_times(&report);
    let gaps: Vec<f64> = on.windows(2).map(|w| w[1] - w[0]).collect();
    // 7 s at one probe a second would be 7; the rests after the second
    // probe are 1.8 and 3.6 s.
    assert!(
        on.len() >= 2 && on.len() <= 4,
        "probes at {on:?} (gaps {gaps:?} ms)"
    );
    assert!(
        gaps.first().is_some_and(|&g| g < 1_500.0) && gaps.iter().any(|&g| g >= 1_700.0),
        "the first rest 0.9 s, a later one longer: gaps {gaps:?} ms"
    );
    assert!(
        report.contains("rests lengthened after "),
        "the exit report says so: {report}"
    );
}

#[test]
fn a_decode_loop_that_turns_into_a_batch_job_is_probed_again_within_a_second() {
    // A lengthened rest must not let a process that changed keep the old
    // ratio: a decode loop (charged a few percent) that starts a batch job
    // in the same process is probed again within about `REST_NS` of the
    // change (its launches per time in flight moved), and is then charged
    // as saturating (heavy beside the trainer) — not after the 3.6 s rest.
    let (out, _, seen, _, _) = decode_probed(
        "decode-then-batch",
        "3.6",
        &[("DECODE_THEN_BATCH_S", "4")],
        None,
    );
    let report = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let batch_at: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("BATCH_AT "))
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("no BATCH_AT in {stdout}"));
    assert!(
        report.contains("rests lengthened after "),
        "the decode loop was steady before the change (a rest was lengthened): {report}"
    );
    let on = probe_times(&report);
    let next = on.iter().copied().find(|&t| t >= batch_at);
    assert!(
        next.is_some_and(|t| t - batch_at <= 1_300.0),
        "probed again within 1.3 s of the batch job's start at {batch_at:.0} ms: probes at {on:?}"
    );
    let heavy_at = seen
        .iter()
        .find(|&&(t, heavy)| t >= batch_at && heavy)
        .map(|&(t, _)| t - batch_at);
    assert!(
        heavy_at.is_some_and(|d| d <= 2_000.0),
        "charged as the batch job it became within 2 s: heavy {heavy_at:?} ms after its start"
    );
}

#[test]
fn a_steady_decode_loop_is_probed_again_soon_when_another_tenant_starts() {
    // What a free process's kernels get of the GPU changes with who else
    // competes for it: a lengthened rest ends when the tenants competing
    // change (here a second trainer starts 4 s in, during the 3.6 s rest
    // after the third probe), and the next probe comes within about a
    // second, not at the end of the rest.
    let (out, _, _, _, second) =
        decode_probed("decode-competition", "7", &[], Some(Duration::from_secs(4)));
    let report = String::from_utf8_lossy(&out.stderr);
    let second = second.expect("the second trainer started");
    let on = probe_times(&report);
    let before: Vec<f64> = on.iter().copied().filter(|&t| t < second).collect();
    let gaps: Vec<f64> = before.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().any(|&g| g >= 1_700.0),
        "a rest was lengthened before the second trainer started at {second:.0} ms: probes at {on:?}"
    );
    let next = on.iter().copied().find(|&t| t >= second);
    assert!(
        next.is_some_and(|t| t - second <= 1_500.0),
        "probed again within 1.5 s of the second trainer's start at {second:.0} ms: probes at {on:?}"
    );
    assert!(
        report.contains("the tenants competing for its GPU changed since the last probe"),
        "it says why: {report}"
    );
}

#[test]
fn with_detach_off_cupti_stays_attached_between_probes() {
    // CUSLICE_METER_DETACH=0: registered once, never detached, and still
    // probed (recording switched on again and again), measured as
    // detached.
    let (_, _, c) = metered_decode("decode-attached", &[("CUSLICE_METER_DETACH", "0")]);
    assert!(
        c.on >= 2 && c.records > 0,
        "recorded in 2 probes or more: {c:?}"
    );
    assert!(
        c.registered == 1 && c.finalized == 0,
        "attached all along: {c:?}"
    );
}

#[test]
fn a_detach_setting_other_than_0_or_1_and_a_removed_meter_mode_say_what_applies() {
    // One line naming the variable and its value, and what the meter does
    // instead: detach between probes (the default). The experiments'
    // meter modes are gone: a process started with one says it is
    // ignored, and records in probes.
    let h = Host::new("compute", "detach-setting");
    let q = h.quota("t", "", "compute = 50");
    for (var, value, says) in [
        (
            "CUSLICE_METER_DETACH",
            "yes",
            "CUSLICE_METER_DETACH=yes is not 0 or 1; detaching CUPTI between probes (the default)",
        ),
        (
            "CUSLICE_METER",
            "continuous",
            "CUSLICE_METER=continuous is ignored: the meter records kernels in probes only (continuous and always recording were experiments, removed)",
        ),
        (
            "CUSLICE_METER",
            "always",
            "CUSLICE_METER=always is ignored: the meter records kernels in probes only (continuous and always recording were experiments, removed)",
        ),
    ] {
        let out = common::output_by(
            "spin",
            h.spawn("spin", Some(&q), &["0.1", "1000000", "4"], &[(var, value)]),
            Instant::now() + Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{var}={value}: {err}");
        assert!(
            err.lines().any(|l| l.ends_with(says)),
            "{var}={value}: {err}"
        );
    }
}

#[test]
fn a_program_that_uses_cuptis_callback_or_profiler_api_never_has_cupti_detached_from_under_it() {
    // cuptiFinalize detaches all of CUPTI: a program's own subscription
    // (the callback API: cuptiSubscribe or CUDA 13's cuptiSubscribe_v2) or
    // range profiler session would end at the meter's next detach (the
    // fake logs subscriber_lost=1 or profiler_lost=1 then). The shim
    // exports these entry points in front
    // of CUPTI's: from the program's call on, the meter keeps probing but
    // leaves CUPTI attached between probes, and says so. The call comes
    // before the first request (the meter has not loaded CUPTI yet), or
    // 1.3 s into the run (after a probe or two, each followed by a detach:
    // CUPTI may be detached when the program calls, and attaches for it);
    // the function is looked up in the global scope (what a program linked
    // against libcupti binds to) or in a libcupti opened privately (as
    // Python's ctypes does: the shim's export must still reach CUPTI).
    for (what, how, at_ms, seconds) in [
        ("subscribe", "global", "0", "2.5"),
        ("profiler", "private", "0", "2.5"),
        ("subscribe", "private", "1300", "3.5"),
        ("profiler", "global", "1300", "3.5"),
        ("subscribe2", "private", "1300", "3.5"),
    ] {
        let case = format!("{what} {how} at {at_ms} ms");
        let h = Host::new("compute", &format!("cupti-user-{what}-{how}"));
        let log = h.dir.join("calls.log");
        let logged = log.display().to_string();
        let env = [
            ("FAKE_CUDA_TIMESLICE_NS", "2000000"),
            ("FAKE_CUDA_LOG", logged.as_str()),
        ];
        let qt = h.quota("trainer", "", "compute = 50");
        let qd = h.quota("tracer", "", "compute = 50");
        let trainer_s = format!("{}", seconds.parse::<f64>().unwrap() + 1.0);
        let t = h.spawn("spin", Some(&qt), &[&trainer_s, "5000000", "10"], &env);
        std::thread::sleep(Duration::from_millis(300));
        // decode_beside_trainer's loop.
        let mut denv = env.to_vec();
        denv.push(("CUSLICE_LOG", "info"));
        let d = h.spawn(
            "cupti_user",
            Some(&qd),
            &[
                what, how, at_ms, seconds, "80000", "12", "4", "20000", "100000",
            ],
            &denv,
        );
        let pid = d.id();
        let out = common::output_by("cupti_user", d, Instant::now() + Duration::from_secs(60));
        finish(t);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{case}: {stdout}\n{err}");
        assert!(
            stdout.contains(" libcuslice.so "),
            "{case}: the program's lookup found the shim's export: {stdout}"
        );
        let p = ping_result(&out);
        assert_eq!(p.served, p.due, "{case}: {p:?}");
        let c = cupti_calls(&log, pid);
        let s = c
            .order
            .find('S')
            .unwrap_or_else(|| panic!("{case}: the program's call is not in the log: {c:?}"));
        assert!(
            c.lost == 0 && !c.order[s..].contains('F'),
            "{case}: CUPTI never detached after the program's call: {c:?}"
        );
        // Still metered: probes before and after the call.
        assert!(
            c.on >= 2 && c.records > 0 && c.order[s..].contains('E'),
            "{case}: recorded in 2 probes or more, and after the call: {c:?}"
        );
        assert!(
            err.contains(
                "the program uses CUPTI's callback/profiler API: cuslice keeps CUPTI attached between probes"
            ),
            "{case}: says why it keeps CUPTI attached: {err}"
        );
        if at_ms != "0" {
            // Detached by default until then.
            assert!(
                c.order[..s].contains('F'),
                "{case}: detached after the probes before the call: {c:?}"
            );
        }
        // The exit report counts what the meter's thread did with CUPTI
        // (and how long it took): loaded once, switched on per probe,
        // detached as often as the call log says.
        let line = err
            .lines()
            .find(|l| l.contains("GPU time meter: recorded kernels in"))
            .unwrap_or_else(|| panic!("{case}: no meter line at exit: {err}"));
        let detaches = c.order.matches('F').count();
        assert!(
            line.contains(&format!("recorded kernels in {} probes", c.on))
                && line.contains("; loading CUPTI 1 in ")
                && line.contains(&format!("; switching recording on {} in ", c.on))
                && (detaches == 0 && !line.contains("detaching")
                    || line.contains(&format!("; detaching CUPTI {detaches} in "))),
            "{case}: {line} ({c:?})"
        );
    }
}

#[test]
fn a_launch_bound_tenant_beside_a_trainer_is_as_fast_as_natively() {
    // Issue #19: a decode loop (a token of many small kernels launched
    // faster than the GPU serves them beside a trainer, then read back)
    // launches freely, metered, and is never held: nothing in the shim may
    // make it slower than the same pair without cuslice (a queue bound on
    // its free passes, a lease, a wait for its own checkpoints). Guaranteed:
    // its median latency is within noise of the twin pair's without
    // cuslice, run at the same time; it never took the lease and waited
    // under 1 % of its run for others or its own queue (its exit report);
    // the trainer keeps the GPU. (Its p99 is one slow request of 20, which
    // CPU load on the test machine decides.)
    let tw = Twin::new("decode-twin");
    let qt = tw.sliced.quota("trainer", "", "compute = 50");
    let qd = tw.sliced.quota("decode", "", "compute = 50");
    let env = [slice(2_000_000), ("CUSLICE_LOG", "info".to_string())];
    // Trainer: 2 ms kernels, 50 ms queued.
    let (t, nt) = tw.spawn("spin", &qt, &["4.5", "2000000", "25"], &env);
    std::thread::sleep(Duration::from_millis(300));
    // A request every 200 ms: 8 tokens of 256 kernels of 10 us, 35 us of
    // host time before each launch (a token takes ~10 ms to launch).
    let (d, nd) = tw.spawn(
        "decode",
        &qd,
        &["4", "200000", "8", "256", "10000", "35000"],
        &env,
    );
    let out = common::output_by("decode", d, Instant::now() + Duration::from_secs(60));
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    let p = ping_result(&out);
    let np = finish_ping(nd);
    let (st, _) = (finish(t), finish(nt));
    // A CPU-starved test machine may not keep up with the schedule (the
    // decoder busy-waits between launches): as many served as the twin.
    assert!(
        p.served + 1 >= np.served,
        "served as without cuslice: {p:?}, without cuslice {np:?}"
    );
    assert!(
        p.p50 <= np.p50 + noise(np.p50),
        "as without cuslice: {p:?}, without cuslice {np:?}"
    );
    let line = report
        .lines()
        .find(|l| l.contains("passes launching freely"))
        .unwrap_or_else(|| panic!("no exit report: {report}"));
    let waited: f64 = line
        .split("waited ")
        .nth(1)
        .into_iter()
        .flat_map(|r| r.split(" ms"))
        .filter_map(|x| x.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        line.contains(" 0 holding the lease") && waited <= 40.0,
        "never held, waited {waited} ms of 4 s: {line}"
    );
    assert!(
        st.fraction() >= 80.0,
        "the trainer keeps the GPU: {:.1} %",
        st.fraction()
    );
}

#[test]
fn without_a_usable_cupti_free_launches_are_charged_their_time_in_flight_and_it_says_why() {
    for (what, env, says) in [
        (
            "enable fails",
            ("FAKE_CUPTI_FAIL", "enable"),
            "cannot record kernel activity",
        ),
        (
            "register fails",
            ("FAKE_CUPTI_FAIL", "register"),
            "cannot register activity callbacks",
        ),
        (
            "no such library",
            ("CUSLICE_CUPTI", "/nonexistent/libcupti.so"),
            "CUSLICE_CUPTI=/nonexistent/libcupti.so: cannot load it",
        ),
    ] {
        let h = Host::new("compute", "decode-nocupti");
        let qt = h.quota("trainer", "", "compute = 50");
        let qd = h.quota("decode", "", "compute = 50");
        let t = h.spawn("spin", Some(&qt), &["2", "5000000", "10"], &[env]);
        std::thread::sleep(Duration::from_millis(200));
        let d = h.spawn(
            "decode",
            Some(&qd),
            &["1.2", "100000", "4", "4", "20000", "100000"],
            &[env, ("CUSLICE_LOG", "info")],
        );
        let out = common::output_by("decode", d, Instant::now() + Duration::from_secs(60));
        let _ = finish(t);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
        assert!(err.contains("wall time in flight"), "{what}: {err}");
        // Charged its time in flight: far more than its kernels ran (at
        // most 12 requests of 4 tokens of 4 kernels of 20 us: 3.84 ms;
        // measured on the kernels' records, the charge is about that; in
        // flight beside 5 ms trainer kernels, ~200 ms, more on a loaded
        // machine, where a fixed 200 ms was missed by a few ms).
        let kernels_ns: u64 = 12 * 4 * 4 * 20_000;
        let used = used_ns(&h, "decode");
        assert!(
            used >= 25 * kernels_ns,
            "{what}: charged {} ms for at most {} ms of kernels",
            used as f64 / 1e6,
            kernels_ns as f64 / 1e6
        );
    }
}

#[test]
fn cupti_is_loaded_only_once_the_gpu_is_shared() {
    // Loading and initialising CUPTI costs a process startup time and
    // every launch a little: a tenant alone on its GPU never loads it; one
    // that launches freely beside another (whose GPU time is then
    // measured) does.
    let h = Host::new("compute", "meter-lazy");
    let qa = h.quota("a", "", "compute = 50");
    let qb = h.quota("b", "", "compute = 50");
    let log = [("CUSLICE_LOG", "info")];
    let stderr = |c: Child| {
        let out = common::output_by("spin", c, Instant::now() + Duration::from_secs(60));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let alone = stderr(h.spawn("spin", Some(&qa), &["0.6", "1000000", "4"], &log));
    assert!(
        alone.contains("compute share 50%") && !alone.contains("GPU time meter:"),
        "alone: {alone}"
    );
    let a = h.spawn("spin", Some(&qa), &["1.2", "1000000", "4"], &log);
    std::thread::sleep(Duration::from_millis(300));
    let b = h.spawn("spin", Some(&qb), &["0.6", "1000000", "4"], &log);
    let (_, b) = (stderr(a), stderr(b));
    assert!(b.contains("GPU time meter: "), "shared: {b}");
}

#[test]
fn a_program_that_profiles_itself_keeps_cupti_and_gets_every_record() {
    // Its own profiler wins: cuslice's meter steps aside (and says so),
    // and the program's callbacks get all its kernels, as without cuslice.
    let h = Host::new("compute", "profiled");
    let q = h.quota("prof", "", "compute = 50");
    let out = common::output_by(
        "profiled",
        h.spawn(
            "profiled",
            Some(&q),
            &["20", "1000000"],
            &[("CUSLICE_LOG", "info")],
        ),
        Instant::now() + Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{err}");
    let r: Vec<u64> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("R records "))
        .expect("records line")
        .split_whitespace()
        .map(|x| x.parse().expect("number"))
        .collect();
    assert_eq!(r[0], 20, "{stdout}");
    assert!((r[1] as i64 - 20_000_000).abs() <= 200_000, "{stdout}");
    assert!(err.contains("steps aside"), "{err}");
}

/// `decode_alone`'s program: 2.5 s of requests every 10 ms, each 12 tokens
/// of 4 kernels of 20 us with 100 us of host work between launches.
const DECODE_ALONE: [&str; 6] = ["2.5", "10000", "12", "4", "20000", "100000"];

/// A decode loop alone on the fake GPU (`decode_beside_trainer`'s, one
/// request every 10 ms: in flight ~60 % of the time, its kernels ~10 %)
/// under `quota` (None: no limits): its results and the GPU time charged
/// to its tenant.
fn decode_alone(h: &Host, quota: Option<&Path>, extra: &[(&'static str, &str)]) -> (Ping, u64) {
    let out = common::output_by(
        "decode",
        h.spawn("decode", quota, &DECODE_ALONE, extra),
        Instant::now() + Duration::from_secs(60),
    );
    let used = quota.map_or(0, |_| used_ns(h, "decode"));
    (ping_result(&out), used)
}

#[test]
fn a_ceiling_holds_a_launch_bound_loop_to_its_kernels_time_not_its_time_in_flight() {
    // Charged its time in flight (and the lease it held through its host
    // gaps), a decode loop alone at a 30 % ceiling whose kernels ran 10 %
    // of the time was held to 30 % of its wall time: p50 692 ms for 4.9 ms
    // without limits, half its requests never served. Charged what its
    // kernels ran (the meter probes it alone too, under a ceiling), it runs
    // as without limits.
    //
    // "Without limits" is a twin started at the same moment on a fake GPU
    // of its own: both see the same load on the test machine, which on a
    // busy 2-core machine moves a 4.9 ms p50 by more than the shim could.
    let tw = Twin::new("decode-ceiling");
    let h = &tw.sliced;
    let q = h.quota("decode", "", "compute_max = 30");
    let (d, nd) = tw.spawn("decode", &q, &DECODE_ALONE, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let capped = ping_result(&common::output_by("decode", d, deadline));
    let free = ping_result(&common::output_by("decode", nd, deadline));
    let used = used_ns(h, "decode");
    // A CPU-starved machine may not keep to the schedule (the decoder
    // busy-waits between launches; 171 and 175 of 250 seen beside 4 busy
    // processes on 2 cores): as many served as the twin, within a tenth
    // of the requests due (charged its time in flight, it served half).
    assert!(
        capped.served + capped.due / 10 >= free.served,
        "served as without limits: {capped:?}, without limits {free:?}"
    );
    assert!(
        capped.p50 <= free.p50 * 1.3 + noise(free.p50),
        "p50 {:.2} ms under a 30 % ceiling, {:.2} ms without limits",
        capped.p50,
        free.p50
    );
    let kernels_ns = u64::from(capped.served) * 48 * 20_000;
    assert!(
        used >= kernels_ns * 9 / 10 && used <= kernels_ns * 3 / 2 + 30_000_000,
        "charged {} ms for {} ms of kernels",
        used as f64 / 1e6,
        kernels_ns as f64 / 1e6
    );

    // The ceiling still binds where its kernels need more than it gives:
    // at 5 %, half what they run, it is charged about 5 % of the run and
    // falls behind.
    let h = Host::new("compute", "decode-ceiling-tight");
    let q = h.quota("decode", "", "compute_max = 5");
    let begin = Instant::now();
    let (tight, used) = decode_alone(&h, Some(&q), &[]);
    let run_ns = begin.elapsed().as_nanos() as f64;
    let pct = 100.0 * used as f64 / run_ns;
    assert!(pct <= 8.0, "charged {pct:.1} % of the run at a 5 % ceiling");
    assert!(
        tight.served < tight.due || tight.p50 > 10.0 * free.p50,
        "held back at a 5 % ceiling: {tight:?}"
    );
}
