//! Shared by the integration tests (and `#[path]`-included by cli/tests):
//! builds the fake driver and the test programs once (guarded by a file
//! lock, so parallel test processes share one build), runs programs with
//! and without the shim, parses the shim's debug log, and waits for
//! conditions (never for a guessed time). The fixtures: a simulated
//! [`Host`], readers of the segments ([`Mem`], [`GpuView`]) and of the fake
//! driver's state ([`Fake`]), an [`Rng`], `spin`'s output ([`Spin`]), and a
//! container's root file system ([`rootfs`]).

// Every test binary includes all of this and uses a part of it.
#![allow(dead_code, unused_imports)]

mod fake;
mod host;
mod lines;
pub mod podman;
mod rng;
pub mod rootfs;
mod segments;
mod spin;

pub use fake::{FAKE_SLOTS, Fake};
pub use host::{FAKE_UUID, Host, PAGE, set_env};
pub use lines::Proc;
pub use rng::Rng;
pub use segments::{GpuView, Mem, ProcView};
pub use spin::Spin;

use std::collections::BTreeMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The label (podman) or annotation (runc) naming the test process that
/// made a container or image: where a test is killed at its time limit,
/// the reaper it runs under (testkit/, scripts/test.sh) removes what bears
/// its pid.
pub const OWNER_LABEL: &str = "cuslice.test.owner";

/// `OWNER_LABEL=<this test process>`.
pub fn owner_label() -> String {
    format!("{OWNER_LABEL}={}", std::process::id())
}

pub struct Env {
    pub root: PathBuf,
    /// Holds libcuda.so.1 / libnvidia-ml.so.1 (the fake driver).
    pub fake: PathBuf,
    /// Holds the compiled test programs and helper libraries.
    pub apps: PathBuf,
    pub shim: PathBuf,
}

/// The repository root (this module is also used by cli/tests/).
fn repo() -> PathBuf {
    let mut d = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !d.join("cuda-headers").is_dir() {
        assert!(
            d.pop(),
            "cannot find the repository root above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
    d
}

/// target/<profile>/ of this test binary (target/<profile>/deps/<test>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn sources_hash(root: &Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for dir in ["tests/fake", "tests/apps", "cuda-headers"] {
        let mut entries: Vec<_> = fs::read_dir(root.join(dir))
            .expect("read source dir")
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            e.path().hash(&mut h);
            fs::read(e.path()).unwrap_or_default().hash(&mut h);
        }
    }
    h.finish()
}

fn sh(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cc() -> Command {
    Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()))
}

fn build(root: &Path, dir: &Path) {
    let fake = dir.join("fake");
    let apps = dir.join("apps");
    fs::create_dir_all(&apps).expect("mkdir apps");
    sh(Command::new("bash")
        .arg(root.join("tests/fake/build.sh"))
        .arg(&fake));
    let inc = [
        format!("-I{}", root.join("cuda-headers").display()),
        format!("-I{}", root.join("tests/fake").display()),
        format!("-I{}", root.join("tests/apps").display()),
    ];
    let src = |n: &str| root.join("tests/apps").join(n);
    // Every program in tests/apps (apart from the helper libraries and
    // rtldnext, built below); all but those that find the driver
    // themselves are linked against the (fake) driver.
    const HELPERS: [&str; 4] = ["base", "next", "partial_driver", "rtldnext"];
    const NOT_LINKED: [&str; 4] = ["dlopen", "procaddr", "missing", "attack_noshim"];
    let mut programs: Vec<String> = fs::read_dir(root.join("tests/apps"))
        .expect("read tests/apps")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".c")?.to_string();
            (!HELPERS.contains(&stem.as_str())).then_some(stem)
        })
        .collect();
    programs.sort();
    for app in &programs {
        let mut c = cc();
        c.args(["-O1", "-g", "-Wall", "-o"])
            .arg(apps.join(app))
            .args(&inc)
            .arg(src(&format!("{app}.c")));
        if !NOT_LINKED.contains(&app.as_str()) {
            c.arg(format!("-L{}", fake.display()))
                .args(["-lcuda", "-lnvidia-ml"]);
        }
        if app == "profiled" {
            // Profiles itself with CUPTI, linked as PyTorch's profiler is.
            c.arg("-lcupti");
        }
        c.args(["-ldl", "-lpthread"]);
        sh(&mut c);
    }
    // Helper libraries for the RTLD_NEXT and missing-driver tests.
    for (lib, file) in [
        ("libbase.so", "base.c"),
        ("libnext.so", "next.c"),
        ("libpartialcuda.so", "partial_driver.c"),
    ] {
        sh(cc()
            .args(["-shared", "-fPIC", "-o"])
            .arg(apps.join(lib))
            .arg(src(file))
            .arg("-ldl"));
    }
    sh(cc()
        .arg("-o")
        .arg(apps.join("rtldnext"))
        .arg(src("rtldnext.c"))
        .arg(format!("-L{}", apps.display()))
        .arg("-lbase"));
}

