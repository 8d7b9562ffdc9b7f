//! The ratio estimate: what share of a process's time in flight (or of its
//! hold of the lease) its kernels ran on the GPU, as the last probe
//! measured it. Between probes the compute path charges time in flight
//! times this ratio (`crate::compute`).

use std::sync::atomic::{AtomicU64, Ordering};

/// A probe's ratio stands in for records this long (probes come every
/// `PROBE_NS + REST_NS` while needed, at most every `PROBE_NS +
/// REST_LONGEST_NS` for a steady process).
pub const RATIO_STALE_NS: u64 = super::cadence::REST_LONGEST_NS + 1_400_000_000;
/// Two probes in a row measured the same (the rest may lengthen) where
/// their ratios differ by at most this (ppm), or a quarter of the earlier.
pub const STEADY_PPM: u64 = 10_000;
/// A probe that saw less time in flight than this teaches nothing (the
/// process was idle through it): the last ratio stands.
pub const MIN_PROBE_WALL_NS: u64 = 2_000_000;
/// Parts per million of a whole.
pub const WHOLE_PPM: u64 = 1_000_000;
const NO_RATIO: u64 = u64::MAX;

/// `ns` times `ppm` parts per million.
pub fn of_ppm(ns: u64, ppm: u64) -> u64 {
    (u128::from(ns) * u128::from(ppm) / u128::from(WHOLE_PPM)) as u64
}

/// What a probe measured: GPU time `gpu` of `wall` in flight, as a ratio
/// (ppm, at most a whole), and whether it agrees with the ratio standing
/// `before` it (steady). None where `wall` is too short to teach anything.
pub fn learn(gpu: u64, wall: u64, before: Option<u64>) -> Option<(u64, bool)> {
    if wall < MIN_PROBE_WALL_NS {
        return None;
    }
    let ppm =
        (u128::from(gpu) * u128::from(WHOLE_PPM) / u128::from(wall)).min(WHOLE_PPM.into()) as u64;
    let steady = before.is_some_and(|b| ppm.abs_diff(b) <= STEADY_PPM.max(b / 4));
    Some((ppm, steady))
}

/// Whether a ratio `ppm` learned `at` still stands at `now`: one was
/// learned, it is not stale, and the meter still works (`usable`).
pub fn stands(ppm: u64, at: u64, now: u64, usable: bool) -> Option<u64> {
    (ppm != NO_RATIO && usable && now.saturating_sub(at) < RATIO_STALE_NS).then_some(ppm)
}

/// One estimate: the current probe's counts (GPU time from records, time in
/// flight) and the ratio the last probe learned.
pub struct Estimate {
    probe_gpu: AtomicU64,
    probe_wall: AtomicU64,
    ppm: AtomicU64,
    at: AtomicU64,
}

/// A probe closed on an estimate: its counts, and what it taught.
pub struct Closed {
    pub gpu: u64,
    pub wall: u64,
    /// The ratio learned and whether it was steady; None: too little in
    /// flight (the last ratio stands).
    pub learned: Option<(u64, bool)>,
}

impl Estimate {
    pub const fn new() -> Self {
        Estimate {
            probe_gpu: AtomicU64::new(0),
            probe_wall: AtomicU64::new(0),
            ppm: AtomicU64::new(NO_RATIO),
            at: AtomicU64::new(0),
        }
    }

    /// GPU time from the current probe's records.
    pub fn add_gpu(&self, ns: u64) {
        self.probe_gpu.fetch_add(ns, Ordering::Relaxed);
    }

    /// Time in flight inside the current probe.
    pub fn add_wall(&self, ns: u64) {
        self.probe_wall.fetch_add(ns, Ordering::Relaxed);
    }

    /// The current probe's counts so far: (GPU time, time in flight).
    pub fn so_far(&self) -> (u64, u64) {
        (
            self.probe_gpu.load(Ordering::Relaxed),
            self.probe_wall.load(Ordering::Relaxed),
        )
    }

    /// A probe begins: its counts start from zero.
    pub fn reset_probe(&self) {
        self.probe_gpu.store(0, Ordering::Relaxed);
        self.probe_wall.store(0, Ordering::Relaxed);
    }

