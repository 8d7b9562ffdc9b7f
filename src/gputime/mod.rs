//! GPU time as the GPU spent it: CUPTI's kernel activity records (the
//! meter). The compute path (`crate::compute`) calls in, one way: it asks
//! for probes (`want_probe`, `load_cupti`, `cancel_probe`), reads the
//! recording window (`window`) and whether ratios stand (`usable`); the
//! meter hands what it measures back through the `Sink` the compute path
//! gave it at `start` (kernel GPU time per device, probe boundaries).
//!
//! - `cupti`: loading libcupti, the calls made to it, detach and attach;
//! - `records`: CUPTI's buffers, read into GPU time (the union of a
//!   process's concurrent kernels counted once);
//! - `cadence`: when to probe and how long to rest (pure, unit-tested);
//! - `ratio`: the ratio estimate probes teach (pure, unit-tested);
//! - `thread`: the meter's thread that drives them (its state its own,
//!   `thread::Meter`; every word it shares with the program's threads and
//!   CUPTI's callbacks is in one static, `SHARED`, which says who writes
//!   and who reads each);
//! - `fronts`: the CUPTI entry points the shim exports in front of
//!   CUPTI's, to see a program use CUPTI itself.
//!
//!
//! Under time-slicing, a process whose work is in flight is not on the GPU
//! for most of that time: a decode loop beside a trainer is in flight
//! 67-77 % of the time while its kernels run 4.5 %
//! (docs/benchmarks/2026-11-24-h100-gpu-time-signals.md). Only CUPTI's
//! kernel records say when the GPU ran a process's kernels. But recording
//! costs every launch about a microsecond (more through PyTorch: a decode
//! loop's requests took ~15 % longer while recorded,
//! docs/benchmarks/2026-11-26-h200-decode-tail.md), so the meter records
//! only where the answer can change a decision, and then in **probes**:
//!
//! - A process that launches freely on a contended GPU is charged its wall
//!   time in flight (an upper bound of its GPU time) while that bound is
//!   well under its share: it is light either way, and nothing is recorded
//!   (two light services beside each other never pay for recording).
//! - Where the bound could make it heavy (in flight at least half its
//!   share over a demand window, or a busy stretch of `NEED_BUSY_NS`), the
//!   compute path asks for a probe (`want_probe`): the meter records kernels for
//!   `PROBE_NS`, then rests for `REST_NS` before the next. During a probe
//!   the process is charged its kernels' GPU time from the records; at its
//!   end the compute path learns the ratio of GPU time to wall time in flight
//!   (`Sink::probe_end`), and until the ratio is stale it charges
//!   wall time in flight times that ratio. So recording costs a launch-bound
//!   loop a tenth of what it did; the price is that a change in a process's
//!   ratio (a decode server that turns into a batch job) is seen at the next
//!   probe, within about `PROBE_NS + REST_NS`.
//! - A steady process is probed less and less often: after a probe whose
//!   ratio agreed with the one before it (within a point or a quarter of
//!   it), the rest doubles, up to `REST_LONGEST_NS` (3.6 s). Each probe
//!   costs a launch-bound loop's requests time (re-attaching CUPTI, ~20 ms
//!   on an H100, and recording: the requests a probe fell in were the
//!   slowest); a decode server beside a trainer, 6 interleaved starts on
//!   one H100: p50 median 322 ms with a probe every second, 246 ms with
//!   lengthened rests, 252 ms for the native pair. A lengthened rest
//!   ends early (back to `REST_NS` after the probe) where the process's
//!   launches per time in flight move by more than 2x either way from the
//!   probe's (its kernels changed size: a decode loop that turns into a
//!   batch job is probed again within about `REST_NS`), or where the
//!   tenants competing for its GPU change (one starts or stops, or turns
//!   heavy or light: what its kernels get of the GPU changes with them).
//! - The meter only records in probes. (`CUSLICE_METER=continuous` and
//!   `always`, the experiments' recording all along, are gone: they are
//!   said to be ignored where set.)
//! - `libcupti` is the tenant's (`CUSLICE_CUPTI=<path>`, else the one the
//!   program already loaded, else `libcupti.so.13` / `.12` / `libcupti.so`
//!   on the search path or in the CUDA installation); `CUSLICE_CUPTI=off`
//!   turns the meter off. Without it, the shim charges wall time as before
//!   (and says so once).
//! - Alone under a ceiling, a process holding the lease that does not keep
//!   the GPU fed (a launch-bound loop) is probed the same way, so that its
//!   ceiling counts its kernels' GPU time, not its hold
//!   (`crate::compute`'s `hold_ppm`).
//! - CUPTI is loaded, and its callbacks registered, by the meter's thread
//!   the first time the process launches freely on a contended GPU, or
//!   holds the lease alone under a ceiling without keeping the GPU fed
//!   (`load_cupti`), not before: a process alone on its GPU otherwise never
//!   loads it (initialised, CUPTI costs every launch a little, and loading
//!   it takes milliseconds).
//! - At the program's exit, an exit handler registered when CUPTI is loaded
//!   (after the CUDA runtime's, so it runs first) has the meter's thread
//!   stop recording and detach CUPTI before the runtime destroys its
//!   contexts.
//! - A thread of ours flushes the records every `FLUSH_NS` while recording;
//!   the charges lag the GPU by about that much.
//! - The tenant's own profiler wins: when the program registers its own
//!   activity callbacks (`cuptiActivityRegisterCallbacks`, which the shim
//!   exports so that it sees the call), when a profiler is injected
//!   (`CUDA_INJECTION64_PATH`: Nsight), or when records stop coming while
//!   the process launches, the meter stops for good and the process is
//!   charged wall time again (said once, at info level).
//! - Between probes CUPTI is detached (the default;
//!   `CUSLICE_METER_DETACH=0` keeps it attached): once a probe's last records are in, the meter's thread
//!   detaches CUPTI from the process (`cuptiFinalize`, after a forced
//!   flush) and, before the next probe, registers its callbacks again. Why:
//!   on an H100, a PyTorch decode loop's requests stayed ~8-11 % slower for
//!   as long as CUPTI stayed attached after its activity API had been used
//!   (recording off), and were as fast as before once `cuptiFinalize`
//!   detached it; so a launch-bound tenant, attached between probes, pays
//!   for recording all the time its GPU is shared (on the GPU, a decode
//!   server beside a trainer: p99 median 323 ms detached, 364 ms attached,
//!   332 ms for the pair without cuslice; 6 starts each, no crash). A
//!   libcupti without `cuptiFinalize` stays attached (said once).
//!   `cuptiFinalize` detaches all of CUPTI, so the meter never detaches
//!   while the program uses CUPTI itself, as far as the shim can see it:
//!   its own activity callbacks (the meter steps aside altogether, above),
//!   or CUPTI's callback API (`cuptiSubscribe`, `cuptiSubscribe_v2`) or
//!   range profiler (`cuptiProfilerInitialize`), which the shim exports
//!   too, in front of CUPTI's: from the program's first call to one, the
//!   meter keeps
//!   probing but leaves CUPTI attached between probes (said once). Each
//!   check and detach is made under the lock those calls take before they
//!   reach CUPTI, so that nothing is detached from under them. (The
//!   program's calls to these exports go on to CUPTI's functions: those the
//!   dlsym hook found where it handed ours out, as for a libcupti opened
//!   privately, else the meter's library's, else the next definitions
//!   after ours.) Not
//!   covered: a program that reaches CUPTI only through other entry points
//!   (the event and metric, PM sampling, PC sampling or SASS metrics APIs,
//!   ...) would lose its session at the next detach
//!   (`CUSLICE_METER_DETACH=0` for such a program); and NVIDIA recommends
//!   calling `cuptiFinalize` from an API exit callback, while the meter
//!   calls it from its own thread, between probes, while the program may
//!   be launching.

