//! The meter's thread: loads CUPTI when first wanted, then each tick reads
//! the clock and the counters, asks the cadence (`super::cadence`) what to
//! do, and does it (recording on and off, flushing, taking a probe's
//! ratios, detaching and attaching CUPTI). Its state is its own (`Meter`);
//! what it shares with the program's threads and CUPTI's callbacks is in
//! `super::SHARED`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use super::cadence::{Cadence, Silence};
use super::cupti::{self, CUPTI_SUCCESS};
use super::records::reset_covered;
use super::*;

/// How often the thread flushes CUPTI's records while recording (the
/// charges lag the GPU by about that much); it ticks five times slower
/// while not.
const FLUSH_NS: u64 = 4_000_000;
/// The records-stopped check runs this often while a recording lasts
/// longer than a probe.
const LOST_CHECK_NS: u64 = 200_000_000;
/// Recalibrate CUPTI's clock against ours this often.
const CALIBRATE_NS: u64 = 10_000_000_000;
/// How long the program's exit waits for the meter's thread.
const EXIT_WAIT_NS: u64 = 200_000_000;
/// How often the thread looks whether it is wanted before CUPTI is loaded.
const UNLOADED_NAP_NS: u64 = 10_000_000;

/// What only the meter's thread uses: made by `load`, then owned by the
/// thread and passed by `&mut` (`run`). Nothing here is read by another
/// thread.
pub struct Meter {
    /// CUPTI, loaded, and the words of its recording (shared with the
    /// buffer callbacks and the program's threads: `super::Loaded`).
    c: &'static Loaded,
    /// The library's path (for what is said).
    path: String,
    /// Detaching between probes: `cuptiFinalize` where it is on (unless
    /// `CUSLICE_METER_DETACH=0`) and the library has it (None once it
    /// failed)...
    finalize: Option<unsafe extern "C" fn() -> i32>,
    /// ...and whether CUPTI is detached now.
    detached: bool,
    /// Which of `CALLBACKS` and `GRAPHS` has been said to keep CUPTI
    /// attached (`super::keeps_attached`).
    said: u8,
    /// When to probe and how long to rest.
    cadence: Cadence,
    /// The records-stopped check.
    silence: Silence,
    /// When CUPTI's clock was last measured against ours.
    calibrated_at: u64,
    /// When the records-stopped check runs next while recording.
    check_at: u64,
}

/// Waits until CUPTI is first wanted, then loads it and registers the
/// callbacks: the thread's state. None where it cannot (said once) or the
/// program's own profiler came first. `detach`: whether CUPTI is detached
/// between probes (`super::detach_setting`).
pub fn load(devices: usize, sink: &'static dyn Sink, detach: bool) -> Option<Meter> {
    while !SHARED.load.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_nanos(UNLOADED_NAP_NS));
    }
    if program_profiles() {
        return None;
    }
    // The library is opened before `loading` is taken: a program thread
    // that registers its callbacks from a library's constructor holds the
    // loader's lock while it waits for `loading`.
    let loading_since = now_ns();
    let (h, path) = match cupti::open() {
        Ok(x) => x,
        Err(why) => {
            crate::info!(
                "GPU time meter off ({why}): a process that launches freely on a shared GPU is charged its wall time in flight, an upper bound"
            );
            return None;
        }
    };
    let api = match cupti::load_api(h) {
        Ok(a) => a,
        Err(why) => {
            crate::warn!("{path} is not a usable libcupti ({why}): charging wall time in flight");
            return None;
        }
    };
    let _g = SHARED.loading.lock().unwrap_or_else(|e| e.into_inner());
    if program_profiles() {
        return None;
    }
    let loaded = Loaded {
        api,
        sink,
        since: AtomicU64::new(0),
        until: AtomicU64::new(0),
        offset: AtomicI64::new(0),
        lost: AtomicBool::new(false),
        records: AtomicU64::new(0),
        covered: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        pool: Mutex::new(Vec::new()),
    };
    if SHARED.loaded.set(loaded).is_err() {
        return None;
    }
    let c = SHARED.loaded.get()?;
    let r = c.register();
    if r != CUPTI_SUCCESS {
        c.lost.store(true, Ordering::Release);
        crate::warn!(
            "{}: cannot register activity callbacks: {}; charging wall time in flight",
            path,
            c.error(r)
        );
        return None;
    }
    SHARED.report.loading.since(loading_since);
    // Registered now, after the program's CUDA runtime registered its own
    // teardown: ours runs first (exit handlers run in reverse order).
    // SAFETY: registering a plain `extern "C" fn()`.
    unsafe { libc::atexit(at_program_exit) };
    crate::info!(
        "GPU time meter: {} (kernel records while the GPU is shared or a ceiling applies)",
        path
    );
    if detach && c.api.finalize.is_none() {
        crate::info!(
            "{} has no cuptiFinalize: CUPTI stays attached between probes",
            path
        );
    }
    Some(Meter {
        c,
        path,
        finalize: if detach { c.api.finalize } else { None },
        detached: false,
        said: 0,
        cadence: Cadence::default(),
        silence: Silence::default(),
        calibrated_at: 0,
        check_at: 0,
    })
}