    /// Whether any probe has taught a ratio yet (stale or not).
    pub fn learned_any(&self) -> bool {
        self.ppm.load(Ordering::Relaxed) != NO_RATIO
    }

    /// The ratio while it stands at `now` (see `stands`).
    pub fn standing(&self, now: u64) -> Option<u64> {
        stands(
            self.ppm.load(Ordering::Relaxed),
            self.at.load(Ordering::Relaxed),
            now,
            super::usable(),
        )
    }

    /// The probe ended at `now` with its records in: its counts are taken
    /// (and zeroed), and where it saw enough in flight, its ratio replaces
    /// the last.
    pub fn close_probe(&self, now: u64) -> Closed {
        let gpu = self.probe_gpu.swap(0, Ordering::Relaxed);
        let wall = self.probe_wall.swap(0, Ordering::Relaxed);
        let learned = learn(gpu, wall, self.standing(now));
        if let Some((ppm, _)) = learned {
            self.ppm.store(ppm, Ordering::Relaxed);
            self.at.store(now, Ordering::Relaxed);
        }
        Closed { gpu, wall, learned }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_probe_with_too_little_in_flight_teaches_nothing() {
        assert_eq!(learn(MS, MIN_PROBE_WALL_NS - 1, None), None);
        assert_eq!(learn(MS, MIN_PROBE_WALL_NS, None), Some((500_000, false)));
    }

    #[test]
    fn the_ratio_is_gpu_time_per_time_in_flight_and_at_most_whole() {
        assert_eq!(learn(3 * MS, 100 * MS, None), Some((30_000, false)));
        // Records of overlapping kernels can sum past the time in flight.
        assert_eq!(learn(150 * MS, 100 * MS, None), Some((WHOLE_PPM, false)));
        assert_eq!(learn(0, 100 * MS, None), Some((0, false)));
    }

    #[test]
    fn steady_means_within_a_point_or_a_quarter_of_the_ratio_before() {
        // Low ratios: within 10 000 ppm (a point).
        assert_eq!(learn(5 * MS, 100 * MS, Some(40_000)), Some((50_000, true)));
        assert_eq!(learn(6 * MS, 100 * MS, Some(40_000)), Some((60_000, false)));
        // High ratios: within a quarter of the earlier.
        assert_eq!(
            learn(70 * MS, 100 * MS, Some(800_000)),
            Some((700_000, true))
        );
        assert_eq!(
            learn(50 * MS, 100 * MS, Some(800_000)),
            Some((500_000, false))
        );
        // Nothing standing before: not steady.
        assert_eq!(learn(50 * MS, 100 * MS, None), Some((500_000, false)));
    }

    #[test]
    fn a_ratio_stands_until_stale_and_only_while_the_meter_works() {
        assert_eq!(stands(NO_RATIO, 0, 1, true), None);
        assert_eq!(stands(42, 10, 10 + RATIO_STALE_NS - 1, true), Some(42));
        assert_eq!(stands(42, 10, 10 + RATIO_STALE_NS, true), None);
        assert_eq!(stands(42, 10, 11, false), None);
        // A clock before the learning time (another thread's) stands.
        assert_eq!(stands(42, 10, 5, true), Some(42));
    }

    #[test]
    fn of_ppm_scales_without_overflow() {
        assert_eq!(of_ppm(10 * MS, 250_000), 2_500_000);
        assert_eq!(of_ppm(u64::MAX, WHOLE_PPM), u64::MAX);
        assert_eq!(of_ppm(u64::MAX, 0), 0);
    }

    #[test]
    fn closing_a_probe_takes_its_counts() {
        let e = Estimate::new();
        e.add_gpu(20 * MS);
        e.add_wall(40 * MS);
        assert_eq!(e.so_far(), (20 * MS, 40 * MS));
        // (The meter is not loaded in unit tests: the ratio is learned,
        // but does not stand.)
        let c = e.close_probe(1_000 * MS);
        assert_eq!(
            (c.gpu, c.wall, c.learned),
            (20 * MS, 40 * MS, Some((500_000, false)))
        );
        assert_eq!(e.so_far(), (0, 0));
        assert!(e.learned_any());
        assert_eq!(e.standing(1_000 * MS), None);
    }
}
