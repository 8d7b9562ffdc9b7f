//! Load and faults (issue #7, first part): many processes and threads
//! allocating, freeing and launching at once under one quota, some killed
//! with SIGKILL mid-flight; the container's accounted usage must end at
//! exactly zero, with no deadlock.

mod common;

use std::time::{Duration, Instant};

use common::{Host, Mem, Opts, set_env};
use cuslice_core::segment::Segment;

/// A host with one container (tenant "t") under a memory `quota`, and the
/// environment of its processes (errors only: they are noisy under load).
fn setup(name: &str, quota: &str) -> (Host, Vec<(&'static str, String)>) {
    let h = Host::new("rel", name).context_overhead("1MiB");
    let q = h.quota("t", "", &format!("memory = \"{quota}\""));
    let mut env = h.env(Some(&q));
    set_env(&mut env, "CUSLICE_LOG", "error");
    (h, env)
}

/// Usage the container's segment still accounts (after reclaiming the dead).
fn accounted(h: &Host) -> u64 {
    Mem::read(&h.mem_seg("t"), true).used
}

/// The outputs of `children`, all finished within `limit` (a deadlock fails
/// the test, the process killed).
fn wait_all(children: Vec<std::process::Child>, limit: Duration) -> Vec<std::process::Output> {
    let deadline = Instant::now() + limit;
    children
        .into_iter()
        .map(|c| common::output_by("a load process (deadlock?)", c, deadline))
        .collect()
}

#[test]
fn eight_processes_of_sixteen_threads_end_at_zero() {
    let (h, env) = setup("load", "512MiB");
    let t0 = Instant::now();
    let opts = Opts {
        args: vec!["16".into(), "100000".into()],
        env,
        ..Opts::default()
    };
    let children: Vec<_> = (0..8).map(|_| common::spawn("load", &opts)).collect();
    let outs = wait_all(children, Duration::from_secs(300));
    let mut refused = 0u64;
    for o in &outs {
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && s.contains("R ok"),
            "{s}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        refused += s
            .split_whitespace()
            .find_map(|w| w.strip_prefix("refused="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
    }
    eprintln!(
        "8 processes x 16 threads x 100k operations: {:.1} s, {refused} refusals",
        t0.elapsed().as_secs_f64()
    );
    assert!(refused > 0, "the quota must bind during the load");
    assert_eq!(
        accounted(&h),
        0,
        "accounted usage after every process freed everything"
    );
}

#[test]
fn processes_killed_mid_load_leave_nothing_accounted() {
    let (h, env) = setup("kill", "256MiB");
    let long = Opts {
        args: vec!["16".into(), "1000000".into()],
        env: env.clone(),
        ..Opts::default()
    };
    let victims: Vec<_> = (0..4).map(|_| common::spawn("load", &long)).collect();
    let short = Opts {
        args: vec!["8".into(), "20000".into()],
        env,
        ..Opts::default()
    };
    let survivors: Vec<_> = (0..2).map(|_| common::spawn("load", &short)).collect();
    // Killed mid-load: once each victim's slot accounts more than its
    // context (1 MiB), it holds allocations and its threads are at work.
    let seg = h.mem_seg("t");
    let pids: Vec<u32> = victims.iter().map(std::process::Child::id).collect();
    // (Opened once it exists, and kept: polled every millisecond.)
    let mut opened: Option<Segment> = None;
    let mut loaded = || -> Option<Vec<u32>> {
        if opened.is_none() {
            opened = Segment::open_read_only(&seg).ok();
        }
        let procs = opened.as_ref()?.processes();
        Some(
            pids.iter()
                .copied()
                .filter(|&pid| {
                    procs
                        .iter()
                        .any(|p| p.pid == pid && p.alive && p.used.iter().sum::<u64>() > 1 << 20)
                })
                .collect(),
        )
    };
    // The victims are killed whatever happens (so that none outlives a
    // failure); whether they had started is checked after.
    let started = common::poll_until(Duration::from_secs(60), || {
        (loaded()?.len() == pids.len()).then_some(())
    });
    let seen = loaded();
    for mut v in victims {
        v.kill().expect("SIGKILL");
        let _ = v.wait();
    }
    assert!(
        started.is_some(),
        "the victims {pids:?} did not all start allocating within 60 s (those that did, by {}: {seen:?})",
        seg.display()
    );
    for o in wait_all(survivors, Duration::from_secs(300)) {
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && s.contains("R ok"),
            "survivors continue: {s}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(accounted(&h), 0, "the killed processes' usage is reclaimed");
}
