//! The `cuslice` command.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};

use clap::{Args, Parser, Subcommand};
use cuslice_core::config;

mod exporter;
mod frame;
mod health;
mod limits;
mod oci;
mod readings;
mod resize;
mod top;
mod view;
mod watch;

#[derive(Parser)]
#[command(
    name = "cuslice",
    version,
    about = "Share one NVIDIA GPU safely between containers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program under the shim, with the given limits.
    Run {
        #[command(flatten)]
        limits: limits::Limits,
        /// Run on these GPUs only (CUDA_VISIBLE_DEVICES), e.g. 0 or 0,1.
        #[arg(long)]
        gpu: Option<String>,
        /// Path of libcuslice.so (default: $CUSLICE_LIB, then next to this
        /// executable, then ../lib/cuslice/, then /usr/lib/cuslice/).
        #[arg(long)]
        lib: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<OsString>,
    },
    /// Print the path of the libcuslice.so that `run` would preload.
    Lib,
    /// Change the limits of a running container, DRA claim or `cuslice
    /// run` session: its quota file, its segments and the driver's limit
    /// (see docs/memory-quota.md, "Resize").
    Resize {
        #[command(flatten)]
        args: resize::ResizeArgs,
    },
    /// Per GPU (from NVML), tenant and process: what it runs, memory used /
    /// quota, share, ceiling, class and mode, GPU time and time throttled
    /// (reads the segments; no GPU needed).
    Status {
        #[command(flatten)]
        src: SourceArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Seconds between the two readings the GPU time share and the
        /// time throttled are measured over (0: one reading, without them;
        /// at most 3600).
        #[arg(long, default_value_t = 0.5, value_parser = status_interval)]
        interval: f64,
        /// Seconds a tenant with no live process is still listed (0 to 86400).
        #[arg(long, default_value_t = view::DEFAULT_LINGER_SECONDS, value_parser = linger_seconds)]
        linger: f64,
    },
    /// The status table, refreshed in place every interval, with each
    /// tenant's share of the GPU and time throttled over the last interval;
    /// q quits.
    Top {
        #[command(flatten)]
        src: SourceArgs,
        /// Seconds between refreshes (0.1 to 3600).
        #[arg(long, default_value_t = 1.0, value_parser = top_interval)]
        interval: f64,
        /// Print one frame (measured over one interval) and exit.
        #[arg(long)]
        once: bool,
        /// Seconds a tenant with no live process is still listed (dimmed; 0 to 86400).
        #[arg(long, default_value_t = view::DEFAULT_LINGER_SECONDS, value_parser = linger_seconds)]
        linger: f64,
    },
    /// OCI runtime hook: `create` (createRuntime / prestart) gives a
    /// container its quota file and mounts from its cuslice.io/*
    /// annotations; `poststop` removes them.
    OciHook {
        #[arg(value_enum)]
        stage: HookStage,
        /// Host directory for per-container files and the GPU segments.
        #[arg(long, default_value = oci::DEFAULT_ROOT)]
        root: PathBuf,
        /// The library to mount into containers.
        #[arg(long, default_value = oci::DEFAULT_LIB)]
        lib: PathBuf,
        /// Take the limits from a Kubernetes ResourceClaim instead of the
        /// annotations: the quota file and segment directory that the DRA
        /// plugin keeps under <root>/claims/<CLAIM> (the claim's UID).
        #[arg(long)]
        claim: Option<String>,
    },
    /// Container Device Interface spec.
    Cdi {
        #[command(subcommand)]
        cmd: CdiCmd,
    },
    /// Host watchdog: every interval, hold each container and `cuslice run`
    /// session to its slice from NVML's per-process figures (memory over
    /// quota, GPU processes that bypass the shim, GPU time over share or
    /// ceiling, tampered segments); report, kill or freeze (see
    /// /etc/cuslice/watch.toml). One per host.
    Watch {
        #[command(flatten)]
        args: watch::WatchArgs,
    },
    /// Every GPU's health (healthy, degraded, unhealthy: why, since when);
    /// `follow` runs the health source, `clear GPU` returns a GPU to service.
    Health {
        #[command(flatten)]
        args: health::HealthArgs,
    },
    /// Serve the status figures as Prometheus metrics on GET /metrics.
    Exporter {
        #[command(flatten)]
        src: SourceArgs,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9836")]
        listen: String,
        /// Seconds a tenant with no live process is still exported (0 to 86400).
        #[arg(long, default_value_t = view::DEFAULT_LINGER_SECONDS, value_parser = linger_seconds)]
        linger: f64,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum HookStage {
    Create,
    Poststop,
}

#[derive(Subcommand)]
enum CdiCmd {
    /// Write a CDI spec for the device `cuslice.io/gpu=all`, whose hooks give
    /// annotated containers their slice.
    Generate {
        /// Where to write it (default: stdout).
        #[arg(long)]
        output: Option<PathBuf>,
        /// The cuslice command the hooks run.
        #[arg(long, default_value = "/usr/bin/cuslice")]
        cuslice: PathBuf,
        /// The hooks' --root (host directory for per-container files and
        /// the GPU segments), where it is not the default /run/cuslice.
        #[arg(long)]
        root: Option<PathBuf>,
        /// The hooks' --lib (the library mounted into containers), where
        /// it is not the default /usr/lib/cuslice/libcuslice.so.
        #[arg(long)]
        lib: Option<PathBuf>,
    },
}

/// The CDI spec of the device `cuslice.io/gpu=all` (JSON, which CDI
/// accepts as YAML too), as its file holds it; `root` and `lib` are passed
/// on to the hooks. Built by the host layer's `cdi`, as the DRA plugin's
/// per-claim specs are: its version is the lowest its content needs
/// (0.3.0 here: device hooks named by OCI stage), since a runtime refuses a
/// spec newer than its CDI library knows (podman 4.3, Debian 12's, knows
/// up to 0.5.0).
fn cdi_spec(cuslice: &Path, root: Option<&Path>, lib: Option<&Path>) -> Result<String, String> {
    use cuslice_host::cdi;
    let hooks = cdi::OciHooks {
        cuslice,
        root,
        lib,
        claim: None,
    }
    .hooks()?;
    let all = cdi::Device {
        container_edits: cdi::ContainerEdits {
            hooks,
            ..cdi::ContainerEdits::default()
        },
        name: "all".into(),
    };
    Ok(cdi::Spec::new(cdi::GPU_KIND, vec![all], cdi::ContainerEdits::default())?.to_json())
}

/// Where the segments are.
#[derive(Args)]
struct SourceArgs {
    /// Directory of the per-GPU segments (default: $CUSLICE_GPU_SEGMENT_DIR,
    /// else both /run/cuslice/gpu and /dev/shm/cuslice/gpu).
    #[arg(long)]
    gpu_dir: Option<PathBuf>,
    /// A container's memory segment file (repeatable; default: every
    /// */memory.seg under --containers-root, and /dev/shm/cuslice/memory.seg).
    #[arg(long = "memory-segment")]
    memory: Vec<PathBuf>,
    /// Directory holding one directory per container.
    #[arg(long)]
    containers_root: Option<PathBuf>,
}

impl SourceArgs {
    /// The sources; a segment file named on the command line must exist
    /// (a typo would otherwise read as a tenant with nothing on it).
    /// Directories need not: a containers root or GPU directory appears
    /// with the first container or tenant.
    fn sources(self) -> Result<view::Sources, String> {
        if let Some(m) = self.memory.iter().find(|m| !m.is_file()) {
            return Err(format!("--memory-segment {}: no such file", m.display()));
        }
        Ok(view::Sources::resolve(
            self.gpu_dir,
            self.memory,
            self.containers_root,
        ))
    }
}

fn candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("CUSLICE_LIB") {
        v.push(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        v.push(dir.join("libcuslice.so"));
        v.push(dir.join("../lib/cuslice/libcuslice.so"));
    }
    v.push(PathBuf::from("/usr/lib/cuslice/libcuslice.so"));
    v
}

fn find_lib(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("--lib {}: no such file", p.display()))
        };
    }
    let c = candidates();
    c.iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            let tried: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
            format!(
                "cannot find libcuslice.so (tried {}); pass --lib or set CUSLICE_LIB",
                tried.join(", ")
            )
        })
}

