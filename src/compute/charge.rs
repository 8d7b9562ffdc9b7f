//! What a process is charged, and what it gives the GPU time meter: work
//! in flight of free passes (its wall time, or the GPU time the meter
//! measured of it), a holder's hold measured alone under a ceiling
//! (`hold_ppm`), and the meter's `Sink` (kernel GPU time per device,
//! probe boundaries, the ratios probes teach).

use std::sync::atomic::Ordering;

use cuslice_core::gpu::DEMAND_WINDOW_NS;

use super::*;
use crate::gputime::ratio::{WHOLE_PPM, of_ppm};
use crate::gputime::{self, PROBE_NS, REST_LONGEST_NS, Sink};

/// A gap this long between a process's passes (or synchronising calls)
/// ends its busy period.
pub(super) const BUSY_GAP_NS: u64 = 200_000;
/// A process on a contended GPU asks the meter for probes once its wall
/// time in flight could make its tenant heavy: in flight this long without
/// a break...
const NEED_BUSY_NS: u64 = 10_000_000;
/// ...or at least this much of its share (per mille) over a demand window.
/// Under it, charged its wall time in flight (an upper bound), it is light
/// whatever its kernels ran.
const NEED_SHARE_PERMILLE: u64 = 500;
/// A holder alone under a ceiling whose kernels ran less than this share of
/// its hold (ppm) is charged what they ran (`hold_ppm`); one that ran more
/// (a saturating loop: ~95-100 %) is charged its hold, as the caps were
/// measured.
const HOLD_MEASURED_BELOW_PPM: u64 = 500_000;
/// How long a holder alone under a ceiling may wait for its first
/// measurement before its ceiling applies (`hold_ppm`, `booting`): a
/// probe's length and CUPTI's loading.
const FIRST_MEASURE_NS: u64 = PROBE_NS + 150_000_000;
/// Held this long inside the first probe, a loop whose kernels ran at least
/// `HOLD_MEASURED_BELOW_PPM` of it ends its wait for the measurement then.
const BOOT_PARTIAL_NS: u64 = 20_000_000;
/// Ratios stand for longer than the longest rest between probes
/// (`gputime::ratio::RATIO_STALE_NS`).
const _: () = assert!(crate::gputime::ratio::RATIO_STALE_NS > REST_LONGEST_NS + PROBE_NS);

/// Whether wall time in flight could make a tenant of `share` percent
/// heavy (see `Gpu::needs_probe`): `busy` for `NEED_BUSY_NS` without a
/// break, or in flight at least `NEED_SHARE_PERMILLE` of its share over
/// the last window (`last_pm`, per mille of the GPU) or the current one so
/// far (`current_pm`).
fn could_be_heavy(share: u32, busy_for: Option<u64>, last_pm: u64, current_pm: u64) -> bool {
    let bar = u64::from(share.clamp(1, 100)) * 10 * NEED_SHARE_PERMILLE / 1000;
    busy_for.is_some_and(|b| b >= NEED_BUSY_NS) || last_pm >= bar || current_pm >= bar
}

impl Gpu {
    /// Charges a free pass (its wall time, up to its deadline: a pass that
    /// ended long after it had nothing in flight is not charged the idle
    /// time; nothing where its kernels' GPU time is measured) and notes the
    /// busy period.
    pub(super) fn close_free_pass(&self, now: u64) {
        let end = now.min(self.pass.deadline.load(Ordering::Relaxed));
        let start = self.pass.start.load(Ordering::Relaxed);
        self.charge_in_flight(start, end, now);
        self.pass.credits.store(0, Ordering::Release);
        self.pass.mode.store(NONE, Ordering::Release);
    }

