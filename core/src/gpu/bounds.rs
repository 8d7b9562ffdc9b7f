//! What a cuslice process can write into the per-GPU segment, as bounds:
//! every limit on a value read from the segment, defined once. The
//! scheduling policy ([`super::policy`]) clamps with them (a value beyond
//! one is corrupt: it is not honoured), and the watchdog's audit
//! ([`super::audit`]) judges with them (a value beyond one is a finding).
//!
//! Any tenant can write the segment, so each bound is the tightest one no
//! real cuslice process exceeds, read from how the value is written: one
//! looser lets garbage steer arbitration, one tighter calls an honest
//! tenant's value forged. Times written "ahead" are the writer's clock plus
//! a lead; a reader whose clock it read a moment before the writer read its
//! own sees them a little further ahead ([`CLOCK_LAG_NS`]).
//!
//! Pure functions on integers: no segment, no clock.

use std::ops::RangeInclusive;

use crate::config::{MAX_COMPUTE_BURST_MS, MAX_COMPUTE_SLICE_MS};

/// The longest slice a process may use: `compute_slice_ms` is at most
/// `MAX_COMPUTE_SLICE_MS` (1 s). A holder's deadline lies at most this far
/// ahead of its clock, and one charge covers at most this much (a free pass
/// is charged at its end, a lease taken over up to its deadline).
pub const MAX_SLICE_NS: u64 = MAX_COMPUTE_SLICE_MS as u64 * 1_000_000;

/// The largest burst a configuration can give (`compute_burst_ms`); a
/// larger one in a tenant entry was not written at registration.
pub const MAX_BURST_NS: u64 = MAX_COMPUTE_BURST_MS as u64 * 1_000_000;

/// The most a ceiling bucket can hold: a whole burst saved while waiting
/// (refills while waiting stop at the burst), plus what it earns during one
/// slice it holds before that slice is charged. The policy never refills a
/// bucket beyond it, so no real process writes more.
pub const MAX_SAVED_NS: u64 = MAX_BURST_NS + MAX_SLICE_NS;

/// The largest debt a ceiling bucket can owe: charges are at most a slice
/// each (or one hold's length), so a debt of an hour of GPU time is
/// garbage, and honouring it would stop the tenant for hours.
pub const MAX_DEBT_NS: u64 = 3_600_000_000_000;

/// How far a reader's clock may lag the clock a writer stamped a value
/// with (CLOCK_MONOTONIC is host wide; the lag is the time between a
/// process reading its clock and using it: preemption on a loaded host).
/// The same as the lease's overstay grace (`policy::GRACE_NS`).
pub const CLOCK_LAG_NS: u64 = 50_000_000;

/// The furthest ahead of a reader's clock a lease deadline can lie: one
/// maximal slice from its holder's clock (granted or renewed at `now +
/// slice`), plus the reader's lag.
pub const DEADLINE_AHEAD_NS: u64 = MAX_SLICE_NS + CLOCK_LAG_NS;

/// The longest a latency stamp reaches ahead of its writer's clock: a
/// synchronising call stamps this far (policy's `LATENCY_SYNC_CAP_NS`,
/// which is this), a launch less (`LATENCY_LINGER_NS`), a call's return
/// less again.
pub const STAMP_LEAD_NS: u64 = 20_000_000;

/// The furthest ahead of a reader's clock a latency stamp (a tenant's
/// `active_until`, the scheduler's `lat_until` hint) can lie.
pub const STAMP_AHEAD_NS: u64 = STAMP_LEAD_NS + CLOCK_LAG_NS;

/// The furthest ahead of a reader's clock a time written as its writer's
/// own clock can lie (bucket refill time, demand window start, last
/// activity, slice start, last sweep): the reader's lag alone.
pub const CLOCK_AHEAD_NS: u64 = CLOCK_LAG_NS;

/// How far a tenant's counter (live processes, waiting ones, threads in a
/// synchronising call) may differ from what its process entries say: a
/// process registering or leaving moves the entry and the counter one
/// after the other, without a common lock.
pub const COUNT_SLACK: u32 = 2;

/// The most threads of one process counted inside a synchronising call
/// (a process entry's `syncing`): far beyond any real process's threads,
/// and small enough that summing 512 entries cannot overflow.
pub const MAX_SYNCING: u32 = 1 << 16;

/// How far a waiting tenant's virtual time may lag the least of the other
/// competing tenants: it is raised to theirs when it starts to wait, and
/// they advance by at most a slice each at share 1 while it waits for its
/// turn; ten maximal slices at share 1 is far beyond that.
pub const VTIME_LAG: u64 = 10 * MAX_SLICE_NS * 100;

/// A share or a ceiling, percent: registration clamps both into this
/// range (a ceiling of 100 is none).
pub const PERCENT: RangeInclusive<u32> = 1..=100;

/// Whether `v`, read from the segment at the reader's `now`, lies further
/// ahead than `ahead` (one of the `*_AHEAD_NS` bounds): then no cuslice
/// process wrote it.
pub fn too_far_ahead(v: u64, now: u64, ahead: u64) -> bool {
    v > now.saturating_add(ahead)
}

/// Whether a ceiling bucket's tokens lie within what a bucket can hold
/// (`MAX_DEBT_NS` owed to `MAX_SAVED_NS` saved).
pub fn tokens_in_bounds(tokens: i64) -> bool {
    (-(MAX_DEBT_NS as i64)..=MAX_SAVED_NS as i64).contains(&tokens)
}