mod cadence;
mod cupti;
mod fronts;
pub mod ratio;
mod records;
mod thread;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

pub use cadence::{PROBE_NS, REST_LONGEST_NS};
pub use cuslice_core::gpu::monotonic_ns as now_ns;
pub use fronts::front_for;

use cupti::Api;

/// What the meter measures goes to the compute path through this (given
/// at `start`; called on the meter's thread).
pub trait Sink: Sync {
    /// A probe begins: its counts start from zero.
    fn probe_begin(&self);
    /// The process's kernels ran on CUDA device `dev` from `start` to
    /// `end` (our clock), counted once.
    fn kernels(&self, dev: usize, start: u64, end: u64);
    /// A buffer of records was read: charge what `kernels` collected.
    fn flush(&self, now: u64);
    /// A probe's records are all in: its ratios are taken. Whether it
    /// measured something, and whether every ratio it measured agreed with
    /// the one before (steady: the meter may rest longer).
    fn probe_end(&self, now: u64) -> (bool, bool);
    /// Who competes for the process's GPUs (a number that changes when any
    /// of them does).
    fn competition(&self, now: u64) -> u64;
    /// The process's launches and time in flight so far (for the
    /// records-stopped check and the rest's guard).
    fn activity(&self) -> (u64, u64);
}