/// The program exits: the meter's thread stops recording and detaches
/// CUPTI (if a probe was on) before the CUDA runtime's own exit handler
/// destroys its contexts; waits for it at most `EXIT_WAIT_NS`. (A test
/// program on an H100 crashed at exit, once in about nine runs, with CUPTI
/// loaded for its ceiling.)
extern "C" fn at_program_exit() {
    // A meter that stopped for good (its thread returned, or a fork child,
    // which has no meter thread) has nothing to stop: the exit must not
    // wait for it.
    if given_up() {
        return;
    }
    SHARED.exiting.store(true, Ordering::Release);
    let until = now_ns() + EXIT_WAIT_NS;
    while !SHARED.stopped.load(Ordering::Acquire) && now_ns() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

impl Meter {
    /// Switches recording off at `now` (the records so far are flushed; the
    /// last ones at the next tick, when the probe's end is reported).
    fn stop_recording(&self, now: u64) {
        let c = self.c;
        c.until.store(now, Ordering::Release);
        c.disable();
        c.flush();
        SHARED.report.recorded_ns.fetch_add(
            now.saturating_sub(c.since.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    }

    /// The meter's thread after loading: takes probes, flushes; returns
    /// once it stopped (for the program's exit, or for good).
    pub fn run(&mut self) {
        let c = self.c;
        loop {
            if SHARED.exiting.load(Ordering::Acquire) {
                // The program exits (`at_program_exit`): no probe is left
                // recording, nor CUPTI attached after one, when its CUDA
                // runtime tears its contexts down.
                if !c.lost.load(Ordering::Acquire) && !program_profiles() {
                    if c.recording() {
                        self.stop_recording(now_ns());
                    }
                    if let Some(f) = self.finalize.filter(|_| !self.detached) {
                        let _ = c.detach(f, &mut self.said);
                    }
                }
                SHARED.stopped.store(true, Ordering::Release);
                return;
            }
            if c.lost.load(Ordering::Acquire) {
                if c.recording() && !program_profiles() {
                    c.until.store(now_ns(), Ordering::Release);
                    c.disable();
                }
                SHARED.stopped.store(true, Ordering::Release);
                return;
            }
            let now = now_ns();
            let wanted = wanted(now);
            let recording = c.recording();
            let ended = c.until.load(Ordering::Relaxed);
            if !recording && self.cadence.ending() {
                // The probe's last records (the kernels that were still
                // running when it ended) are in: its ratio can be taken.
                c.flush();
                let (measured, steady) = c.sink.probe_end(now);
                let activity = c.sink.activity();
                if self.cadence.collected(
                    now,
                    ended,
                    measured,
                    steady,
                    activity,
                    c.sink.competition(now),
                ) {
                    SHARED.report.rests_longer.fetch_add(1, Ordering::Relaxed);
                }
                SHARED
                    .rest_until
                    .store(self.cadence.rest_until(), Ordering::Relaxed);
                // Over two probes in a row.
                if self
                    .silence
                    .look(c.records.load(Ordering::Relaxed), activity.0)
                {
                    c.give_up(
                        "no kernel records while the process launches: another CUPTI client took them",
                    );
                    continue;
                }
                if let Some(f) = self.finalize {
                    let detaching_since = now_ns();
                    match c.detach(f, &mut self.said) {
                        Ok(d) => {
                            if d {
                                SHARED.report.detaching.since(detaching_since);
                            }
                            self.detached = d;
                        }
                        Err(r) => {
                            crate::info!(
                                "{}: cannot detach CUPTI between probes: {}; it stays attached",
                                self.path,
                                c.error(r)
                            );
                            self.finalize = None;
                        }
                    }
                }
                crate::debug!(
                    "GPU time meter off at {:.3} ms (CLOCK_MONOTONIC; {})",
                    now_ns() as f64 / 1e6,
                    if self.detached {
                        "CUPTI detached"
                    } else {
                        "CUPTI stays attached"
                    }
                );
            }
            if !recording
                && self.cadence.lengthened()
                && let Some(cut) =
                    self.cadence
                        .check_rest(now, ended, c.sink.activity(), c.sink.competition(now))
            {
                SHARED
                    .rest_until
                    .store(self.cadence.rest_until(), Ordering::Relaxed);
                SHARED.report.rests_cut.fetch_add(1, Ordering::Relaxed);
                crate::debug!(
                    "GPU time meter: {cut} since the last probe; the next probe comes sooner"
                );
            }
            if !recording && self.cadence.may_start(now, wanted) {
                let switching_since = now_ns();
                if self.detached {
                    if !c.attach(&self.path) {
                        continue;
                    }
                    self.detached = false;
                }
                c.calibrate();
                self.calibrated_at = now;
                let r = c.enable();
                if r != CUPTI_SUCCESS {
                    crate::warn!(
                        "{}: cannot record kernel activity: {}; charging wall time in flight",
                        self.path,
                        c.error(r)
                    );
                    c.lost.store(true, Ordering::Release);
                    continue;
                }
                reset_covered(&c.covered);
                SHARED.report.switching_on.since(switching_since);
                let activity = c.sink.activity();
                c.sink.probe_begin();
                let t = now_ns();
                c.since.store(t, Ordering::Release);
                c.until.store(u64::MAX, Ordering::Release);
                self.cadence.started(t, activity);
                self.check_at = now + LOST_CHECK_NS;
                self.silence
                    .rebase(c.records.load(Ordering::Relaxed), activity.0);
                crate::debug!(
                    "GPU time meter on at {:.3} ms (CLOCK_MONOTONIC)",
                    t as f64 / 1e6
                );
            } else if recording {
                c.flush();
                if self.cadence.probe_over(now) {
                    self.stop_recording(now);
                    self.cadence.stopped(now);
                    SHARED
                        .rest_until
                        .store(self.cadence.rest_until(), Ordering::Relaxed);
                } else if now >= self.check_at {
                    // Over two checks in a row (recording longer than a
                    // probe: the thread fell behind).
                    let (r, l) = (c.records.load(Ordering::Relaxed), c.sink.activity().0);
                    if self.silence.look(r, l) {
                        c.give_up("no kernel records while the process launches: another CUPTI client took them");
                    } else {
                        self.silence.rebase(r, l);
                    }
                    self.check_at = now + LOST_CHECK_NS;
                }
                if now.saturating_sub(self.calibrated_at) >= CALIBRATE_NS {
                    c.calibrate();
                    self.calibrated_at = now;
                }
            }
            let nap = if c.recording() || self.cadence.ending() {
                FLUSH_NS
            } else {
                FLUSH_NS * 5
            };
            std::thread::sleep(std::time::Duration::from_nanos(nap));
        }
    }
}
