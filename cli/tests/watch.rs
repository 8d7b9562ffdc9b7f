//! `cuslice watch` against the fake driver and the fake NVML, with real
//! processes under `cuslice run` and in real runc containers, and the real
//! attacks of `attacks/` (`attack_noshim`, `attack-quota`,
//! `attack-gpuseg`; the Rust ones built by `common::attack_bin`): each
//! attack is reported within two intervals; with `kill`, the slice is back
//! under its quota within two intervals and the well-behaved tenant beside
//! it keeps its allocation; a tampered memory or GPU segment is restored,
//! after which shares hold again (and a fast forger gets nobody killed); a
//! tenant over its ceiling around the limiter is frozen then let go, or
//! killed; a second watch refuses to start; bad watch.toml lines are one
//! line.
//!
//! Timings (issue 42): the interval is 250 ms, and the watch acts within
//! two intervals of an attack on an idle machine; a loaded 2-core CI
//! machine (each test beside others, busy processes) misses that figure,
//! so the tests wait for each finding, kill or repair up to `WITHIN`
//! (returning as soon as it is there) and assert only that bound. What
//! must not happen is checked over a number of the watch's passes (its
//! state's pass count), not over a fixed sleep, so that a slow watch is
//! seen to have looked.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/watch.rs"]
mod watch_host;

use common::Proc;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuslice_core::gpu::GpuSegment;
use cuslice_core::segment::Segment;

const INTERVAL_MS: u64 = 250;
/// How long a test waits for what the watch does "within two intervals"
/// (see the module documentation): a bound a loaded machine meets.
const WITHIN: Duration = Duration::from_secs(30);

/// A test's host: a private root for the watch (its lock and state), the
/// fake GPU's state, the runs' directory.
struct Host {
    dir: PathBuf,
}