/// Every word the meter shares between threads, in one static: who writes
/// each and who reads it is said at the field. What only the meter's thread
/// uses is its own (`thread::Meter`, passed by `&mut`), not here.
///
/// - The launch and allocation paths (`window`, `recording`, `usable`,
///   `given_up`, `coming`, `want_probe`, `cancel_probe`, `load_cupti`,
///   `note_graph_launch`, `graphs_launched`) reach their words without a
///   lock: atomics, and `loaded`, a `OnceLock` read with one acquire load.
/// - CUPTI's buffer callbacks (`records`), which run on the driver's
///   threads, reach `loaded` the same way.
/// - Built in a const: nothing is allocated or initialised lazily, so a
///   call that comes back into the shim, an exit handler or a fork child
///   finds it whole (a fork child only marks `loaded` lost:
///   `after_fork_child`).
struct Shared {
    /// How the program uses CUPTI itself, as far as the shim sees it (bits,
    /// set once, never cleared): `PROFILES`, `CALLBACKS`, `GRAPHS`.
    /// Written by the launch path (`GRAPHS`) and the fronts (`PROFILES`,
    /// `CALLBACKS`, under `loading`); read by the launch path
    /// (`graphs_launched`), `start`, and the meter's thread (whether it
    /// steps aside, whether it keeps CUPTI attached).
    program: AtomicU8,
    /// Held while the meter loads CUPTI and registers its callbacks, and
    /// while the program's own registration makes the meter step aside:
    /// whichever comes second sees the first. Also held around each detach
    /// and attach between probes (`Loaded::detach`, `Loaded::attach`), and
    /// by the fronts before the program's calls reach CUPTI. Taken by the
    /// meter's thread and by the program's threads in the fronts; never by
    /// the launch or allocation paths.
    loading: Mutex<()>,
    /// The meter's thread runs (it loads CUPTI when first wanted). Written
    /// once by `start`; read by `coming` (the launch path) and the fronts.
    started: AtomicBool,
    /// CUPTI is to be loaded (the process's GPU was shared). Written by the
    /// launch path (`load_cupti`); read by the meter's thread until it is
    /// set.
    load: AtomicBool,
    /// When the process last asked for a probe (our clock; 0: never or
    /// cancelled). Written by the launch path (`want_probe`,
    /// `cancel_probe`); read by the meter's thread (`wanted`) and the
    /// launch path (`coming`). Kept outside `Loaded`, which exists only
    /// once CUPTI is loaded.
    wanted_at: AtomicU64,
    /// The next probe begins no sooner than this (our clock; the thread's
    /// cadence). Written by the meter's thread; read by `coming`.
    rest_until: AtomicU64,
    /// CUPTI, loaded, and the words of its recording (`Loaded`, which says
    /// who writes and reads each). Set once, by the meter's thread; read
    /// by everyone.
    loaded: OnceLock<Loaded>,
    /// The program exits (`thread::at_program_exit`): set by the exit
    /// handler; read by the meter's thread, which stops for it.
    exiting: AtomicBool,
    /// The meter's thread has stopped (for the exit, or for good). Set by
    /// the meter's thread; read by the exit handler, which waits for it.
    stopped: AtomicBool,
    /// For the exit report: written by the meter's thread, read by
    /// `summary` (the program's exit).
    report: Report,
    /// Where the program's calls to the fronts go on to. Written by the
    /// dlsym hook and the fronts, read by the fronts (the program's
    /// threads); the meter's thread never touches them.
    fronts: fronts::Fronts,
}

