//! When the meter records: the probe cadence, decided on plain numbers so
//! that it is unit-tested without CUPTI. The meter's thread
//! (`super::thread`) reads the clock and the counters, asks the cadence,
//! and does what it says.
//!
//! - A probe records `PROBE_NS`, then the meter rests `REST_NS` before the
//!   next (only while a probe is wanted).
//! - After a probe whose ratio agreed with the one before it (steady), the
//!   rest doubles, up to `REST_LONGEST_NS`; a probe that measured nothing
//!   (nothing in flight in it) needs no rest.
//! - A lengthened rest is cut back to `REST_NS` after the probe where the
//!   tenants competing for the GPU change, or where the process's launches
//!   per time in flight move by more than `GUARD_FACTOR` either way from
//!   the probe's (its kernels changed size).
//! - The records-stopped check (`Silence`): a process that launches but
//!   gets no record, twice in a row, has lost CUPTI to another client.

/// A probe records this long...
pub const PROBE_NS: u64 = 100_000_000;
/// ...and the next begins no sooner than this after it ended...
pub const REST_NS: u64 = 900_000_000;
/// ...doubled after each probe that measured what the one before it did
/// (a steady process), up to `REST_NS << REST_MAX_SHIFT`: a steady decode
/// loop beside a trainer pays for a probe every 3.7 s instead of every
/// second (each probe's requests took ~10-25 % longer on an H100).
pub const REST_MAX_SHIFT: u32 = 2;
/// The longest rest between probes.
pub const REST_LONGEST_NS: u64 = REST_NS << REST_MAX_SHIFT;
/// A lengthened rest ends (back to `REST_NS` after the probe) when the
/// process's launches per unit of time in flight move by more than this
/// factor, either way, from what they were during the probe. Judged over
/// at least `GUARD_WALL_NS` of time in flight.
pub const GUARD_FACTOR: u128 = 2;
pub const GUARD_WALL_NS: u64 = 50_000_000;
/// Under this much time in flight, a probe's launches per time in flight
/// are no baseline for the guard: the rest is not lengthened.
pub const GUARD_MIN_PROBE_WALL_NS: u64 = 10_000_000;
/// The records-stopped check: a look that finds no new record while the
/// process launched at least `LOST_LAUNCHES` kernels is silent.
pub const LOST_LAUNCHES: u64 = 16;

/// The process's launches and time in flight (ns), counted from its start.
pub type Activity = (u64, u64);

/// Why a lengthened rest was cut short.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut {
    /// The tenants competing for the process's GPUs changed.
    Competition,
    /// Launches per time in flight moved: during the probe, and since.
    Density { probe: Activity, since: Activity },
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Competition => write!(f, "the tenants competing for its GPU changed"),
            Cut::Density { probe, since } => write!(
                f,
                "launches per time in flight moved from {} per {:.1} ms to {} per {:.1} ms",
                probe.0,
                probe.1 as f64 / 1e6,
                since.0,
                since.1 as f64 / 1e6
            ),
        }
    }
}

/// Whether launches per time in flight moved by more than `GUARD_FACTOR`
/// either way from `base` to `now` (each: launches, time in flight).
pub fn density_moved(base: Activity, now: Activity) -> bool {
    let (bl, bw) = (u128::from(base.0), u128::from(base.1));
    let (nl, nw) = (u128::from(now.0), u128::from(now.1));
    // (Saturating: counters near their ends compare as unmoved, never
    // overflow.)
    let more = |a: u128, b: u128, c: u128| a.saturating_mul(b) > GUARD_FACTOR.saturating_mul(c);
    more(nl, bw, bl.saturating_mul(nw)) || more(bl, nw, nl.saturating_mul(bw))
}

fn since(now: Activity, base: Activity) -> Activity {
    (now.0.saturating_sub(base.0), now.1.saturating_sub(base.1))
}

