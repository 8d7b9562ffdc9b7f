//! `cuslice resize` against the fake driver and NVML: a running `cuslice
//! run` session and a container laid out as the OCI hook lays it out (its
//! process given the container's quota file and segment as the hook's
//! mounts would), resized down and up while they run; what each running
//! process then sees (admission, `cuMemGetInfo`, NVML's memory figures,
//! its share in the GPU segment), what `cuslice status` shows, what
//! `cuslice watch` does with a tenant over its lowered quota (nothing
//! within the grace, its policy after) and with a tenant raising its own
//! quota after a resize (put back to the resized value); the targets that
//! match none or several.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/watch.rs"]
mod watch_host;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Proc;
use cuslice_core::config::format_uuid;
use cuslice_core::gpu::GpuSegment;
use cuslice_core::segment::Segment;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const INTERVAL_MS: u64 = 250;
/// CUDA_ERROR_OUT_OF_MEMORY.
const OOM: i32 = 2;

/// A test's host: the hook's root (containers, GPU segments, the watch's
/// state), the runtime directory of its sessions, the fake GPU's state.
struct Host {
    dir: PathBuf,
}

impl Host {
    fn new(name: &str) -> Host {
        let dir =
            std::env::temp_dir().join(format!("cuslice-resize-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root/gpu")).expect("mkdir");
        std::fs::create_dir_all(dir.join("xdg")).expect("mkdir");
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// `prog` on this host's fake GPU.
    fn cmd(&self, prog: &Path) -> Command {
        let mut c = common::host_command(prog, &self.dir);
        c.env("CUSLICE_SEGMENT_DIR", self.dir.join("local"));
        c
    }

    fn cuslice(&self) -> Command {
        self.cmd(Path::new(env!("CARGO_BIN_EXE_cuslice")))
    }

    /// `cuslice resize ARGS --root <root>`: (exit code, stdout, stderr).
    fn resize(&self, args: &[&str]) -> (i32, String, String) {
        let out = self
            .cuslice()
            .arg("resize")
            .args(args)
            .arg("--root")
            .arg(self.root())
            .output()
            .expect("cuslice resize");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `cuslice resize ARGS`, which must succeed: its stdout.
    fn resized(&self, args: &[&str]) -> String {
        let (code, out, err) = self.resize(args);
        assert_eq!(code, 0, "cuslice resize {args:?}:\n{out}{err}");
        out
    }

    /// `cuslice status --json` of this host.
    fn status_json(&self) -> serde_json::Value {
        let out = self
            .cuslice()
            .args(["status", "--json", "--interval", "0", "--containers-root"])
            .arg(self.root().join("containers"))
            .output()
            .expect("status");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `cuslice status` (text) of this host.
    fn status_text(&self) -> String {
        let out = self
            .cuslice()
            .args(["status", "--interval", "0", "--containers-root"])
            .arg(self.root().join("containers"))
            .output()
            .expect("status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts `cuslice watch` (every 250 ms, this host's root, `extra`
    /// lines of watch.toml) and waits for its first pass.
    fn watch(&self, extra: &str) -> Proc {
        let cfg = watch_host::config(&self.dir, &self.root(), INTERVAL_MS, extra);
        watch_host::start(self.cuslice(), &cfg, &self.root())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child in a process group of its own (dropping it kills the group),
/// its stdout and stderr lines collected, asked questions on its stdin
/// (`memtest serve`).
struct Lines {
    child: Child,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<String>>>,
    answers: Receiver<String>,
}

impl Lines {
    fn spawn(mut c: Command) -> Lines {
        use std::os::unix::process::CommandExt;
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = c.spawn().expect("spawn");
        let lines = Arc::new(Mutex::new(vec![]));
        let (tx, answers) = channel();
        let out = child.stdout.take().expect("stdout");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l.lock().expect("lock").push(line.clone());
                if line.starts_with("R ") && tx.send(line).is_err() {
                    break;
                }
            }
        });
        let err = child.stderr.take().expect("stderr");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                l.lock().expect("lock").push(line);
            }
        });
        Lines {
            stdin: child.stdin.take().expect("stdin"),
            child,
            lines,
            answers,
        }
    }

    fn text(&self) -> String {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The next `R ...` line.
    fn answer(&self) -> String {
        self.answers
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no answer:\n{}", self.text()))
    }

    /// Asks `q` (a line of `memtest serve`), returns its answer.
    fn ask(&mut self, q: &str) -> String {
        let stdin = &mut self.stdin;
        writeln!(stdin, "{q}").expect("ask");
        stdin.flush().expect("flush");
        self.answer()
    }

    /// `info`: cuMemGetInfo_v2's total and free, NVML's total and used.
    fn info(&mut self) -> Info {
        let a = self.ask("info");
        let v = |k: &str| -> u64 {
            a.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in {a:?}"))
        };
        Info {
            total: v("total"),
            free: v("free"),
            nvml_total: v("nvml_total"),
        }
    }

    /// `alloc N`: the status of one allocation of `n` bytes (kept).
    fn alloc(&mut self, n: u64) -> i32 {
        let a = self.ask(&format!("alloc {n}"));
        a.strip_prefix("R alloc=")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{a:?}"))
    }

    fn free(&mut self) {
        let a = self.ask("free");
        assert!(a.starts_with("R freed="), "{a}");
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the child's own process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Info {
    total: u64,
    free: u64,
    nvml_total: u64,
}

/// `cuslice run LIMITS -- memtest serve HOLD`, once it holds.
fn session(h: &Host, limits: &[&str], hold: u64) -> Lines {
    let e = common::env();
    let mut c = h.cuslice();
    c.arg("run")
        .args(limits)
        .arg("--")
        .arg(e.apps.join("memtest"))
        .args(["serve", &hold.to_string()]);
    let s = Lines::spawn(c);
    assert_eq!(s.answer(), "R held", "{}", s.text());
    s
}

/// The directory of the session whose `cuslice run` process is `run`.
fn run_dir(h: &Host, run: u32) -> PathBuf {
    let prefix = format!("cuslice-run-{run}-");
    std::fs::read_dir(h.dir.join("xdg"))
        .expect("xdg")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .expect("the session's directory")
}

/// The quota of device entry 0 of the segment at `p`, and its usage.
fn seg_entry(p: &Path) -> (u64, u64) {
    let s = Segment::open_read_only(p).expect("segment");
    let u = s.device_usage(0).expect("entry");
    (u.limit, u.used)
}

/// The context charge (the shim's default) plus what the session holds is
/// in use: 640 MiB + 100 MiB of a 4 GiB quota.
const CONTEXT: u64 = 640 * MIB;

#[test]
fn a_running_session_sees_a_resize_down_and_up_at_its_next_allocation_and_memory_query() {
    let h = Host::new("session");
    let mut s = session(&h, &["--memory", "4GiB"], 100 * MIB);
    let run = s.pid();
    let used = CONTEXT + 100 * MIB;
    let i = s.info();
    assert_eq!(
        (i.total, i.free, i.nvml_total),
        (4 * GIB, 4 * GIB - used, 4 * GIB)
    );
    // 1.5 GiB more fits in 4 GiB.
    assert_eq!(s.alloc(1536 * MIB), 0, "{}", s.text());
    s.free();

    // Down to 2 GiB: the same 1.5 GiB no longer fits, and every memory
    // query says 2 GiB, at the next call.
    let out = h.resized(&[&format!("run:{run}"), "--memory", "2GiB"]);
    assert!(
        out.starts_with(&format!("cuslice run {run}: memory 4GiB -> 2GiB ([all])\n")),
        "{out}"
    );
    let i = s.info();
    assert_eq!(
        (i.total, i.free, i.nvml_total),
        (2 * GIB, 2 * GIB - used, 2 * GIB)
    );
    assert_eq!(s.alloc(1536 * MIB), OOM, "{}", s.text());
    assert_eq!(s.alloc(512 * MIB), 0);
    s.free();
    // The quota file the watch restores from, and the segment, say so.
    let dir = run_dir(&h, run);
    let q = cuslice_core::config::parse_file(
        &dir.join("quota.toml"),
        &std::fs::read_to_string(dir.join("quota.toml")).expect("quota"),
    )
    .expect("the resized file loads");
    assert_eq!(q.all.memory, Some(2 * GIB));
    assert_eq!(q.tenant.as_deref(), Some(format!("run-{run}").as_str()));
    assert_eq!(seg_entry(&dir.join("segment/memory.seg")).0, 2 * GIB);

    // Up to 8 GiB (a bare PID names the session too): 6 GiB fits now.
    h.resized(&[&run.to_string(), "--memory", "8GiB"]);
    let i = s.info();
    assert_eq!((i.total, i.nvml_total), (8 * GIB, 8 * GIB));
    assert_eq!(s.alloc(6 * GIB), 0, "{}", s.text());
}

/// A tenant that may burst (`memory_max`): `--memory` resizes its
/// guarantee, in its segment and in the GPU's memory pool, so what the
/// others may burst into changes at once.
#[test]
fn a_bursting_tenants_guarantee_is_resized_in_the_gpus_memory_pool() {
    let h = Host::new("burst");
    // A: 2 GiB guaranteed; B: 8 GiB guaranteed, up to 14 on a 16 GiB GPU.
    let a = session(
        &h,
        &["--memory", "2GiB", "--memory-max", "12GiB"],
        100 * MIB,
    );
    let mut b = session(
        &h,
        &["--memory", "8GiB", "--memory-max", "14GiB"],
        100 * MIB,
    );
    // B may take all A is not guaranteed: 12 GiB more fits (14 in all).
    assert_eq!(b.alloc(12 * GIB), 0, "{}", b.text());
    b.free();
    let out = h.resized(&[&format!("run:{}", a.pid()), "--memory", "6GiB"]);
    assert!(out.contains("guarantee 6GiB (was 2GiB)"), "{out}");
    // Now A is guaranteed 6: B reaches 10 GiB, no more.
    assert_eq!(b.alloc(12 * GIB), OOM, "{}", b.text());
    assert_eq!(b.alloc(8 * GIB), 0, "{}", b.text());
    let pool = std::fs::read_dir(h.root().join("gpu"))
        .expect("gpu dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "memory"))
        .expect("the GPU's memory pool");
    let entries = cuslice_core::pool::Pool::open_read_only(&pool)
        .expect("pool")
        .entries();
    let ea = entries
        .iter()
        .find(|e| e.name == format!("run-{}", a.pid()))
        .expect("A's entry");
    assert_eq!((ea.guarantee, ea.max), (6 * GIB, 12 * GIB), "{entries:?}");
    let dir = run_dir(&h, a.pid());
    let seg = Segment::open_read_only(&dir.join("segment/memory.seg")).expect("segment");
    let u = seg.device_usage(0).expect("entry");
    assert_eq!((u.guarantee, u.limit), (6 * GIB, 12 * GIB));
}

#[test]
fn a_resize_below_what_is_in_use_refuses_every_new_allocation_and_status_shows_the_grace_left() {
    let h = Host::new("below");
    let mut s = session(&h, &["--memory", "4GiB"], 3 * GIB);
    let run = s.pid();
    let out = h.resized(&[&format!("run:{run}"), "--memory", "2GiB", "--grace", "60s"]);
    assert!(
        out.contains("over the new quota: every new allocation above it is refused"),
        "{out}"
    );
    let i = s.info();
    assert_eq!((i.total, i.free), (2 * GIB, 0));
    assert_eq!(s.alloc(MIB), OOM);
    // Status: the segment's quota, and the grace left for the GPU over it.
    let v = h.status_json();
    let c = v["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["tenant"] == format!("run-{run}"))
        .unwrap_or_else(|| panic!("no session in {v}"))
        .clone();
    let d = &c["devices"][0];
    assert_eq!(d["limit_bytes"], 2 * GIB, "{c}");
    let left = d["grace_left_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("{c}"));
    assert!(left > 40.0 && left <= 60.0, "{c}");
    assert_eq!(c["resize"]["grace_seconds"], 60.0, "{c}");
    let text = h.status_text();
    assert!(
        text.lines()
            .any(|l| l.contains("memory 3.62 GiB / 2.00 GiB")
                && l.contains("over its quota after a resize: grace ")
                && l.contains("s left")),
        "{text}"
    );
    assert!(
        text.contains("resized by uid 0") && text.contains("memory 4GiB -> 2GiB ([all])"),
        "{text}"
    );
    // Raised above what is in use: no grace left to show.
    h.resized(&[&format!("run:{run}"), "--memory", "4GiB"]);
    let v = h.status_json();
    let c = v["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["tenant"] == format!("run-{run}"))
        .expect("session")
        .clone();
    assert_eq!(c["devices"][0]["limit_bytes"], 4 * GIB);
    assert!(c["devices"][0]["grace_left_seconds"].is_null(), "{c}");
    assert_eq!(s.alloc(MIB), 0);
}

#[test]
fn a_sessions_share_and_ceiling_are_resized_in_the_gpu_segment_it_runs_under() {
    let h = Host::new("compute");
    let s = session(&h, &["--memory", "4GiB", "--compute", "40"], 0);
    let run = s.pid();
    let name = format!("run-{run}");
    let seg = h
        .root()
        .join("gpu")
        .join(format!("{}.seg", format_uuid(&common::FAKE_UUID)));
    let tenant = || {
        GpuSegment::open_read_only(&seg)
            .expect("gpu segment")
            .tenants()
            .into_iter()
            .find(|t| t.name == name)
            .map(|t| (t.share, t.max))
    };
    assert_eq!(tenant(), Some((40, 100)));
    let out = h.resized(&[
        &format!("run:{run}"),
        "--compute",
        "60",
        "--compute-max",
        "80",
    ]);
    assert!(
        out.contains("compute 40% -> 60% ([all]), compute_max none -> 80% ([all])"),
        "{out}"
    );
    assert_eq!(tenant(), Some((60, 80)), "{out}");
    // A ceiling below the share is the grammar's one line; nothing moves.
    let (code, _, err) = h.resize(&[&format!("run:{run}"), "--compute-max", "50"]);
    assert_eq!(code, 125);
    assert!(
        err.starts_with("cuslice: the resized quota file would not load: ")
            && err.contains("compute"),
        "{err}"
    );
    assert_eq!(tenant(), Some((60, 80)));
    // --grace is for a lowered memory quota.
    let (code, _, err) = h.resize(&[&format!("run:{run}"), "--compute", "50", "--grace", "5s"]);
    assert_eq!(code, 125);
    assert!(err.contains("--grace: only applies with --memory"), "{err}");
}

/// Issue 41 H3: a tenant keeping the GPU segment's lock (any tenant of
/// the GPU can take it), or its own memory segment's, hung root's resize
/// of a slice on that GPU with no output, the quota file and record
/// already rewritten and the segments not. Now the resize waits at most
/// 2 s for each, writes all the same, and says which file's lock was kept
/// and by whom.
#[test]
fn a_tenant_keeping_a_segments_lock_holds_roots_resize_only_a_bounded_time_and_it_says_so() {
    use std::os::fd::AsRawFd;
    let h = Host::new("kept-lock");
    let s = session(&h, &["--memory", "4GiB", "--compute", "40"], 0);
    let run = s.pid();
    let name = format!("run-{run}");
    let gpu_seg = h
        .root()
        .join("gpu")
        .join(format!("{}.seg", format_uuid(&common::FAKE_UUID)));
    let mem_seg = run_dir(&h, run).join("segment/memory.seg");
    let hold = |p: &Path| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .expect("open");
        // SAFETY: flock on the descriptor we just opened.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        f
    };
    let held = (hold(&gpu_seg), hold(&mem_seg));
    let mut c = h.cuslice();
    c.arg("resize")
        .args([&format!("run:{run}"), "--memory", "2GiB", "--compute", "60"])
        .arg("--root")
        .arg(h.root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("cuslice resize");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cuslice resize still waiting after 30 s for a lock a tenant keeps");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    let me = std::process::id();
    for (what, p) in [("memory segment", &mem_seg), ("GPU segment", &gpu_seg)] {
        let want = format!(
            "{what}: written without its lock: {}: its lock is held by pid {me}, not let go within ",
            p.display()
        );
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with(&want)).count(),
            1,
            "{want}\n{stdout}{stderr}"
        );
    }
    // Applied all the same.
    assert_eq!(seg_entry(&mem_seg).0, 2 * GIB, "{stdout}");
    let share = GpuSegment::open_read_only(&gpu_seg)
        .expect("gpu segment")
        .tenants()
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| t.share);
    assert_eq!(share, Some(60), "{stdout}");
    drop(held);
}

/// A container as the OCI hook lays it out under the host's root: its
/// quota file in its quota directory (`etc/quota.toml`, root's, 0444:
/// `memory`, and a share), its record (naming a
/// process as its init, and the driver's limit as the hook left it:
/// `driver`), its segment directory; and a process of it that the shim
/// gives that quota file and segment, as the hook's mounts would. The
/// process and the container's directory.
fn container(h: &Host, id: &str, memory: &str, hold: u64, driver: &str) -> (Lines, PathBuf) {
    container_of(h, id, memory, hold, driver, "etc/quota.toml")
}

/// [`container`] with its quota file at `quota` in its directory:
/// `etc/quota.toml` as the hook lays it out, `quota.toml` as an older
/// hook did.
fn container_of(
    h: &Host,
    id: &str,
    memory: &str,
    hold: u64,
    driver: &str,
    quota: &str,
) -> (Lines, PathBuf) {
    let dir = h.root().join("containers").join(id);
    std::fs::create_dir_all(dir.join("segment")).expect("mkdir");
    let quota = dir.join(quota);
    std::fs::create_dir_all(quota.parent().expect("parent")).expect("mkdir");
    std::fs::write(
        &quota,
        format!(
            "# written by cuslice oci-hook for container {id}\ntenant = \"ctr-{id}\"\nslice = \"ctr-{id}\"\nsegment_dir = \"{}\"\ngpu_segment_dir = \"{}\"\n[all]\nmemory = \"{memory}\"\ncompute = 30\n",
            dir.join("segment").display(),
            h.root().join("gpu").display()
        ),
    )
    .expect("quota");
    std::fs::set_permissions(&quota, std::os::unix::fs::PermissionsExt::from_mode(0o444))
        .expect("chmod");
    let e = common::env();
    let mut c = h.cmd(&e.apps.join("memtest"));
    c.args(["serve", &hold.to_string()])
        .env("LD_PRELOAD", &e.shim)
        .env("CUSLICE_CONFIG", &quota);
    let p = Lines::spawn(c);
    assert_eq!(p.answer(), "R held", "{}", p.text());
    let start = cuslice_host::proc::stat(p.pid()).expect("stat").start;
    std::fs::write(
        dir.join("container.json"),
        format!(
            r#"{{"id":"{id}","name":"web-1","image":"pytorch/pytorch","pid_ns":1,"init_pid":{},"init_start":{start},"driver_memory_limit":"{driver}","future_field":7}}"#,
            p.pid(),
        ),
    )
    .expect("record");
    (p, dir)
}

#[test]
fn a_containers_resize_rewrites_its_root_owned_quota_file_its_segment_and_the_drivers_limit() {
    let h = Host::new("container");
    let id = "3f2a9c8b7d6e5f4a3b2c1d0e";
    let (mut p, dir) = container(
        &h,
        id,
        "4GiB",
        100 * MIB,
        &format!(
            "set: GPU 0 {} bytes on /sys/fs/cgroup/test.slice/{id}",
            4 * GIB
        ),
    );
    let log = h.dir.join("limits.log");
    // By the prefix `cuslice status` shows, with a driver that has the
    // per-cgroup limit.
    let out = {
        let o = h
            .cuslice()
            .args(["resize", "3f2a9c8b7d6e", "--memory", "2GiB", "--root"])
            .arg(h.root())
            .env("FAKE_NVML_LIMITS_LOG", &log)
            .output()
            .expect("resize");
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(
        out.starts_with(
            "container 3f2a9c8b7d6e (web-1 pytorch/pytorch): memory 4GiB -> 2GiB ([all])\n"
        ),
        "{out}"
    );
    // The quota file: root's, 0444 as the hook wrote it, the share kept,
    // in the quota directory the hook mounts (nothing else there).
    let quota = dir.join("etc/quota.toml");
    assert!(
        out.contains(&format!("\n{}: written\n", quota.display())),
        "{out}"
    );
    assert!(!out.contains("older cuslice oci-hook"), "{out}");
    let listed: Vec<_> = std::fs::read_dir(dir.join("etc"))
        .expect("etc")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(listed, ["quota.toml"]);
    assert!(!dir.join("quota.toml").exists());
    let m = std::fs::metadata(&quota).expect("quota");
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o444));
    let text = std::fs::read_to_string(&quota).expect("quota");
    assert!(
        text.starts_with("# written by cuslice oci-hook for container 3f2a9c8b7d6e5f4a3b2c1d0e; resized by `cuslice resize`\n"),
        "{text}"
    );
    let q = cuslice_core::config::parse_file(&quota, &text).expect("loads");
    assert_eq!((q.all.memory, q.all.compute), (Some(2 * GIB), Some(30)));
    // The record, in the container's directory (out of the container's
    // sight).
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("resize.json")).expect("record"))
            .expect("json");
    assert_eq!(r["grace_seconds"], 30.0);
    assert_eq!(r["changes"][0]["to"], 2 * GIB);
    // The running process.
    assert_eq!(p.info().total, 2 * GIB);
    assert_eq!(p.alloc(1536 * MIB), OOM);
    // The driver's limit on the container's cgroup, and the record.
    let set = std::fs::read_to_string(&log).expect("the driver's limit was set");
    assert_eq!(
        set,
        format!(
            "SET 0 /sys/fs/cgroup/test.slice/{id} {} {}\n",
            2 * GIB,
            2 * GIB
        )
    );
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("container.json")).expect("record"))
            .expect("json");
    assert_eq!(
        rec["driver_memory_limit"],
        format!(
            "set: GPU 0 {} bytes on /sys/fs/cgroup/test.slice/{id}",
            2 * GIB
        )
    );
    assert_eq!(
        rec["future_field"], 7,
        "a field resize does not know was dropped"
    );
    // Status shows the container's new quota and the driver's limit.
    let text = h.status_text();
    assert!(text.contains("memory 0.72 GiB / 2.00 GiB"), "{text}");
    assert!(
        text.contains(&format!(
            "  driver memory limit: set: GPU 0 {} bytes on /sys/fs/cgroup/test.slice/{id}",
            2 * GIB
        )),
        "{text}"
    );
}