static SHARED: Shared = Shared {
    program: AtomicU8::new(0),
    loading: Mutex::new(()),
    started: AtomicBool::new(false),
    load: AtomicBool::new(false),
    wanted_at: AtomicU64::new(0),
    rest_until: AtomicU64::new(0),
    loaded: OnceLock::new(),
    exiting: AtomicBool::new(false),
    stopped: AtomicBool::new(false),
    report: Report {
        rests_longer: AtomicU64::new(0),
        rests_cut: AtomicU64::new(0),
        recorded_ns: AtomicU64::new(0),
        loading: Spent::new(),
        switching_on: Spent::new(),
        detaching: Spent::new(),
    },
    fronts: fronts::Fronts::new(),
};

/// `Shared::program`'s bits:
/// - `PROFILES`: the program registered its own activity callbacks (a
///   profiler): the meter steps aside for good (even before it started:
///   then it never starts);
/// - `CALLBACKS`: it called CUPTI's callback API (`cuptiSubscribe`, `_v2`)
///   or range profiler (`cuptiProfilerInitialize`): CUPTI is never
///   detached again (set under `loading`);
/// - `GRAPHS`: it launched a CUDA graph (`note_graph_launch`): CUPTI is
///   never detached again, and a holder alone under a ceiling is not
///   probed (`crate::compute`'s `hold_ppm`). On an H200 (driver 580,
///   PyTorch's CUPTI), a graph-replayed matmul loop alone under a 30 %
///   ceiling, probed while it held the lease and detached after each
///   probe, died with "unspecified launch failure" in 2 of 7 runs
///   (docs/benchmarks/2026-11-27-h200-s16.md); NVIDIA's CUPTI release
///   notes (12.4 Update 1) list "a crash when cuptiFinalize is used for
///   applications using CUDA Graph" as fixed, so older CUPTIs, the ones
///   frameworks ship, have it.
const PROFILES: u8 = 1;
const CALLBACKS: u8 = 2;
const GRAPHS: u8 = 4;