/// A number of seconds from `lo` to `hi`: a finite decimal, never NaN,
/// an infinity or a negative value quietly clamped into range.
fn seconds_in(s: &str, lo: f64, hi: f64) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a number of seconds from {lo} to {hi}, got {s:?}"
        )),
    }
}

fn status_interval(s: &str) -> Result<f64, String> {
    seconds_in(s, 0.0, 3600.0)
}

fn top_interval(s: &str) -> Result<f64, String> {
    seconds_in(s, 0.1, 3600.0)
}

fn linger_seconds(s: &str) -> Result<f64, String> {
    seconds_in(s, 0.0, 86400.0)
}

/// `--gpu` as CUDA_VISIBLE_DEVICES: GPU indices or UUIDs separated by
/// commas, each GPU once, written without the spaces CUDA would stop at.
fn check_gpus(s: &str) -> Result<String, String> {
    let bad =
        || format!("--gpu {s:?}: expected GPU indices or UUIDs separated by commas, like 0 or 0,1");
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for g in s.split(',').map(str::trim) {
        // Indices in plain decimal; a UUID as given (GPU- or MIG-).
        let (key, text) = if !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) {
            let i: u32 = g.parse().map_err(|_| bad())?;
            (i.to_string(), i.to_string())
        } else if let Ok(u) = config::parse_uuid(g) {
            (config::format_uuid(&u), g.to_string())
        } else {
            return Err(bad());
        };
        if seen.contains(&key) {
            return Err(format!(
                "--gpu {s:?}: expected each GPU once, got {g:?} twice"
            ));
        }
        seen.push(key);
        out.push(text);
    }
    Ok(out.join(","))
}