    /// Work of a process that launches freely was in flight from `start`
    /// to `end`: charged as GPU time (what the meter's records cover of it
    /// by them; the rest by the last probe's ratio where there is one, else
    /// whole, an upper bound), and the busy period goes on to `end`.
    pub(super) fn charge_in_flight(&self, start: u64, end: u64, now: u64) {
        // A privileged latency process spends its privilege budget by its
        // wall time in flight: that is what its privilege costs the others
        // (they hold back meanwhile), however little of it its kernels run.
        // Its share is charged like anyone's: its kernels' GPU time where
        // measured (a privilege spent is not GPU time used: charged its
        // wall time, a decode loop's first milliseconds of each request
        // made it heavy, and through the lease it stayed so).
        if self.latency && self.lat.privileged.load(Ordering::Relaxed) {
            self.lat
                .tokens
                .fetch_sub(end.saturating_sub(start) as i64, Ordering::Relaxed);
        }
        let wall = end.saturating_sub(start);
        self.note_wall(wall, now);
        self.time.in_flight.fetch_add(wall, Ordering::Relaxed);
        let window = gputime::window();
        let recorded = window.map_or(0, |(s, u)| end.min(u).saturating_sub(start.max(s)));
        if recorded > 0 {
            self.time.free.add_wall(recorded);
        }
        let ratio = self.ratio(now);
        let rest = wall - recorded.min(wall);
        if rest > 0 {
            match ratio {
                Some(r) => self.seg.charge_free(self.tenant, of_ppm(rest, r), now),
                // Nothing measured it: counted apart too (status sets it
                // against NVML's per-process time).
                None => self.seg.charge_bound(self.slot, self.tenant, rest, now),
            }
        }
        self.busy.last.store(end, Ordering::Relaxed);
        let busy_since = self.busy.since.load(Ordering::Relaxed);
        match window {
            Some((since, u64::MAX)) => {
                // Measured from when both the busy period and the records
                // began (records lag by a flush: an underestimate).
                let busy = end.saturating_sub(busy_since.max(since));
                let gpu = self
                    .time
                    .metered
                    .load(Ordering::Relaxed)
                    .saturating_sub(self.busy.metered.load(Ordering::Relaxed));
                self.seg.note_busy(self.tenant, busy, Some(gpu), now);
            }
            _ => {
                let busy = end.saturating_sub(busy_since);
                match ratio {
                    Some(r) => self
                        .seg
                        .note_busy(self.tenant, busy, Some(of_ppm(busy, r)), now),
                    // Where the meter works (or a probe asked for is on its
                    // way), a stretch is judged by what probes measure, not
                    // by its wall time; one not measured yet is charged its
                    // wall time meanwhile, which its demand then shows.
                    None if gputime::usable() || gputime::coming(now) => {}
                    None => self.seg.note_busy(self.tenant, busy, None, now),
                }
            }
        }
    }

