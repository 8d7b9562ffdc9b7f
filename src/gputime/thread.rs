//! The meter's thread: loads CUPTI when first wanted, then each tick reads
//! the clock and the counters, asks the cadence (`super::cadence`) what to
//! do, and does it (recording on and off, flushing, taking a probe's
//! ratios, detaching and attaching CUPTI).

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

/// The program exits (`at_program_exit`), and the meter's thread has
/// stopped for it.
static EXITING: AtomicBool = AtomicBool::new(false);
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Waits until CUPTI is first wanted, then loads it and registers the
/// callbacks. False where it cannot (said once) or the program's own
/// profiler came first.
pub fn load(devices: usize, sink: &'static dyn Sink) -> bool {
    while !LOAD.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_nanos(UNLOADED_NAP_NS));
    }
    if program_profiles() {
        return false;
    }
    // The library is opened before `LOADING` is taken: a program thread
    // that registers its callbacks from a library's constructor holds the
    // loader's lock while it waits for `LOADING`.
    let loading_since = now_ns();
    let (h, path) = match cupti::open() {
        Ok(x) => x,
        Err(why) => {
            crate::info!(
                "GPU time meter off ({why}): a process that launches freely on a shared GPU is charged its wall time in flight, an upper bound"
            );
            return false;
        }
    };
    let api = match cupti::load_api(h) {
        Ok(a) => a,
        Err(why) => {
            crate::warn!("{path} is not a usable libcupti ({why}): charging wall time in flight");
            return false;
        }
    };
    let _g = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if program_profiles() {
        return false;
    }
    let m = Meter {
        api,
        path,
        sink,
        since: AtomicU64::new(0),
        until: AtomicU64::new(0),
        offset: AtomicI64::new(0),
        lost: AtomicBool::new(false),
        records: AtomicU64::new(0),
        covered: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        pool: Mutex::new(Vec::new()),
    };
    if METER.set(m).is_err() {
        return false;
    }
    let Some(m) = METER.get() else { return false };
    let r = m.register();
    if r != CUPTI_SUCCESS {
        m.lost.store(true, Ordering::Release);
        crate::warn!(
            "{}: cannot register activity callbacks: {}; charging wall time in flight",
            m.path,
            m.error(r)
        );
        return false;
    }
    LOADING_SPENT.since(loading_since);
    // Registered now, after the program's CUDA runtime registered its own
    // teardown: ours runs first (exit handlers run in reverse order).
    // SAFETY: registering a plain `extern "C" fn()`.
    unsafe { libc::atexit(at_program_exit) };
    crate::info!(
        "GPU time meter: {} (kernel records while the GPU is shared or a ceiling applies)",
        m.path
    );
    if DETACH.load(Ordering::Relaxed) && m.api.finalize.is_none() {
        crate::info!(
            "{} has no cuptiFinalize: CUPTI stays attached between probes",
            m.path
        );
    }
    true
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
    EXITING.store(true, Ordering::Release);
    let until = now_ns() + EXIT_WAIT_NS;
    while !STOPPED.load(Ordering::Acquire) && now_ns() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Switches recording off at `now` (the records so far are flushed; the
/// last ones at the next tick, when the probe's end is reported).
fn stop_recording(m: &Meter, now: u64) {
    m.until.store(now, Ordering::Release);
    m.disable();
    m.flush();
    RECORDED_NS.fetch_add(
        now.saturating_sub(m.since.load(Ordering::Relaxed)),
        Ordering::Relaxed,
    );
}

/// The meter's thread after loading: takes probes, flushes.
pub fn run() {
    let Some(m) = METER.get() else { return };
    let mut calibrated_at = 0u64;
    let mut check_at = 0u64;
    let mut silence = Silence::default();
    let mut cadence = Cadence::default();
    // Detaching between probes: `cuptiFinalize` where it is on and the
    // library has it (None once it failed), and whether CUPTI is detached
    // now.
    let mut finalize = if DETACH.load(Ordering::Relaxed) {
        m.api.finalize
    } else {
        None
    };
    let mut detached = false;
    loop {
        if EXITING.load(Ordering::Acquire) {
            // The program exits (`at_program_exit`): no probe is left
            // recording, nor CUPTI attached after one, when its CUDA
            // runtime tears its contexts down.
            if !m.lost.load(Ordering::Acquire) && !program_profiles() {
                if m.recording() {
                    stop_recording(m, now_ns());
                }
                if let Some(f) = finalize.filter(|_| !detached) {
                    let _ = m.detach(f);
                }
            }
            STOPPED.store(true, Ordering::Release);
            return;
        }
        if m.lost.load(Ordering::Acquire) {
            if m.recording() && !program_profiles() {
                m.until.store(now_ns(), Ordering::Release);
                m.disable();
            }
            STOPPED.store(true, Ordering::Release);
            return;
        }
        let now = now_ns();
        let wanted = wanted(now);
        let recording = m.recording();
        let ended = m.until.load(Ordering::Relaxed);
        if !recording && cadence.ending() {
            // The probe's last records (the kernels that were still running
            // when it ended) are in: its ratio can be taken.
            m.flush();
            let (measured, steady) = m.sink.probe_end(now);
            let activity = m.sink.activity();
            if cadence.collected(
                now,
                ended,
                measured,
                steady,
                activity,
                m.sink.competition(now),
            ) {
                RESTS_LONGER.fetch_add(1, Ordering::Relaxed);
            }
            REST_UNTIL.store(cadence.rest_until(), Ordering::Relaxed);
            // Over two probes in a row.
            if silence.look(m.records.load(Ordering::Relaxed), activity.0) {
                m.give_up(
                    "no kernel records while the process launches: another CUPTI client took them",
                );
                continue;
            }
            if let Some(f) = finalize {
                let detaching_since = now_ns();
                match m.detach(f) {
                    Ok(d) => {
                        if d {
                            DETACHING.since(detaching_since);
                        }
                        detached = d;
                    }
                    Err(r) => {
                        crate::info!(
                            "{}: cannot detach CUPTI between probes: {}; it stays attached",
                            m.path,
                            m.error(r)
                        );
                        finalize = None;
                    }
                }
            }
            crate::debug!(
                "GPU time meter off at {:.3} ms (CLOCK_MONOTONIC; {})",
                now_ns() as f64 / 1e6,
                if detached {
                    "CUPTI detached"
                } else {
                    "CUPTI stays attached"
                }
            );
        }
        if !recording
            && cadence.lengthened()
            && let Some(cut) =
                cadence.check_rest(now, ended, m.sink.activity(), m.sink.competition(now))
        {
            REST_UNTIL.store(cadence.rest_until(), Ordering::Relaxed);
            RESTS_CUT.fetch_add(1, Ordering::Relaxed);
            crate::debug!(
                "GPU time meter: {cut} since the last probe; the next probe comes sooner"
            );
        }
        if !recording && cadence.may_start(now, wanted) {
            let switching_since = now_ns();
            if detached {
                if !m.attach() {
                    continue;
                }
                detached = false;
            }
            m.calibrate();
            calibrated_at = now;
            let r = m.enable();
            if r != CUPTI_SUCCESS {
                crate::warn!(
                    "{}: cannot record kernel activity: {}; charging wall time in flight",
                    m.path,
                    m.error(r)
                );
                m.lost.store(true, Ordering::Release);
                continue;
            }
            reset_covered(&m.covered);
            SWITCHING_ON.since(switching_since);
            let activity = m.sink.activity();
            m.sink.probe_begin();
            let t = now_ns();
            m.since.store(t, Ordering::Release);
            m.until.store(u64::MAX, Ordering::Release);
            cadence.started(t, activity);
            check_at = now + LOST_CHECK_NS;
            silence.rebase(m.records.load(Ordering::Relaxed), activity.0);
            crate::debug!(
                "GPU time meter on at {:.3} ms (CLOCK_MONOTONIC)",
                t as f64 / 1e6
            );
        } else if recording {
            m.flush();
            if cadence.probe_over(now) {
                stop_recording(m, now);
                cadence.stopped(now);
                REST_UNTIL.store(cadence.rest_until(), Ordering::Relaxed);
            } else if now >= check_at {
                // Over two checks in a row (recording longer than a probe:
                // the thread fell behind).
                let (r, l) = (m.records.load(Ordering::Relaxed), m.sink.activity().0);
                if silence.look(r, l) {
                    m.give_up("no kernel records while the process launches: another CUPTI client took them");
                } else {
                    silence.rebase(r, l);
                }
                check_at = now + LOST_CHECK_NS;
            }
            if now.saturating_sub(calibrated_at) >= CALIBRATE_NS {
                m.calibrate();
                calibrated_at = now;
            }
        }
        let nap = if m.recording() || cadence.ending() {
            FLUSH_NS
        } else {
            FLUSH_NS * 5
        };
        std::thread::sleep(std::time::Duration::from_nanos(nap));
    }
}
