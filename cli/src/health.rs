//! `cuslice health`: every GPU's health (healthy, degraded or unhealthy,
//! why and since when), as the host's health source judged it and one
//! look now (`host::health::view`); `cuslice health follow`: the health
//! source in the foreground (each change one line; for a host without the
//! watch, and for measuring its cost); `cuslice health clear GPU`: an
//! operator's return of a GPU to service (docs/observability.md, *GPU
//! health*).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuslice_host::gpu::health::judge::{ago, utc};
use cuslice_host::gpu::health::source::{self, Config, Report, Source, now_unix, parse_duration};
use cuslice_host::gpu::health::view::{self, View};
use cuslice_host::gpu::health::{State, file};
use cuslice_host::gpu::nvml::Nvml;
use cuslice_host::layout::{DEFAULT_ROOT, Layout};

#[derive(clap::Args)]
pub struct HealthArgs {
    #[command(subcommand)]
    cmd: Option<HealthCmd>,
    /// The hook's root, where the health source publishes (`health/`).
    #[arg(long, global = true, default_value = DEFAULT_ROOT)]
    root: PathBuf,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum HealthCmd {
    /// Run the health source in the foreground until SIGTERM / SIGINT (or
    /// --seconds): wait for XID events, ask each GPU now and then, print
    /// each change of a GPU's health as one line, and publish the
    /// judgement under --root where no other source does.
    Follow {
        /// How long to wait for an event before asking each GPU whether it
        /// is alive (100ms to 60s).
        #[arg(long, default_value = "5s")]
        poll: String,
        /// How often to check each GPU's memory: retired pages, remapped
        /// rows, uncorrectable ECC errors (100ms to 1h).
        #[arg(long, default_value = "30s")]
        check: String,
        /// How long nothing must be seen before a GPU returns to service
        /// (1s to 7d).
        #[arg(long, default_value = "300s")]
        quiet: String,
        /// Stop after this many seconds, and say what it cost.
        #[arg(long)]
        seconds: Option<f64>,
    },
    /// Return a GPU (its index or UUID) to service now: the health source
    /// forgets what it saw of it up to now.
    Clear { gpu: String },
}

pub fn run(a: HealthArgs) -> Result<(), String> {
    let layout = Layout::new(&a.root);
    match a.cmd {
        None => show(&layout, a.json),
        Some(HealthCmd::Follow {
            poll,
            check,
            quiet,
            seconds,
        }) => {
            let cfg = Config {
                root: a.root.clone(),
                writer: "cuslice health follow".into(),
                poll: parse_duration(&poll, source::POLL_BOUNDS)
                    .map_err(|e| format!("--poll: {e}"))?,
                check: parse_duration(&check, source::CHECK_BOUNDS)
                    .map_err(|e| format!("--check: {e}"))?,
                quiet: parse_duration(&quiet, source::QUIET_BOUNDS)
                    .map_err(|e| format!("--quiet: {e}"))?,
            };
            let seconds = match seconds {
                Some(s) if !(s.is_finite() && (0.0..=86_400.0 * 365.0).contains(&s)) => {
                    return Err(format!(
                        "--seconds: expected a number of seconds from 0 to a year, got {s}"
                    ));
                }
                s => s,
            };
            follow(cfg, seconds)
        }
        Some(HealthCmd::Clear { gpu }) => clear(&layout, &gpu),
    }
}

fn nvml() -> Result<Nvml, String> {
    Nvml::open().map_err(|e| {
        format!(
            "cannot load NVML ({e}): GPU health needs the NVIDIA driver's libnvidia-ml.so.1; set CUSLICE_REAL_NVML to its path"
        )
    })
}

/// One GPU's line: `GPU 0  GPU-...  unhealthy since ... (3m12s): why`.
pub fn gpu_line(g: &view::GpuView, now: f64) -> String {
    let h = &g.health;
    let mut s = format!("GPU {}  {}  {}", g.index, g.uuid, h.state);
    if h.state != State::Healthy {
        s.push_str(&format!(
            " since {} ({})",
            utc(h.since_unix),
            ago(now - h.since_unix)
        ));
    }
    if let Some(r) = &h.reason {
        s.push_str(&format!(": {r}"));
    }
    if g.judged_by == "look" && h.state != State::Healthy {
        s.push_str(" [one look now]");
    }
    s
}

/// The source's line: who judges, and how often.
pub fn source_line(v: &View) -> String {
    match (&v.source, &v.note) {
        (Some(s), None) => format!(
            "health: {} pid {} {}, last wrote {} ago (every GPU asked every {}s, its memory checked every {}s, back in service after {}s quiet)",
            s.writer,
            s.pid,
            if s.up { "up" } else { "DOWN" },
            ago(s.updated_seconds_ago),
            s.poll_seconds,
            s.check_seconds,
            s.quiet_seconds
        ),
        (_, Some(n)) => format!("health: {n}"),
        (None, None) => "health: no GPU".into(),
    }
}

fn show(layout: &Layout, json: bool) -> Result<(), String> {
    let nvml = nvml()?;
    let devices = nvml.devices()?;
    let now = now_unix();
    let v = view::view(layout, &nvml, &devices, now);
    if json {
        let j = serde_json::to_string_pretty(&v).map_err(|e| format!("cannot encode JSON: {e}"))?;
        println!("{j}");
        return Ok(());
    }
    for g in &v.gpus {
        println!("{}", gpu_line(g, now));
    }
    println!("{}", source_line(&v));
    Ok(())
}

fn clear(layout: &Layout, gpu: &str) -> Result<(), String> {
    let nvml = nvml()?;
    let devices = nvml.devices()?;
    let d = devices
        .iter()
        .find(|d| d.index.to_string() == gpu || d.uuid.eq_ignore_ascii_case(gpu))
        .ok_or_else(|| {
            format!(
                "{gpu:?}: expected a GPU of this host, by index or UUID ({} GPUs listed by NVML)",
                devices.len()
            )
        })?;
    let now = now_unix();
    file::request_clear(layout, &d.uuid, now)?;
    let up = file::read(layout).ok().flatten().filter(|p| p.fresh(now));
    match up {
        Some(p) => println!(
            "GPU {} ({}): cleared at {}; {} (pid {}) returns it to service within {}s",
            d.index,
            d.uuid,
            utc(now),
            p.writer,
            p.pid,
            p.poll_seconds
        ),
        None => println!(
            "GPU {} ({}): cleared at {}; no health source runs here now: the next one to start applies it",
            d.index,
            d.uuid,
            utc(now)
        ),
    }
    Ok(())
}

/// The CPU time this process used, seconds (user + system).
fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage into a valid struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and the threads it
/// starts), so that [`wait_signal`] takes them.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is initialised by sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Sleeps until one of `set`'s signals comes (true) or `limit` passes.
fn wait_signal(set: &libc::sigset_t, limit: Option<Duration>) -> bool {
    let until = limit.map(|l| Instant::now() + l);
    loop {
        let left = until.map(|u| u.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return false;
        }
        // At most a day at a time (the timespec needs no more).
        let d = left
            .unwrap_or(Duration::from_secs(86_400))
            .min(Duration::from_secs(86_400));
        let ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        };
        // SAFETY: a valid set and timespec; no siginfo wanted.
        let r = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if r > 0 {
            return true;
        }
    }
}

fn follow(cfg: Config, seconds: Option<f64>) -> Result<(), String> {
    let signals = block_stop_signals();
    let cpu_start = cpu_seconds();
    let changes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let n = changes.clone();
    let src = Source::start(
        cfg,
        Box::new(move |r| match r {
            Report::Change(c) => {
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                println!("{}  {}", utc(now_unix()), c.line());
            }
            Report::Note(m) => eprintln!("cuslice health: {m}"),
        }),
    )?;
    // Its cost from here: the start-up (loading NVML, the first look at
    // every GPU) is said apart.
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    wait_signal(&signals, seconds.map(Duration::from_secs_f64));
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    src.stop();
    eprintln!(
        "cuslice health follow: ran {wall:.1}s, {} changes, CPU {cpu:.4}s after start-up ({:.4} % of one core), start-up {:.3}s",
        changes.load(std::sync::atomic::Ordering::Relaxed),
        if wall > 0.0 { 100.0 * cpu / wall } else { 0.0 },
        cpu0 - cpu_start
    );
    Ok(())
}
