//! The health source: one thread per long-running process (`cuslice
//! watch`, `cuslice health follow`, the DRA plugin) that keeps every GPU's
//! judge. Event-driven, no busy polling:
//!
//! - it sleeps in NVML's `nvmlEventSetWait_v2` (XID and double-bit ECC
//!   events of every GPU, one set) for at most `poll` (5 s by default);
//! - an event is judged at once, and its GPU asked at once whether it is
//!   alive and how its memory is;
//! - every `poll` each GPU is asked whether it is alive (one
//!   `nvmlDeviceGetMemoryInfo`: a GPU that fell off the bus without an
//!   event is seen within a poll);
//! - every `check` (30 s by default) each GPU's memory is checked
//!   (retired pages pending, remapped rows, the uncorrectable ECC count);
//! - at every wake it applies the operators' clears (`clear.json`, read
//!   again only when it changed: one `fstatat` a wake), lets quiet periods
//!   pass and reports each change once; where it holds the health lock
//!   (one publisher per host), it writes `state.json` at each change and
//!   at least every `check` (a reader knows it is up).
//!
//! So 8 GPUs cost, every 5 s, one wake, 8 cheap NVML calls and a `stat`,
//! and every 30 s 24 more calls and a small file write (docs/benchmarks/
//! has the measure on a GPU).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::file::{self, GpuHealth, Published};
use super::judge::{Change, Check, Judge, State};
use super::probe;
use crate::fs::Dir;
use crate::gpu::nvml::{DeviceHandle, EventSet, HEALTH_EVENTS, Nvml};
use crate::layout::Layout;

/// How long the source waits for an event before it asks each GPU
/// whether it is alive.
pub const DEFAULT_POLL: Duration = Duration::from_secs(5);
/// How often it checks each GPU's memory.
pub const DEFAULT_CHECK: Duration = Duration::from_secs(30);
/// How long nothing must be seen before a GPU returns to service.
pub const DEFAULT_QUIET: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The hook's root (`/run/cuslice`): `health/` below it.
    pub root: PathBuf,
    /// Who runs it, as published: `cuslice watch`, `cuslice-dra-plugin`.
    pub writer: String,
    pub poll: Duration,
    pub check: Duration,
    pub quiet: Duration,
}

/// The bounds of each setting: a poll from 0.1 s to 60 s, a check from
/// 0.1 s to 1 h, a quiet period from 1 s to 7 days.
pub const POLL_BOUNDS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(60));
pub const CHECK_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
pub const QUIET_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(7 * 86_400));

/// `5s`, `300`, `500ms`, `10m`, `1h`, `1d` (a bare number is seconds),
/// from `bounds.0` to `bounds.1`. The error says what was expected.
pub fn parse_duration(s: &str, bounds: (Duration, Duration)) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = [
        ("ms", 1e-3),
        ("s", 1.0),
        ("m", 60.0),
        ("h", 3600.0),
        ("d", 86_400.0),
    ]
    .iter()
    .find_map(|(u, k)| t.strip_suffix(u).map(|n| (n, *k)))
    .unwrap_or((t, 1.0));
    let bad = || {
        format!(
            "expected a duration from {} to {} (like 5s, 500ms, 10m, 1h), got {s:?}",
            show(bounds.0),
            show(bounds.1)
        )
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(bad)?;
    let d = Duration::from_secs_f64((v * scale).min(1e9));
    if d < bounds.0 || d > bounds.1 {
        return Err(bad());
    }
    Ok(d)
}