/// Builds everything once per source version.
pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        // A host-wide quota file would be every test process's: the shim
        // takes it over the test's own CUSLICE_CONFIG (a mounted quota
        // file wins, by design). scripts/test.sh hides it.
        let host_quota = Path::new(cuslice_core::config::DEFAULT_CONFIG_PATH);
        assert!(
            !host_quota.exists(),
            "{} exists on this host: the shim in every test process would take it over the test's own \
             quota file (a mounted quota file wins over CUSLICE_CONFIG, by design). Run the tests with \
             `bash scripts/test.sh`, which hides the host's cuslice state in a private mount namespace.",
            host_quota.display()
        );
        let root = repo();
        let profile = profile_dir();
        let shim = profile.join("libcuslice.so");
        let base = profile.join("cuslice-tests");
        fs::create_dir_all(&base).expect("mkdir cuslice-tests");
        let dir = base.join(format!("build-{:016x}", sources_hash(&root)));
        let lock = fs::File::create(base.join(".lock")).expect("lock file");
        // SAFETY: flock on an fd we own; released when `lock` is dropped.
        assert_eq!(unsafe { libc_flock(lock.as_raw_fd(), 2) }, 0, "flock");
        // `cargo test` does not build a cdylib-only library for integration
        // tests: build it (a no-op when up to date; cargo has released its
        // build lock by the time tests run).
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "-p", "cuslice", "--lib"])
            .current_dir(&root);
        if profile.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        sh(&mut cargo);
        assert!(shim.exists(), "{} was not built", shim.display());
        if !dir.join("done").exists() {
            let tmp = base.join(format!("tmp-{}", std::process::id()));
            let _ = fs::remove_dir_all(&tmp);
            build(&root, &tmp);
            fs::File::create(tmp.join("done"))
                .and_then(|mut f| f.write_all(b"ok"))
                .expect("done marker");
            let _ = fs::remove_dir_all(&dir);
            fs::rename(&tmp, &dir).expect("publish build");
        }
        drop(lock);
        Env {
            fake: dir.join("fake"),
            apps: dir.join("apps"),
            root,
            shim,
        }
    })
}

/// A binary of the `cuslice-attacks` package (`attack-quota`,
/// `attack-gpuseg`), for tests outside that package, where Cargo sets no
/// `CARGO_BIN_EXE_*` for it: built here with `cargo build -p
/// cuslice-attacks --bins` in this test's profile (once per test process;
/// a no-op when up to date), so the binary is never a stale one left under
/// target/ by an earlier build, and found next to this test binary's
/// profile directory (target/<profile>/<name>).
pub fn attack_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let profile = profile_dir();
    BUILT.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "-p", "cuslice-attacks", "--bins"])
            .current_dir(repo());
        if profile.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        sh(&mut cargo);
    });
    let p = profile.join(name);
    assert!(p.exists(), "{} was not built", p.display());
    p
}

unsafe extern "C" {
    #[link_name = "flock"]
    fn libc_flock(fd: i32, op: i32) -> i32;
}

/// A program run.
pub struct Run {
    pub out: Output,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The "R ..." result lines.
    pub fn results(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("R "))
            .collect()
    }

    /// The "D what file symbol" diagnostic line for `what`: (file, symbol).
    pub fn diag(&self, what: &str) -> (String, String) {
        let prefix = format!("D {what} ");
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no diagnostic for {what} in:\n{}", self.stdout));
        let mut it = line[prefix.len()..].split(' ');
        (
            it.next().unwrap_or("").to_string(),
            it.next().unwrap_or("").to_string(),
        )
    }

    /// Per process: hook name -> call count, from `CUSLICE_LOG=debug`.
    pub fn calls(&self) -> BTreeMap<u32, BTreeMap<String, u64>> {
        let mut m: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
        for l in self.stderr.lines() {
            let Some(rest) = l.strip_prefix("cuslice[") else {
                continue;
            };
            let Some((pid, msg)) = rest.split_once("]: debug: calls ") else {
                continue;
            };
            let mut w = msg.split(' ');
            let (Some(name), Some(n)) = (w.next(), w.next()) else {
                continue;
            };
            m.entry(pid.parse().expect("pid"))
                .or_default()
                .insert(name.into(), n.parse().expect("count"));
        }
        m
    }

    /// Call counts of the only process that logged (panics if several).
    pub fn calls_single(&self) -> BTreeMap<String, u64> {
        let m = self.calls();
        assert_eq!(
            m.len(),
            1,
            "expected one process's counts, got {m:?}\nstderr:\n{}",
            self.stderr
        );
        m.into_values().next().unwrap_or_default()
    }

    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.out.status.success(),
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.out.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// How to run a program.
pub struct Opts<'a> {
    pub args: Vec<String>,
    pub shim: bool,
    pub env: Vec<(&'a str, String)>,
    pub preload_extra: Vec<PathBuf>,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            args: vec![],
            shim: true,
            env: vec![("CUSLICE_LOG", "debug".into())],
            preload_extra: vec![],
        }
    }
}