#[test]
fn a_tenant_raising_its_own_quota_after_a_resize_is_put_back_to_the_resized_value() {
    let h = Host::new("raise");
    let id = "c0ffee0000000000";
    // A driver without its own limit: the record stays as the hook wrote
    // it (the quota file alone changes).
    let (mut p, dir) = container(
        &h,
        id,
        "4GiB",
        100 * MIB,
        "unsupported: no nvmlDeviceSetMemoryLimits_v1 in this NVML",
    );
    let record = std::fs::read(dir.join("container.json")).expect("record");
    let w = h.watch("");
    h.resized(&[id, "--memory", "2GiB"]);
    assert_eq!(
        std::fs::read(dir.join("container.json")).expect("record"),
        record
    );
    let seg = dir.join("segment/memory.seg");
    assert_eq!(seg_entry(&seg).0, 2 * GIB);
    // The tenant writes its quota in its segment (the container's
    // processes map it read-write): 100 GiB.
    let s = Segment::open_existing(&seg).expect("segment");
    s.device(0)
        .expect("entry")
        .limit
        .store(100 * GIB, std::sync::atomic::Ordering::Release);
    // Put back to 2 GiB (the resized value), not to 4 GiB.
    common::wait_for(
        || {
            format!(
                "the quota was not put back to 2 GiB (it is {}):\n{}",
                seg_entry(&seg).0,
                w.text()
            )
        },
        // (Two intervals on an idle machine: a bound a loaded one meets.)
        Duration::from_secs(30),
        || (seg_entry(&seg).0 == 2 * GIB).then_some(()),
    );
    // ... and stays there over the next passes.
    watch_host::after_passes(&h.root(), 3);
    assert_eq!(seg_entry(&seg).0, 2 * GIB, "{}", w.text());
    assert!(
        w.text().contains("its quota file 2.0 GiB") && !w.text().contains("its quota file 4.0 GiB"),
        "{}",
        w.text()
    );
    assert_eq!(p.info().total, 2 * GIB);
}