/// The quota file of `cuslice run` for process `pid`: its own tenant,
/// slice (`run-<run_dir>`, the run directory's name: unique per session,
/// where two sessions in different PID namespaces may have one PID, so
/// one tenant name) and memory segment directory, the host's GPU segment
/// directory (`gpu_dir`, None: the default), the limits; `quota` (where it
/// will be written) names it in errors.
fn run_quota(
    pid: u32,
    run_dir: &str,
    segment_dir: &Path,
    gpu_dir: Option<&Path>,
    top: config::QuotaFile,
    all: config::Limits,
    quota: &Path,
) -> Result<String, String> {
    // A quota file holds text: a path that is not UTF-8 cannot be written
    // in one (lossy conversion would name another directory).
    let utf8 = |p: &Path, what: &str| {
        p.to_str().map(str::to_string).ok_or_else(|| {
            format!(
                "{what} {}: not UTF-8, cannot be written in a quota file",
                p.display()
            )
        })
    };
    let file = config::QuotaFile {
        tenant: Some(format!("run-{pid}")),
        slice: Some(format!("run-{run_dir}")),
        segment_dir: Some(utf8(segment_dir, "segment directory")?),
        gpu_segment_dir: gpu_dir
            .map(|d| utf8(d, "CUSLICE_GPU_SEGMENT_DIR"))
            .transpose()?,
        all,
        ..top
    };
    file.render(
        &format!("written by `cuslice run` for process {pid}"),
        quota,
    )
    .map(|(text, _)| text)
    .map_err(|e| e.to_string())
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Runs the program to its end, forwarding SIGINT/SIGTERM/SIGHUP/SIGQUIT to
/// it; returns its exit status.
///
/// `run` is a child subreaper: a descendant orphaned by its parent is
/// reparented to it, not to init, so that every process the program starts
/// stays a descendant of `run` (which is how `cuslice watch` finds the
/// session's processes, whatever their environment). Such orphans are
/// reaped as they end; the status returned is still the program's own, and
/// `run` exits when the program does.
fn run_child(mut cmd: Command) -> Result<std::process::ExitStatus, String> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: installing a handler that only calls kill.
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "cuslice: cannot become a child subreaper ({}): orphaned processes of the program leave the session",
            std::io::Error::last_os_error()
        );
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let pid = child.id() as i32;
    CHILD.store(pid, Ordering::Relaxed);
    loop {
        let mut status = 0;
        // SAFETY: waitpid for any child into a local.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r == pid {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(format!("cannot wait for the program: {e}"));
            }
        }
        // Another pid: an orphan of the program, reaped.
    }
}