/// The probe cadence's state between the thread's ticks.
#[derive(Debug, Default)]
pub struct Cadence {
    /// End of the current probe; earliest start of the next.
    probe_until: u64,
    rest_until: u64,
    /// A probe ended and waits for its last records to be reported.
    ending: bool,
    /// Doublings of the current rest.
    backoff: u32,
    /// Activity at the probe's start, and at the start of the guard's
    /// current window.
    probe_base: Activity,
    rest_base: Activity,
    /// The last probe's launches and time in flight (the guard's baseline;
    /// None: too little in flight to be one).
    probe_density: Option<Activity>,
    /// Who competed for the GPUs when the last probe ended.
    probe_competition: u64,
}

impl Cadence {
    /// Earliest start of the next probe.
    pub fn rest_until(&self) -> u64 {
        self.rest_until
    }

    /// Whether a probe ended and its last records are still to be taken.
    pub fn ending(&self) -> bool {
        self.ending
    }

    /// Whether the current rest was lengthened (steady probes).
    pub fn lengthened(&self) -> bool {
        self.backoff > 0
    }

    /// A probe begins at `t` (recording on), with the process's activity
    /// then.
    pub fn started(&mut self, t: u64, activity: Activity) {
        self.probe_until = t.saturating_add(PROBE_NS);
        self.probe_base = activity;
    }

    /// While recording: whether the probe is over at `now`.
    pub fn probe_over(&self, now: u64) -> bool {
        now >= self.probe_until
    }

    /// Recording was switched off at `now`: its last records are to be
    /// taken at the next tick, and the next probe rests `REST_NS`.
    pub fn stopped(&mut self, now: u64) {
        self.rest_until = now.saturating_add(REST_NS);
        self.ending = true;
    }

    /// The probe's last records are in (at `now`; recording ended at
    /// `ended`): it `measured` something and was `steady` (see
    /// `super::ratio::learn`); `activity` and `competition` as of now.
    /// Returns whether the rest was lengthened.
    pub fn collected(
        &mut self,
        now: u64,
        ended: u64,
        measured: bool,
        steady: bool,
        activity: Activity,
        competition: u64,
    ) -> bool {
        self.ending = false;
        if !measured {
            // Nothing in flight in it (the process waited through it, for
            // its ceiling say): no reason to rest before the next.
            self.rest_until = now;
        }
        let during = since(activity, self.probe_base);
        self.probe_density =
            (during.1 >= GUARD_MIN_PROBE_WALL_NS && during.0 > 0).then_some(during);
        self.backoff = if steady && self.probe_density.is_some() {
            (self.backoff + 1).min(REST_MAX_SHIFT)
        } else {
            0
        };
        self.rest_base = activity;
        self.probe_competition = competition;
        if self.backoff > 0 {
            self.rest_until = ended.saturating_add(REST_NS << self.backoff);
        }
        self.backoff > 0
    }

    /// During a lengthened rest (not recording, nothing ending): cut it
    /// back to `REST_NS` after the probe (`ended`) where the competition
    /// changed or the process's kernels changed size. What cut it, if
    /// anything.
    pub fn check_rest(
        &mut self,
        now: u64,
        ended: u64,
        activity: Activity,
        competition: u64,
    ) -> Option<Cut> {
        if self.ending || self.backoff == 0 || now >= self.rest_until {
            return None;
        }
        let moved = since(activity, self.rest_base);
        let mut cut = None;
        if competition != self.probe_competition {
            cut = Some(Cut::Competition);
        } else if moved.1 >= GUARD_WALL_NS {
            if let Some(p) = self.probe_density.filter(|&p| density_moved(p, moved)) {
                cut = Some(Cut::Density {
                    probe: p,
                    since: moved,
                });
            }
            self.rest_base = activity;
        }
        if cut.is_some() {
            self.backoff = 0;
            let base = ended.saturating_add(REST_NS);
            self.rest_until = self.rest_until.min(base.max(now));
        }
        cut
    }

    /// Whether a probe may begin at `now` (not recording): one is
    /// `wanted` and the rest is over.
    pub fn may_start(&self, now: u64, wanted: bool) -> bool {
        wanted && now >= self.rest_until
    }
}