/// CUPTI, once the meter's thread loaded it, and the words of its
/// recording (`Shared::loaded`: set once, then shared).
struct Loaded {
    /// CUPTI's entry points (read-only: the meter's thread, the buffer
    /// callbacks, the fronts).
    api: Api,
    /// Where what is measured goes (read-only; called on the meter's
    /// thread and in the buffer callbacks).
    sink: &'static dyn Sink,
    /// The current or last recording: from `since` (our clock; kernels
    /// launched before are not in the records) to `until` (`u64::MAX`
    /// while it goes on: recording now). Written by the meter's thread
    /// (and `until` by the fronts when the program's profiler takes
    /// CUPTI); read by the launch path (`window`, `recording`) and the
    /// buffer callbacks (`since`).
    since: AtomicU64,
    until: AtomicU64,
    /// CUPTI's clock minus ours. Written by the meter's thread
    /// (`calibrate`); read by the buffer callbacks.
    offset: AtomicI64,
    /// Given up for good (the tenant's profiler took CUPTI, or CUPTI
    /// failed). Set by the meter's thread, the fronts
    /// (`program_registers`) and a fork child; read by everyone.
    lost: AtomicBool,
    /// Records seen (the records-stopped check). Added to by the buffer
    /// callbacks; read by the meter's thread.
    records: AtomicU64,
    /// Per CUDA ordinal: end of the GPU time already counted (the union of
    /// a process's concurrent kernels is charged once). Advanced by the
    /// buffer callbacks; reset by the meter's thread as a probe begins.
    covered: Box<[AtomicU64]>,
    /// Record buffers CUPTI gave back, for it to fill again: taken and
    /// given back by the buffer callbacks (CUPTI's threads, and the meter's
    /// thread in a flush).
    pool: Mutex<Vec<usize>>,
}

impl Loaded {
    fn recording(&self) -> bool {
        self.until.load(Ordering::Acquire) == u64::MAX
    }
}

/// For the exit report: rests lengthened, and cut short; wall time
/// recorded; time the meter's thread spent in CUPTI loading it (`dlopen`
/// and the first registration), switching recording on at each probe
/// (registering again where it was detached, enabling: one per probe),
/// and detaching it after a probe. Where CUPTI makes the program's
/// launches wait meanwhile, these bound that wait. Written by the meter's
/// thread only; read by `summary`.
struct Report {
    rests_longer: AtomicU64,
    rests_cut: AtomicU64,
    recorded_ns: AtomicU64,
    loading: Spent,
    switching_on: Spent,
    detaching: Spent,
}

/// A probe begins only while the process asked for one this recently (it
/// launches, and needs it).
const WANT_FRESH_NS: u64 = 50_000_000;

fn program_profiles() -> bool {
    SHARED.program.load(Ordering::Acquire) & PROFILES != 0
}

/// Whether the program keeps CUPTI attached between probes (its own
/// callback or profiler API, or graph launches; said once each: `said`,
/// the meter's thread's, holds which of `CALLBACKS` and `GRAPHS` was).
fn keeps_attached(said: &mut u8) -> bool {
    let p = SHARED.program.load(Ordering::Acquire);
    for (bit, why) in [
        (
            CALLBACKS,
            "the program uses CUPTI's callback/profiler API: cuslice keeps CUPTI attached between probes",
        ),
        (
            GRAPHS,
            "the program launches CUDA graphs: cuslice keeps CUPTI attached between probes (detaching it crashed graph replays)",
        ),
    ] {
        if p & bit != 0 {
            if *said & bit == 0 {
                *said |= bit;
                crate::info!("{why}");
            }
            return true;
        }
    }
    false
}

/// Starts the meter for `devices` CUDA ordinals, measuring for `sink`:
/// its thread, which loads CUPTI once the process first launches freely on
/// a shared GPU. Says once why not, where it cannot.
pub fn start(devices: usize, sink: &'static dyn Sink) {
    match std::env::var("CUSLICE_CUPTI").as_deref() {
        Ok("off") | Ok("0") | Ok("false") | Ok("no") => {
            crate::info!(
                "CUSLICE_CUPTI=off: a process that launches freely on a shared GPU is charged its wall time in flight"
            );
            return;
        }
        _ => {}
    }
    if std::env::var_os("CUDA_INJECTION64_PATH").is_some_and(|v| !v.is_empty()) {
        crate::info!(
            "a profiler is injected (CUDA_INJECTION64_PATH): cuslice leaves CUPTI to it and charges wall time in flight"
        );
        return;
    }
    if program_profiles() {
        crate::info!(
            "the program uses CUPTI's activity API itself: cuslice leaves it alone and charges wall time in flight"
        );
        return;
    }
    match std::env::var("CUSLICE_METER").as_deref() {
        Ok("") | Ok("shared") | Err(_) => {}
        Ok(v) => crate::warn!(
            "CUSLICE_METER={v} is ignored: the meter records kernels in probes only (continuous and always recording were experiments, removed)"
        ),
    }
    let detach = detach_setting(std::env::var_os("CUSLICE_METER_DETACH"));
    let spawned = std::thread::Builder::new()
        .name("cuslice-meter".into())
        .spawn(move || {
            // The thread's own state, made once CUPTI is loaded, owned by
            // it from then on.
            if let Some(mut meter) = thread::load(devices, sink, detach) {
                meter.run();
            }
        });
    match spawned {
        Ok(_) => SHARED.started.store(true, Ordering::Release),
        Err(e) => crate::warn!(
            "cannot start the GPU time meter's thread ({e}): charging wall time in flight"
        ),
    }
}

