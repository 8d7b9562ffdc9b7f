//! What a tenant is charged: GPU time measured under the lease (which
//! moves its virtual time), work in flight of a process that launched
//! freely (`charge_free`, `charge_bound`), and what every charge touches
//! (the accounting, the ceiling bucket, the demand window).

use super::*;
use crate::gpu::bounds;

/// A hold charged whole (`renew_measured`, `release_measured`).
pub const WHOLE_PPM: u64 = 1_000_000;

/// `ns` of a hold charged at `ppm` parts per million (at most all of it).
pub(super) fn of_hold(ns: u64, ppm: u64) -> u64 {
    (u128::from(ns) * u128::from(ppm.min(WHOLE_PPM)) / u128::from(WHOLE_PPM)) as u64
}

impl GpuSegment {
    /// Charges `ns` of GPU time measured under the lease to `tenant`: its
    /// virtual time, and what every charge touches (`charge_usage`).
    pub(super) fn charge(&self, tenant: usize, ns: u64, now: u64) {
        let Some(t) = self.tenant(tenant) else { return };
        let share = u64::from(bounds::percent(t.share.load(Ordering::Relaxed)));
        t.vtime
            .fetch_add(ns.saturating_mul(100) / share, Ordering::AcqRel);
        self.charge_usage(t, ns, now);
    }

    /// What any charge touches: the accounting, the ceiling bucket and the
    /// demand window. Not the virtual time: that orders tenants competing
    /// through the lease, by GPU time measured exactly (a free tenant's
    /// charge is an upper bound, and several light tenants' bounds overlap;
    /// a tenant that turns heavy joins at the active ones' virtual time).
    fn charge_usage(&self, t: &Tenant, ns: u64, now: u64) {
        t.used_ns.fetch_add(ns, Ordering::AcqRel);
        if t.max.load(Ordering::Relaxed) < 100 {
            let ns = ns.min(i64::MAX as u64) as i64;
            let _ = t
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_sub(ns))
                });
        }
        t.win_used.fetch_add(ns, Ordering::AcqRel);
        self.roll_demand(t, now);
    }

    pub fn add_throttled(&self, tenant: usize, ns: u64) {
        if let Some(t) = self.tenant(tenant) {
            t.throttled_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Charges `ns` of work in flight of a process that launched freely.
    pub fn charge_free(&self, tenant: usize, ns: u64, now: u64) {
        if let Some(t) = self.tenant(tenant) {
            self.charge_usage(t, bounds::charge_ns(ns), now);
        }
    }

    /// Charges `ns` of work in flight of process `slot` that launched
    /// freely while nothing measured what its kernels ran: its wall time
    /// in flight, an upper bound, which the process entry also counts
    /// (`bound_ns`, display: `cuslice status` checks it against NVML).
    pub fn charge_bound(&self, slot: usize, tenant: usize, ns: u64, now: u64) {
        let ns = bounds::charge_ns(ns);
        if let Some(t) = self.tenant(tenant) {
            self.charge_usage(t, ns, now);
            if let Some(p) = self.proc_entry(slot) {
                p.bound_ns.fetch_add(ns, Ordering::Relaxed);
            }
        }
    }
}
