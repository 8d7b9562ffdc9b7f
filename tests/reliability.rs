//! Load and faults (issue #7, first part): many processes and threads
//! allocating, freeing and launching at once under one quota, some killed
//! with SIGKILL mid-flight; the container's accounted usage must end at
//! exactly zero, with no deadlock.

mod common;

use std::time::{Duration, Instant};

use common::{Host, Mem, Opts, set_env};
use cuslice_core::segment::Segment;

const MIB: u64 = 1 << 20;

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
    // All eight start their load together once each holds its context (as
    // in the test below): on a loaded machine the first to run filled the
    // quota before the last made its context, which was refused (1 run in
    // 5 under 4 busy processes on 2 cores).
    let go = h.dir.join("go");
    let opts = Opts {
        args: vec!["16".into(), "100000".into(), go.display().to_string()],
        env,
        ..Opts::default()
    };
    let children: Vec<_> = (0..8).map(|_| common::spawn("load", &opts)).collect();
    let pids: Vec<u32> = children.iter().map(std::process::Child::id).collect();
    let seg = h.mem_seg("t");
    // Told to go whatever happens (none may wait for ever); a process that
    // could not make its context fails the checks below.
    let _ = common::poll_until(Duration::from_secs(60), || {
        let procs = Segment::open_read_only(&seg).ok()?.processes();
        pids.iter()
            .all(|&pid| {
                procs
                    .iter()
                    .any(|p| p.pid == pid && p.alive && p.used.iter().sum::<u64>() >= MIB)
            })
            .then_some(())
    });
    std::fs::write(&go, b"").expect("go");
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
    // All six start their load together once each holds its context: the
    // first to run would otherwise fill the quota before the last made its
    // context, which is then refused (and that process never runs).
    let go = h.dir.join("go");
    let go_arg = go.display().to_string();
    let long = Opts {
        args: vec!["16".into(), "1000000".into(), go_arg.clone()],
        env: env.clone(),
        ..Opts::default()
    };
    let victims: Vec<_> = (0..4).map(|_| common::spawn("load", &long)).collect();
    let short = Opts {
        args: vec!["8".into(), "20000".into(), go_arg],
        env,
        ..Opts::default()
    };
    let survivors: Vec<_> = (0..2).map(|_| common::spawn("load", &short)).collect();
    // What each process's slot accounts (its context: 1 MiB; then its
    // allocations), read from the container's segment, opened once it
    // exists and kept (polled every millisecond).
    let seg = h.mem_seg("t");
    let mut opened: Option<Segment> = None;
    let mut accounted_to = |pids: &[u32]| -> Option<Vec<(u32, u64)>> {
        if opened.is_none() {
            opened = Segment::open_read_only(&seg).ok();
        }
        let procs = opened.as_ref()?.processes();
        Some(
            pids.iter()
                .filter_map(|&pid| {
                    let p = procs.iter().find(|p| p.pid == pid && p.alive)?;
                    Some((pid, p.used.iter().sum::<u64>()))
                })
                .collect(),
        )
    };
    let pids =
        |c: &[std::process::Child]| c.iter().map(std::process::Child::id).collect::<Vec<_>>();
    let (victim_pids, all_pids) = (pids(&victims), [pids(&victims), pids(&survivors)].concat());
    // The processes are killed whatever happens (so that none outlives a
    // failure, waiting for its go); what did not happen is checked after.
    let ready = common::poll_until(Duration::from_secs(60), || {
        let held = accounted_to(&all_pids)?;
        (held.len() == all_pids.len() && held.iter().all(|&(_, u)| u >= MIB)).then_some(())
    });
    let seen_ready = accounted_to(&all_pids);
    std::fs::write(&go, b"").expect("go");
    // Killed mid-load: once each victim's slot accounts more than its
    // context, it holds allocations and its threads are at work.
    let started = ready.and_then(|()| {
        common::poll_until(Duration::from_secs(60), || {
            let held = accounted_to(&victim_pids)?;
            (held.len() == victim_pids.len() && held.iter().all(|&(_, u)| u > MIB)).then_some(())
        })
    });
    let seen_started = accounted_to(&victim_pids);
    for mut v in victims {
        v.kill().expect("SIGKILL");
        let _ = v.wait();
    }
    assert!(
        ready.is_some(),
        "the processes {all_pids:?} did not all make their context within 60 s (slots of live processes, by {}: {seen_ready:?})",
        seg.display()
    );
    assert!(
        started.is_some(),
        "the victims {victim_pids:?} did not all start allocating within 60 s (their slots, by {}: {seen_started:?})",
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