/// `CUSLICE_METER_DETACH`: `0` keeps CUPTI attached between probes (for a
/// program that uses CUPTI through entry points the shim does not front);
/// unset, empty or `1` detaches it; anything else is said and detaches.
fn detach_setting(v: Option<std::ffi::OsString>) -> bool {
    match v {
        None => true,
        Some(v) if v.is_empty() || v == "1" => true,
        Some(v) if v == "0" => false,
        Some(v) => {
            crate::warn!(
                "CUSLICE_METER_DETACH={} is not 0 or 1; detaching CUPTI between probes (the default)",
                v.to_string_lossy()
            );
            true
        }
    }
}

/// The current or last recording, `(since, until)` (our clock; `until` is
/// `u64::MAX` while it goes on): kernels launched in it are charged from
/// the records. None where the meter is not loaded or has stopped for good.
#[inline]
pub fn window() -> Option<(u64, u64)> {
    let m = SHARED.loaded.get()?;
    if m.lost.load(Ordering::Acquire) {
        return None;
    }
    let until = m.until.load(Ordering::Acquire);
    let since = m.since.load(Ordering::Acquire);
    (since != 0).then_some((since, until))
}

/// Whether the meter records now.
#[inline]
pub fn recording() -> bool {
    SHARED
        .loaded
        .get()
        .is_some_and(|m| m.recording() && !m.lost.load(Ordering::Acquire))
}

/// The program launches a CUDA graph (`cuGraphLaunch`): see `GRAPHS`. A
/// load and, once per process, an or.
#[inline]
pub fn note_graph_launch() {
    if SHARED.program.load(Ordering::Relaxed) & GRAPHS == 0 {
        SHARED.program.fetch_or(GRAPHS, Ordering::Relaxed);
    }
}

/// Whether the program has launched a CUDA graph (see `GRAPHS`).
#[inline]
pub fn graphs_launched() -> bool {
    SHARED.program.load(Ordering::Relaxed) & GRAPHS != 0
}

/// Whether a ratio learned from probes may stand in for records: the
/// meter works (loaded, not given up).
#[inline]
pub fn usable() -> bool {
    SHARED
        .loaded
        .get()
        .is_some_and(|m| !m.lost.load(Ordering::Acquire))
}

/// Whether the meter has stopped for good.
#[inline]
pub fn given_up() -> bool {
    SHARED
        .loaded
        .get()
        .is_some_and(|m| m.lost.load(Ordering::Acquire))
}

/// Whether a probe the process asked for is coming: asked for within the
/// last `WANT_FRESH_NS`, the meter not given up, and (loaded or not) not
/// recording yet. A busy stretch is not judged saturating unmeasured while
/// its measurement is on its way.
#[inline]
pub fn coming(now: u64) -> bool {
    if !SHARED.started.load(Ordering::Acquire) || recording() || given_up() {
        return false;
    }
    let at = SHARED.wanted_at.load(Ordering::Relaxed);
    at != 0
        && now.saturating_sub(at) < WANT_FRESH_NS
        && now >= SHARED.rest_until.load(Ordering::Relaxed)
}

