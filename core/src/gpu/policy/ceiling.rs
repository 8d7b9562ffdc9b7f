//! The ceiling (`compute_max`): a token bucket refilled at the ceiling's
//! rate; the burst a standard tenant saves up once its ceiling ended a
//! hold ([`tokens_needed`]); admission by it ([`ceiling_wait`]). A bucket
//! holding a value no bucket can hold (`bounds`) is healed.

use super::*;
use crate::gpu::bounds;

/// The ceiling bucket's burst of tenant `t`, ns (one slice where its
/// entry's is unset or out of bounds: `bounds::burst_or_slice`).
fn burst_of(t: &Tenant, slice: u64) -> i64 {
    bounds::burst_or_slice(t.burst_ns.load(Ordering::Relaxed), slice).min(i64::MAX as u64) as i64
}

/// Heals `t`'s bucket if it holds a value no bucket can hold (out of
/// `bounds::tokens_in_bounds`): it restarts at 0. Returns the tokens.
fn heal_tokens(t: &Tenant) -> i64 {
    let v = t.tokens.load(Ordering::Acquire);
    if bounds::tokens_in_bounds(v) {
        return v;
    }
    let _ = t
        .tokens
        .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Acquire);
    0
}

/// How long (ns) a ceiling bucket refilled at `max` percent of wall time
/// takes to go from `tokens` to `need` (0 if it is there).
pub fn refill_wait(tokens: i64, need: i64, max: u32) -> u64 {
    if tokens >= need {
        return 0;
    }
    need.saturating_sub(tokens)
        .unsigned_abs()
        .saturating_mul(100)
        / u64::from(bounds::percent(max))
}

/// The tokens a tenant under a ceiling needs before it may take the lease:
/// after its ceiling ended a hold (`recharging`), a whole `burst`; a tenant
/// that merely waited for others, one. Waiting for a whole burst makes a
/// ceiling-bound tenant run in long stretches, long enough for the GPU's
/// clocks to settle where they are under sustained load (short bursts on a
/// mostly idle GPU run at boost clocks, and a 30 % ceiling of GPU time
/// would give ~35 % of the throughput).
pub fn tokens_needed(recharging: bool, burst: i64) -> i64 {
    if recharging { burst } else { 1 }
}

/// None when a ceiling of `max` percent lets a tenant with `tokens` saved
/// go, needing `need` ([`tokens_needed`]); else how long until it does
/// (ns). No ceiling (100) never waits.
pub fn ceiling_wait(max: u32, tokens: i64, need: i64) -> Option<u64> {
    (max < 100 && tokens < need).then(|| refill_wait(tokens, need, max))
}

/// Admits `t`, with `tokens` saved, by its ceiling ([`ceiling_wait`]):
/// None when it may take the lease, ending its recharge if it was saving
/// up a burst; else how long until it may (ns).
pub(super) fn admit_by_ceiling(t: &Tenant, tokens: i64, slice: u64) -> Option<u64> {
    let max = t.max.load(Ordering::Relaxed);
    if max >= 100 {
        return None;
    }
    let recharging = t.recharging.load(Ordering::Acquire) != 0;
    let need = tokens_needed(recharging, burst_of(t, slice));
    let wait = ceiling_wait(max, tokens, need);
    if wait.is_none() && recharging {
        t.recharging.store(0, Ordering::Release);
    }
    wait
}

impl GpuSegment {
    /// Refills the ceiling bucket up to `now`; returns the tokens (ns). The
    /// burst cap (one slice) applies to what a tenant saves up while it waits
    /// (`capped`), not to what it earns while it holds the GPU: a slice longer
    /// than the burst (long kernels) must not lose the tokens it accrued.
    /// Either way no bucket holds more than `bounds::MAX_SAVED_NS`.
    pub(super) fn refill(&self, t: &Tenant, now: u64, slice: u64, capped: bool) -> i64 {
        let max = t.max.load(Ordering::Relaxed);
        if max >= 100 {
            return i64::MAX;
        }
        // 0 is out of range: the tightest ceiling (`bounds::percent`),
        // not a bucket that never refills.
        let max = u64::from(bounds::percent(max));
        let at = t.tokens_at.load(Ordering::Acquire);
        if bounds::too_far_ahead(at, now, bounds::CLOCK_AHEAD_NS) {
            // A refill time in the future is corrupt: restart the bucket's
            // clock now (nothing is earned for the bogus interval).
            let _ = t
                .tokens_at
                .compare_exchange(at, now, Ordering::AcqRel, Ordering::Acquire);
        } else if now > at
            && t.tokens_at
                .compare_exchange(at, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let add = ((now - at) as u128 * max as u128 / 100).min(i64::MAX as u128) as i64;
            let burst = if capped { burst_of(t, slice) } else { i64::MAX };
            let _ = t
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    // A corrupt bucket (see `heal_tokens`) restarts at 0.
                    let v = if bounds::tokens_in_bounds(v) { v } else { 0 };
                    let n = v.saturating_add(add);
                    Some(bounds::saved_at_most(if n > burst {
                        burst.max(v)
                    } else {
                        n
                    }))
                });
        }
        heal_tokens(t)
    }

    /// Refills `t`'s bucket and admits it by its ceiling
    /// ([`admit_by_ceiling`]): None when it may take the lease, else until
    /// when to wait (at least 100 µs).
    pub(super) fn ceiling_hold(&self, t: &Tenant, now: u64, slice: u64) -> Option<u64> {
        let tokens = self.refill(t, now, slice, true);
        admit_by_ceiling(t, tokens, slice).map(|wait| now.saturating_add(wait.max(100_000)))
    }

    /// Refills the bucket of holder `t` (uncapped: see `refill`) and, if
    /// `used` of its hold spends it, starts its recharge; whether it did
    /// (the holder must release). No ceiling: never.
    pub(super) fn recharge_if_spent(&self, t: &Tenant, now: u64, slice: u64, used: u64) -> bool {
        if t.max.load(Ordering::Relaxed) >= 100 {
            return false;
        }
        let spent = self
            .refill(t, now, slice, false)
            .saturating_sub(used.min(i64::MAX as u64) as i64)
            <= 0;
        if spent {
            t.recharging.store(1, Ordering::Release);
        }
        spent
    }

    /// Whether `tenant` has no ceiling on this GPU.
    pub fn uncapped(&self, tenant: usize) -> bool {
        self.tenant(tenant)
            .is_some_and(|t| t.max.load(Ordering::Relaxed) >= 100)
    }
}