/// The watch's log line about the memory finding of session `run` whose
/// action contains `action`.
fn finding_line(w: &Proc, run: u32, action: &str) -> Option<String> {
    w.lines
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, l)| l)
        .find(|l| {
            l.contains(&format!("cuslice run {run} "))
                && l.contains(" memory ")
                && l.contains(action)
        })
        .cloned()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The session's program (the run process's child): its PID.
fn program_of(run: u32) -> u32 {
    common::wait_for(
        || format!("cuslice run {run} has no child"),
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(format!("/proc/{run}/task/{run}/children"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        },
    )
}

#[test]
fn a_tenant_over_its_lowered_quota_is_killed_after_the_grace_and_not_before() {
    let h = Host::new("kill");
    let s = session(&h, &["--memory", "4GiB"], 3 * GIB);
    let run = s.pid();
    let program = program_of(run);
    let w = h.watch("policy = \"kill\"");
    // A grace of 6 s: a loaded machine's watch still finds the tenant
    // within it (on an idle one, at its next pass).
    let grace = Duration::from_secs(6);
    let t0 = Instant::now();
    h.resized(&[&format!("run:{run}"), "--memory", "1GiB", "--grace", "6s"]);
    // Found within the grace, and not acted on.
    let line = common::wait_for(
        || format!("no finding within the grace:\n{}", w.text()),
        grace,
        || {
            finding_line(
                &w,
                run,
                "not acted on: over its resized quota, within its grace until",
            )
        },
    );
    assert!(line.contains("> quota 1.0 GiB"), "{line}");
    // Alive all through the grace (a little less: the test's own polling).
    while t0.elapsed() < grace - Duration::from_millis(300) {
        assert!(alive(program), "killed within the grace:\n{}", w.text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killed after it (within two intervals on an idle machine; waited
    // for up to a bound a loaded one meets).
    common::wait_for(
        || format!("not killed after the grace:\n{}", w.text()),
        Duration::from_secs(30),
        || (!alive(program)).then_some(()),
    );
    // The watch's line may reach our reader after the process is gone.
    common::wait_for(
        || format!("no line saying it was killed:\n{}", w.text()),
        Duration::from_secs(20),
        || finding_line(&w, run, &format!("killed pid {program}")),
    );
}

#[test]
fn a_tenant_over_its_lowered_quota_is_reported_again_when_the_grace_ends() {
    let h = Host::new("report");
    let s = session(&h, &["--memory", "4GiB"], 3 * GIB);
    let run = s.pid();
    let program = program_of(run);
    let w = h.watch("");
    let t0 = Instant::now();
    // A grace of 5 s: a loaded machine's watch still says the first line
    // within it.
    h.resized(&[&format!("run:{run}"), "--memory", "2GiB", "--grace", "5s"]);
    // Said within the grace, then again when it ends, in that order.
    let within = "not acted on: over its resized quota, within its grace";
    let after = "reported: over its resized quota after its grace";
    common::wait_for(
        || format!("the grace's end was not said:\n{}", w.text()),
        Duration::from_secs(40),
        || finding_line(&w, run, after),
    );
    // Not before the grace ended (t0 is before the resize).
    assert!(t0.elapsed() >= Duration::from_secs(5), "{}", w.text());
    let lines = w.lines.lock().expect("lock").clone();
    let at = |needle: &str| lines.iter().position(|(_, l)| l.contains(needle));
    assert!(
        at(within).is_some_and(|i| Some(i) < at(after)),
        "{}",
        w.text()
    );
    assert!(alive(program), "the report policy killed it:\n{}", w.text());
}

#[test]
fn resize_targets_that_match_none_or_several_are_one_line_naming_what_matched() {
    let h = Host::new("targets");
    for id in ["abc123", "abc456"] {
        let d = h.root().join("containers").join(id);
        std::fs::create_dir_all(d.join("segment")).expect("mkdir");
        std::fs::write(d.join("quota.toml"), "[all]\nmemory = \"1GiB\"\n").expect("quota");
        std::fs::write(d.join("container.json"), format!(r#"{{"id":"{id}"}}"#)).expect("rec");
    }
    // Containers of a DRA claim (one of this hook, its copy of the
    // claim's quota file in its quota directory; one of an older hook,
    // its copy beside its record), and the claim (with its record).
    let uid = "0b1c2d3e-0000-4000-8000-000000000001";
    let gpu = format_uuid(&common::FAKE_UUID);
    let copy = format!("[device.\"{gpu}\"]\nmemory = \"1GiB\"\n");
    let c = h.root().join("containers/def789");
    std::fs::create_dir_all(c.join("etc")).expect("mkdir");
    std::fs::write(c.join("etc/quota.toml"), &copy).expect("copy");
    std::fs::write(
        c.join("container.json"),
        format!(r#"{{"id":"def789","claim":"{uid}"}}"#),
    )
    .expect("rec");
    let old = h.root().join("containers/fed987");
    std::fs::create_dir_all(&old).expect("mkdir");
    std::fs::write(old.join("quota.toml"), &copy).expect("copy");
    std::fs::write(
        old.join("container.json"),
        format!(r#"{{"id":"fed987","claim":"{uid}"}}"#),
    )
    .expect("rec");
    let claim = h.root().join("claims").join(uid);
    std::fs::create_dir_all(claim.join("segment")).expect("mkdir");
    // As the DRA plugin writes it: the claim's GPU by UUID.
    std::fs::write(claim.join("quota.toml"), &copy).expect("quota");
    std::fs::write(
        claim.join("claim.json"),
        format!(r#"{{"namespace":"team-a","name":"trainer","uid":"{uid}"}}"#),
    )
    .expect("rec");
    let err = |args: &[&str]| {
        let (code, out, err) = h.resize(args);
        assert_eq!(code, 125, "{args:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let e = err(&["abc", "--memory", "2GiB"]);
    assert_eq!(
        e,
        "cuslice: \"abc\": matches container abc123, container abc456: say which\n"
    );
    let e = err(&["zzz", "--memory", "2GiB"]);
    assert!(
        e.starts_with(&format!(
            "cuslice: \"zzz\": matches no container in {}, no DRA claim in {} and no cuslice run process",
            h.root().join("containers").display(),
            h.root().join("claims").display()
        )),
        "{e}"
    );
    // A process that is no session's (this test).
    let me = std::process::id().to_string();
    let e = err(&[&format!("run:{me}"), "--memory", "2GiB"]);
    assert!(e.contains("matches no container"), "{e}");
    let e = err(&["def789", "--memory", "2GiB"]);
    assert_eq!(
        e,
        format!(
            "cuslice: container def789 is a container of DRA claim 0b1c2d3e-000: resize the claim (claim:{uid}), whose quota all its containers share\n"
        )
    );
    // A limit its processes never registered.
    let e = err(&["abc123", "--compute", "20"]);
    assert!(
        e.contains("container abc123 has no compute share or ceiling for every GPU ([all])"),
        "{e}"
    );
    // The claim, by namespace/name: an operator's override.
    let out = h.resized(&["claim:team-a/trainer", "--memory", "2GiB"]);
    assert!(
        out.starts_with(&format!(
            "DRA claim team-a/trainer (0b1c2d3e-000): memory 1GiB -> 2GiB ([device.{gpu}])\n"
        )),
        "{out}"
    );
    let text = std::fs::read_to_string(claim.join("quota.toml")).expect("quota");
    assert!(text.contains("memory = 2147483648"), "{text}");
    // Its containers' copies (what their processes started from now on
    // read), the same text; the older hook's container is told to be
    // recreated for its processes to read it.
    for copy in [c.join("etc/quota.toml"), old.join("quota.toml")] {
        assert_eq!(std::fs::read_to_string(&copy).expect("copy"), text);
        assert!(
            out.contains(&format!("\n{}: written (container ", copy.display())),
            "{out}"
        );
    }
    assert!(
        out.contains("note: container fed987 was made by an older cuslice oci-hook, which mounted its quota file as a file: "),
        "{out}"
    );
    assert!(!out.contains("note: container def789"), "{out}");
    // Nothing to resize, a bad size: one line each.
    let e = err(&["abc123"]);
    assert!(e.contains("nothing to resize"), "{e}");
    let e = err(&["abc123", "--memory", "lots"]);
    assert!(
        e.starts_with("cuslice: --memory \"lots\": expected a size"),
        "{e}"
    );
}

/// A container made by an older OCI hook (its quota file beside its
/// record, mounted into it as a file) is resized where its quota file is,
/// and the resize says that the processes it starts later still read the
/// old file until it is recreated.
#[test]
fn an_older_hooks_container_is_resized_where_its_quota_file_is_and_the_resize_says_what_it_misses()
{
    let h = Host::new("legacy");
    let id = "0ld0000000000000";
    let (mut p, dir) = container_of(
        &h,
        id,
        "4GiB",
        100 * MIB,
        "unsupported: no nvmlDeviceSetMemoryLimits_v1 in this NVML",
        "quota.toml",
    );
    let quota = dir.join("quota.toml");
    let out = h.resized(&[id, "--memory", "2GiB"]);
    assert!(
        out.contains(&format!("\n{}: written\n", quota.display())),
        "{out}"
    );
    assert!(
        out.contains("\nnote: container 0ld000000000 (web-1 pytorch/pytorch) was made by an older cuslice oci-hook, which mounted its quota file as a file: the processes it starts from now on still read the quota it was created with"),
        "{out}"
    );
    // Its running processes follow the segment, as any container's.
    assert_eq!(p.info().total, 2 * GIB);
    let text = std::fs::read_to_string(&quota).expect("quota");
    assert!(text.contains("memory = 2147483648"), "{text}");
    assert_eq!(
        std::fs::metadata(&quota).expect("quota").mode() & 0o7777,
        0o444
    );
    // No quota directory made for it: its mount would not show one.
    assert!(!dir.join("etc").exists());
    // Status reads it where it is.
    let v = h.status_json();
    let rows = v["containers"].as_array().cloned().unwrap_or_default();
    assert!(
        rows.iter()
            .any(|r| r["resize"]["changes"][0]["to"] == 2 * GIB),
        "{v}"
    );
}

/// `/tmp/<name>`, every directory on the way searchable by every user
/// (the test's own temporary directory is its user's alone), removed at
/// the end.
struct Shared(PathBuf);

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn root_resizes_a_users_session_as_that_user_and_another_user_may_not() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (a session of another user)");
        return;
    }
    const USER: u32 = 4242;
    let shared = Shared(PathBuf::from(format!(
        "/tmp/cuslice-resize-users-{}",
        std::process::id()
    )));
    let _ = std::fs::remove_dir_all(&shared.0);
    let h = Host {
        dir: shared.0.join("host"),
    };
    for d in ["root/gpu", "xdg", "local"] {
        std::fs::create_dir_all(h.dir.join(d)).expect("mkdir");
    }
    for d in [&shared.0, &h.dir] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    // The user's: its runtime directory, the fake GPU's state, the GPU
    // segment directory.
    for p in ["xdg", "root/gpu", "root", "local", ""] {
        std::os::unix::fs::chown(h.dir.join(p), Some(USER), Some(USER)).expect("chown");
    }
    let e = common::env();
    let mut c = h.cuslice();
    c.uid(USER)
        .gid(USER)
        .arg("run")
        .args(["--memory", "4GiB", "--"])
        .arg(e.apps.join("memtest"))
        .args(["serve", "0"]);
    let mut s = Lines::spawn(c);
    assert_eq!(s.answer(), "R held", "{}", s.text());
    let run = s.pid();
    // Another user may not.
    let out = h
        .cuslice()
        .uid(USER + 1)
        .gid(USER + 1)
        .args([
            "resize",
            &format!("run:{run}"),
            "--memory",
            "2GiB",
            "--root",
        ])
        .arg(h.root())
        .output()
        .expect("resize");
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "cuslice: cuslice run {run}: the session is uid {USER}'s: only that user or root may resize it\n"
        )
    );
    assert_eq!(s.info().total, 4 * GIB);
    // Root may, and writes as the user: every file stays the user's (the
    // watch reads a session's files only as its user's).
    h.resized(&[&format!("run:{run}"), "--memory", "2GiB"]);
    assert_eq!(s.info().total, 2 * GIB);
    let dir = run_dir(&h, run);
    for f in ["quota.toml", "resize.json", ".", "segment/memory.seg"] {
        let m = std::fs::metadata(dir.join(f)).expect("file");
        assert_eq!((m.uid(), m.gid()), (USER, USER), "{f}");
    }
    assert_eq!(
        std::fs::metadata(dir.join("quota.toml"))
            .expect("quota")
            .mode()
            & 0o7777,
        0o600
    );
    // And the user, of their own session.
    let out = h
        .cuslice()
        .uid(USER)
        .gid(USER)
        .args(["resize", &run.to_string(), "--memory", "3GiB", "--root"])
        .arg(h.root())
        .output()
        .expect("resize");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(s.info().total, 3 * GIB);
}