/// Whether a probe is wanted at `now` (asked for within `WANT_FRESH_NS`).
fn wanted(now: u64) -> bool {
    let at = SHARED.wanted_at.load(Ordering::Relaxed);
    at != 0 && now.saturating_sub(at) < WANT_FRESH_NS
}

/// The process launches freely on a contended GPU: CUPTI is loaded (once,
/// by the meter's thread) so that a probe can begin at once when one is
/// wanted.
#[inline]
pub fn load_cupti() {
    if !SHARED.load.load(Ordering::Relaxed) {
        SHARED.load.store(true, Ordering::Relaxed);
    }
}

/// The process's GPU time is to be measured now (loading CUPTI first if
/// need be): its wall time in flight could make it heavy on a contended
/// GPU, or it holds the lease alone under a ceiling without keeping the
/// GPU fed.
#[inline]
pub fn want_probe(now: u64) {
    load_cupti();
    SHARED.wanted_at.store(now, Ordering::Relaxed);
}

/// The process stops launching for a while (it waits for the lease or its
/// ceiling): a probe wanted before is no longer (one begun then would
/// measure nothing).
#[inline]
pub fn cancel_probe() {
    SHARED.wanted_at.store(0, Ordering::Relaxed);
}

/// How often something took how long (ns): a count, the sum, the longest.
struct Spent {
    n: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Spent {
    const fn new() -> Self {
        Spent {
            n: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Adds one that began at `since` (our clock) and ends now.
    fn since(&self, since: u64) {
        let ns = now_ns().saturating_sub(since);
        self.n.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }

    /// "N in X ms (longest Y ms)" ("1 in X ms"), or None where there was
    /// none.
    fn said(&self) -> Option<String> {
        let n = self.count();
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        match n {
            0 => None,
            1 => Some(format!("1 in {:.2} ms", ms(&self.sum))),
            _ => Some(format!(
                "{n} in {:.2} ms (longest {:.2} ms)",
                ms(&self.sum),
                ms(&self.max)
            )),
        }
    }
}

/// The exit report's line, where the meter was loaded: probes taken, wall
/// time recorded, and the time spent loading CUPTI, switching recording on
/// and detaching CUPTI.
pub fn summary() -> Option<String> {
    SHARED.loaded.get()?;
    let r = &SHARED.report;
    let mut s = format!(
        "recorded kernels in {} probes, {:.0} ms in all",
        r.switching_on.count(),
        r.recorded_ns.load(Ordering::Relaxed) as f64 / 1e6
    );
    let (longer, cut) = (
        r.rests_longer.load(Ordering::Relaxed),
        r.rests_cut.load(Ordering::Relaxed),
    );
    if longer > 0 {
        s.push_str(&format!(
            "; rests lengthened after {longer} steady probes ({cut} cut short)"
        ));
    }
    for (what, spent) in [
        ("loading CUPTI", &r.loading),
        ("switching recording on", &r.switching_on),
        ("detaching CUPTI", &r.detaching),
    ] {
        if let Some(x) = spent.said() {
            s.push_str(&format!("; {what} {x}"));
        }
    }
    Some(s)
}

/// A fork child: the meter's thread did not come along, so nothing would
/// flush its records; it charges wall time in flight (CUDA in a child of a
/// process that initialised it is not supported anyway).
pub fn after_fork_child() {
    if let Some(m) = SHARED.loaded.get() {
        m.lost.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_0_keeps_cupti_attached() {
        assert!(detach_setting(None));
        assert!(detach_setting(Some("".into())));
        assert!(detach_setting(Some("1".into())));
        assert!(!detach_setting(Some("0".into())));
        assert!(detach_setting(Some("no".into())));
    }
}