/// A duration as `parse_duration` reads it back.
fn show(d: Duration) -> String {
    if d.subsec_millis() != 0 || d.as_secs() == 0 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

impl Config {
    pub fn new(root: impl Into<PathBuf>, writer: &str) -> Config {
        Config {
            root: root.into(),
            writer: writer.into(),
            poll: DEFAULT_POLL,
            check: DEFAULT_CHECK,
            quiet: DEFAULT_QUIET,
        }
    }

    /// One line: the cadence.
    pub fn describe(&self) -> String {
        format!(
            "XID events waited for, each GPU asked every {}s, its memory checked every {}s, back in service after {}s quiet",
            secs(self.poll),
            secs(self.check),
            secs(self.quiet)
        )
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

/// A GPU's health changed.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuChange {
    pub index: u32,
    pub uuid: String,
    pub change: Change,
    /// It was an operator's clear.
    pub cleared: bool,
    /// The quiet period, seconds (for the line).
    pub quiet_seconds: f64,
}

impl GpuChange {
    /// `GPU 0 (GPU-...): healthy -> unhealthy: XID 79: the GPU has fallen
    /// off the bus`.
    pub fn line(&self) -> String {
        let (from, to) = (&self.change.from, &self.change.to);
        let why = match (&to.reason, self.cleared) {
            (Some(r), _) => r.clone(),
            (None, true) => "cleared by an operator".into(),
            (None, false) => format!(
                "nothing seen for the quiet period ({}s)",
                self.quiet_seconds
            ),
        };
        let lost = if to.lost { " (lost)" } else { "" };
        if from.state == to.state {
            // Another cause (or lost now) at the same state.
            return format!(
                "GPU {} ({}): still {}{lost}, now: {why}",
                self.index, self.uuid, to.state
            );
        }
        format!(
            "GPU {} ({}): {} -> {}{lost}: {why}",
            self.index, self.uuid, from.state, to.state
        )
    }
}

/// What the source tells its process.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// A GPU's health changed (once per change).
    Change(GpuChange),
    /// Something to log once: how it started, what it cannot do.
    Note(String),
}

struct Shared {
    stop: AtomicBool,
    gpus: Mutex<Vec<GpuHealth>>,
    publisher: Mutex<Publisher>,
}

/// Where and whether this source publishes.
struct Publisher {
    dir: Option<Dir>,
    /// The health lock, while this source holds it.
    lock: Option<std::fs::File>,
    /// Stopped: nothing more is written.
    closed: bool,
    head: Published,
}

impl Publisher {
    fn write(&mut self, gpus: &[GpuHealth], now: f64, running: bool) -> Result<(), String> {
        let (Some(dir), Some(_)) = (&self.dir, &self.lock) else {
            return Ok(());
        };
        if self.closed {
            return Ok(());
        }
        self.head.gpus = gpus.to_vec();
        self.head.updated_unix = now;
        self.head.running = running;
        file::write(dir, &self.head)
    }

    /// Takes the lock if free; a line where this source starts publishing.
    fn try_take(&mut self) -> Option<String> {
        if self.lock.is_some() {
            return None;
        }
        let dir = self.dir.as_ref()?;
        match file::try_lock(dir) {
            Ok(Some(l)) => {
                self.lock = Some(l);
                Some(format!(
                    "publishing GPU health in {}",
                    dir.join(crate::layout::HEALTH_STATE).display()
                ))
            }
            Ok(None) => None,
            Err(e) => Some(format!("cannot take the health lock: {e}")),
        }
    }
}

/// A running health source. Dropping it stops it (at its next wake).
pub struct Source {
    shared: Arc<Shared>,
}

pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

type Sink = Box<dyn FnMut(Report) + Send>;

impl Source {
    /// Opens NVML, registers every GPU for its events, takes up what a
    /// source published before (a GPU out of service stays out), asks
    /// every GPU once, and starts the thread. `report` is called from it
    /// (and from here, for the first notes). The error is one line: NVML
    /// cannot be loaded or lists no GPU.
    pub fn start(cfg: Config, mut report: Sink) -> Result<Source, String> {
        let layout = Layout::new(&cfg.root);
        let nvml = Arc::new(Nvml::open()?);
        let devices = nvml.devices()?;
        let quiet = cfg.quiet.as_secs_f64();
        let now = now_unix();
        let before = match file::read(&layout) {
            Ok(p) => p,
            Err(e) => {
                report(Report::Note(format!(
                    "cannot take up the health published before ({e}): every GPU starts healthy"
                )));
                None
            }
        };
        let mut gpus: Vec<GpuHealth> = devices
            .iter()
            .map(|d| {
                let mut judge = before
                    .as_ref()
                    .and_then(|p| p.gpu(&d.uuid))
                    .map(|g| g.judge.clone())
                    .unwrap_or_else(|| Judge::new(now, quiet));
                judge.quiet_seconds = quiet;
                GpuHealth {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    events: false,
                    judge,
                }
            })
            .collect();
        let set = match nvml.event_set() {
            Ok(mut set) => {
                for (d, g) in devices.iter().zip(gpus.iter_mut()) {
                    let r = set.register(d, HEALTH_EVENTS);
                    g.events = r.is_ok();
                    if let Err(e) = &r {
                        report(Report::Note(format!(
                            "GPU {} ({}): its XID events cannot be watched ({}: {}); it is still asked every {}s",
                            d.index,
                            d.uuid,
                            Check::Events.call(),
                            e.text,
                            secs(cfg.poll)
                        )));
                    }
                    g.judge.observe(&probe::registered(r), now);
                }
                Some(set)
            }
            Err(e) => {
                report(Report::Note(format!(
                    "cannot make an NVML event set ({}): XID events are not watched; every GPU is still asked every {}s",
                    e.text,
                    secs(cfg.poll)
                )));
                None
            }
        };
        for (d, g) in devices.iter().zip(gpus.iter_mut()) {
            look(&nvml, d, &mut g.judge, now);
            g.judge.settle(now);
        }
        let dir = match file::keep_dir(&layout) {
            Ok(d) => Some(d),
            Err(e) => {
                report(Report::Note(format!(
                    "cannot keep the health directory ({e}): GPU health is not published"
                )));
                None
            }
        };
        let mut publisher = Publisher {
            dir,
            lock: None,
            closed: false,
            head: Published {
                writer: cfg.writer.clone(),
                pid: std::process::id(),
                running: true,
                started_unix: now,
                updated_unix: now,
                poll_seconds: cfg.poll.as_secs_f64(),
                check_seconds: cfg.check.as_secs_f64(),
                quiet_seconds: quiet,
                gpus: vec![],
            },
        };
        if let Some(n) = publisher.try_take() {
            report(Report::Note(n));
        }
        if let Err(e) = publisher.write(&gpus, now, true) {
            report(Report::Note(e));
        }
        report(Report::Note(format!(
            "{} GPU{}: {}",
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" },
            cfg.describe()
        )));
        for g in &gpus {
            let h = g.judge.health();
            if h.state != State::Healthy {
                report(Report::Note(format!(
                    "GPU {} ({}): {} since {}",
                    g.index,
                    g.uuid,
                    h.describe(),
                    super::judge::utc(h.since_unix)
                )));
            }
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            gpus: Mutex::new(gpus.clone()),
            publisher: Mutex::new(publisher),
        });
        let s = shared.clone();
        let clears = lock(&shared.publisher)
            .dir
            .as_ref()
            .and_then(|d| d.try_clone().ok());
        std::thread::Builder::new()
            .name("cuslice-health".into())
            .spawn(move || {
                run(
                    &cfg,
                    &layout,
                    clears.as_ref(),
                    &nvml,
                    &devices,
                    set,
                    gpus,
                    &s,
                    report,
                )
            })
            .map_err(|e| format!("cannot start the health thread: {e}"))?;
        Ok(Source { shared })
    }

    /// Every GPU's health now.
    pub fn gpus(&self) -> Vec<GpuHealth> {
        lock(&self.shared.gpus).clone()
    }

    /// Stops it: nothing more is reported or written but, where it
    /// publishes, that it stopped (readers then stop trusting the file).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let gpus = self.gpus();
        let mut p = lock(&self.shared.publisher);
        let _ = p.write(&gpus, now_unix(), false);
        p.closed = true;
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Asks GPU `d` whether it is alive and how its memory is.
fn look(nvml: &Nvml, d: &DeviceHandle, j: &mut Judge, now: f64) -> Vec<Change> {
    let mut out = vec![];
    out.extend(j.observe(&probe::alive(nvml, d), now));
    for i in probe::checks(nvml, d) {
        out.extend(j.observe(&i, now));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run(
    cfg: &Config,
    layout: &Layout,
    clears_dir: Option<&Dir>,
    nvml: &Nvml,
    devices: &[DeviceHandle],
    set: Option<EventSet>,
    mut gpus: Vec<GpuHealth>,
    shared: &Shared,
    mut report: Sink,
) {
    let poll_ms = u32::try_from(cfg.poll.as_millis()).unwrap_or(u32::MAX);
    let mut next_alive = Instant::now() + cfg.poll;
    let mut next_check = Instant::now() + cfg.check;
    let mut last_write = Instant::now();
    let mut said: Option<String> = None;
    let mut said_clears: Option<String> = None;
    let mut said_write: Option<String> = None;
    // The clears file as last read (device, inode, size, mtime): read again
    // only when it changed (one fstatat a wake).
    let mut clears_seen: Option<(u64, u64, i64, i64, i64)> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let waited_from = Instant::now();
        let waited = match &set {
            Some(s) => s.wait(poll_ms),
            None => {
                std::thread::sleep(cfg.poll);
                Ok(None)
            }
        };
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let now = now_unix();
        let mut changes: Vec<(usize, Change, bool)> = vec![];
        let record = |i: usize, c: Option<Change>, cleared: bool, changes: &mut Vec<_>| {
            if let Some(c) = c {
                changes.push((i, c, cleared));
            }
        };
        match waited {
            Ok(Some(ev)) => {
                if let Some(i) = devices.iter().position(|d| d.index == ev.index) {
                    if let Some(input) = probe::event(&ev) {
                        let c = gpus[i].judge.observe(&input, now);
                        record(i, c, false, &mut changes);
                    }
                    for c in look(nvml, &devices[i], &mut gpus[i].judge, now) {
                        record(i, Some(c), false, &mut changes);
                    }
                }
                said = None;
            }
            Ok(None) => said = None,
            Err(e) => {
                let line = format!(
                    "waiting for XID events failed ({}): every GPU is asked now",
                    e.text
                );
                if said.as_deref() != Some(line.as_str()) {
                    report(Report::Note(line.clone()));
                    said = Some(line);
                }
                next_alive = Instant::now();
                // A wait that fails at once must not spin.
                let spent = waited_from.elapsed();
                if spent < cfg.poll {
                    std::thread::sleep(cfg.poll - spent);
                }
            }
        }
        let at = Instant::now();
        if at >= next_alive {
            for (i, d) in devices.iter().enumerate() {
                let c = gpus[i].judge.observe(&probe::alive(nvml, d), now);
                record(i, c, false, &mut changes);
            }
            next_alive = at + cfg.poll;
        }
        if at >= next_check {
            for (i, d) in devices.iter().enumerate() {
                for inp in probe::checks(nvml, d) {
                    let c = gpus[i].judge.observe(&inp, now);
                    record(i, c, false, &mut changes);
                }
            }
            next_check = at + cfg.check;
            if let Some(n) = lock(&shared.publisher).try_take() {
                report(Report::Note(n));
            }
        }
        let seen = clears_dir
            .and_then(|d| d.stat(crate::layout::HEALTH_CLEARS).ok())
            .map(|st| {
                (
                    st.st_dev,
                    st.st_ino,
                    st.st_size,
                    st.st_mtime,
                    st.st_mtime_nsec,
                )
            });
        if seen.is_some() && seen != clears_seen {
            match file::read_clears(layout) {
                Ok(clears) => {
                    said_clears = None;
                    clears_seen = seen;
                    for (i, g) in gpus.iter_mut().enumerate() {
                        if let Some(&at) = clears.get(&g.uuid) {
                            let c = g.judge.clear(at, now);
                            record(i, c, true, &mut changes);
                        }
                    }
                }
                Err(e) => {
                    if said_clears.as_deref() != Some(e.as_str()) {
                        report(Report::Note(format!("the operators' clears: {e}")));
                        said_clears = Some(e);
                    }
                }
            }
        }
        for (i, g) in gpus.iter_mut().enumerate() {
            let c = g.judge.settle(now);
            record(i, c, false, &mut changes);
        }
        // What a report's receiver reads (`Source::gpus`) is the health
        // that made the change.
        *lock(&shared.gpus) = gpus.clone();
        // Written at a change, else every `check` (its heartbeat: a reader
        // trusts it for two of them, `Published::fresh`); before the change
        // is reported, so that whoever sees the line finds the file saying
        // so (a test under load read the file between the two).
        if !changes.is_empty() || last_write.elapsed() + Duration::from_millis(100) >= cfg.check {
            let r = lock(&shared.publisher).write(&gpus, now, true);
            match r {
                Ok(()) => said_write = None,
                Err(e) if said_write.as_deref() != Some(e.as_str()) => {
                    report(Report::Note(e.clone()));
                    said_write = Some(e);
                }
                Err(_) => {}
            }
            last_write = Instant::now();
        }
        for (i, change, cleared) in changes.iter().cloned() {
            report(Report::Change(GpuChange {
                index: gpus[i].index,
                uuid: gpus[i].uuid.clone(),
                change,
                cleared,
                quiet_seconds: cfg.quiet.as_secs_f64(),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_unit_within_bounds() {
        let b = QUIET_BOUNDS;
        assert_eq!(parse_duration("300", b), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5m", b), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration(" 1h ", b), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d", b), Ok(Duration::from_secs(172_800)));
        assert_eq!(
            parse_duration("500ms", POLL_BOUNDS),
            Ok(Duration::from_millis(500))
        );
        for bad in ["", "-1", "5 fortnights", "0.5s", "8d", "nan"] {
            assert_eq!(
                parse_duration(bad, b),
                Err(format!(
                    "expected a duration from 1s to 604800s (like 5s, 500ms, 10m, 1h), got {bad:?}"
                )),
                "{bad}"
            );
        }
        assert_eq!(
            parse_duration("50ms", POLL_BOUNDS),
            Err(
                "expected a duration from 100ms to 60s (like 5s, 500ms, 10m, 1h), got \"50ms\""
                    .into()
            )
        );
    }

    #[test]
    fn a_change_is_one_line_saying_why() {
        let from = crate::gpu::health::Health::healthy(0.0);
        let mut j = Judge::new(0.0, 300.0);
        let c = j
            .observe(&crate::gpu::health::Input::Xid(79), 1.0)
            .expect("a change");
        let g = GpuChange {
            index: 0,
            uuid: "GPU-x".into(),
            change: c.clone(),
            cleared: false,
            quiet_seconds: 300.0,
        };
        assert_eq!(
            g.line(),
            "GPU 0 (GPU-x): healthy -> unhealthy (lost): XID 79: the GPU has fallen off the bus"
        );
        let back = GpuChange {
            change: Change {
                from: c.to.clone(),
                to: from.clone(),
            },
            ..g.clone()
        };
        assert_eq!(
            back.line(),
            "GPU 0 (GPU-x): unhealthy -> healthy: nothing seen for the quiet period (300s)"
        );
        assert_eq!(
            GpuChange {
                cleared: true,
                ..back
            }
            .line(),
            "GPU 0 (GPU-x): unhealthy -> healthy: cleared by an operator"
        );
        let mut again = j.clone();
        let c = again
            .observe(
                &crate::gpu::health::Input::Failed(
                    Check::Alive,
                    crate::gpu::health::Failure {
                        code: 999,
                        text: "Unknown Error (999)".into(),
                    },
                ),
                400.0,
            )
            .expect("another cause");
        assert_eq!(
            GpuChange { change: c, ..g }.line(),
            "GPU 0 (GPU-x): still unhealthy, now: nvmlDeviceGetMemoryInfo fails: Unknown Error (999)"
        );
    }
}
