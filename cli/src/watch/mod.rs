//! `cuslice watch`: the host watchdog. Every interval it reads NVML's
//! per-process device memory and SM utilization for every GPU, maps each
//! host PID to its slice (a container made through the OCI hook, every
//! container of a Kubernetes DRA claim together, or a `cuslice run`
//! session: `slices`), compares with the slice's quota file and share,
//! audits the segments, and acts by the host's policy
//! (`config`): report, kill or freeze. What it finds is one log line when
//! it starts, when something is done about it and when it ends, a counter
//! in the exporter and a row in `cuslice status` (the state file,
//! `host::watch_state`).
//!
//! A pass is observe, judge, act, in that order:
//!
//! - `observe` reads NVML, `/proc` and the segments into a `snapshot`
//!   (plain data; the only part of a pass that reads the host);
//! - `judge` judges the snapshot, one rule per module: pure functions of
//!   it, of what earlier passes left (`judge::History`, each rule its
//!   part) and of the configuration, returning verdicts (unit-tested on
//!   snapshots written by hand);
//! - `act` maps each verdict and the policy to an action (`act::decide`,
//!   the one place that does), performs it (signals, the freezer, segment
//!   repairs) and records the finding (log lines, counts, the state);
//!   what it leaves to the next passes goes into the history
//!   (`act::acted_on`, the freezes still served).
//!
//! Beside the passes, GPU health (`host::health::source`): a thread of
//! its own asleep in NVML's event wait, each change of a GPU's health one
//! log line, the judgement published in `<root>/health/state.json` for
//! `status`, `top`, the exporter and the OCI hook (`health = false` in
//! watch.toml turns it off).
//!
//! Beside them: `slices` (whose a host process is), `procfs`, `gpuseg`
//! (core's GPU segment audit and repair), `tenant` (what observe and the
//! judge agree on about a tenant), `config` and `log`. No two of these
//! import each other.

pub mod act;
pub mod config;
pub mod gpuseg;
pub mod judge;
pub mod log;
pub mod observe;
pub mod orphans;
pub mod procfs;
pub mod slices;
pub mod snapshot;
pub mod tenant;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use act::Actor;
use config::{Policy, WatchConfig};
use cuslice_host::fs::Dir;
use cuslice_host::gpu::health;
use cuslice_host::gpu::nvml::Nvml;
use cuslice_host::layout::{Layout, WATCH_DIR, WATCH_LOCK};
use cuslice_host::watch_state::{self, Count, WatchState, now_unix};
use judge::History;
use log::log;
use observe::Observer;

/// `cuslice watch`'s flags (they override the file).
#[derive(clap::Args)]
pub struct WatchArgs {
    /// Seconds between passes, or a duration like 200ms (default: the
    /// file's `interval`, else 1s).
    #[arg(long)]
    pub interval: Option<String>,
    /// What to do about a finding (default: the file's `policy`, else
    /// report).
    #[arg(long, value_enum)]
    pub policy: Option<Policy>,
    /// The watch's configuration file.
    #[arg(long, default_value = config::DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The hook's host directory (default: the file's `root`, else
    /// /run/cuslice).
    #[arg(long)]
    pub root: Option<PathBuf>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage into a valid struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

pub struct Watch {
    cfg: WatchConfig,
    observer: Observer,
    history: History,
    actor: Actor,
    pass: u64,
    started: f64,
    last_pass: f64,
    last_cpu: f64,
    errors: Vec<String>,
    gpu_processes: u32,
    /// Guarantees root registered whose container or claim is gone.
    orphans: orphans::Orphans,
    /// `<root>/watch`, where the state is replaced after every pass.
    state_dir: Dir,
}

impl Watch {
    /// One pass: observe, judge, act. The judge is given what the
    /// earlier passes left (acting included: the freezes still served at
    /// the pass's time, the compute counts an action restarted); acting
    /// leaves its part in the history the judge returned.
    pub fn pass(&mut self) {
        self.pass += 1;
        let pass = self.pass;
        self.errors.clear();

        // Observe.
        for n in self.observer.refresh() {
            log(&n);
        }
        // The pass's time, before NVML is read: a freeze whose time is up
        // by then ends in this pass, and its slice is judged again.
        let at = Instant::now();
        let snap = self.observer.observe(pass);
        self.gpu_processes = snap.nvml_pids.len() as u32;
        self.errors.extend(snap.errors.iter().cloned());

        // Judge.
        self.history.compute.frozen = self.actor.executor.frozen_at(at);
        let (verdicts, mut next) = judge::judge(&snap, &self.history, &self.cfg);

        // Act.
        let errors = self.actor.act(
            pass,
            at,
            verdicts,
            &mut next,
            &self.cfg,
            &self.observer.slices,
        );
        self.errors.extend(errors);
        self.history = next;

        // Guarantees whose maker vanished (orphans.rs).
        let live: std::collections::HashSet<(String, u64)> = self
            .observer
            .slices
            .all()
            .map(|s| (s.tenant.clone(), s.tag))
            .collect();
        for l in self.orphans.tidy(
            &self.cfg.root.join(cuslice_host::layout::GPU_DIR),
            &live,
            cuslice_core::gpu::monotonic_ns(),
            u64::try_from(self.cfg.orphan_grace.as_nanos()).unwrap_or(u64::MAX),
        ) {
            log(&l);
        }
        self.last_pass = now_unix();
    }

