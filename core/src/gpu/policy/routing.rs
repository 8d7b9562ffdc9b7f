//! How a process that does not hold the lease puts its next work on the
//! GPU ([`GpuSegment::route`]: freely, through the lease, or throttled),
//! and who else competes for the GPU (where heavy matters, and what a free
//! process's kernels get of it).

use super::*;

/// How a process that does not hold the lease puts its next work on the
/// GPU ([`GpuSegment::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// At once, without the lease (charged with `charge_free`).
    Free,
    /// Through the lease (`begin_wait` / `try_acquire`).
    Lease,
    /// A latency tenant out of ceiling tokens: freely, once `until` has
    /// passed.
    Throttle { until: u64 },
}

impl GpuSegment {
    /// How a process of `tenant` that does not hold the lease launches
    /// next: freely while the tenant's demand is under its share and its
    /// ceiling has tokens, else through the lease. A latency tenant under
    /// its share never takes the lease: out of tokens, it waits for them.
    pub fn route(&self, tenant: usize, now: u64, slice: u64) -> Route {
        let Some(t) = self.tenant(tenant) else {
            return Route::Lease;
        };
        self.roll_demand(t, now);
        let max = t.max.load(Ordering::Relaxed);
        // Heavy matters only where someone else wants the GPU (or a
        // ceiling needs the lease's accounting): alone, a heavy tenant
        // launches freely, as it would without cuslice.
        if is_heavy(t) && (max < 100 || self.contended(tenant, now)) {
            return Route::Lease;
        }
        if max >= 100 {
            return Route::Free;
        }
        let tokens = self.refill(t, now, slice, true);
        if is_latency(t) {
            // It never saves up a burst: one token lets it go.
            return match ceiling_wait(max, tokens, 1) {
                None => Route::Free,
                Some(wait) => Route::Throttle {
                    until: now.saturating_add(wait.max(100_000)),
                },
            };
        }
        match admit_by_ceiling(t, tokens, slice) {
            None => Route::Free,
            Some(_) => Route::Lease,
        }
    }

    /// Whether a tenant other than `tenant` competes for this GPU now: one
    /// of its processes waits for the lease or holds it, or it had GPU time
    /// charged in its current or last demand window (with a live process).
    pub fn contended(&self, tenant: usize, now: u64) -> bool {
        let s = self.sched();
        let lease = s.lease.load(Ordering::Acquire);
        if lease != 0 && s.holder_tenant.load(Ordering::Relaxed) as usize != tenant {
            return true;
        }
        (0..MAX_TENANTS).any(|i| i != tenant && self.competes(i, now))
    }

    /// How many tenants other than `tenant` compete for this GPU now.
    pub fn competitors(&self, tenant: usize, now: u64) -> u64 {
        (0..MAX_TENANTS)
            .filter(|&i| i != tenant && self.competes(i, now))
            .count() as u64
    }

    /// Who else competes for this GPU now: how many tenants other than
    /// `tenant` compete, and how many of those are heavy (go through the
    /// lease). A change in either changes what a free process's kernels
    /// get of the GPU (its ratio of GPU time to time in flight).
    pub fn competition(&self, tenant: usize, now: u64) -> (u64, u64) {
        (0..MAX_TENANTS)
            .filter(|&i| i != tenant && self.competes(i, now))
            .fold((0, 0), |(n, heavy), i| {
                let h = self.tenant(i).is_some_and(is_heavy);
                (n + 1, heavy + u64::from(h))
            })
    }

    /// Whether tenant `i` competes for the GPU: a live process of it waits
    /// for the lease, or it was charged GPU time recently.
    fn competes(&self, i: usize, now: u64) -> bool {
        self.tenant(i).is_some_and(|o| {
            // A window is rolled by its own tenant's charges: one that
            // started long ago belongs to a tenant gone idle.
            let recent =
                now.saturating_sub(o.win_start.load(Ordering::Relaxed)) < 2 * DEMAND_WINDOW_NS;
            o.state.load(Ordering::Acquire) == READY
                && o.procs.load(Ordering::Acquire) > 0
                && (o.waiting.load(Ordering::Acquire) > 0
                    || (recent
                        && (o.win_used.load(Ordering::Relaxed) > 0
                            || o.demand_pm.load(Ordering::Relaxed) > 0)))
        })
    }

    /// Whether a process of `tenant` that launches freely may do so in
    /// long passes: no ceiling to account for, and nobody else competing.
    pub fn free_alone(&self, tenant: usize, now: u64) -> bool {
        self.tenant(tenant)
            .is_some_and(|t| t.max.load(Ordering::Relaxed) >= 100)
            && !self.contended(tenant, now)
    }
}
