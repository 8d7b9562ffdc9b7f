//! Load and faults (issue #7, first part): many processes and threads
//! allocating, freeing and launching at once under one quota, some killed
//! with SIGKILL mid-flight; the container's accounted usage must end at
//! exactly zero, with no deadlock.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::Opts;
use cuslice_core::segment::{MAX_DEVICES, Segment};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn setup(name: &str, quota: &str) -> (Dir, Vec<(&'static str, String)>) {
    let d = std::env::temp_dir().join(format!("cuslice-rel-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    std::fs::write(
        d.join("quota.toml"),
        format!(
            "segment_dir = \"{}\"\ncontext_overhead = \"1MiB\"\n[all]\nmemory = \"{quota}\"\n",
            d.join("seg").display()
        ),
    )
    .expect("write");
    let env = vec![
        ("CUSLICE_CONFIG", d.join("quota.toml").display().to_string()),
        ("CUSLICE_LOG", "error".to_string()),
        (
            "FAKE_CUDA_STATE",
            d.join("fake.state").display().to_string(),
        ),
        ("FAKE_CUDA_CTX_OVERHEAD", "1MiB".to_string()),
    ];
    (Dir(d), env)
}

/// Usage the container's segment still accounts (after reclaiming the dead).
fn accounted(dir: &Dir) -> u64 {
    let seg = Segment::open_or_create(&dir.0.join("seg").join("memory.seg")).expect("segment");
    seg.reclaim_dead();
    (0..MAX_DEVICES)
        .filter_map(|d| seg.device_usage(d))
        .map(|u| u.used)
        .sum()
}

fn wait_all(children: Vec<std::process::Child>, limit: Duration) -> Vec<std::process::Output> {
    let start = Instant::now();
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().expect("try_wait").is_none() {
                assert!(
                    start.elapsed() < limit,
                    "deadlock: a process did not finish within {limit:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            c.wait_with_output().expect("output")
        })
        .collect()
}

#[test]
fn eight_processes_of_sixteen_threads_end_at_zero() {
    let (dir, env) = setup("load", "512MiB");
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
        accounted(&dir),
        0,
        "accounted usage after every process freed everything"
    );
}

#[test]
fn processes_killed_mid_load_leave_nothing_accounted() {
    let (dir, env) = setup("kill", "256MiB");
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
    let seg = dir.0.join("seg").join("memory.seg");
    let pids: Vec<u32> = victims.iter().map(std::process::Child::id).collect();
    let loaded = || -> Option<Vec<u32>> {
        let s = Segment::open_read_only(&seg).ok()?;
        let procs = s.processes();
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
    assert_eq!(
        accounted(&dir),
        0,
        "the killed processes' usage is reclaimed"
    );
}