    fn state(&self, running: bool) -> WatchState {
        WatchState {
            pid: std::process::id(),
            running,
            policy: self.cfg.policy.name().into(),
            repair: self.cfg.repair,
            interval_seconds: self.cfg.interval.as_secs_f64(),
            started_unix: self.started,
            last_pass_unix: self.last_pass,
            passes: self.pass,
            cpu_seconds: cpu_seconds(),
            last_pass_cpu_seconds: self.last_cpu,
            slices: self.observer.slices.all().count() as u32,
            gpu_processes: self.gpu_processes,
            findings: self.actor.record.views(),
            counts: self
                .actor
                .record
                .counts()
                .map(|((kind, tenant), n)| Count {
                    kind: *kind,
                    tenant: tenant.clone(),
                    count: *n,
                })
                .collect(),
            errors: self.errors.clone(),
        }
    }
}

/// Takes the host's watch lock, `<root>/watch/lock`, for the life of the
/// process; the error names the PID that holds it. Returns it with the
/// watch's directory, held open (the state is replaced in it). The root
/// (the administrator's path) is made where missing, 0755 as ever (the
/// hook keeps it 0700 once it runs); `watch/` below it is kept through the
/// layer (a directory of ours, 0755, not a link), the lock file in it
/// opened without following a link or blocking, 0644.
fn lock(root: &Path) -> Result<(std::fs::File, Dir), String> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let dir = Layout::new(root).open()?.keep_dir(WATCH_DIR, 0o755)?;
    match dir.try_lock(WATCH_LOCK, 0o644)? {
        Ok(mut f) => {
            let _ = f.set_len(0);
            let _ = f.rewind();
            let _ = writeln!(f, "{}", std::process::id());
            Ok((f, dir))
        }
        Err(f) => {
            let mut s = String::new();
            let _ = f.take(64).read_to_string(&mut s);
            let holder = s.trim();
            Err(format!(
                "another cuslice watch{} holds {}: one runs per host",
                if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                },
                dir.join(WATCH_LOCK).display()
            ))
        }
    }
}