/// The command `run` and `spawn` execute: the test program, with the fake
/// driver on the library path and the shim (and extra preloads) preloaded,
/// in an environment of `opts.env` only.
pub fn command(prog: &str, opts: &Opts<'_>) -> Command {
    let e = env();
    let mut cmd = Command::new(e.apps.join(prog));
    cmd.args(&opts.args);
    cmd.env_clear();
    cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd.env(
        "LD_LIBRARY_PATH",
        format!("{}:{}", e.fake.display(), e.apps.display()),
    );
    let mut preload: Vec<String> = Vec::new();
    if opts.shim {
        preload.push(e.shim.display().to_string());
    }
    preload.extend(opts.preload_extra.iter().map(|p| p.display().to_string()));
    if !preload.is_empty() {
        cmd.env("LD_PRELOAD", preload.join(":"));
    }
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    pin_defaults(&mut cmd, &opts.env);
    cmd
}

/// A shim started without a quota file takes its segment directories by
/// default: the host's own, /dev/shm/cuslice and /dev/shm/cuslice/gpu,
/// which no test may write (scripts/test.sh fails the run if one does).
/// Such a process gets directories of this test process's own instead (in
/// its temporary directory, which the test harness gives each test), the
/// same for every program the test starts, so that its programs still meet
/// in them. A test that names a directory, or a quota file (which names
/// them: tests/common/host.rs), keeps what it named.
fn pin_defaults(cmd: &mut Command, env: &[(&str, String)]) {
    let set = |k: &str| env.iter().any(|(n, v)| *n == k && !v.is_empty());
    if set("CUSLICE_CONFIG") {
        return;
    }
    let own = std::env::temp_dir().join(format!("cuslice-defaults-{}", std::process::id()));
    if !set("CUSLICE_SEGMENT_DIR") {
        cmd.env("CUSLICE_SEGMENT_DIR", own.join("segment"));
    }
    if !set("CUSLICE_GPU_SEGMENT_DIR") {
        cmd.env("CUSLICE_GPU_SEGMENT_DIR", own.join("gpu"));
    }
}

/// `prog` (a host command, the shim's library given as `CUSLICE_LIB`) on
/// the fake GPU of a test host whose files are in `dir`: its fake state
/// `dir/fake.state` (contexts cost 1 MiB), its runtime directory
/// `dir/xdg`, its GPU segments `dir/root/gpu`; warnings only.
pub fn host_command(prog: &Path, dir: &Path) -> Command {
    let e = env();
    let mut c = Command::new(prog);
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(
            "LD_LIBRARY_PATH",
            format!("{}:{}", e.fake.display(), e.apps.display()),
        )
        .env("CUSLICE_LIB", &e.shim)
        .env("CUSLICE_REAL_NVML", e.fake.join("libnvidia-ml.so.1"))
        .env("FAKE_CUDA_STATE", dir.join("fake.state"))
        .env("FAKE_CUDA_CTX_OVERHEAD", "1MiB")
        .env("XDG_RUNTIME_DIR", dir.join("xdg"))
        .env("CUSLICE_GPU_SEGMENT_DIR", dir.join("root/gpu"))
        .env("CUSLICE_LOG", "warn");
    c
}

/// Spawns a program the way `run` does, without waiting (for kill tests).
pub fn spawn(prog: &str, opts: &Opts<'_>) -> std::process::Child {
    let mut cmd = command(prog, opts);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {prog}: {e}"))
}

pub fn run(prog: &str, opts: Opts<'_>) -> Run {
    let out = command(prog, &opts)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog}: {e}"));
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        out,
    }
}

pub fn native(prog: &str) -> Run {
    run(
        prog,
        Opts {
            args: vec![],
            shim: false,
            env: vec![],
            preload_extra: vec![],
        },
    )
}

pub fn shimmed(prog: &str) -> Run {
    run(prog, Opts::default())
}

/// Polls `f` every millisecond until it returns Some, for at most `limit`:
/// None if it never did (for a caller that must clean up before it fails).
pub fn poll_until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Polls `f` every millisecond until it returns Some, or fails the test
/// with `what` (what did not happen, and what was seen) after `limit`.
pub fn wait_for<T>(what: impl Fn() -> String, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll_until(limit, f).unwrap_or_else(|| panic!("{} (waited {limit:?})", what()))
}

/// Waits for `c` to exit until `deadline`; a process still running then is
/// a hang: it is killed and the test fails, naming `name` and showing what
/// it printed (its progress shows where it stalled).
pub fn output_by(name: &str, mut c: std::process::Child, deadline: Instant) -> Output {
    while c.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            let out = c.wait_with_output().expect("wait");
            panic!(
                "{name} hung: not finished by its deadline, killed (at CLOCK_MONOTONIC {:.0} ms); what it printed shows where it stalled:\nstdout:\n{}\nstderr:\n{}",
                cuslice_core::gpu::monotonic_ns() as f64 / 1e6,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Coarse: the processes waited for are measured, the test's own
        // polling should not compete with them.
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().expect("wait")
}
