//! The three attacks of issue #12 against the fake driver: each shows a
//! hole that the shim alone cannot close and that the host watchdog
//! (`cuslice watch`) is there to report. These tests prove the attacks
//! work today, by the fake driver's ground truth and the segments:
//!
//! - `attack-quota` (under the shim) raises its own container's quota in
//!   its memory segment and then holds more device memory than the quota;
//! - `attack_noshim` (shim preloaded, but reaching the driver through its
//!   own symbol lookup) holds device memory while its container's memory
//!   segment has no process registered for it;
//! - `attack-gpuseg` leaves forged shares and ceilings in the per-GPU
//!   segment, and puts them back when a tenant re-registers.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::time::Duration;

use common::{Fake, Host, Opts, wait_for};
use cuslice_core::gpu::{self, GpuSegment};
use cuslice_core::segment::Segment;

const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(30);

/// A spawned attack, killed when dropped (also when the test fails).
struct Attack {
    child: Child,
    line: String,
}

impl Drop for Attack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `prog` (a path, or a program of tests/apps) on `host`'s fake GPU
/// under `quota`, with the shim preloaded, and waits for its `ATTACK` line.
fn attack(host: &Host, prog: &str, quota: &Path, args: &[&str]) -> Attack {
    let opts = Opts {
        args: args.iter().map(|a| a.to_string()).collect(),
        env: host.env(Some(quota)),
        ..Opts::default()
    };
    let mut child = common::spawn(prog, &opts);
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut out = BufReader::new(out);
        let _ = out.read_line(&mut line);
        let _ = tx.send(line);
        // Keep the pipe open (and drained) while the attack holds.
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    let mut a = Attack {
        child,
        line: String::new(),
    };
    let line = rx.recv_timeout(LIMIT).unwrap_or_default();
    if !line.starts_with("ATTACK ") {
        // It exited (or hangs): stderr says why.
        let _ = a.child.kill();
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut stderr);
        panic!("{prog} printed no ATTACK line: {line:?}\nstderr: {stderr}");
    }
    // stderr: drained so that the attack never blocks on it.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut BufReader::new(err), &mut std::io::sink());
    });
    a.line = line.trim_end().to_string();
    a
}

fn bin(name: &str) -> &'static str {
    match name {
        "attack-quota" => env!("CARGO_BIN_EXE_attack-quota"),
        "attack-gpuseg" => env!("CARGO_BIN_EXE_attack-gpuseg"),
        _ => unreachable!("{name}"),
    }
}

#[test]
fn raising_its_own_quota_lets_a_process_hold_more_than_it() {
    let h = Host::new("attacks", "quota").context_overhead("1MiB");
    let q = h.quota("victim-of-itself", "", "memory = \"64MiB\"");
    let a = attack(&h, bin("attack-quota"), &q, &["128MiB"]);
    let pid = a.child.id();
    assert_eq!(
        a.line,
        format!(
            "ATTACK quota raised {} -> {}; holding {} bytes; pid {pid}",
            64 * MIB,
            192 * MIB,
            128 * MIB
        )
    );
    // By the fake GPU's ground truth, it holds its context and 128 MiB: far
    // beyond its 64 MiB quota.
    let fake = Fake::open(&h.fake_state(), false);
    let held = fake.held_by(&[pid]);
    assert_eq!(held, 129 * MIB, "{}", a.line);
    assert!(held > 64 * MIB);
    // And the segment says the quota is what it wrote.
    let seg = Segment::open_read_only(&h.mem_seg("victim-of-itself")).expect("segment");
    let u = seg.device_usage(0).expect("device 0");
    assert_eq!(u.limit, 192 * MIB);
    assert_eq!(u.used, 129 * MIB);
}

#[test]
fn a_process_around_the_shim_holds_memory_its_container_does_not_see() {
    let h = Host::new("attacks", "noshim").context_overhead("1MiB");
    let q = h.quota("sliced", "", "memory = \"64MiB\"");
    // A registered sibling first, so that the container's segment exists.
    let sibling = attack(&h, bin("attack-quota"), &q, &["1MiB"]);
    let a = attack(&h, "attack_noshim", &q, &[&(128 * MIB).to_string()]);
    let pid = a.child.id();
    assert!(
        a.line.starts_with(&format!(
            "ATTACK noshim holding {} bytes on device 0 via ",
            128 * MIB
        )) && a.line.ends_with(&format!("; pid {pid}")),
        "{}",
        a.line
    );
    // It found the (fake) driver, not the preloaded shim.
    let via = a.line.split(" via ").nth(1).unwrap_or("");
    let driver = common::env().fake.join("libcuda.so.1");
    assert!(
        via.starts_with(&format!("{}; ", driver.display())),
        "{}",
        a.line
    );
    // The fake GPU: its context and 128 MiB, twice its container's quota.
    let fake = Fake::open(&h.fake_state(), false);
    assert_eq!(fake.held_by(&[pid]), 129 * MIB);
    // The container's segment: only the sibling is registered; what the
    // segment counts is the sibling's (after its raise, still far below).
    let seg = Segment::open_read_only(&h.mem_seg("sliced")).expect("segment");
    let procs = seg.processes();
    assert!(procs.iter().all(|p| p.pid != pid), "{procs:?}");
    assert!(
        procs.iter().any(|p| p.pid == sibling.child.id()),
        "{procs:?}"
    );
    assert_eq!(seg.device_usage(0).expect("device 0").used, 2 * MIB);
}

#[test]
fn a_tenant_forges_the_gpu_segment_and_keeps_it_forged() {
    let h = Host::new("attacks", "gpuseg").context_overhead("1MiB");
    let q = h.quota(
        "greedy",
        "",
        "memory = \"64MiB\"\ncompute = \"20%\"\ncompute_max = \"30%\"",
    );
    // A victim tenant, registered as the shim registers one; the attacker's
    // own tenant is registered by the shim when the attack calls cuInit.
    std::fs::create_dir_all(h.gpu_dir()).expect("mkdir gpu");
    let seg = GpuSegment::open_or_create(&h.gpu_seg()).expect("gpu segment");
    seg.register_tenant("victim", 60, 60, 0, gpu::monotonic_ns())
        .expect("victim");
    let a = attack(&h, bin("attack-gpuseg"), &q, &["60", "5"]);
    assert_eq!(
        a.line,
        format!(
            "ATTACK gpuseg {}: greedy share 20 -> 100 ceiling 30 -> 100; victim share 60 -> 1; pid {}",
            h.gpu_seg().display(),
            a.child.id()
        )
    );
    let shares = || {
        seg.tenants()
            .into_iter()
            .map(|t| (t.name, t.share, t.max))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        shares(),
        vec![("victim".into(), 1, 60), ("greedy".into(), 100, 100)]
    );
    // The victim's next process registers its share again: within a few
    // periods the attacker has put it back to 1.
    seg.register_tenant("victim", 60, 60, 0, gpu::monotonic_ns())
        .expect("victim again");
    wait_for(
        || format!("the victim's share was not forged again: {:?}", shares()),
        LIMIT,
        || (shares()[0].1 == 1).then_some(()),
    );
}