/// `cuslice watch`: runs until SIGTERM / SIGINT.
pub fn run(a: WatchArgs) -> Result<(), String> {
    let explicit = a.config.as_os_str() != config::DEFAULT_CONFIG;
    let mut cfg = config::load(&a.config, explicit)?;
    if let Some(i) = &a.interval {
        cfg.interval = config::parse_duration(i).map_err(|e| format!("--interval: {e}"))?;
    }
    if let Some(p) = a.policy {
        cfg.policy = p;
    }
    if let Some(r) = a.root {
        cfg.root = r;
    }
    let nvml = Nvml::open().map_err(|e| {
        format!(
            "watch: cannot load NVML ({e}): it needs the NVIDIA driver's libnvidia-ml.so.1; set CUSLICE_REAL_NVML to its path"
        )
    })?;
    nvml.check_per_process().map_err(|e| {
        format!("watch: this NVML cannot list processes ({e}); set CUSLICE_REAL_NVML to a newer libnvidia-ml.so.1")
    })?;
    let devices = nvml.devices().map_err(|e| format!("watch: {e}"))?;
    let (_lock, state_dir) = lock(&cfg.root).map_err(|e| format!("watch: {e}"))?;
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe { libc::signal(sig, on_stop as *const () as libc::sighandler_t) };
    }
    log(&format!(
        "pid {}, {} GPU{}, {}",
        std::process::id(),
        devices.len(),
        if devices.len() == 1 { "" } else { "s" },
        cfg.describe()
    ));
    // GPU health: its own thread, asleep in NVML's event wait; each change
    // one line here, the judgement published under the root.
    let health = if cfg.health {
        let hc = health::source::Config {
            root: cfg.root.clone(),
            writer: "cuslice watch".into(),
            poll: cfg.health_poll,
            check: cfg.health_check,
            quiet: cfg.health_quiet,
        };
        let src = health::source::Source::start(
            hc,
            Box::new(|r| match r {
                health::source::Report::Change(c) => log(&format!("health: {}", c.line())),
                health::source::Report::Note(n) => log(&format!("health: {n}")),
            }),
        )
        .map_err(|e| format!("watch: GPU health: {e}"))?;
        Some(src)
    } else {
        None
    };
    let mut w = Watch {
        observer: Observer::new(nvml, devices, &cfg.root),
        cfg,
        history: History::default(),
        actor: Actor::default(),
        pass: 0,
        started: now_unix(),
        last_pass: 0.0,
        last_cpu: 0.0,
        errors: vec![],
        gpu_processes: 0,
        orphans: orphans::Orphans::default(),
        state_dir,
    };
    let mut next = Instant::now();
    let mut said: Option<String> = None;
    let notify = Notify::from_env();
    let mut ready = false;
    while !STOP.load(Ordering::Relaxed) {
        let c0 = cpu_seconds();
        w.pass();
        w.last_cpu = cpu_seconds() - c0;
        // systemd: ready after the first pass, then one keep-alive per
        // pass, so that a watch stuck in a pass (a hung NVML call, a
        // blocked read) is restarted (`WatchdogSec=` in the unit).
        if let Some(n) = &notify {
            n.send(if ready {
                "WATCHDOG=1"
            } else {
                "READY=1\nWATCHDOG=1"
            });
            ready = true;
        }
        let e = w.errors.join("; ");
        if !e.is_empty() && said.as_deref() != Some(e.as_str()) {
            log(&e);
        }
        said = Some(e);
        if let Err(e) = watch_state::write(&w.state_dir, &w.state(true)) {
            log(&e);
        }
        next += w.cfg.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while !STOP.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
        }
    }
    if let Some(n) = &notify {
        n.send("STOPPING=1");
    }
    w.actor.executor.thaw(None, &w.observer.slices);
    if let Some(h) = &health {
        h.stop();
    }
    let _ = watch_state::write(&w.state_dir, &w.state(false));
    log("stopped");
    Ok(())
}

/// systemd's notification socket (`NOTIFY_SOCKET`: a path, or `@name` for
/// an abstract socket), where the unit is `Type=notify`.
struct Notify {
    sock: std::os::unix::net::UnixDatagram,
    addr: std::os::unix::net::SocketAddr,
}

impl Notify {
    fn from_env() -> Option<Notify> {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let v = std::env::var_os("NOTIFY_SOCKET")?;
        let b = std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str());
        let addr = match b.first() {
            Some(b'@') => SocketAddr::from_abstract_name(&b[1..]),
            Some(b'/') => SocketAddr::from_pathname(Path::new(&v)),
            _ => {
                log(&format!(
                    "NOTIFY_SOCKET={}: not a path or @name; systemd is not told",
                    v.to_string_lossy()
                ));
                return None;
            }
        };
        let sock = UnixDatagram::unbound();
        match (addr, sock) {
            (Ok(addr), Ok(sock)) => Some(Notify { sock, addr }),
            (Err(e), _) | (_, Err(e)) => {
                log(&format!(
                    "NOTIFY_SOCKET={}: {e}; systemd is not told",
                    v.to_string_lossy()
                ));
                None
            }
        }
    }

    /// Best effort: a lost datagram costs at most one keep-alive.
    fn send(&self, msg: &str) {
        let _ = self.sock.send_to_addr(msg.as_bytes(), &self.addr);
    }
}