/// A bucket's tokens after a refill, never beyond what a bucket can hold.
pub fn saved_at_most(tokens: i64) -> i64 {
    tokens.min(MAX_SAVED_NS as i64)
}

/// A burst as the policy uses it: `raw` from the tenant entry, or one
/// `slice` where it is unset (0) or beyond what a configuration gives.
pub fn burst_or_slice(raw: u64, slice: u64) -> u64 {
    if raw == 0 || raw > MAX_BURST_NS {
        slice
    } else {
        raw
    }
}

/// What one charge counts at most: a slice's worth.
pub fn charge_ns(ns: u64) -> u64 {
    ns.min(MAX_SLICE_NS)
}

/// A share or a ceiling read from the segment, clamped into [`PERCENT`]:
/// 0 counts as 1 (the tightest ceiling, the smallest weight), beyond 100
/// as 100.
pub fn percent(v: u32) -> u32 {
    v.clamp(*PERCENT.start(), *PERCENT.end())
}

/// Whether a counter recording `recorded` agrees with the `counted`
/// process entries, within [`COUNT_SLACK`].
pub fn count_agrees(recorded: u32, counted: u32) -> bool {
    recorded.abs_diff(counted) <= COUNT_SLACK
}

/// Whether a waiting tenant's virtual time `vtime` lags `least` (the other
/// competing tenants' least) by more than any wait can make it.
pub fn vtime_lags(vtime: u64, least: u64) -> bool {
    vtime.saturating_add(VTIME_LAG) < least
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000_000;

    #[test]
    fn times_ahead_are_accepted_up_to_their_bound() {
        for ahead in [DEADLINE_AHEAD_NS, STAMP_AHEAD_NS, CLOCK_AHEAD_NS] {
            assert!(!too_far_ahead(NOW + ahead, NOW, ahead), "{ahead}");
            assert!(too_far_ahead(NOW + ahead + 1, NOW, ahead), "{ahead}");
            assert!(!too_far_ahead(0, NOW, ahead), "the past is never ahead");
            // Near the end of the clock: no overflow, nothing is beyond.
            assert!(!too_far_ahead(u64::MAX, u64::MAX - 1, ahead));
        }
        // What the writers write, read by a reader that lags them.
        let writer = NOW + CLOCK_LAG_NS;
        assert!(!too_far_ahead(
            writer + MAX_SLICE_NS,
            NOW,
            DEADLINE_AHEAD_NS
        ));
        assert!(!too_far_ahead(writer + STAMP_LEAD_NS, NOW, STAMP_AHEAD_NS));
        assert!(!too_far_ahead(writer, NOW, CLOCK_AHEAD_NS));
    }

    #[test]
    fn a_bucket_holds_a_burst_and_a_slice_saved_and_an_hour_owed() {
        assert!(tokens_in_bounds(MAX_SAVED_NS as i64));
        assert!(!tokens_in_bounds(MAX_SAVED_NS as i64 + 1));
        assert!(tokens_in_bounds(-(MAX_DEBT_NS as i64)));
        assert!(!tokens_in_bounds(-(MAX_DEBT_NS as i64) - 1));
        assert!(!tokens_in_bounds(i64::MIN) && !tokens_in_bounds(i64::MAX));
        assert_eq!(saved_at_most(MAX_SAVED_NS as i64), MAX_SAVED_NS as i64);
        assert_eq!(saved_at_most(i64::MAX), MAX_SAVED_NS as i64);
        assert_eq!(saved_at_most(-5), -5);
    }

    #[test]
    fn a_burst_beyond_any_configuration_is_one_slice() {
        assert_eq!(burst_or_slice(MAX_BURST_NS, 20), MAX_BURST_NS);
        assert_eq!(burst_or_slice(MAX_BURST_NS + 1, 20), 20);
        assert_eq!(burst_or_slice(0, 20), 20, "unset");
        assert_eq!(burst_or_slice(1, 20), 1);
    }

    #[test]
    fn one_charge_counts_at_most_a_slice() {
        assert_eq!(charge_ns(MAX_SLICE_NS), MAX_SLICE_NS);
        assert_eq!(charge_ns(MAX_SLICE_NS + 1), MAX_SLICE_NS);
        assert_eq!(charge_ns(u64::MAX), MAX_SLICE_NS);
    }

    #[test]
    fn shares_and_ceilings_are_percent() {
        assert_eq!(percent(1), 1);
        assert_eq!(percent(0), 1);
        assert_eq!(percent(100), 100);
        assert_eq!(percent(101), 100);
        assert_eq!(percent(u32::MAX), 100);
    }

    #[test]
    fn counters_agree_within_the_slack() {
        assert!(count_agrees(5 + COUNT_SLACK, 5));
        assert!(count_agrees(5 - COUNT_SLACK, 5));
        assert!(!count_agrees(5 + COUNT_SLACK + 1, 5));
        assert!(!count_agrees(0, COUNT_SLACK + 1));
        assert!(!count_agrees(u32::MAX, 0));
        // The largest sum of syncing threads cannot overflow a counter.
        assert!((MAX_SYNCING as u64) * 512 < u32::MAX as u64);
    }

    #[test]
    fn a_virtual_time_lags_at_most_ten_maximal_slices_at_share_one() {
        let least = 100 * VTIME_LAG;
        assert!(!vtime_lags(least - VTIME_LAG, least));
        assert!(vtime_lags(least - VTIME_LAG - 1, least));
        assert!(!vtime_lags(u64::MAX, 0), "ahead is no lag");
    }
}