impl Host {
    fn new(name: &str) -> Host {
        let dir = std::env::temp_dir().join(format!("cuslice-watch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root")).expect("mkdir");
        std::fs::create_dir_all(dir.join("xdg")).expect("mkdir");
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    fn gpu_dir(&self) -> PathBuf {
        self.root().join("gpu")
    }

    /// A command on this host's fake GPU.
    fn cmd(&self, prog: &Path) -> Command {
        common::host_command(prog, &self.dir)
    }

    fn cuslice(&self) -> Command {
        self.cmd(Path::new(env!("CARGO_BIN_EXE_cuslice")))
    }

    fn config(&self, extra: &str) -> PathBuf {
        watch_host::config(&self.dir, &self.root(), INTERVAL_MS, extra)
    }

    fn state(&self) -> Option<serde_json::Value> {
        watch_host::state(&self.root())
    }

    /// Starts the watch and waits for its first pass.
    fn watch(&self, extra: &str) -> Proc {
        watch_host::start(self.cuslice(), &self.config(extra), &self.root())
    }

    /// Waits until the watch's state shows an active finding of `kind`
    /// whose text contains `needle`; returns it.
    fn finding(
        &self,
        kind: &str,
        needle: &str,
        limit: Duration,
        watch: &Proc,
    ) -> serde_json::Value {
        common::wait_for(
            || {
                format!(
                    "no {kind} finding with {needle:?} within {limit:?}; state:\n{}\nwatch:\n{}",
                    self.state().map(|s| s.to_string()).unwrap_or_default(),
                    watch.text()
                )
            },
            limit,
            || {
                self.state()?["findings"]
                    .as_array()?
                    .iter()
                    .find(|f| {
                        f["kind"] == kind && f["what"].as_str().is_some_and(|w| w.contains(needle))
                    })
                    .cloned()
            },
        )
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Proc {
    /// Waits for a line starting with `prefix`; its rest and when it came.
    fn line(&self, prefix: &str) -> (String, Instant) {
        common::wait_for(
            || format!("no line {prefix:?}:\n{}", self.text()),
            Duration::from_secs(20),
            || {
                self.lines
                    .lock()
                    .expect("lock")
                    .iter()
                    .find_map(|(t, l)| l.strip_prefix(prefix).map(|r| (r.trim().to_string(), *t)))
            },
        )
    }

    fn pid(&self, name: &str) -> u32 {
        self.line(&format!("{name} ")).0.parse().expect("pid")
    }

    fn stop(&mut self) {
        // SAFETY: SIGTERM to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().expect("try_wait").is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The directory of the live `cuslice run` session `run_pid`:
/// `cuslice-run-<pid>-<random>` in its `$XDG_RUNTIME_DIR`.
fn run_dir(h: &Host, run_pid: u32) -> PathBuf {
    let prefix = format!("cuslice-run-{run_pid}-");
    let found: Vec<PathBuf> = std::fs::read_dir(h.dir.join("xdg"))
        .expect("xdg")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert_eq!(found.len(), 1, "{prefix}*: {found:?}");
    found.into_iter().next().expect("one")
}

/// The memory segment of the `cuslice run` session `run_pid`.
fn run_seg(h: &Host, run_pid: u32) -> PathBuf {
    run_dir(h, run_pid).join("segment/memory.seg")
}

/// A session: `cuslice run LIMITS -- sh -c SCRIPT`, `$M` naming memtest,
/// `$N` attack_noshim, `$S` spin.
fn session(h: &Host, limits: &[&str], script: &str) -> Proc {
    let e = common::env();
    let mut c = h.cuslice();
    c.arg("run").args(limits).args(["--", "sh", "-c", script]);
    c.env("M", e.apps.join("memtest"))
        .env("N", e.apps.join("attack_noshim"))
        .env("S", e.apps.join("spin"));
    Proc::spawn(c, "cuslice run")
}

/// A session with a memory quota and a compute share (so a memory
/// segment and a tenant entry in the GPU segment), holding 100 MiB: the
/// session and its run process's PID.
fn holding_session(h: &Host) -> (Proc, u32) {
    let s = session(
        h,
        &["--memory", "1GiB", "--compute", "40"],
        "$M hold 104857600 & echo P $!; wait",
    );
    s.pid("P");
    s.line("R held");
    let run = s.child.id();
    (s, run)
}

/// The GPU segment of this host's fake GPU.
fn gpu_segment_file(h: &Host) -> PathBuf {
    std::fs::read_dir(h.gpu_dir())
        .expect("gpu dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .expect("a GPU segment")
}

fn seg_used(p: &Path) -> u64 {
    let s = Segment::open_read_only(p).expect("segment");
    s.device_usage(0).map_or(0, |u| u.used)
}

#[test]
fn a_bad_watch_toml_is_one_line_naming_file_key_and_value() {
    let h = Host::new("badcfg");
    for (text, want) in [
        (
            "policy = \"nuke\"\n",
            "policy: expected report, kill or freeze, got \"nuke\"",
        ),
        ("intervl = \"1s\"\n", "got unknown key \"intervl\""),
        (
            "interval = \"1 fortnight\"\n",
            "interval: expected a duration like 1s or 200ms, got \"1 fortnight\"",
        ),
        (
            "memory_tolerance = -1\n",
            "memory_tolerance: expected a size like 64MiB, got -1",
        ),
    ] {
        let p = h.dir.join("bad.toml");
        std::fs::write(&p, text).expect("write");
        let out = h
            .cuslice()
            .args(["watch", "--config"])
            .arg(&p)
            .output()
            .expect("watch");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("cuslice: {}: ", p.display())),
            "{err}"
        );
        assert!(err.contains(want), "{text}: {err}");
    }
    // A flag is checked the same way.
    let out = h
        .cuslice()
        .args(["watch", "--interval", "0"])
        .output()
        .expect("watch");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("cuslice: --interval: expected a duration from 10ms to 1h"),
        "{err}"
    );
    // No NVML: one line naming the library and the variable.
    let mut c = h.cuslice();
    c.env("CUSLICE_REAL_NVML", h.dir.join("no-such-libnvidia-ml.so.1"));
    let out = c
        .args(["watch", "--root"])
        .arg(h.root())
        .output()
        .expect("watch");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot load NVML") && err.contains("CUSLICE_REAL_NVML"),
        "{err}"
    );
}

#[test]
fn a_second_watch_refuses_to_start_and_a_stopped_one_says_so() {
    let h = Host::new("twice");
    let mut first = h.watch("");
    let pid = first.child.id();
    let cfg = h.config("");
    let out = h
        .cuslice()
        .args(["watch", "--config"])
        .arg(&cfg)
        .output()
        .expect("second");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(
        err.trim(),
        format!(
            "cuslice: watch: another cuslice watch (pid {pid}) holds {}: one runs per host",
            h.root().join("watch/lock").display()
        )
    );
    assert!(
        first.child.try_wait().expect("wait").is_none(),
        "the first watch died"
    );
    // `status` shows it up, the exporter exports it.
    let out = h
        .cuslice()
        .args(["status", "--interval", "0", "--containers-root"])
        .arg(h.root().join("containers"))
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("watch: up  policy report  repair on"),
        "{text}"
    );
    first.stop();
    assert_eq!(
        first.child.try_wait().expect("wait").and_then(|s| s.code()),
        Some(0)
    );
    let s = h.state().expect("state");
    assert_eq!(s["running"], false, "{s}");
    // Its last line may reach our reader after the process is gone: waited
    // for, not looked up (under 4 busy processes it was not there yet).
    first.line("cuslice watch: stopped");
}

#[test]
fn a_run_session_over_its_quota_is_killed_newest_first_and_the_tenant_beside_it_keeps_its_memory() {
    let h = Host::new("runkill");
    // The tenant beside: 300 MiB of its 1 GiB.
    let beside = session(
        &h,
        &["--memory", "1GiB"],
        "$M hold 314572800 & echo B $!; wait",
    );
    let b_pid = beside.pid("B");
    beside.line("R held");
    let b_run = beside.child.id();
    let b_used = seg_used(&run_seg(&h, b_run));
    // The attacker: an older process within its quota, then a newer one
    // that reaches the driver around the shim (attack_noshim: its own
    // symbol lookup) and takes 2 GiB of the session's 1 GiB. (Raising the quota in the
    // segment from inside a registered process is the other way over it:
    // attack-quota; a new process cannot, the shim refuses a segment whose
    // quota differs from its file's.)
    let fifo = h.dir.join("go");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let attacker = session(
        &h,
        &["--memory", "1GiB"],
        &format!(
            "$M hold 314572800 & echo A1 $!; cat {} >/dev/null; $N 2147483648 & echo A2 $!; wait",
            fifo.display()
        ),
    );
    let a1 = attacker.pid("A1");
    attacker.line("R held");
    let a_run = attacker.child.id();
    let watch = h.watch("policy = \"kill\"");
    std::fs::write(&fifo, b"go").expect("fifo");
    let a2 = attacker.pid("A2");
    let (_, held) = attacker.line("ATTACK noshim holding 2147483648 bytes");
    let f = h.finding("memory", &format!("cuslice run {a_run} "), WITHIN, &watch);
    assert!(held.elapsed() <= WITHIN);
    // Killed within the same pass: the slice is back under its quota.
    common::wait_for(
        || format!("A2 ({a2}) still alive:\n{}", watch.text()),
        WITHIN,
        || (!alive(a2)).then_some(()),
    );
    assert!(
        f["what"].as_str().is_some_and(|w| w.contains(
            "GPU 0 memory 2.3 GiB > quota 1.0 GiB (+64 MiB tolerance, +64 MiB per process)"
        )),
        "{f}"
    );
    // The log line (read from the watch's stderr by a thread).
    common::wait_for(
        || format!("no line saying A2 ({a2}) was killed:\n{}", watch.text()),
        Duration::from_secs(5),
        || {
            watch
                .text()
                .lines()
                .any(|l| {
                    l.starts_with("cuslice watch: cuslice run ")
                        && l.ends_with(&format!(": killed pid {a2}"))
                })
                .then_some(())
        },
    );
    let log = watch.text();
    // The older process of the slice, the tenant beside it: untouched.
    assert!(alive(a1), "A1 was killed:\n{log}");
    assert!(alive(b_pid), "the tenant beside was killed:\n{log}");
    assert_eq!(
        seg_used(&run_seg(&h, b_run)),
        b_used,
        "the tenant beside lost memory"
    );
    // The finding ends once the slice is under its quota again.
    common::wait_for(
        || format!("the finding never ended:\n{}", watch.text()),
        WITHIN,
        || {
            watch
                .text()
                .contains("killed pid")
                .then(|| {
                    watch
                        .text()
                        .lines()
                        .any(|l| l.ends_with(": ended"))
                        .then_some(())
                })
                .flatten()
        },
    );
    // Counted for the exporter.
    let s = h.state().expect("state");
    assert!(
        s["counts"]
            .as_array()
            .expect("counts")
            .iter()
            .any(|c| c["kind"] == "memory"
                && c["tenant"] == format!("run-{a_run}")
                && c["count"] == 1),
        "{s}"
    );
}

/// A tenant that may burst (`--memory-max`) is held to what it publishes
/// in the GPU's memory pool: one whose burst there reads less than its
/// processes hold (a tenant writing false figures) is found like any
/// tenant over its quota, though it is within its `memory_max`.
#[test]
fn a_tenant_under_reporting_its_burst_in_the_gpus_memory_pool_is_found() {
    let h = Host::new("poollie");
    let s = session(
        &h,
        &["--memory", "256MiB", "--memory-max", "2GiB"],
        "$M hold 629145600 & echo P $!; wait",
    );
    s.pid("P");
    s.line("R held");
    let run = s.child.id();
    let watch = h.watch("policy = \"report\"");
    // Honest: 600 MiB held, 256 MiB guaranteed, the rest its burst.
    after_passes(&h, 2);
    let clean = h.state().expect("state");
    assert!(
        !clean["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["kind"] == "memory")),
        "{clean}"
    );
    // The tenant rewrites its burst to nothing.
    let pools: Vec<PathBuf> = std::fs::read_dir(h.gpu_dir())
        .expect("gpu dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "memory"))
        .collect();
    assert_eq!(pools.len(), 1, "{pools:?}");
    let pool = cuslice_core::pool::Pool::open_or_create(&pools[0]).expect("pool");
    let e = pool
        .entries()
        .into_iter()
        .find(|e| e.name == format!("run-{run}"))
        .expect("the session's entry");
    assert!(e.burst >= 344 << 20, "{e:?}");
    pool.entry(e.index)
        .expect("entry")
        .burst
        .store(0, std::sync::atomic::Ordering::Release);
    let f = h.finding("memory", &format!("cuslice run {run} "), WITHIN, &watch);
    assert!(
        f["what"].as_str().is_some_and(|w| w.contains(
            "> its guarantee and the burst it publishes in the GPU's memory pool 256 MiB"
        )),
        "{f}"
    );
}

/// The memory pool of this host's fake GPU (the one file there is).
fn pool_file(h: &Host) -> PathBuf {
    let pools: Vec<PathBuf> = std::fs::read_dir(h.gpu_dir())
        .expect("gpu dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "memory"))
        .collect();
    assert_eq!(pools.len(), 1, "{pools:?}");
    pools.into_iter().next().expect("one")
}

/// H2 of issue 41: a tenant writes 2^62 into its GPU's memory pool's
/// capacity (the file is every tenant's) and its shim lets it take 12 GiB
/// beside a tenant guaranteed 8 GiB on the 16 GiB fake GPU. The watch
/// grants bursts from NVML's total, not the pool's: it finds the borrower
/// and kills it, and the tenant beside keeps its memory. (Before the
/// watch stopped reading the pool's capacity it said nothing.)
#[test]
fn a_burst_taken_through_a_forged_pool_capacity_is_found_and_killed() {
    let h = Host::new("poolcap");
    let beside = session(
        &h,
        &["--memory", "8GiB"],
        "$M hold 104857600 & echo B $!; wait",
    );
    let b_pid = beside.pid("B");
    beside.line("R held");
    let pool = cuslice_core::pool::Pool::open_or_create(&pool_file(&h)).expect("pool");
    assert_eq!(pool.head().capacity.load(Ordering::Acquire), 16 << 30);
    pool.head().capacity.store(1 << 62, Ordering::Release);
    let watch = h.watch("policy = \"kill\"");
    // The shim counts against what its own driver says, not the file: a
    // burst into the forged room is refused there. Then the borrower
    // forges its own burst in the pool (as a tenant can) and takes 12 GiB
    // past the shim's refusal: the watch is what finds it.
    let go = std::env::temp_dir().join(format!("cuslice-poolcap-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let borrower = session(
        &h,
        &["--memory", "1GiB", "--memory-max", "13GiB"],
        &format!(
            "$M alloc 12884901888; $M hold 104857600 & echo A0 $!; while [ ! -e {go} ]; do sleep 0.05; done; $M hold 11811160064 & echo A $!; wait",
            go = go.display()
        ),
    );
    borrower.line("R alloc=2");
    borrower.line("R held");
    let a_run = borrower.child.id();
    let e = pool
        .entries()
        .into_iter()
        .find(|e| e.name == format!("run-{a_run}"))
        .expect("the borrower's entry");
    pool.entry(e.index)
        .expect("entry")
        .burst
        .store(12 << 30, Ordering::Release);
    std::fs::write(&go, "").expect("go");
    let a_pid = borrower.pid("A");
    // Its second "R held": the 12 GiB.
    let held = common::wait_for(
        || format!("the borrower never held its burst:\n{}", borrower.text()),
        Duration::from_secs(20),
        || {
            let l = borrower.lines.lock().expect("lock");
            let held: Vec<Instant> = l
                .iter()
                .filter(|(_, l)| l.starts_with("R held"))
                .map(|(t, _)| *t)
                .collect();
            held.get(1).copied()
        },
    );
    let _ = std::fs::remove_file(&go);
    let a_run = borrower.child.id();
    let f = h.finding("memory", &format!("cuslice run {a_run} "), WITHIN, &watch);
    assert!(held.elapsed() <= WITHIN);
    assert!(
        f["what"].as_str().is_some_and(|w| w.contains(
            "> its guarantee and the burst the watch granted it (from the room NVML showed beside the others' guarantees) 1.0 GiB"
        )),
        "{f}"
    );
    common::wait_for(
        || format!("the borrower ({a_pid}) still alive:\n{}", watch.text()),
        WITHIN,
        || (!alive(a_pid)).then_some(()),
    );
    assert!(
        alive(b_pid),
        "the tenant beside was killed:\n{}",
        watch.text()
    );
}

/// Issue 41: a tenant bursts legally (all the memory nobody is
/// guaranteed), then a tenant whose guarantee that memory is registers.
/// The late guarantee makes the burst inconvenient, not illegal: under
/// `kill` nobody is killed and nothing is found. (Before, the watch held
/// the borrower to the room the pool's entries left it and killed it.)
#[test]
fn a_legal_burst_is_not_killed_when_a_late_arrivals_guarantee_registers() {
    let h = Host::new("lateguar");
    let watch = h.watch("policy = \"kill\"");
    let borrower = session(
        &h,
        &["--memory", "2GiB", "--memory-max", "12GiB"],
        "$M hold 10737418240 & echo A $!; wait",
    );
    let a_pid = borrower.pid("A");
    borrower.line("R held");
    after_passes(&h, 2);
    let late = session(
        &h,
        &["--memory", "8GiB"],
        "$M hold 104857600 & echo B $!; wait",
    );
    let b_pid = late.pid("B");
    late.line("R held");
    // The pool holds both: 2 + 8 GiB guaranteed and 8 GiB of burst, on a
    // GPU of 16.
    let pool = cuslice_core::pool::Pool::open_or_create(&pool_file(&h)).expect("pool");
    let committed: u64 = pool.entries().iter().map(|e| e.guarantee + e.burst).sum();
    assert!(committed > 16 << 30, "{:?}", pool.entries());
    after_passes(&h, 8);
    let s = h.state().expect("state");
    assert!(
        !s["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["kind"] == "memory")),
        "{s}\n{}",
        watch.text()
    );
    assert!(alive(a_pid), "the borrower was killed:\n{}", watch.text());
    assert!(
        alive(b_pid),
        "the late arrival was killed:\n{}",
        watch.text()
    );
    // `status --json` shows the late arrival's pending part and the
    // borrower's burst, from the GPU's memory pool.
    let out = h
        .cuslice()
        .args(["status", "--json", "--interval", "0", "--containers-root"])
        .arg(h.root().join("containers"))
        .output()
        .expect("status");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let tenants: Vec<&serde_json::Value> = v["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["tenants"].as_array().into_iter().flatten())
        .collect();
    let of = |run: u32| {
        tenants
            .iter()
            .find(|t| t["name"] == format!("run-{run}"))
            .unwrap_or_else(|| panic!("no tenant run-{run}: {v}"))
    };
    assert!(
        of(late.child.id())["memory_pending_bytes"].as_u64() > Some(0),
        "{v}"
    );
    assert!(
        of(borrower.child.id())["memory_burst_bytes"].as_u64() > Some(0),
        "{v}"
    );
}

#[test]
fn a_process_of_a_run_session_that_bypasses_the_shim_is_reported_and_killed() {
    let h = Host::new("noshim");
    let watch = h.watch("policy = \"kill\"");
    // One process reaches the driver around the shim (attack_noshim: the
    // shim is preloaded, but it finds the driver's functions by its own
    // symbol lookup); its sibling goes through the shim.
    let s = session(
        &h,
        &["--memory", "1GiB"],
        "$M hold 104857600 & echo S $!; $N 104857600 & echo U $!; wait",
    );
    let (u, s_pid) = (s.pid("U"), s.pid("S"));
    s.line("R held");
    let (_, held) = s.line("ATTACK noshim holding 104857600 bytes");
    let f = h.finding(
        "unregistered",
        &format!("pid {u}: uses GPU 0"),
        WITHIN,
        &watch,
    );
    assert!(held.elapsed() <= WITHIN);
    assert_eq!(f["pid"], u, "{f}");
    common::wait_for(
        || format!("the unshimmed process {u} still alive:\n{}", watch.text()),
        WITHIN,
        || (!alive(u)).then_some(()),
    );
    assert!(
        alive(s_pid),
        "the shimmed sibling was killed:\n{}",
        watch.text()
    );
    assert!(
        !h.state().expect("state")["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .any(|f| f["pid"] == s_pid),
        "the shimmed sibling was reported"
    );
}

/// Issue 41 H1: a session's tenant keeping its memory segment's lock
/// while the watch must repair that segment stopped the whole host's
/// watch (its repair waited for the lock without bound), and a process
/// around the shim 2 GiB over the session's quota stayed alive as long as
/// the lock was held. Now the repair waits at most 2 s, puts the quota
/// back all the same with one line naming the file and the holder, and
/// the pass goes on to kill the process under `policy = "kill"`.
#[test]
fn a_tenant_keeping_its_segments_lock_while_it_is_repaired_stops_neither_the_watch_nor_a_kill() {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering::Release;
    let h = Host::new("keptlock");
    let fifo = h.dir.join("go");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let s = session(
        &h,
        &["--memory", "1GiB"],
        &format!(
            "$M hold 104857600 & echo S $!; cat {} >/dev/null; $N 2147483648 & echo U $!; wait",
            fifo.display()
        ),
    );
    s.pid("S");
    s.line("R held");
    let run = s.child.id();
    let watch = h.watch("policy = \"kill\"");
    // The tenant takes its segment's lock and keeps it, and raises its
    // quota there, so that the watch must repair the segment.
    let path = run_seg(&h, run);
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    // SAFETY: flock on the descriptor we just opened.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let seg = Segment::open_existing(&path).expect("segment");
    seg.device(0).expect("dev").limit.store(100 << 30, Release);
    std::fs::write(&fifo, b"go").expect("fifo");
    let u = s.pid("U");
    s.line("ATTACK noshim holding 2147483648 bytes");
    common::wait_for(
        || {
            format!(
                "the process 2 GiB over the quota ({u}) still alive:\n{}",
                watch.text()
            )
        },
        Duration::from_secs(30),
        || (!alive(u)).then_some(()),
    );
    let me = std::process::id();
    common::wait_for(
        || format!("no line naming the kept lock:\n{}", watch.text()),
        Duration::from_secs(30),
        || {
            watch
                .text()
                .lines()
                .any(|l| {
                    l.starts_with("cuslice watch: ")
                        && l.contains("restored without its lock: ")
                        && l.contains(&format!("memory.seg: its lock is held by pid {me}, "))
                })
                .then_some(())
        },
    );
    assert_eq!(seg.device_usage(0).map(|u| u.limit), Some(1 << 30));
    // The watch's passes go on while the lock is still kept.
    let passes = || h.state().and_then(|s| s["passes"].as_u64()).unwrap_or(0);
    let now = passes();
    common::wait_for(
        || format!("the watch's passes stopped at {now}:\n{}", watch.text()),
        Duration::from_secs(30),
        || (passes() >= now + 2).then_some(()),
    );
    drop(held);
}

#[test]
fn tampered_segments_are_reported_and_restored_within_two_intervals() {
    let h = Host::new("tamper");
    // A session with a memory quota and a compute share: it has a memory
    // segment and a tenant entry in the GPU segment.
    let (_s, run) = holding_session(&h);
    let watch = h.watch("");
    // The quota raised in the memory segment.
    let seg = Segment::open_existing(&run_seg(&h, run)).expect("segment");
    seg.device(0)
        .expect("dev")
        .limit
        .store(100 << 30, std::sync::atomic::Ordering::Release);
    let t = Instant::now();
    let f = h.finding(
        "memory_segment",
        &format!("cuslice run {run} "),
        WITHIN,
        &watch,
    );
    assert!(t.elapsed() <= WITHIN);
    assert!(
        f["what"]
            .as_str()
            .is_some_and(|w| w.contains("quota 100.0 GiB, its quota file 1.0 GiB")),
        "{f}"
    );
    common::wait_for(
        || format!("the quota was not restored:\n{}", watch.text()),
        WITHIN,
        || (seg.device_usage(0).map(|u| u.limit) == Some(1 << 30)).then_some(()),
    );
    // Raised again and hidden: the entry's state word overwritten (a reader
    // that skips entries not READY would not see it, and the shim still
    // admits against the entry it registered). Found and restored, its
    // state with it.
    use std::sync::atomic::Ordering::{Acquire, Release};
    let d0 = seg.device(0).expect("dev");
    d0.limit.store(100 << 30, Release);
    d0.state.store(7, Release);
    let f = h.finding(
        "memory_segment",
        "state word was overwritten",
        WITHIN,
        &watch,
    );
    assert!(
        f["what"].as_str().is_some_and(|w| w.contains(
            "quota 100.0 GiB in an entry whose state word was overwritten, its quota file 1.0 GiB"
        )),
        "{f}"
    );
    common::wait_for(
        || format!("the hidden quota was not restored:\n{}", watch.text()),
        WITHIN,
        || (seg.device_usage(0).map(|u| u.limit) == Some(1 << 30)).then_some(()),
    );
    // Raised again and hidden behind a flipped UUID byte: the entry names
    // no GPU of this host, and is held to what the file gives every GPU.
    let w = d0.uuid[3].load(Acquire);
    d0.uuid[3].store(w ^ 0xff00_0000, Release);
    d0.limit.store(100 << 30, Release);
    let f = h.finding("memory_segment", "no GPU of this host", WITHIN, &watch);
    assert!(
        f["what"]
            .as_str()
            .is_some_and(|w| w.contains("quota 100.0 GiB, its quota file 1.0 GiB")),
        "{f}"
    );
    common::wait_for(
        || {
            format!(
                "the quota behind a flipped UUID was not restored:\n{}",
                watch.text()
            )
        },
        WITHIN,
        || (d0.limit.load(Acquire) == 1 << 30).then_some(()),
    );
    d0.uuid[3].store(w, Release);
    // Its share raised in the GPU segment, while the watch reports only.
    let gpu_seg = gpu_segment_file(&h);
    let g = GpuSegment::open_existing(&gpu_seg).expect("gpu segment");
    let name = format!("run-{run}");
    let idx = g
        .tenants()
        .into_iter()
        .find(|t| t.name == name)
        .expect("tenant")
        .index;
    g.tenant(idx)
        .expect("tenant")
        .share
        .store(100, std::sync::atomic::Ordering::Release);
    g.tenant(idx)
        .expect("tenant")
        .max
        .store(100, std::sync::atomic::Ordering::Release);
    let t = Instant::now();
    let f = h.finding("gpu_segment", &name, WITHIN, &watch);
    assert!(t.elapsed() <= WITHIN, "{f}");
    common::wait_for(
        || format!("the share was not restored:\n{}", watch.text()),
        WITHIN,
        || {
            (g.tenants()
                .into_iter()
                .find(|t| t.name == name)
                .map(|t| t.share)
                == Some(40))
            .then_some(())
        },
    );
    // The line may reach our reader after the segment is restored: waited
    // for (under 4 busy processes, 1 run in 5 had not read it yet).
    common::wait_for(
        || format!("no 'GPU segment ...: restored' line:\n{}", watch.text()),
        Duration::from_secs(10),
        || {
            watch
                .text()
                .lines()
                .any(|l| l.starts_with("cuslice watch: GPU segment ") && l.ends_with(": restored"))
                .then_some(())
        },
    );
}

#[test]
fn a_tenant_truncating_the_segments_the_watch_maps_does_not_stop_the_watch() {
    // Any tenant can write (so truncate) its slice's memory segment and
    // the GPU segment it shares: a page of a mapping past the file's new
    // end raises SIGBUS in whoever touches it, the root watch included.
    let h = Host::new("truncate");
    let (_s, run) = holding_session(&h);
    let mut watch = h.watch("");
    let gpu_seg = gpu_segment_file(&h);
    // Mapped by the watch since its first pass.
    let passes = || h.state().and_then(|s| s["passes"].as_u64()).unwrap_or(0);
    let p0 = passes();
    common::wait_for(
        || format!("no second pass:\n{}", watch.text()),
        WITHIN,
        || (passes() > p0).then_some(()),
    );
    for p in [run_seg(&h, run), gpu_seg.clone()] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_len(0))
            .expect("truncate");
    }
    let p1 = passes();
    common::wait_for(
        || format!("the watch stopped passing after {p1}:\n{}", watch.text()),
        WITHIN,
        || (passes() >= p1 + 3).then_some(()),
    );
    assert!(
        watch.child.try_wait().expect("wait").is_none(),
        "the watch ended:\n{}",
        watch.text()
    );
    // The truncated GPU segment is said to be unreadable, by its path.
    let shown = gpu_seg.display().to_string();
    common::wait_for(
        || format!("no line naming {shown}:\n{}", watch.text()),
        WITHIN,
        || {
            watch
                .text()
                .lines()
                .find(|l| {
                    l.contains(&shown) && (l.contains("truncated") || l.contains(" is 0 bytes"))
                })
                .map(str::to_string)
        },
    );
}

/// Where a container's slice comes from.
enum Quota<'a> {
    /// A memory quota (the `cuslice.io/memory` annotation).
    Memory(&'a str),
    /// A DRA claim's (`oci-hook create --claim <uid>`, as the claim's CDI
    /// spec has it), no annotation.
    Claim(&'a str),
}

/// A runc bundle whose hooks use `root`, running `script` (fake driver
/// inside, FAKE_CUDA_STATE shared with the host's), with `extra` host
/// binaries copied into its root file system (path inside), its slice
/// from `quota`.
fn bundle(h: &Host, name: &str, quota: &Quota, script: &str, extra: &[(PathBuf, &str)]) -> PathBuf {
    let e = common::env();
    let dir = h.dir.join(format!("bundle-{name}"));
    let rootfs = dir.join("rootfs");
    common::rootfs::populate(&rootfs);
    for (bin, dest) in extra {
        common::rootfs::copy_with_libs(bin, &rootfs, dest);
    }
    std::fs::create_dir_all(rootfs.join("state")).expect("mkdir");
    let out = Command::new("runc")
        .arg("spec")
        .current_dir(&dir)
        .output()
        .expect("runc spec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    let hook = |stage: &str| {
        let mut args = serde_json::json!([
            "cuslice",
            "oci-hook",
            stage,
            "--root",
            h.root(),
            "--lib",
            e.shim
        ]);
        if let (Quota::Claim(uid), "create") = (quota, stage) {
            let a = args.as_array_mut().expect("args");
            a.push("--claim".into());
            a.push((*uid).into());
        }
        serde_json::json!({"path": env!("CARGO_BIN_EXE_cuslice"), "args": args})
    };
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    spec["process"]["env"] = serde_json::json!([
        "PATH=/usr/bin:/bin",
        "LD_LIBRARY_PATH=/usr/lib/fake",
        "FAKE_CUDA_STATE=/state/fake.state",
        "FAKE_CUDA_CTX_OVERHEAD=1MiB",
    ]);
    spec["root"]["readonly"] = false.into();
    spec["annotations"] = match quota {
        Quota::Memory(m) => serde_json::json!({"cuslice.io/memory": m}),
        Quota::Claim(_) => serde_json::json!({}),
    };
    spec["hooks"] =
        serde_json::json!({"createRuntime": [hook("create")], "poststop": [hook("poststop")]});
    // The fake GPU's state, shared with the host's processes and NVML.
    spec["mounts"]
        .as_array_mut()
        .expect("mounts")
        .push(serde_json::json!({
            "destination": "/state", "type": "bind", "source": h.dir, "options": ["rbind", "rw"]
        }));
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).expect("encode")).expect("write");
    dir
}

/// A running runc container, killed and deleted when dropped (also when
/// the test fails).
struct Container {
    id: String,
    proc: Proc,
}

impl Container {
    fn run(
        h: &Host,
        name: &str,
        memory: &str,
        script: &str,
        extra: &[(PathBuf, &str)],
    ) -> Container {
        Container::start(h, name, &Quota::Memory(memory), script, extra)
    }

    /// A container of DRA claim `uid` (see [`claim`]).
    fn of_claim(
        h: &Host,
        name: &str,
        uid: &str,
        script: &str,
        extra: &[(PathBuf, &str)],
    ) -> Container {
        Container::start(h, name, &Quota::Claim(uid), script, extra)
    }

    fn start(
        h: &Host,
        name: &str,
        quota: &Quota,
        script: &str,
        extra: &[(PathBuf, &str)],
    ) -> Container {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "the container tests need root");
        // Unique on the machine: the host's directory names the test.
        let id = format!(
            "{name}-{}",
            h.dir.file_name().expect("name").to_string_lossy()
        );
        let dir = bundle(h, name, quota, script, extra);
        let mut c = Command::new("runc");
        c.args(["run", "--bundle"]).arg(dir).arg(&id);
        Container {
            proc: Proc::spawn(c, "runc run"),
            id,
        }
    }

    /// What the watch calls it (`container <id>`, the ID cut to 12).
    fn label(&self) -> String {
        format!("container {}", &self.id[..12])
    }

    fn seg(&self, h: &Host) -> PathBuf {
        h.root()
            .join("containers")
            .join(&self.id)
            .join("segment/memory.seg")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("runc")
            .args(["kill", &self.id, "KILL"])
            .output();
        let _ = Command::new("runc")
            .args(["delete", "--force", &self.id])
            .output();
    }
}

/// The live fake-driver slots naming `pid` (as the process sees itself)
/// that hold exactly `bytes` on device 0: the driver's ground truth for a
/// process whose figure is unique on the test's GPU.
fn held_exactly(h: &Host, pid: u32, bytes: u64) -> usize {
    let fake = common::Fake::open(&h.dir.join("fake.state"), false);
    (0..common::FAKE_SLOTS)
        .filter(|i| fake.alive(*i) && fake.slot(*i) == (pid as i32, bytes))
        .count()
}

/// The well-behaved container beside an attacked one: 200 MiB (its
/// context makes it 201 MiB on the fake GPU, a figure nothing else holds)
/// of its 1 GiB.
fn neighbour(h: &Host) -> (Container, u32, PathBuf, u64) {
    let b = Container::run(
        h,
        "b",
        "1GiB",
        "memtest hold 209715200 & echo B $!; wait",
        &[],
    );
    let inner = b.proc.pid("B");
    b.proc.line("R held");
    let seg = b.seg(h);
    let used = seg_used(&seg);
    assert_eq!(
        held_exactly(h, inner, 201 << 20),
        1,
        "B's process on the fake GPU"
    );
    (b, inner, seg, used)
}

/// Container A's script: an older process within A's quota (300 MiB, a
/// registered sibling), and once it holds its memory, `attack` in the
/// background.
fn sibling_then(attack: &str) -> String {
    format!(
        "memtest hold 314572800 >/tmp/a1 & echo A1 $!; while ! [ -s /tmp/a1 ]; do :; done; cat /tmp/a1; {attack} & wait"
    )
}

/// After an attack on container `a`: its older process lives on (one live
/// process in its segment), the container beside keeps its memory by its
/// segment and by the fake GPU, and is never mentioned.
fn a_sibling_and_the_neighbour_are_untouched(
    h: &Host,
    watch: &Proc,
    a: &Container,
    b: &(Container, u32, PathBuf, u64),
) {
    let a_live = Segment::open_read_only(&a.seg(h))
        .expect("A's segment")
        .processes()
        .iter()
        .filter(|p| p.alive)
        .count();
    assert_eq!(
        a_live,
        1,
        "A's older process must live on:\n{}",
        watch.text()
    );
    assert_eq!(seg_used(&b.2), b.3, "the container beside lost memory");
    assert_eq!(
        held_exactly(h, b.1, 201 << 20),
        1,
        "the container beside lost memory on the fake GPU"
    );
    assert!(
        !watch.text().contains(&b.0.label()),
        "the container beside was reported:\n{}",
        watch.text()
    );
}

#[test]
fn a_container_process_around_the_shim_is_reported_and_killed_and_the_container_beside_keeps_its_memory()
 {
    let h = Host::new("ctr-noshim");
    let watch = h.watch("policy = \"kill\"");
    let b = neighbour(&h);
    // A: its registered sibling, then attack_noshim (the shim is preloaded
    // by the hook, but it finds the driver's functions by its own symbol
    // lookup) with 2 GiB of A's 1 GiB.
    let a = Container::run(
        &h,
        "a",
        "1GiB",
        &sibling_then("attack_noshim 2147483648"),
        &[],
    );
    a.proc.line("R held");
    let (line, t) = a.proc.line("ATTACK noshim holding 2147483648 bytes");
    let label = a.label();
    let u = h.finding("unregistered", &label, WITHIN, &watch);
    let m = h.finding("memory", &label, WITHIN, &watch);
    assert!(t.elapsed() <= WITHIN, "{line}");
    let pid = u["pid"].as_u64().expect("pid") as u32;
    assert!(
        u["what"]
            .as_str()
            .is_some_and(|w| w.contains("never registered with the shim")),
        "{u}"
    );
    assert!(
        m["what"]
            .as_str()
            .is_some_and(|w| w.contains("> quota 1.0 GiB")),
        "{m}"
    );
    // Killed in the pass that found it (the newest of A's processes): A is
    // back under its quota within two intervals of the attack.
    common::wait_for(
        || format!("the attack ({pid}) still alive:\n{}", watch.text()),
        WITHIN.saturating_sub(t.elapsed()),
        || (!alive(pid)).then_some(()),
    );
    assert!(
        m["action"] == format!("killed pid {pid}"),
        "memory: {m}\nunregistered: {u}"
    );
    // The next pass finds A within its quota: the finding ends.
    common::wait_for(
        || format!("A's memory finding never ended:\n{}", watch.text()),
        WITHIN,
        || {
            watch
                .text()
                .lines()
                .any(|l| {
                    l.starts_with(&format!("cuslice watch: {label}"))
                        && l.contains(" memory ")
                        && l.ends_with(": ended")
                })
                .then_some(())
        },
    );
    a_sibling_and_the_neighbour_are_untouched(&h, &watch, &a, &b);
}

#[test]
fn a_container_raising_its_own_quota_is_restored_and_killed_and_the_container_beside_keeps_its_memory()
 {
    let h = Host::new("ctr-quota");
    let watch = h.watch("policy = \"kill\"");
    let b = neighbour(&h);
    // A (2 GiB: the hook's quota file charges each context 640 MiB, so
    // that two processes fit): its registered sibling, then attack-quota:
    // raises A's quota in A's memory segment by 3 GiB and takes 3 GiB
    // through the shim.
    let a = Container::run(
        &h,
        "a",
        "2GiB",
        &sibling_then("attack-quota 3GiB"),
        &[(common::attack_bin("attack-quota"), "/usr/bin/attack-quota")],
    );
    a.proc.line("R held");
    let (line, t) = a.proc.line("ATTACK quota raised");
    assert!(line.contains("; holding 3221225472 bytes; pid "), "{line}");
    let label = a.label();
    let s = h.finding("memory_segment", &label, WITHIN, &watch);
    let m = h.finding("memory", &label, WITHIN, &watch);
    assert!(t.elapsed() <= WITHIN, "{line}");
    assert!(
        s["what"]
            .as_str()
            .is_some_and(|w| w.contains("quota 5.0 GiB, its quota file 2.0 GiB")),
        "{s}"
    );
    // Restored from the quota file, and what A holds beyond it killed
    // (the newest process: the attack), within two intervals.
    let seg = Segment::open_read_only(&a.seg(&h)).expect("A's segment");
    common::wait_for(
        || format!("A's quota was not restored:\n{}", watch.text()),
        WITHIN.saturating_sub(t.elapsed()),
        || (seg.device_usage(0).map(|u| u.limit) == Some(2 << 30)).then_some(()),
    );
    let killed = m["action"]
        .as_str()
        .and_then(|a| a.strip_prefix("killed pid "))
        .and_then(|p| p.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("not killed: {m}"));
    common::wait_for(
        || format!("the attack ({killed}) still alive:\n{}", watch.text()),
        WITHIN.saturating_sub(t.elapsed()),
        || (!alive(killed)).then_some(()),
    );
    assert!(s["action"] == "restored", "memory segment: {s}");
    a_sibling_and_the_neighbour_are_untouched(&h, &watch, &a, &b);
}

/// The UID of the tests' DRA claims, and what the watch calls such a
/// claim: `DRA claim team-a/<name> (<its UID cut to 12>)`.
const CLAIM_UID: &str = "0b1c2d3e-0000-4000-8000-000000000001";

fn claim_label(name: &str) -> String {
    format!("DRA claim team-a/{name} ({})", &CLAIM_UID[..12])
}

/// A DRA claim as `cuslice-dra-plugin` prepares one (issue #20), under the
/// host's root: `claims/<uid>/quota.toml` (root's, 0444: `memory` for
/// every container of the claim together, as tenant `team-a/<name>`, each
/// context charged 1 MiB, what the fake GPU takes), its record
/// `claim.json` and its segment directory. Returns the claim's memory
/// segment (made by the hook for the claim's first container).
fn claim(h: &Host, uid: &str, name: &str, memory: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = h.root().join("claims").join(uid);
    std::fs::create_dir_all(d.join("segment")).expect("mkdir");
    let q = d.join("quota.toml");
    std::fs::write(
        &q,
        format!(
            "# written by cuslice-dra-plugin for ResourceClaim team-a/{name} (uid {uid})\ntenant = \"team-a/{name}\"\nsegment_dir = \"/run/cuslice/segment\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\ncontext_overhead = \"1MiB\"\n[all]\nmemory = \"{memory}\"\n"
        ),
    )
    .expect("quota");
    std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    std::fs::write(
        d.join("claim.json"),
        serde_json::json!({"namespace": "team-a", "name": name, "uid": uid, "pods": [format!("team-a/{name}-0")]})
            .to_string(),
    )
    .expect("record");
    d.join("segment/memory.seg")
}

/// What `container.json` of container `c` says.
fn record(h: &Host, c: &Container) -> serde_json::Value {
    let p = h
        .root()
        .join("containers")
        .join(&c.id)
        .join("container.json");
    serde_json::from_slice(&std::fs::read(&p).expect("container.json")).expect("json")
}

/// Issue #20: the containers of a DRA claim share its memory segment and
/// its quota, and are judged together. A holds 700 MiB through the shim,
/// B 700 MiB around it (registered, so that only the memory check can
/// catch it), under the claim's 1 GiB: each alone is within it, together
/// they are not. Before, each was judged alone against its copy of the
/// claim's quota (nothing found) and looked for in a memory segment of
/// its own that a claim's container does not have (both reported as
/// never registered: under `kill`, killed).
#[test]
fn two_containers_of_a_claim_over_its_quota_together_are_found_and_neither_is_taken_for_unregistered()
 {
    let h = Host::new("claim-mem");
    let seg = claim(&h, CLAIM_UID, "pair", "1GiB");
    let watch = h.watch("");
    let a = Container::of_claim(
        &h,
        "a",
        CLAIM_UID,
        "memtest hold 734003200 & echo A $!; wait",
        &[],
    );
    a.proc.line("R held");
    let b = Container::of_claim(
        &h,
        "b",
        CLAIM_UID,
        "attack_noshim 734003200 -1 0 register & echo B $!; wait",
        &[],
    );
    let (line, t) = b.proc.line("ATTACK noshim holding 734003200 bytes");
    // The hook recorded the claim: what maps the containers to it.
    for c in [&a, &b] {
        assert_eq!(record(&h, c)["claim"], CLAIM_UID);
    }
    // Both registered in the claim's one segment.
    let live = || {
        Segment::open_read_only(&seg)
            .expect("the claim's segment")
            .processes()
            .iter()
            .filter(|p| p.alive)
            .count()
    };
    assert_eq!(live(), 2, "{line}");
    let label = claim_label("pair");
    let m = h.finding("memory", &label, WITHIN, &watch);
    assert!(t.elapsed() <= WITHIN, "{line}");
    let what = m["what"].as_str().unwrap_or_default();
    assert!(
        what.starts_with(&format!("{label} pids ")) && what.contains("> quota 1.0 GiB"),
        "{m}"
    );
    assert_eq!(m["tenant"], "team-a/pair", "{m}");
    assert_eq!(m["action"], "reported", "{m}");
    // A few passes more: neither process is taken for unregistered, and
    // neither container is judged on its own.
    after_passes(&h, 3);
    let state = h.state().expect("state");
    assert!(
        !state["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .any(|f| f["kind"] == "unregistered"),
        "{state}"
    );
    let text = watch.text();
    assert!(!text.contains("never registered"), "{text}");
    assert!(
        !text.contains(&a.label()) && !text.contains(&b.label()),
        "{text}"
    );
    assert_eq!(live(), 2, "report only: nobody killed\n{text}");
}

/// Issue #20, the claim's side of #18's hole 6: a container of a claim
/// raises the quota in the claim's memory segment (shared by every
/// container of the claim) and takes 3 GiB through the shim. The watch
/// finds it in the claim's segment, restores the quota there from the
/// claim's quota file and, under `kill`, kills what the claim holds beyond
/// its quota: the attack, the newest process; A's older process and the
/// claim's other container keep theirs. Before, the watch looked in
/// `containers/<id>/segment`, which a claim's container does not have.
#[test]
fn a_claim_container_raising_the_claims_quota_is_restored_from_the_claims_quota_file_and_killed() {
    let h = Host::new("claim-quota");
    let seg = claim(&h, CLAIM_UID, "quota", "2GiB");
    let watch = h.watch("policy = \"kill\"");
    // B, the claim's other container: 200 MiB (201 with its context, a
    // figure nothing else on the fake GPU holds).
    let b = Container::of_claim(
        &h,
        "b",
        CLAIM_UID,
        "memtest hold 209715200 & echo B $!; wait",
        &[],
    );
    let b_inner = b.proc.pid("B");
    b.proc.line("R held");
    let a = Container::of_claim(
        &h,
        "a",
        CLAIM_UID,
        &sibling_then("attack-quota 3GiB"),
        &[(common::attack_bin("attack-quota"), "/usr/bin/attack-quota")],
    );
    a.proc.line("R held");
    let (line, t) = a.proc.line("ATTACK quota raised");
    assert!(line.contains("; holding 3221225472 bytes; pid "), "{line}");
    let label = claim_label("quota");
    let s = h.finding("memory_segment", &label, WITHIN, &watch);
    let m = h.finding("memory", &label, WITHIN, &watch);
    assert!(t.elapsed() <= WITHIN, "{line}");
    assert!(
        s["what"].as_str().is_some_and(|w| w.contains(&format!(
            "memory segment {} says GPU 0 quota 5.0 GiB, its quota file 2.0 GiB",
            seg.display()
        ))),
        "{s}"
    );
    // Restored in the claim's segment from the claim's quota file.
    let sg = Segment::open_read_only(&seg).expect("the claim's segment");
    common::wait_for(
        || format!("the claim's quota was not restored:\n{}", watch.text()),
        WITHIN.saturating_sub(t.elapsed()),
        || (sg.device_usage(0).map(|u| u.limit) == Some(2 << 30)).then_some(()),
    );
    assert!(s["action"] == "restored", "memory segment: {s}");
    let killed = m["action"]
        .as_str()
        .and_then(|a| a.strip_prefix("killed pid "))
        .and_then(|p| p.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("not killed: {m}"));
    common::wait_for(
        || format!("the attack ({killed}) still alive:\n{}", watch.text()),
        WITHIN.saturating_sub(t.elapsed()),
        || (!alive(killed)).then_some(()),
    );
    // A's older process and B's live on, B's memory with it.
    let live = sg.processes().iter().filter(|p| p.alive).count();
    assert_eq!(live, 2, "A1 and B must live on:\n{}", watch.text());
    assert_eq!(
        held_exactly(&h, b_inner, 201 << 20),
        1,
        "the claim's other container lost memory on the fake GPU"
    );
}

/// This process's start time (field 22 of `/proc/self/stat`).
fn own_start() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let rest = s.rsplit_once(')').expect("stat").1;
    rest.split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .expect("start time")
}

/// A container record naming a DRA claim that cannot be checked (no
/// directory, no quota file) is one log line naming the path and what is
/// wrong: never judged against its own copy of a quota, nor taken as
/// unlimited without a word.
#[test]
fn a_container_record_naming_a_claim_without_a_quota_file_is_one_line_naming_the_path() {
    let h = Host::new("claim-missing");
    // Another claim, so that the claims' directory is there.
    claim(&h, CLAIM_UID, "other", "1GiB");
    std::fs::create_dir_all(h.root().join("claims/empty-uid")).expect("mkdir");
    // Records as the hook writes them for a live container (its init: this
    // process), each with its copy of a quota file.
    for (id, uid) in [("ghost1", "missing-uid"), ("ghost2", "empty-uid")] {
        let d = h.root().join("containers").join(id);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join("quota.toml"), "[all]\nmemory = \"100GiB\"\n").expect("quota");
        std::fs::write(
            d.join("container.json"),
            serde_json::json!({"id": id, "pid_ns": 1, "cgroup": format!("/{id}"),
                "init_pid": std::process::id(), "init_start": own_start(), "claim": uid})
            .to_string(),
        )
        .expect("record");
    }
    let watch = h.watch("");
    let claims = h.root().join("claims");
    for (uid, id, path, wrong) in [
        (
            "missing-uid",
            "ghost1",
            claims.join("missing-uid"),
            "cannot open the directory: No such file or directory",
        ),
        (
            "empty-uid",
            "ghost2",
            claims.join("empty-uid/quota.toml"),
            "cannot open the file: No such file or directory",
        ),
    ] {
        let prefix = format!("cuslice watch: DRA claim {uid} (named by container {id}): ");
        let (rest, _) = watch.line(&prefix);
        assert!(
            rest.starts_with(&format!("{}: {wrong}", path.display()))
                && rest.ends_with(": its containers are not checked"),
            "{rest}"
        );
        // Said once.
        after_passes(&h, 2);
        let n = watch
            .text()
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .count();
        assert_eq!(n, 1, "{}", watch.text());
    }
}

/// Issue #32 item 9: two slices given one tenant name (quota files written
/// by hand, as no hook would let them be) are two entries of the GPU
/// segment, and the watch restores each from its own slice's quota file,
/// whichever container's id sorts first.
#[test]
fn two_slices_of_one_tenant_name_are_two_entries_each_restored_from_its_own_quota_file() {
    use cuslice_core::config::{Config, format_uuid, parse_file};
    use std::sync::atomic::Ordering;
    let h = Host::new("one-name");
    let path = h
        .gpu_dir()
        .join(format!("{}.seg", format_uuid(&common::FAKE_UUID)));
    let g = GpuSegment::open_or_create(&path).expect("GPU segment");
    // Per tenant name, the victim (share 50) and the intruder (share and
    // ceiling 1): under "first" the victim's id sorts first, under
    // "second" the intruder's.
    let pairs = [
        ("first", "a-victim", "b-intruder"),
        ("second", "b-victim", "a-intruder"),
    ];
    let quota = |tenant: &str, id: &str, limits: &str| {
        format!(
            "tenant = \"{tenant}\"\nslice = \"ctr-{id}\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\n[all]\n{limits}"
        )
    };
    let mut entries = vec![];
    for (tenant, victim, intruder) in pairs {
        for (id, limits, want) in [
            (victim, "compute = 50\n", (50, 100)),
            (intruder, "compute = 1\ncompute_max = 1\n", (1, 1)),
        ] {
            // A record as the hook writes it for a live container (its
            // init: this process).
            let id = format!("{id}-{tenant}");
            let d = h.root().join("containers").join(&id);
            std::fs::create_dir_all(&d).expect("mkdir");
            let text = quota(tenant, &id, limits);
            std::fs::write(d.join("quota.toml"), &text).expect("quota");
            std::fs::write(
                d.join("container.json"),
                serde_json::json!({"id": id, "pid_ns": 1, "cgroup": format!("/{id}"),
                    "init_pid": std::process::id(), "init_start": own_start()})
                .to_string(),
            )
            .expect("record");
            // Its process registers as the shim does: the name and the
            // slice's tag.
            let cfg: Config = parse_file(&d.join("quota.toml"), &text).expect("quota");
            let spec = cfg.tenant_spec(0, &common::FAKE_UUID).expect("a share");
            let (i, old) = g
                .register(
                    tenant,
                    cfg.slice_tag(),
                    spec,
                    cuslice_core::gpu::monotonic_ns(),
                )
                .expect("tenant");
            assert_eq!(old, None, "{id}: another slice's entry was changed");
            entries.push((id, i, want));
        }
    }
    let indices: std::collections::BTreeSet<usize> = entries.iter().map(|e| e.1).collect();
    assert_eq!(indices.len(), 4, "one entry per slice: {entries:?}");
    let watch = h.watch("");
    let got = |i: usize| {
        let t = g.tenant(i).expect("entry");
        (
            t.share.load(Ordering::Acquire),
            t.max.load(Ordering::Acquire),
        )
    };
    // Nothing to find in what each slice registered.
    after_passes(&h, 2);
    assert!(!watch.text().contains("GPU segment"), "{}", watch.text());
    // Every entry swapped with its namesake's values: each is put back
    // from its own quota file.
    for (_, i, want) in &entries {
        let forged = if *want == (50, 100) {
            (1, 1)
        } else {
            (50, 100)
        };
        let t = g.tenant(*i).expect("entry");
        t.share.store(forged.0, Ordering::Release);
        t.max.store(forged.1, Ordering::Release);
    }
    h.finding("gpu_segment", "share", WITHIN, &watch);
    let restored = common::poll_until(WITHIN, || {
        entries
            .iter()
            .all(|(_, i, want)| got(*i) == *want)
            .then_some(())
    });
    assert!(
        restored.is_some(),
        "not each restored from its own quota file: {:?}\n{}",
        entries
            .iter()
            .map(|(id, i, want)| (id.clone(), got(*i), *want))
            .collect::<Vec<_>>(),
        watch.text()
    );
}

/// The GPU time (percent of the wall time) a `spin` session got between
/// `from` and `to`, from its `P <ms> <GPU ms>` progress lines (each taken
/// when it came).
fn spin_fraction(p: &Proc, from: Instant, to: Instant) -> Option<f64> {
    let lines = p.lines.lock().expect("lock");
    let samples: Vec<(Instant, f64, f64)> = lines
        .iter()
        .filter_map(|(t, l)| {
            let mut w = l.strip_prefix("P ")?.split(' ');
            Some((*t, w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    let at = |x: Instant| samples.iter().rev().find(|s| s.0 <= x).copied();
    let (a, b) = (at(from)?, at(to)?);
    (b.1 > a.1).then(|| 100.0 * (b.2 - a.2) / (b.1 - a.1))
}

/// Two well-behaved tenants (shares 30 and 70) saturate the fake GPU with
/// 1 ms kernels; after 1 s attack-gpuseg (its own tenant, share 10) forges
/// the GPU segment, once or every `period_ms`. Returns the two tenants'
/// parts of the GPU time they got together, over 3.5 s from two intervals
/// after the attack line, and that line's time.
fn split_under_gpuseg(
    h: &Host,
    watch: Option<&Proc>,
    period_ms: Option<u64>,
) -> (f64, f64, Instant, Vec<Proc>) {
    let a = session(h, &["--compute", "30"], "exec $S 7 1000000 4");
    let b = session(h, &["--compute", "70"], "exec $S 7 1000000 4");
    a.line("P ");
    b.line("P ");
    std::thread::sleep(Duration::from_millis(1000));
    let g = common::attack_bin("attack-gpuseg");
    let mut c = h.cuslice();
    c.args(["run", "--compute", "10", "--"]).arg(g).arg("6");
    if let Some(p) = period_ms {
        c.arg(p.to_string());
    }
    let atk = Proc::spawn(c, "attack-gpuseg");
    let (line, t) = atk.line("ATTACK gpuseg ");
    assert!(
        line.contains("share 30 -> 1") && line.contains("share 70 -> 1"),
        "{line}"
    );
    // The window starts two intervals after the attack, and not before
    // the test saw the watch's finding (on a loaded machine the repair can
    // come later than two intervals: the split is the shares' from then).
    let mut from = t + 2 * Duration::from_millis(INTERVAL_MS);
    if let Some(w) = watch {
        h.finding("gpu_segment", "share", WITHIN, w);
        assert!(t.elapsed() <= WITHIN);
        from = from.max(Instant::now());
    }
    let to = from + Duration::from_millis(3500);
    let done = |p: &Proc| {
        common::poll_until(Duration::from_secs(30), || {
            p.text().lines().any(|l| l.starts_with("R ")).then_some(())
        })
    };
    if done(&a).is_none() || done(&b).is_none() {
        eprintln!(
            "A:\n{}\nB:\n{}\nwatch:\n{}",
            a.text(),
            b.text(),
            watch.map(|w| w.text()).unwrap_or_default()
        );
    }
    let fa = spin_fraction(&a, from, to).unwrap_or(0.0);
    let fb = spin_fraction(&b, from, to).unwrap_or(0.0);
    let total = fa + fb;
    eprintln!(
        "gpuseg split: period {period_ms:?}, watch {}: A (30) {:.1} % of {total:.1}, B (70) {:.1} %",
        watch.is_some(),
        100.0 * fa / total,
        100.0 * fb / total
    );
    (100.0 * fa / total, 100.0 * fb / total, t, vec![a, b, atk])
}

#[test]
fn a_forged_gpu_segment_is_restored_and_the_shares_hold_again_and_a_fast_forger_gets_nobody_killed()
{
    // Without the watch: the forged shares stay, the split is 50/50.
    let h = Host::new("gpuseg-none");
    let (a, b, _, _) = split_under_gpuseg(&h, None, None);
    assert!(
        a > 40.0 && b < 60.0,
        "the attack did not skew the split: {a:.1} / {b:.1}"
    );
    drop(h);
    // With it: reported (in split_under_gpuseg) and restored within two
    // intervals; from then on the split is the shares' (compute.rs's
    // tolerance).
    let h = Host::new("gpuseg-once");
    let w = h.watch("policy = \"kill\"");
    let (a, b, _, _) = split_under_gpuseg(&h, Some(&w), None);
    assert!(
        (a - 30.0).abs() <= 3.0 && (b - 70.0).abs() <= 3.0,
        "after the repair: {a:.1} / {b:.1}, want 30 / 70 ± 3\n{}",
        w.text()
    );
    drop((w, h));
    // A forger that rewrites every 20 ms (faster than the 250 ms passes)
    // keeps the split skewed while it writes (measured: about 50 / 50; the
    // repair does not keep the shares then), and the compute check, which
    // sees the well-behaved tenants over and under their shares, must not
    // kill either of them: both run to their end.
    let h = Host::new("gpuseg-fast");
    let w = h.watch("policy = \"kill\"");
    let (a, b, _, procs) = split_under_gpuseg(&h, Some(&w), Some(20));
    eprintln!("a forger rewriting every 20 ms, the watch repairing every 250 ms: {a:.1} / {b:.1}");
    for p in &procs[..2] {
        // Each well-behaved tenant finished (its result line, waited for:
        // it may reach our reader after the process is gone).
        p.line("R ");
    }
    assert!(!w.text().contains(": killed"), "{}", w.text());
}

/// A tenant (share 20, ceiling 30) whose process registered through the
/// shim and then keeps the GPU busy around its limiter (attack_noshim with
/// kernels), beside a well-behaved one (share 70, `spin`); the watch under
/// `policy`. Returns the watch, the sessions, the offender's PID, the
/// attack line's time and the neighbour's spin PID.
fn over_its_ceiling(h: &Host, policy: &str) -> (Proc, Proc, Proc, u32, Instant, u32) {
    // A freeze of 5 s: long enough for the test, however late a loaded
    // machine lets it look, to see the process stopped.
    let w = h.watch(&format!("policy = \"{policy}\"\nfreeze_seconds = 5"));
    let n = session(h, &["--compute", "70"], "$S 30 1000000 4 & echo W $!; wait");
    let spin = n.pid("W");
    n.line("P ");
    let o = session(
        h,
        &["--compute", "20", "--compute-max", "30"],
        "exec $N 1048576 -1 1000 register",
    );
    let (line, t) = o.line("ATTACK noshim holding 1048576 bytes");
    assert!(
        line.contains(", keeping it busy, registered; pid "),
        "{line}"
    );
    let pid: u32 = line
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    (w, n, o, pid, t, spin)
}

/// The process state letter of `pid` (`/proc/<pid>/stat`).
fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

// The compute finding's window, on an idle machine: `compute_sustain`
// (2) passes in a row, after a first pass that sees the process start
// (3 intervals). A ceiling's finding: judged over two on/off cycles of
// the tenant's burst (a 30 % ceiling with the default 200 ms burst: 2 x
// (286 + 667) ms, 8 passes of 250 ms, `checks::ceiling_passes`), then
// `compute_sustain` passes in a row, after a first pass (11 intervals).
// The tests wait up to `WITHIN` for either. Beside a neighbour that wants
// more, the tenant over its ceiling (20 % share, 30 % ceiling, taking
// half the GPU) is over its share too, and that rule, judged pass by
// pass, usually finds it first: the tests below take either finding.

/// What either finding of a tenant over its ceiling or share says.
const OVER: &str = "% (+10 points";

#[test]
fn a_tenant_alone_over_its_ceiling_is_found_over_two_cycles_of_its_burst() {
    // Alone on the GPU nobody waits: only the ceiling rule can find a
    // tenant that launches around its limiter, over the window of its
    // burst's cycles.
    let h = Host::new("calone");
    let w = h.watch("policy = \"report\"");
    let o = session(
        &h,
        &["--compute-max", "30"],
        "exec $N 1048576 -1 1000 register",
    );
    let (_, t) = o.line("ATTACK noshim holding 1048576 bytes");
    let f = h.finding("compute", "> ceiling 30% (+10 points, +", WITHIN, &w);
    assert!(t.elapsed() <= WITHIN, "{f}");
    assert_eq!(f["action"], "reported", "{f}");
}

#[test]
fn a_tenant_over_its_ceiling_around_the_limiter_is_frozen_then_let_go_and_its_neighbour_runs_on() {
    let h = Host::new("freeze");
    let (w, n, _o, pid, t, spin) = over_its_ceiling(&h, "freeze");
    let f = h.finding("compute", OVER, WITHIN, &w);
    assert!(t.elapsed() <= WITHIN, "{f}");
    assert!(
        f["action"]
            .as_str()
            .is_some_and(|a| a == format!("froze pid {pid} for 5s")),
        "{f}"
    );
    common::wait_for(
        || format!("{pid} not stopped: {:?}", proc_state(pid)),
        WITHIN,
        || (proc_state(pid) == Some('T')).then_some(()),
    );
    let frozen = Instant::now();
    // Let go after the freeze period (the pass after it ends).
    common::wait_for(
        || format!("{pid} never let go:\n{}", w.text()),
        WITHIN,
        || {
            w.text()
                .lines()
                .any(|l| l.ends_with(&format!(": let pid {pid} go on")))
                .then_some(())
        },
    );
    // Not before the freeze's 5 s (less the time the test, on a loaded
    // machine, may have taken to see the process stopped): a watch that
    // let go at the next pass would have done so after 250 ms.
    assert!(
        frozen.elapsed() >= Duration::from_secs(4),
        "let go {:?} after the test saw it stopped:\n{}",
        frozen.elapsed(),
        w.text()
    );
    common::wait_for(
        || format!("{pid} still stopped: {:?}", proc_state(pid)),
        WITHIN,
        || (proc_state(pid) != Some('T')).then_some(()),
    );
    // The neighbour: never stopped, never reported.
    assert!(alive(spin) && proc_state(spin) != Some('T'));
    assert!(
        !w.text().contains(&format!("cuslice run {} ", n.child.id())),
        "{}",
        w.text()
    );
}

#[test]
fn a_tenant_over_its_ceiling_around_the_limiter_is_killed_and_its_neighbour_runs_on() {
    let h = Host::new("ckill");
    let (w, n, _o, pid, t, spin) = over_its_ceiling(&h, "kill");
    let f = h.finding("compute", OVER, WITHIN, &w);
    assert!(t.elapsed() <= WITHIN, "{f}");
    assert_eq!(f["action"], format!("killed pid {pid}"), "{f}");
    common::wait_for(
        || format!("{pid} still alive"),
        WITHIN,
        || (!alive(pid)).then_some(()),
    );
    // It was registered: never reported as unregistered.
    assert!(!w.text().contains("never registered"), "{}", w.text());
    assert!(alive(spin));
    assert!(
        !w.text().contains(&format!("cuslice run {} ", n.child.id())),
        "{}",
        w.text()
    );
}

/// How many times the watch (`pid`) listed a GPU's processes, by the fake
/// driver's call log.
fn listings(log: &Path, pid: u32) -> usize {
    let prefix = format!("{pid} nvmlDeviceGetComputeRunningProcesses");
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

#[test]
fn a_steady_gpu_is_not_listed_every_pass_and_a_process_in_place_of_one_of_its_footprint_is_found_at_once()
 {
    // NVML's process listing is dear (about 20 ms of CPU with 64
    // processes on an H100): the watch reuses it while the GPU's memory in
    // use stays the same. A process that starts as another of exactly its
    // footprint ends leaves that figure unchanged; the watch must still
    // see it within two intervals (here 1 s, so that both happen between
    // two passes), not at the next full listing ten passes later.
    let h = Host::new("listing");
    let log = h.dir.join("fake.log");
    let go = h.dir.join("go");
    let cfg = h.dir.join("watch-1s.toml");
    std::fs::write(
        &cfg,
        format!("interval = \"1s\"\nroot = \"{}\"\n", h.root().display()),
    )
    .expect("write watch.toml");
    let s = session(
        &h,
        &["--memory", "1GiB"],
        &format!(
            "$M hold 104857600 & A=$!; echo A $A; \
             while [ ! -e {go} ]; do sleep 0.01; done; \
             kill $A; wait $A; $N 104857600 & echo U $!; wait",
            go = go.display()
        ),
    );
    s.pid("A");
    s.line("R held");
    let mut c = h.cuslice();
    c.env("FAKE_CUDA_LOG", &log)
        .args(["watch", "--config"])
        .arg(&cfg);
    let watch = Proc::spawn(c, "watch");
    let wpid = watch.child.id();
    let passes = || h.state().and_then(|s| s["passes"].as_u64()).unwrap_or(0);
    // The first listing, then reuse until the full listing ten passes on.
    common::wait_for(
        || format!("the watch never listed twice:\n{}", watch.text()),
        Duration::from_secs(30),
        || (listings(&log, wpid) >= 2).then_some(()),
    );
    let p = passes();
    assert!(
        p >= 10 && listings(&log, wpid) == 2,
        "{} listings in {p} passes of a steady GPU",
        listings(&log, wpid)
    );
    std::fs::write(&go, "").expect("go");
    s.line("ATTACK noshim holding 104857600 bytes");
    let started = passes();
    let u = s.pid("U");
    h.finding(
        "unregistered",
        &format!("pid {u}: uses GPU 0"),
        WITHIN,
        &watch,
    );
    // Within a few passes of the process's start (counted in passes, which
    // a loaded machine stretches, not in seconds: the pass that found it,
    // one that may have been under way at the start, one for the test's
    // own lateness), not at the full listing ten passes on.
    let found = passes();
    assert!(
        found <= started + 3,
        "found at pass {found}, the process started at pass {started}:\n{}",
        watch.text()
    );
}

#[test]
fn a_tenant_over_its_share_around_the_limiter_is_found_while_its_neighbour_gets_less_than_its_own()
{
    // No ceiling this time: a tenant of share 20 that registered through
    // the shim and then launches around its limiter takes about half of
    // the GPU beside a saturating tenant of share 70. The neighbour never
    // waits for cuslice's lease (the GPU time-slices between them), so
    // its waited time says nothing; what it asked for (its demand) does.
    let h = Host::new("share");
    let w = h.watch("policy = \"kill\"");
    let n = session(
        &h,
        &["--compute", "70"],
        "$S 30 1000000 4 & echo W $!; wait",
    );
    let spin = n.pid("W");
    n.line("P ");
    let o = session(&h, &["--compute", "20"], "exec $N 1048576 -1 1000 register");
    let (line, t) = o.line("ATTACK noshim holding 1048576 bytes");
    let pid: u32 = line
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    let f = h.finding("compute", "> share 20%", WITHIN, &w);
    assert!(t.elapsed() <= WITHIN, "{f}");
    assert!(
        f["what"]
            .as_str()
            .is_some_and(|s| s.contains("of its 70% and asked for")),
        "{f}"
    );
    assert_eq!(f["action"], format!("killed pid {pid}"), "{f}");
    common::wait_for(
        || format!("{pid} still alive"),
        WITHIN,
        || (!alive(pid)).then_some(()),
    );
    assert!(alive(spin));
    assert!(
        !w.text().contains(&format!("cuslice run {} ", n.child.id())),
        "{}",
        w.text()
    );
}

/// What tenant `name` asked of the GPU in its last demand window, per
/// mille, by the GPU segments in the host's GPU directory.
fn demand_pm(h: &Host, name: &str) -> Option<u32> {
    std::fs::read_dir(h.gpu_dir())
        .ok()?
        .flatten()
        .filter_map(|e| GpuSegment::open_read_only(&e.path()).ok())
        .find_map(|g| g.tenants().into_iter().find(|t| t.name == name))
        .map(|t| t.demand_pm)
}

#[test]
fn a_neighbour_that_takes_the_time_an_idle_tenant_left_is_not_held_to_its_share() {
    // Shares are work-conserving: time a tenant leaves idle goes to the
    // others. A tenant that stops launching (a data-loading phase, an idle
    // service; here: stopped) keeps its last demand figure in the segment;
    // the watch must not read it as "crowded out" and kill the neighbour
    // that took the time (found by review: it did).
    let h = Host::new("idle");
    let w = h.watch("policy = \"kill\"");
    let a = session(
        &h,
        &["--compute", "30"],
        "$S 30 1000000 4 & echo W $!; wait",
    );
    let a_spin = a.pid("W");
    a.line("P ");
    let tenant = format!("run-{}", a.child.id());
    common::wait_for(
        || format!("{tenant} never asked for its share"),
        Duration::from_secs(10),
        || (demand_pm(&h, &tenant)? >= 300).then_some(()),
    );
    // SAFETY: SIGSTOP to a process this test started: an idle phase.
    unsafe { libc::kill(a_spin as i32, libc::SIGSTOP) };
    let b = session(
        &h,
        &["--compute", "70"],
        "$S 30 1000000 4 & echo W $!; wait",
    );
    let b_spin = b.pid("W");
    b.line("P ");
    // Twelve passes: six times the sustain count.
    after_passes(&h, 12);
    let text = w.text();
    // SAFETY: as above.
    unsafe { libc::kill(a_spin as i32, libc::SIGCONT) };
    assert!(
        alive(b_spin) && !text.contains(&format!("cuslice run {} ", b.child.id())),
        "the neighbour was reported or killed while the other tenant idled:\n{text}"
    );
}

/// A session whose user rewrote its quota file before the watch read it
/// (tenant, memory segment directory and limits of the user's choosing,
/// here another session's segment and a 100 GiB quota): the watch takes no
/// path from that file. The other session's memory segment keeps its
/// quota, and the rewrite is one line naming the file and the keys.
#[test]
fn a_run_sessions_rewritten_quota_file_does_not_steer_the_watch_into_another_tenants_segment() {
    let h = Host::new("deputy");
    let w = h.watch("");
    let v = session(
        &h,
        &["--memory", "1GiB"],
        "$M hold 104857600 & echo A $!; wait",
    );
    v.line("R held");
    let vseg = run_seg(&h, v.child.id());
    let limit = || {
        Segment::open_read_only(&vseg)
            .expect("segment")
            .device_usage(0)
            .map_or(0, |u| u.limit)
    };
    assert_eq!(limit(), 1 << 30);
    let vdir = vseg.parent().expect("dir").display().to_string();
    let script = format!(
        "Q=$CUSLICE_CONFIG; \
         printf 'tenant = \"x\"\\nsegment_dir = \"{vdir}\"\\n[all]\\nmemory = \"100GiB\"\\n' > $Q; \
         unset LD_PRELOAD; exec $N 1048576 -1"
    );
    let x = session(&h, &["--memory", "1GiB"], &script);
    x.line("ATTACK noshim holding");
    let label = format!("cuslice run {} ", x.child.id());
    // The watch has seen the session (its process is not registered where
    // `cuslice run` put the session)...
    h.finding("unregistered", &label, Duration::from_secs(5), &w);
    // ... and over the next passes it does not write the other's segment.
    let until = passes(&h) + 5;
    let deadline = Instant::now() + WITHIN;
    while passes(&h) < until {
        assert!(
            Instant::now() < deadline,
            "the watch stopped passing:\n{}",
            w.text()
        );
        assert_eq!(
            limit(),
            1 << 30,
            "the other session's quota was changed by the watch:\n{}",
            w.text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let quota = run_dir(&h, x.child.id()).join("quota.toml");
    common::wait_for(
        || format!("the rewrite was not named:\n{}", w.text()),
        WITHIN,
        || {
            w.text()
                .lines()
                .find(|l| {
                    l.contains(&label)
                        && l.contains(&quota.display().to_string())
                        && l.contains("tenant")
                        && l.contains("segment_dir")
                })
                .map(str::to_string)
        },
    );
    assert!(
        !w.text()
            .contains(&format!("memory segment {}", vseg.display())),
        "the other session's segment was judged by the rewritten file:\n{}",
        w.text()
    );
}

/// A session's quota file is the user's: made a FIFO, or a symbolic link
/// to /dev/zero, it is one line and the session goes unchecked by it; the
/// watch (one thread) neither blocks on the FIFO nor reads /dev/zero, and
/// goes on passing.
#[test]
fn a_fifo_or_a_link_to_dev_zero_as_a_run_sessions_quota_file_does_not_stop_the_watch() {
    let h = Host::new("fifo");
    let w = h.watch("");
    let fifo = session(
        &h,
        &["--memory", "1GiB"],
        "Q=$CUSLICE_CONFIG; rm -f $Q; mkfifo $Q; \
         unset LD_PRELOAD; exec $N 1048576 -1",
    );
    fifo.line("ATTACK noshim holding");
    let zero = session(
        &h,
        &["--memory", "1GiB"],
        "Q=$CUSLICE_CONFIG; rm -f $Q; ln -s /dev/zero $Q; \
         unset LD_PRELOAD; exec $N 1048576 -1",
    );
    zero.line("ATTACK noshim holding");
    for (s, want) in [(&fifo, "expected a regular file"), (&zero, "symbolic link")] {
        let label = format!("cuslice run {} ", s.child.id());
        common::wait_for(
            || {
                format!(
                    "no line naming {label}'s quota file ({want}):\n{}",
                    w.text()
                )
            },
            Duration::from_secs(5),
            || {
                w.text()
                    .lines()
                    .find(|l| l.contains(&label) && l.contains("quota.toml") && l.contains(want))
                    .map(str::to_string)
            },
        );
    }
    let passes = || h.state().and_then(|s| s["passes"].as_u64()).unwrap_or(0);
    let p0 = passes();
    common::wait_for(
        || format!("the watch stopped passing after {p0}:\n{}", w.text()),
        WITHIN,
        || (passes() >= p0 + 3).then_some(()),
    );
}

/// A process of a session that enters a PID namespace of its own (as
/// `unshare -Urpf` does without privileges) stays in the session: the
/// parent chain is read from the host's /proc, in host PIDs.
#[test]
fn a_run_process_in_its_own_pid_namespace_stays_in_the_session() {
    let h = Host::new("unshare");
    let w = h.watch("");
    let x = session(
        &h,
        &["--memory", "1GiB"],
        "unset LD_PRELOAD; exec unshare -pf $N 1048576 -1",
    );
    let (_, held) = x.line("ATTACK noshim holding");
    let f = h.finding(
        "unregistered",
        &format!("cuslice run {} ", x.child.id()),
        WITHIN,
        &w,
    );
    assert!(held.elapsed() <= WITHIN, "{f}");
}

/// A process that bypasses the shim in a PID namespace of its own sees
/// itself as PID 1, and so does a registered sibling in another one:
/// registration is checked by what the host process maps, not by the PID
/// it sees (before, the bypass went unreported for as long as it ran).
#[test]
fn an_unregistered_process_hidden_behind_a_namespaced_pid_is_reported() {
    let h = Host::new("nspid");
    let w = h.watch("");
    let x = session(
        &h,
        &["--memory", "1GiB"],
        "unshare -pf $M hold 104857600 & unshare -pf $N 104857600 -1 & wait",
    );
    x.line("R held");
    let (_, held) = x.line("ATTACK noshim holding");
    let f = h.finding(
        "unregistered",
        &format!("cuslice run {} ", x.child.id()),
        WITHIN,
        &w,
    );
    assert!(held.elapsed() <= WITHIN, "{f}");
    // Only the bypass: the registered sibling (also PID 1 in its own
    // namespace) is not reported.
    let findings = h.state().expect("state")["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == "unregistered")
        .count();
    assert_eq!(findings, 1, "{}", w.text());
}

#[test]
fn under_systemd_the_watch_says_ready_after_its_first_pass_and_keeps_alive_every_pass() {
    // The unit is Type=notify with WatchdogSec=: a watch stuck in a pass
    // stops its keep-alives and systemd restarts it.
    use std::os::unix::net::UnixDatagram;
    let h = Host::new("notify");
    let path = h.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind the notification socket");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let cfg = h.config("");
    let mut c = h.cuslice();
    c.env("NOTIFY_SOCKET", &path)
        .args(["watch", "--config"])
        .arg(&cfg);
    let mut w = Proc::spawn(c, "watch");
    let mut got = vec![];
    let mut buf = [0u8; 256];
    while got.len() < 4 {
        let n = sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification ({e}) after {got:?}:\n{}", w.text()));
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(got[0], "READY=1\nWATCHDOG=1", "{got:?}");
    assert!(got[1..].iter().all(|m| m == "WATCHDOG=1"), "{got:?}");
    // Ready only once its first pass is in the state file.
    assert!(h.state().is_some_and(|s| s["passes"].as_u64() >= Some(1)));
    w.stop();
    let mut last = String::new();
    while let Ok(n) = sock.recv(&mut buf) {
        last = String::from_utf8_lossy(&buf[..n]).into_owned();
        if last == "STOPPING=1" {
            break;
        }
    }
    assert_eq!(last, "STOPPING=1");
    let unit = std::fs::read_to_string(common::env().root.join("scripts/cuslice-watch.service"))
        .expect("unit");
    assert!(
        unit.contains("\nType=notify\n") && unit.contains("\nWatchdogSec="),
        "{unit}"
    );
}

/// Every tenant can write the shared per-GPU segment, the names in it
/// included. A name with a newline and what looks like a line of the
/// watch's log (and a terminal's title sequence) is one log line, escaped:
/// it forges no line of the log, and the watch's state carries it escaped
/// (issue 18, hole 7).
#[test]
fn a_tenant_name_with_a_newline_is_one_escaped_log_line() {
    let h = Host::new("inject");
    let path = h.gpu_dir().join(format!(
        "{}.seg",
        cuslice_core::config::format_uuid(&common::FAKE_UUID)
    ));
    let g = GpuSegment::open_or_create(&path).expect("GPU segment");
    let name = "x\ncuslice watch: forged resolved\x1b]0;t\x07";
    let (i, _) = g
        .register_tenant(name, 10, 100, 0, cuslice_core::gpu::monotonic_ns())
        .expect("tenant");
    // Out of range: a value the audit reports even for a tenant no quota
    // file names.
    g.tenant(i)
        .expect("tenant")
        .share
        .store(1000, std::sync::atomic::Ordering::Release);
    let watch = h.watch("repair = false");
    let escaped = "x\\ncuslice watch: forged resolved\\x1b]0;t\\x07";
    let f = h.finding("gpu_segment", escaped, WITHIN, &watch);
    assert_eq!(f["tenant"], escaped, "{f}");
    let line = watch.line("cuslice watch: GPU segment ").0;
    assert!(
        line.contains(&format!("tenant {escaped}: share 1000 / ceiling 100")),
        "{line}"
    );
    let text = watch.text();
    assert!(!text.contains(['\x1b', '\x07']), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("forged")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("cuslice watch: forged")),
        "a forged line:\n{text}"
    );
}

/// Starts the watch with `extra` in its file and `args` on its command
/// line (a flag overrides the file), and waits for its first pass.
fn watch_with_args(h: &Host, extra: &str, args: &[&str]) -> Proc {
    let cfg = h.config(extra);
    let mut c = h.cuslice();
    c.args(["watch", "--config"]).arg(&cfg).args(args);
    let p = Proc::spawn(c, "watch");
    common::wait_for(
        || format!("the watch never passed:\n{}", p.text()),
        Duration::from_secs(20),
        || {
            h.state()
                .filter(|s| s["passes"].as_u64() >= Some(1) && s["running"] == true)
        },
    );
    p
}

/// What the watch's log said it did about unregistered process `pid`, in
/// order (`reported`, `killed`, ...).
fn unregistered_verdicts(w: &Proc, pid: u32) -> Vec<String> {
    let needle = format!(" pid {pid}: uses GPU ");
    w.text()
        .lines()
        .filter(|l| l.starts_with("cuslice watch: ") && l.contains(&needle))
        .filter_map(|l| l.rsplit_once("never registered with the shim: "))
        .map(|(_, v)| v.to_string())
        .collect()
}

fn signal_pid(pid: u32, sig: libc::c_int) {
    // SAFETY: a signal to a process this test started (or its session did).
    let r = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig})");
}

/// The watch's pass count in its state file.
fn passes(h: &Host) -> u64 {
    watch_host::passes(&h.root())
}

/// Waits until the watch has made `n` whole passes from now (see
/// `watch_host::after_passes`).
fn after_passes(h: &Host, n: u64) {
    watch_host::after_passes(&h.root(), n)
}

/// The unregistered check's grace (issue 21): an unregistered process is
/// reported by the first pass that sees it and acted on only if the next
/// pass still sees it (a process that exits normally gives its slot back
/// before the driver lets go of its context, and NVML lists it meanwhile).
/// G is listed once and then exits: reported, never killed. U stays:
/// reported, then killed by the next pass. A watch that acts at the first
/// sighting (the mutant `first < pass` -> `first <= pass` in
/// `check_registered`) says "killed" for both at once, never "reported".
#[test]
fn an_unregistered_process_is_killed_only_if_the_pass_after_the_one_that_reported_it_still_sees_it()
{
    let h = Host::new("grace");
    // Passes 1 s apart: time for the test to step in between two of them
    // on a loaded machine (it also stops the watch meanwhile).
    let w = watch_with_args(&h, "policy = \"kill\"", &["--interval", "1s"]);
    let s = session(
        &h,
        &["--memory", "1GiB"],
        "$N 1048576 -1 & echo G $!; $N 2097152 -1 & echo U $!; wait",
    );
    let (g, u) = (s.pid("G"), s.pid("U"));
    let first = common::wait_for(
        || format!("G ({g}) never found:\n{}", w.text()),
        Duration::from_secs(20),
        || unregistered_verdicts(&w, g).into_iter().next(),
    );
    // No further pass while G leaves.
    let watch_pid = w.child.id();
    signal_pid(watch_pid, libc::SIGSTOP);
    assert_eq!(first, "reported", "G at its first sighting:\n{}", w.text());
    assert!(
        alive(g),
        "G was killed at its first sighting:\n{}",
        w.text()
    );
    signal_pid(g, libc::SIGTERM);
    common::wait_for(
        || format!("G ({g}) did not exit"),
        Duration::from_secs(20),
        || (!alive(g)).then_some(()),
    );
    let resumed = passes(&h);
    signal_pid(watch_pid, libc::SIGCONT);
    // U, still there at the next pass: killed then, and not before.
    common::wait_for(
        || format!("U ({u}) never killed:\n{}", w.text()),
        Duration::from_secs(20),
        || (!alive(u)).then_some(()),
    );
    common::wait_for(
        || format!("the watch stopped passing:\n{}", w.text()),
        Duration::from_secs(20),
        || (passes(&h) >= resumed + 2).then_some(()),
    );
    // The line of a kill follows the kill (U may be seen dead, and the
    // pass counted, before the watch has written it).
    let verdicts = common::wait_for(
        || format!("U ({u}): no verdict after the kill:\n{}", w.text()),
        Duration::from_secs(20),
        || {
            let v = unregistered_verdicts(&w, u);
            (v.len() >= 2).then_some(v)
        },
    );
    assert_eq!(verdicts[..2], ["reported", "killed"], "U:\n{}", w.text());
    // G, gone before a second pass saw it: reported, never acted on, and
    // the finding ended.
    assert_eq!(
        unregistered_verdicts(&w, g),
        ["reported", "ended"],
        "G:\n{}",
        w.text()
    );
}

/// A slot whose lock is gone is a dead process's, whatever PID it holds
/// (issue 21): a process that registered through the shim, then closed
/// its segments' descriptors (its slots' locks drop, its PID stays in
/// them, the mappings remain) and allocates around the shim is
/// unregistered. A watch that counts a dead slot's PID as registered (the
/// mutants: no `alive` filter over the memory segment's slots, or no
/// `proc_alive` check over the GPU segment's entries, in `registered`)
/// never reports it.
#[test]
fn a_process_whose_pid_is_only_in_dead_slots_of_its_sessions_segments_is_unregistered() {
    use cuslice_core::gpu::PROC_FREE;
    use std::sync::atomic::Ordering;
    let h = Host::new("deadslot");
    let w = h.watch("");
    // A memory quota and a compute share: a slot in the memory segment and
    // an entry in the GPU segment.
    let s = session(
        &h,
        &["--memory", "1GiB", "--compute", "50"],
        "exec $N 1048576 -1 0 unlock",
    );
    let (line, held) = s.line("ATTACK noshim holding 1048576 bytes");
    assert!(line.contains(", registered, unlocked; pid "), "{line}");
    let pid: u32 = line
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    // Its PID is in both segments, in slots no live process holds.
    let mem = Segment::open_read_only(&run_seg(&h, s.child.id())).expect("memory segment");
    let slots: Vec<_> = mem
        .processes()
        .into_iter()
        .filter(|p| p.pid == pid)
        .collect();
    assert!(
        !slots.is_empty() && slots.iter().all(|p| !p.alive),
        "memory segment slots of {pid}: {slots:?}\n{}",
        s.text()
    );
    let gpu = GpuSegment::open_read_only(&h.gpu_dir().join(format!(
        "{}.seg",
        cuslice_core::config::format_uuid(&common::FAKE_UUID)
    )))
    .expect("GPU segment");
    let entries: Vec<bool> = (0..cuslice_core::gpu::MAX_PROCS)
        .map_while(|i| gpu.proc_entry(i).map(|e| (i, e)))
        .filter(|(_, e)| {
            e.state.load(Ordering::Acquire) != PROC_FREE && e.pid.load(Ordering::Relaxed) == pid
        })
        .map(|(i, _)| gpu.proc_alive(i))
        .collect();
    assert!(
        !entries.is_empty() && entries.iter().all(|a| !a),
        "GPU segment entries of {pid} (alive?): {entries:?}"
    );
    let f = h.finding(
        "unregistered",
        &format!("pid {pid}: uses GPU 0"),
        WITHIN,
        &w,
    );
    assert!(held.elapsed() <= WITHIN, "{f}");
    assert_eq!(f["pid"], pid, "{f}");
}

/// `cuslice ARGS` on `h` with `FAKE_NVML_SAMPLE_MS` = `sample_ms`: the
/// fake NVML's utilization sample period, which every process of the fake
/// GPU must share (the timeline records run times on its grid).
fn cuslice_sampled(h: &Host, sample_ms: u64, args: &[&str]) -> Command {
    let e = common::env();
    let mut c = h.cuslice();
    c.env("FAKE_NVML_SAMPLE_MS", sample_ms.to_string())
        .env("M", e.apps.join("memtest"))
        .env("N", e.apps.join("attack_noshim"))
        .env("S", e.apps.join("spin"))
        .args(args);
    c
}

/// A well-behaved tenant held to its ceiling by the shim's limiter runs in
/// stretches (it saves up `compute_burst_ms`, then runs at full speed) and
/// pauses between them; NVML samples it only in the periods it ran in
/// (sampled every 100 ms here; a real NVML about every 1/6 s) and lists no
/// sample for the periods it paused in. Over many passes, its GPU time as
/// the watch reads it must not put it over its ceiling (50 %, + 10 points):
/// it is not reported.
///
/// Before 2026-11-26 the watch took the mean of a process's samples since
/// its last pass, so the periods the tenant paused in (no sample) did not
/// count: it read 70-97 % for this tenant and reported it (killed it under
/// `kill`) again and again. Counting the periods without a sample as idle
/// (the sum of the samples times NVML's period, over the window), it still
/// reported it (93 %): each pass judged its own window (250 ms here) and
/// two in a row fell inside one of the tenant's stretches at full speed (a
/// 200 ms burst at a 50 % ceiling runs ~400 ms). A ceiling is now judged
/// over two on/off cycles of the tenant's burst (`ceiling_passes`: 7
/// passes here).
#[test]
fn a_tenant_held_to_its_ceiling_by_the_limiter_is_not_reported_from_sampled_utilization() {
    const SAMPLE_MS: u64 = 100;
    let h = Host::new("sampled");
    let cfg = h.config("");
    let w = Proc::spawn(
        cuslice_sampled(
            &h,
            SAMPLE_MS,
            &["watch", "--config", &cfg.display().to_string()],
        ),
        "watch",
    );
    common::wait_for(
        || format!("the watch never passed:\n{}", w.text()),
        Duration::from_secs(20),
        || {
            h.state()
                .filter(|s| s["passes"].as_u64() >= Some(1) && s["running"] == true)
        },
    );
    let s = Proc::spawn(
        cuslice_sampled(
            &h,
            SAMPLE_MS,
            &[
                "run",
                "--compute",
                "20",
                "--compute-max",
                "50",
                "--",
                "sh",
                "-c",
                "exec $S 4 1000000 4",
            ],
        ),
        "cuslice run",
    );
    s.line("P ");
    let from = passes(&h);
    // Stretches of ~400 ms and pauses as long: 4 s hold several.
    common::wait_for(
        || format!("the session did not finish:\n{}", s.text()),
        Duration::from_secs(30),
        || {
            s.lines
                .lock()
                .expect("lock")
                .iter()
                .any(|(_, l)| l.starts_with("R "))
                .then_some(())
        },
    );
    assert!(passes(&h) >= from + 8, "{}", w.text());
    let log = w.text();
    assert!(
        !log.lines().any(|l| l.contains("> ceiling")),
        "a tenant within its ceiling was reported:\n{log}"
    );
}

/// Issue 41: a guarantee root registered for a container whose runtime
/// died before its poststop (no container of it on the host) stays
/// reserved for nobody; the watch releases it once no container or claim
/// of it has been on the host for its grace, with one line. A session's
/// guarantee beside it (a live slice) is kept.
#[test]
fn a_guarantee_whose_container_vanished_without_poststop_is_released_by_the_watch() {
    let h = Host::new("orphan");
    std::fs::create_dir_all(h.gpu_dir()).expect("gpu dir");
    let path = cuslice_core::pool::path(&h.gpu_dir(), &common::FAKE_UUID);
    let pool = cuslice_core::pool::Pool::open_or_create(&path).expect("pool");
    pool.register(
        "ctr-gone",
        42,
        4 << 30,
        4 << 30,
        16 << 30,
        cuslice_core::pool::Maker::Root,
    )
    .expect("registered");
    let live = session(
        &h,
        &["--memory", "2GiB"],
        "$M hold 104857600 & echo P $!; wait",
    );
    live.pid("P");
    live.line("R held");
    let watch = h.watch("orphan_grace = \"1s\"");
    common::wait_for(
        || {
            format!(
                "the orphan's guarantee is still there: {:?}\n{}",
                pool.entries(),
                watch.text()
            )
        },
        Duration::from_secs(30),
        || (!pool.entries().iter().any(|e| e.name == "ctr-gone")).then_some(()),
    );
    common::wait_for(
        || format!("no line for the release:\n{}", watch.text()),
        Duration::from_secs(30),
        || {
            watch
                .text()
                .contains("released the guarantee of ctr-gone")
                .then_some(())
        },
    );
    assert!(
        pool.entries().iter().any(|e| e.name.starts_with("run-")),
        "the live session's entry went too: {:?}",
        pool.entries()
    );
}