/// The records-stopped check's state: the records and launches at the
/// last baseline, and silent looks in a row.
#[derive(Debug, Default)]
pub struct Silence {
    records: u64,
    launches: u64,
    silent: u32,
}

impl Silence {
    /// A look at (`records`, `launches`): silent where no record came
    /// while at least `LOST_LAUNCHES` kernels were launched since the
    /// baseline. True at the second silent look in a row: someone else
    /// took CUPTI.
    pub fn look(&mut self, records: u64, launches: u64) -> bool {
        self.silent =
            if records == self.records && launches.saturating_sub(self.launches) >= LOST_LAUNCHES {
                self.silent + 1
            } else {
                0
            };
        self.silent >= 2
    }

    /// The next look compares with these counts.
    pub fn rebase(&mut self, records: u64, launches: u64) {
        (self.records, self.launches) = (records, launches);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A probe from `t`, collected right after it: returns the collection
    /// time.
    fn probe(c: &mut Cadence, t: u64, measured: bool, steady: bool, act: Activity) -> u64 {
        c.started(t, act);
        let end = t + PROBE_NS;
        assert!(!c.probe_over(end - 1) && c.probe_over(end));
        c.stopped(end);
        assert!(c.ending());
        let done = end + 4 * MS;
        c.collected(
            done,
            end,
            measured,
            steady,
            (act.0 + 1000, act.1 + 50 * MS),
            7,
        );
        assert!(!c.ending());
        done
    }

    #[test]
    fn a_probe_rests_rest_ns_and_steady_probes_double_the_rest_up_to_the_longest() {
        let mut c = Cadence::default();
        assert!(c.may_start(0, true) && !c.may_start(0, false));
        // Not steady: the next probe after REST_NS from the probe's end.
        let mut t = 0;
        let done = probe(&mut c, t, true, false, (0, 0));
        assert_eq!(c.rest_until(), t + PROBE_NS + REST_NS);
        assert!(!c.lengthened());
        assert!(!c.may_start(c.rest_until() - 1, true) && c.may_start(c.rest_until(), true));
        let _ = done;
        // Steady: 2x, 4x, then 4x again (REST_MAX_SHIFT = 2).
        for shift in [1, 2, 2] {
            t = c.rest_until();
            probe(&mut c, t, true, true, (0, 0));
            assert!(c.lengthened());
            assert_eq!(
                c.rest_until(),
                t + PROBE_NS + (REST_NS << shift),
                "shift {shift}"
            );
        }
        assert_eq!(c.rest_until() - t - PROBE_NS, REST_LONGEST_NS);
        // One unsteady probe: back to REST_NS.
        t = c.rest_until();
        probe(&mut c, t, true, false, (0, 0));
        assert_eq!(c.rest_until(), t + PROBE_NS + REST_NS);
    }

    #[test]
    fn a_probe_that_measured_nothing_needs_no_rest() {
        let mut c = Cadence::default();
        let done = probe(&mut c, 0, false, false, (0, 0));
        assert_eq!(c.rest_until(), done);
        assert!(c.may_start(done, true));
    }

    #[test]
    fn too_little_in_flight_in_a_probe_keeps_the_rest_short_even_when_steady() {
        let mut c = Cadence::default();
        c.started(0, (0, 0));
        c.stopped(PROBE_NS);
        // 5 ms in flight: under GUARD_MIN_PROBE_WALL_NS.
        assert!(!c.collected(PROBE_NS + MS, PROBE_NS, true, true, (100, 5 * MS), 0));
        assert_eq!(c.rest_until(), PROBE_NS + REST_NS);
        // No launches at all: likewise.
        c.started(c.rest_until(), (100, 5 * MS));
        c.stopped(c.rest_until() + PROBE_NS);
        assert!(!c.collected(0, 0, true, true, (100, 500 * MS), 0));
    }

    fn lengthened() -> (Cadence, u64) {
        let mut c = Cadence::default();
        c.started(0, (0, 0));
        c.stopped(PROBE_NS);
        // 1000 launches in 50 ms during the probe; competition 7.
        assert!(c.collected(PROBE_NS + MS, PROBE_NS, true, true, (1000, 50 * MS), 7));
        assert_eq!(c.rest_until(), PROBE_NS + 2 * REST_NS);
        (c, PROBE_NS)
    }

    #[test]
    fn a_lengthened_rest_is_cut_when_the_competition_changes() {
        let (mut c, ended) = lengthened();
        let now = ended + 300 * MS;
        assert_eq!(c.check_rest(now, ended, (1000, 50 * MS), 7), None);
        assert_eq!(
            c.check_rest(now, ended, (1000, 50 * MS), 8),
            Some(Cut::Competition)
        );
        assert!(!c.lengthened());
        assert_eq!(c.rest_until(), ended + REST_NS);
        // Cut late (past REST_NS after the probe): the next probe may
        // begin at once.
        let (mut c, ended) = lengthened();
        let now = ended + REST_NS + 200 * MS;
        assert_eq!(
            c.check_rest(now, ended, (1000, 50 * MS), 9),
            Some(Cut::Competition)
        );
        assert_eq!(c.rest_until(), now);
    }

    #[test]
    fn a_lengthened_rest_is_cut_when_kernels_change_size_judged_over_enough_time_in_flight() {
        let (mut c, ended) = lengthened();
        let now = ended + 100 * MS;
        // 20 per ms during the probe. Since: 60 ms in flight with 3000
        // launches (50 per ms: 2.5x) cuts it...
        let base = (1000, 50 * MS);
        assert_eq!(
            c.check_rest(now, ended, (base.0 + 3000, base.1 + 60 * MS), 7),
            Some(Cut::Density {
                probe: (1000, 50 * MS),
                since: (3000, 60 * MS)
            })
        );
        // ...1.5x does not, and the window moves on.
        let (mut c, ended) = lengthened();
        assert_eq!(
            c.check_rest(now, ended, (base.0 + 1800, base.1 + 60 * MS), 7),
            None
        );
        assert!(c.lengthened());
        // Under GUARD_WALL_NS in flight: not judged yet, whatever moved.
        let (mut c, ended) = lengthened();
        assert_eq!(
            c.check_rest(now, ended, (base.0 + 9000, base.1 + 40 * MS), 7),
            None
        );
        // Kernels that grew (5 per ms: a quarter) cut it too.
        assert!(
            c.check_rest(now, ended, (base.0 + 9000 + 300, base.1 + 100 * MS), 7)
                .is_some()
        );
    }

    #[test]
    fn no_rest_is_checked_while_ending_or_unlengthened_or_over() {
        let mut c = Cadence::default();
        assert_eq!(c.check_rest(1, 0, (0, 0), 99), None);
        let (mut c, ended) = lengthened();
        assert_eq!(c.check_rest(c.rest_until(), ended, (0, 0), 99), None);
    }

    #[test]
    fn density_moves_past_the_factor_either_way() {
        assert!(!density_moved((100, 10), (200, 10)));
        assert!(density_moved((100, 10), (201, 10)));
        assert!(!density_moved((100, 10), (50, 10)));
        assert!(density_moved((100, 10), (49, 10)));
        // No overflow at the extremes.
        assert!(!density_moved((u64::MAX, u64::MAX), (u64::MAX, u64::MAX)));
    }

    #[test]
    fn two_silent_looks_in_a_row_mean_records_stopped() {
        let mut s = Silence::default();
        s.rebase(10, 100);
        // Launches but no record: silent once...
        assert!(!s.look(10, 100 + LOST_LAUNCHES));
        // ...a record came: not silent.
        assert!(!s.look(11, 100 + LOST_LAUNCHES));
        // Too few launches to tell: not silent.
        s.rebase(11, 200);
        assert!(!s.look(11, 200 + LOST_LAUNCHES - 1));
        // Twice silent in a row: lost.
        assert!(!s.look(11, 200 + LOST_LAUNCHES));
        assert!(s.look(11, 200 + 2 * LOST_LAUNCHES));
    }
}