fn run(
    limits: limits::Limits,
    gpu: Option<String>,
    lib: Option<PathBuf>,
    argv: Vec<OsString>,
) -> Result<ExitCode, String> {
    let lib = find_lib(lib)?;
    let (prog, args) = argv.split_first().ok_or("no program given")?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(prog);
    cmd.args(args).env("LD_PRELOAD", &preload);
    if let Some(g) = &gpu {
        cmd.env("CUDA_VISIBLE_DEVICES", check_gpus(g)?);
    }
    let (top, all) = limits::to_quota(&limits, &limits::FLAGS)?;
    if all.is_empty() {
        // No limits: the program simply runs under the shim.
        let err = cmd.exec();
        return Err(format!("cannot run {}: {err}", prog.to_string_lossy()));
    }
    // The shim prefers a mounted quota file to every other: the limits
    // given here would not apply. Refused rather than run under other limits.
    if Path::new(config::DEFAULT_CONFIG_PATH).exists() {
        return Err(format!(
            "{} exists and is authoritative (a container's or the host's quota file): the limits given here would not apply; run the program without limit flags to use that file's",
            config::DEFAULT_CONFIG_PATH
        ));
    }
    // A private directory for the quota file and the memory segment, made
    // exclusively under an unpredictable name, held open (the watch finds
    // it among this process's descriptors) and removed when the program
    // ends: the host file layer's run_dir.
    let dir = cuslice_host::run_dir::RunDir::create()?;
    // Each run is its own tenant; the GPU segment directory is the host's,
    // shared with every other tenant of the GPU. Empty counts as unset, as
    // for every variable the shim reads.
    let gpu_dir = std::env::var_os("CUSLICE_GPU_SEGMENT_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let name = dir
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("the run directory has no name")?
        .to_string();
    let paths = dir.slice_dir();
    let text = run_quota(
        std::process::id(),
        &name,
        &paths.segment_dir(),
        gpu_dir.as_deref(),
        top,
        all,
        &paths.quota(),
    )?;
    dir.make_segment_dir()?;
    let quota = dir.write_quota(&text)?;
    // The session's guarantee, registered before its program starts and
    // kept while this process lives (cuslice_host::guarantee).
    let cfg = config::parse_file(&quota, &text).map_err(|e| e.to_string())?;
    let visible = gpu
        .as_deref()
        .map(str::to_string)
        .or_else(|| std::env::var("CUDA_VISIBLE_DEVICES").ok());
    let held = register_run_guarantee(&cfg, visible.as_deref())?;
    cmd.env("CUSLICE_CONFIG", &quota);
    let status = run_child(cmd);
    cuslice_host::guarantee::finish(&cfg, held);
    let status = status?;
    drop(dir);
    if let Some(code) = status.code() {
        return Ok(ExitCode::from(code as u8));
    }
    if let Some(sig) = status.signal() {
        // Die the same way, so the caller sees the signal.
        // SAFETY: restoring the default action and re-raising.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return Ok(ExitCode::from(128 + sig as u8));
    }
    Ok(ExitCode::FAILURE)
}

/// Registers a session's memory guarantee on the GPUs its program will
/// see (`visible`: `CUDA_VISIBLE_DEVICES` as given, host indices or UUIDs;
/// None: every GPU) in their memory pools, checked against NVML's memory:
/// one that cannot fit beside the others is refused in one line. Where
/// NVML cannot be loaded nothing is registered: the program's first
/// process registers it (docs/memory-quota.md).
fn register_run_guarantee(
    cfg: &config::Config,
    visible: Option<&str>,
) -> Result<Vec<cuslice_host::guarantee::Registration>, String> {
    if !cfg.has_memory() {
        return Ok(vec![]);
    }
    let Ok(nvml) = cuslice_host::gpu::nvml::Nvml::open() else {
        return Ok(vec![]);
    };
    let picked = |index: u32, uuid: &str| match visible {
        None => true,
        Some(list) => list.split(',').map(str::trim).any(|v| {
            v.parse::<u32>().is_ok_and(|i| i == index)
                || (v.starts_with("GPU-") && uuid.starts_with(v))
        }),
    };
    let mut gpus = vec![];
    for d in nvml.devices()? {
        if !picked(d.index, &d.uuid) {
            continue;
        }
        let total = nvml
            .memory_total(&d)
            .map_err(|e| format!("GPU {}: cannot read its memory through NVML: {e}", d.index))?;
        let uuid = config::parse_uuid(&d.uuid)
            .map_err(|e| format!("NVML's GPU {} UUID {:?}: {e}", d.index, d.uuid))?;
        gpus.push(cuslice_host::guarantee::GpuMemory {
            index: d.index,
            uuid,
            total,
        });
    }
    let held = match cuslice_host::guarantee::register(
        &cfg.gpu_segment_dir,
        cfg,
        &gpus,
        cuslice_core::pool::Maker::Process,
        None,
    ) {
        Ok(h) => h,
        // A pool file this user cannot use (another user's in a shared
        // /dev/shm): the program's shim applies its own rule to it (a
        // tenant that may burst or wait is refused CUDA naming the file,
        // one that may not runs on under its quota), said here once.
        Err(e) if e.starts_with(cuslice_host::guarantee::UNUSABLE) => {
            eprintln!(
                "cuslice: warning: the session's memory guarantee is not registered ahead: {}",
                cuslice_host::text::clean_to(&e, cuslice_host::text::LINE_MAX)
            );
            vec![]
        }
        Err(e) => return Err(format!("the session's memory guarantee: {e}")),
    };
    for line in held.iter().filter_map(|r| r.pending_line()) {
        eprintln!(
            "cuslice: warning: {}",
            cuslice_host::text::clean_to(&line, cuslice_host::text::LINE_MAX)
        );
    }
    Ok(held)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The host's side maps segments that tenants can write (and truncate):
    // a truncated one voids a reading, never this process.
    if let Err(e) = cuslice_core::sigbus::guard() {
        eprintln!("cuslice: {e}");
        return ExitCode::from(125);
    }
    let result = match cli.cmd {
        Cmd::Lib => find_lib(None).map(|p| {
            println!("{}", p.display());
            ExitCode::SUCCESS
        }),
        Cmd::Run {
            limits,
            gpu,
            lib,
            cmd,
        } => run(limits, gpu, lib, cmd),
        Cmd::Status {
            src,
            json,
            interval,
            linger,
        } => src.sources().and_then(|sources| {
            let mut obs = view::Viewer::new(sources, linger);
            let mut snap = obs.read();
            if interval > 0.0 {
                std::thread::sleep(std::time::Duration::from_secs_f64(interval.min(3600.0)));
                snap = obs.read();
            }
            if json {
                let j = serde_json::to_string_pretty(&snap)
                    .map_err(|e| format!("cannot encode JSON: {e}"))?;
                println!("{j}");
            } else {
                use std::io::IsTerminal as _;
                let tty = std::io::stdout().is_terminal();
                // On a terminal, its width; into a file or a pipe, whole
                // lines.
                let width = crossterm::terminal::size()
                    .ok()
                    .filter(|_| tty)
                    .map_or(usize::MAX, |(w, _)| usize::from(w));
                print!(
                    "{}{}",
                    top::text(&frame::frame(&snap, "cuslice status", width, false), tty),
                    frame::details(&snap)
                );
            }
            Ok(if snap.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }),
        Cmd::Top {
            src,
            interval,
            once,
            linger,
        } => src
            .sources()
            .and_then(|s| top::run(view::Viewer::new(s, linger), interval, once))
            .map(|()| ExitCode::SUCCESS),
        Cmd::Exporter {
            src,
            listen,
            linger,
        } => src
            .sources()
            .and_then(|s| exporter::serve(&listen, view::Viewer::new(s, linger)))
            .map(|()| ExitCode::SUCCESS),
        Cmd::Watch { args } => watch::run(args).map(|()| ExitCode::SUCCESS),
        Cmd::Resize { args } => resize::resize(&args).map(|lines| {
            for l in lines {
                println!(
                    "{}",
                    cuslice_host::text::clean_to(&l, cuslice_host::text::LINE_MAX)
                );
            }
            ExitCode::SUCCESS
        }),
        Cmd::Health { args } => health::run(args).map(|()| ExitCode::SUCCESS),
        Cmd::OciHook {
            stage,
            root,
            lib,
            claim,
        } => {
            let a = oci::HookArgs { root, lib, claim };
            match stage {
                HookStage::Create => oci::create(&a),
                HookStage::Poststop => oci::poststop(&a),
            }
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| format!("oci-hook: {e}"))
        }
        Cmd::Cdi {
            cmd:
                CdiCmd::Generate {
                    output,
                    cuslice,
                    root,
                    lib,
                },
        } => cdi_spec(&cuslice, root.as_deref(), lib.as_deref()).and_then(|spec| match output {
            Some(p) => std::fs::write(&p, spec)
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| format!("{}: {e}", p.display())),
            None => {
                print!("{spec}");
                Ok(ExitCode::SUCCESS)
            }
        }),
    };
    match result {
        Ok(c) => c,
        Err(e) => {
            // One line whatever the error holds: the OCI hook's go to the
            // runtime's log and name what the container's spec says.
            eprintln!(
                "cuslice: {}",
                cuslice_host::text::clean_to(&e, cuslice_host::text::LINE_MAX)
            );
            ExitCode::from(125)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN_DIR: &str = "cuslice-run-42-0123456789abcdef";

    fn limits() -> (config::QuotaFile, config::Limits) {
        let l = limits::Limits {
            memory: Some("1GiB".into()),
            compute_max: Some("40".into()),
            compute_burst_ms: Some("300".into()),
            ..limits::Limits::default()
        };
        limits::to_quota(&l, &limits::FLAGS).expect("valid limits")
    }

    #[test]
    fn the_run_quota_file_keeps_unusual_paths_as_they_are() {
        // Quotes, backslashes, control characters (Rust's `{:?}` writes
        // \u{1b}, which is not TOML), tabs, non-ASCII.
        let seg = Path::new("/tmp/a \"b\" \\ c\u{1b}\u{7f}é\tx/segment");
        let gpu = Path::new("/tmp/gpu's\ndir");
        let (top, all) = limits();
        let q = Path::new("/run/q.toml");
        let text = run_quota(42, RUN_DIR, seg, Some(gpu), top, all, q).expect("written");
        let c = config::parse_file(q, &text).expect("parses");
        assert_eq!(
            c.slice.as_deref(),
            Some("run-cuslice-run-42-0123456789abcdef")
        );
        assert_eq!(c.segment_dir, seg);
        assert_eq!(c.gpu_segment_dir, gpu);
        assert_eq!(c.tenant.as_deref(), Some("run-42"));
        assert_eq!(c.all.memory, Some(1 << 30));
        assert_eq!(c.all.compute_max, Some(40));
        assert_eq!(c.compute_burst_ms, Some(300));
        assert!(text.starts_with("# written by `cuslice run` for process 42\n"));
        // Without a GPU directory, the shim's default.
        let (top, all) = limits();
        let text = run_quota(7, RUN_DIR, seg, None, top, all, q).expect("written");
        let c = config::parse_file(q, &text).expect("parses");
        assert_eq!(
            c.gpu_segment_dir,
            Path::new(config::DEFAULT_GPU_SEGMENT_DIR)
        );
    }

    #[test]
    fn memory_max_and_memory_wait_flags_reach_the_run_quota_file_or_are_refused_in_one_line() {
        let l = limits::Limits {
            memory: Some("2GiB".into()),
            memory_max: Some("6GiB".into()),
            memory_wait: Some("30s".into()),
            ..limits::Limits::default()
        };
        let (top, all) = limits::to_quota(&l, &limits::FLAGS).expect("valid");
        let q = Path::new("/run/q.toml");
        let seg = Path::new("/tmp/seg");
        let text = run_quota(9, RUN_DIR, seg, None, top, all, q).expect("written");
        let c = config::parse_file(q, &text).expect("parses");
        assert_eq!(
            (c.all.memory, c.all.memory_max),
            (Some(2 << 30), Some(6 << 30))
        );
        assert_eq!(c.memory_wait_ms, Some(30_000));
        let bad = |l: limits::Limits| limits::to_quota(&l, &limits::FLAGS).expect_err("refused");
        let e = bad(limits::Limits {
            memory_max: Some("6GiB".into()),
            ..limits::Limits::default()
        });
        assert_eq!(
            e,
            "--memory-max \"6GiB\": only applies with --memory (the guarantee it may burst past)"
        );
        let e = bad(limits::Limits {
            memory: Some("8GiB".into()),
            memory_max: Some("6GiB".into()),
            ..limits::Limits::default()
        });
        assert!(
            e.starts_with("--memory-max \"6GiB\": expected from --memory"),
            "{e}"
        );
        let e = bad(limits::Limits {
            memory: Some("8GiB".into()),
            memory_wait: Some("soon".into()),
            ..limits::Limits::default()
        });
        assert!(
            e.starts_with("--memory-wait \"soon\": expected a duration"),
            "{e}"
        );
        let e = bad(limits::Limits {
            compute: Some("50".into()),
            memory_wait: Some("5s".into()),
            ..limits::Limits::default()
        });
        assert!(e.contains("only applies with --memory"), "{e}");
    }

    #[test]
    fn a_run_quota_file_the_shim_would_refuse_is_not_written() {
        let (top, all) = limits();
        let q = Path::new("/run/q.toml");
        let e = run_quota(
            1,
            RUN_DIR,
            Path::new("/s"),
            Some(Path::new("gpu")),
            top,
            all,
            q,
        )
        .expect_err("relative");
        assert_eq!(
            e,
            "/run/q.toml: gpu_segment_dir: expected an absolute path like /run/cuslice/abc, got \"gpu\""
        );
        use std::os::unix::ffi::OsStrExt;
        let (top, all) = limits();
        let bad = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xff"));
        let e = run_quota(1, RUN_DIR, bad, None, top, all, q).expect_err("not UTF-8");
        assert_eq!(
            e,
            "segment directory /tmp/\u{fffd}: not UTF-8, cannot be written in a quota file"
        );
    }
}