    /// Counts `ns` of wall time in flight into this process's window.
    fn note_wall(&self, ns: u64, now: u64) {
        let start = self.busy.wall_start.load(Ordering::Relaxed);
        let span = now.saturating_sub(start);
        if span >= DEMAND_WINDOW_NS {
            let total = self.busy.wall_ns.swap(0, Ordering::Relaxed) + ns;
            self.busy.wall_pm.store(
                (total.saturating_mul(1000) / span).min(1000),
                Ordering::Relaxed,
            );
            self.busy.wall_start.store(now, Ordering::Relaxed);
        } else {
            self.busy.wall_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// What share of its hold since its last charge a holder is charged
    /// at `now` (parts per million). All of it, unless its tenant has a
    /// ceiling, nobody else competes, and it does not keep the GPU fed (a
    /// launch-bound loop: kernels a tenth of its time, the lease held
    /// through its host gaps and between requests; charged its hold, it
    /// was held to its ceiling in wall time). Then the meter probes it,
    /// and as a free process is, it is charged its kernels' GPU time from
    /// the records inside a probe (`metered`; that part of the hold is not
    /// charged) and outside, its hold times the last probe's ratio of GPU
    /// time to time held. A loop that keeps the GPU fed is charged its
    /// hold, as the caps were measured, and never loads CUPTI for it; so
    /// is a program that replays CUDA graphs (probing one crashed it).
    ///
    /// Until it is measured (at most `FIRST_MEASURE_NS`, once), its hold
    /// is counted, not charged, and it keeps the lease whatever its
    /// ceiling says (`booting`): its bucket starts empty, and charged its
    /// whole hold before its first probe, a decode loop spent it in one
    /// slice and waited for a whole burst (~0.7 s) before anything could
    /// measure it. The count is charged when the wait ends: times the
    /// ratio measured, else whole.
    pub(super) fn hold_ppm(&self, now: u64) -> u64 {
        // A program replaying CUDA graphs is charged its hold, unprobed, as
        // before holds were measured: probing one crashed it on a GPU
        // (`gputime::graphs_launched`).
        if self.seg.uncapped(self.tenant)
            || self.seg.contended(self.tenant, now)
            || gputime::graphs_launched()
        {
            self.time.hold_metered.store(false, Ordering::Relaxed);
            self.end_boot(WHOLE_PPM, now);
            return WHOLE_PPM;
        }
        let state = self.queue.state.load(Ordering::Relaxed);
        let usable = gputime::usable();
        let standing = self.time.held.standing(now);
        let saturating = standing.is_some_and(|r| r >= HOLD_MEASURED_BELOW_PPM);
        // Probed while it does not keep the GPU fed, until a probe finds it
        // saturating (then again once that is stale: each probe costs a
        // launch-heavy loop a little throughput).
        if state == QUEUE_DRAINED && !saturating {
            gputime::want_probe(now);
        }
        if self.time.boot.load(Ordering::Relaxed) != BOOT_DONE {
            if self.time.boot.swap(BOOT_WAITING, Ordering::Relaxed) == BOOT_NOT_YET {
                self.time.boot_since.store(now, Ordering::Relaxed);
            }
            // A probe's records so far already show a saturating loop.
            let (held_gpu, held) = self.time.held.so_far();
            let shows_saturating =
                held >= BOOT_PARTIAL_NS && held_gpu * WHOLE_PPM >= held * HOLD_MEASURED_BELOW_PPM;
            let waiting = state != QUEUE_FED
                && !self.time.held.learned_any()
                && !shows_saturating
                && !gputime::given_up()
                && now.saturating_sub(self.time.boot_since.load(Ordering::Relaxed))
                    < FIRST_MEASURE_NS;
            if waiting {
                self.time.hold_metered.store(false, Ordering::Relaxed);
                return 0;
            }
            let ppm = match standing {
                Some(r) if state == QUEUE_DRAINED => r,
                _ => WHOLE_PPM,
            };
            self.end_boot(ppm, now);
        }
        let metered = usable && state == QUEUE_DRAINED && !saturating;
        self.time.hold_metered.store(metered, Ordering::Relaxed);
        if !metered {
            return WHOLE_PPM;
        }
        let (span, inside) = self.held_span(self.time.held_counted.load(Ordering::Relaxed), now);
        if span == 0 {
            return WHOLE_PPM;
        }
        let outside = span - inside;
        let charged = standing.map_or(outside, |r| of_ppm(outside, r));
        (u128::from(charged) * u128::from(WHOLE_PPM) / u128::from(span)) as u64
    }

    /// The wait for a first measurement ends (`hold_ppm`): the hold counted
    /// meanwhile is charged at `ppm`.
    fn end_boot(&self, ppm: u64, now: u64) {
        if self.time.boot.swap(BOOT_DONE, Ordering::Relaxed) == BOOT_WAITING {
            let ns = self.time.boot_ns.swap(0, Ordering::Relaxed);
            crate::debug!(
                "ceiling: first measurement after {:.1} ms ({:.1} ms held), charged at {} ppm",
                now.saturating_sub(self.time.boot_since.load(Ordering::Relaxed)) as f64 / 1e6,
                ns as f64 / 1e6,
                ppm
            );
            self.seg.charge_free(self.tenant, of_ppm(ns, ppm), now);
        }
    }

    /// Whether a holder alone under a ceiling waits for its first
    /// measurement (`hold_ppm`): it keeps the lease meanwhile.
    pub(super) fn booting(&self) -> bool {
        self.time.boot.load(Ordering::Relaxed) == BOOT_WAITING
    }

    /// The hold from `from` (the last charge, or the last count into a
    /// probe) to `now`, as the lease charges it (idle gaps left out), and
    /// how much of that falls inside the meter's recording (in proportion).
    fn held_span(&self, from: u64, now: u64) -> (u64, u64) {
        let wall = now.saturating_sub(from);
        if wall == 0 {
            return (0, 0);
        }
        let span = self
            .seg
            .charged_from()
            .map_or(wall, |h| now.saturating_sub(h))
            .min(wall);
        let inside_wall =
            gputime::window().map_or(0, |(s, u)| now.min(u).saturating_sub(from.max(s)));
        let inside = (u128::from(span) * u128::from(inside_wall) / u128::from(wall)) as u64;
        (span, inside.min(span))
    }

    /// Counts the time held up to `t` (not counted yet) into the current
    /// probe, where it falls inside its recording (and into the wait for a
    /// first measurement).
    pub(super) fn count_held(&self, t: u64) {
        let from = self.time.held_counted.fetch_max(t, Ordering::AcqRel);
        if from >= t {
            return;
        }
        // Only a holder measured alone under a ceiling (`hold_ppm`): what
        // the others hold stays out of the meter's counts.
        let booting = self.booting();
        if !booting && !self.time.hold_metered.load(Ordering::Relaxed) {
            return;
        }
        let (span, inside) = self.held_span(from, t);
        if booting {
            self.time.boot_ns.fetch_add(span, Ordering::Relaxed);
        }
        self.time.in_flight.fetch_add(span, Ordering::Relaxed);
        if inside > 0 {
            self.time.held.add_wall(inside);
        }
    }

    /// Whether this process's wall time in flight could make its tenant
    /// heavy (then its GPU time is worth measuring): a busy stretch of
    /// `NEED_BUSY_NS`, or in flight `NEED_SHARE_PERMILLE` of its share over
    /// the last window or the current one so far.
    ///
    /// (Not relaxed where the last ratio puts the process far under its
    /// share: under contention every free process's ratio is low, a
    /// saturating one's too, and it rises when the others are held; probed
    /// only every 2 s such processes were charged at a stale low ratio and
    /// eight saturating tenants missed their shares by up to 8 points.)
    pub(super) fn needs_probe(&self, now: u64) -> bool {
        let busy_for = (now.saturating_sub(self.busy.last.load(Ordering::Relaxed)) <= BUSY_GAP_NS)
            .then(|| now.saturating_sub(self.busy.since.load(Ordering::Relaxed)));
        let span = now
            .saturating_sub(self.busy.wall_start.load(Ordering::Relaxed))
            .max(DEMAND_WINDOW_NS);
        let current = self
            .busy
            .wall_ns
            .load(Ordering::Relaxed)
            .saturating_mul(1000)
            / span;
        could_be_heavy(
            self.share,
            busy_for,
            self.busy.wall_pm.load(Ordering::Relaxed),
            current,
        )
    }

    /// The last probe's ratio of GPU time to wall time in flight (ppm),
    /// while it is fresh and the meter works.
    fn ratio(&self, now: u64) -> Option<u64> {
        self.time.free.standing(now)
    }
}

/// The GPU time meter's sink: what it measures, into this process's
/// `Gpu`s (on the meter's thread).
pub(super) struct Meter;

impl Sink for Meter {
    fn probe_begin(&self) {
        let Some(l) = get() else { return };
        for g in l.each() {
            g.time.free.reset_probe();
            g.time.held.reset_probe();
        }
    }

    /// Charged at the next `flush`, less what the process ran holding the
    /// lease (its slices are charged by the lease).
    fn kernels(&self, dev: usize, start: u64, end: u64) {
        let Some(g) = get().and_then(|l| l.gpus.get(dev)).and_then(Option::as_ref) else {
            return;
        };
        let t = &g.time;
        let (hf, ht) = (
            t.hold_from.load(Ordering::Acquire),
            t.hold_to.load(Ordering::Acquire),
        );
        let held = end.min(ht).saturating_sub(start.max(hf));
        if held > 0 {
            t.held.add_gpu(held);
        }
        let ns = (end - start).saturating_sub(held);
        if ns > 0 {
            t.metered.fetch_add(ns, Ordering::Relaxed);
            t.free.add_gpu(ns);
        }
        // Records of kernels run holding the lease are charged only where
        // the lease does not charge that time (`hold_ppm`).
        let charged = if t.hold_metered.load(Ordering::Relaxed) {
            ns + held
        } else {
            ns
        };
        if charged > 0 {
            t.pending.fetch_add(charged, Ordering::Relaxed);
        }
    }

    fn flush(&self, now: u64) {
        let Some(l) = get() else { return };
        for g in l.each() {
            let ns = g.time.pending.swap(0, Ordering::Relaxed);
            if ns > 0 {
                g.seg.charge_free(g.tenant, ns, now);
            }
        }
    }

    /// Each GPU's ratios of GPU time to time in flight (free passes) and to
    /// time held (alone under a ceiling) over the probe, where the process
    /// had such time in it.
    fn probe_end(&self, now: u64) -> (bool, bool) {
        let Some(l) = get() else {
            return (false, false);
        };
        let (mut any, mut steady) = (false, true);
        for g in l.each() {
            // A holder's time held up to the recording's end counts (its
            // next slice end may come long after: a service idle between
            // requests).
            if g.pass.mode.load(Ordering::Acquire) == HOLDING
                && let Some((_, u)) = gputime::window()
            {
                g.count_held(u.min(now));
            }
            let held = g.time.held.close_probe(now);
            if held.wall >= crate::gputime::ratio::MIN_PROBE_WALL_NS {
                crate::debug!(
                    "GPU time meter: held {:.1} ms of the probe, kernels ran {:.1} ms of it",
                    held.wall as f64 / 1e6,
                    held.gpu as f64 / 1e6
                );
            }
            for learned in [held.learned, g.time.free.close_probe(now).learned]
                .into_iter()
                .flatten()
            {
                any = true;
                steady &= learned.1;
            }
        }
        (any, any && steady)
    }

    /// Each GPU's `competition`, folded into one number that changes when
    /// any of them does.
    fn competition(&self, now: u64) -> u64 {
        let Some(l) = get() else { return 0 };
        l.each().fold(0u64, |acc, g| {
            let (n, heavy) = g.seg.competition(g.tenant, now);
            acc.wrapping_mul(1_000_003).wrapping_add(n << 32 | heavy)
        })
    }

    fn activity(&self) -> (u64, u64) {
        let Some(l) = get() else { return (0, 0) };
        l.each().fold((0, 0), |(n, w), g| {
            (
                n + g.time.launches.load(Ordering::Relaxed),
                w + g.time.in_flight.load(Ordering::Relaxed),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_probe_is_needed_once_time_in_flight_could_make_the_tenant_heavy() {
        // Share 50 %: the bar is 250 per mille of the GPU in flight.
        assert!(!could_be_heavy(50, None, 249, 249));
        assert!(could_be_heavy(50, None, 250, 0));
        assert!(could_be_heavy(50, None, 0, 250));
        // A busy stretch of 10 ms without a break.
        assert!(!could_be_heavy(50, Some(NEED_BUSY_NS - 1), 0, 0));
        assert!(could_be_heavy(50, Some(NEED_BUSY_NS), 0, 0));
        // Share 10 %: 50 per mille; a share of 0 counts as 1 %.
        assert!(could_be_heavy(10, None, 50, 0) && !could_be_heavy(10, None, 49, 0));
        assert!(could_be_heavy(0, None, 5, 0) && !could_be_heavy(0, None, 4, 0));
        let _ = MS;
    }
}
