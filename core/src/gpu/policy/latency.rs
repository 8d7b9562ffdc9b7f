//! The latency class: a latency process's privilege budget
//! ([`privilege_refill`]), its stamps of work in flight (its launches and
//! synchronising calls), and standard tenants holding back while a stamp
//! lies ahead ([`GpuSegment::take_latency_hold`]) and keeping short queues
//! while a latency tenant is live.

use super::*;
use crate::gpu::bounds;

/// A latency tenant's launch keeps it active this long: the gap between
/// the launches of one request, and the time its last kernels take.
pub const LATENCY_LINGER_NS: u64 = 500_000;
/// The longest a synchronising call of a latency tenant holds others back
/// (the furthest ahead a latency stamp reaches: `bounds::STAMP_LEAD_NS`).
pub const LATENCY_SYNC_CAP_NS: u64 = bounds::STAMP_LEAD_NS;
/// After a latency tenant's synchronising call returns, nothing of it is
/// in flight; this covers only the gap to its next launch, if the request
/// goes on (a few tens of microseconds of host code).
pub const LATENCY_SYNC_TAIL_NS: u64 = 100_000;
/// A latency process's privilege (others hold back while its work is in
/// flight) is a budget of wall time in flight: at most this much at once,
/// refilled at half its share of wall time ([`privilege_refill`]). A
/// service's request (milliseconds) finds it full; a launch-bound loop
/// (a decode server, in flight for hundreds of milliseconds while its
/// kernels run a few percent of it) spends it in the first 20 ms of each
/// request and goes on as a standard tenant would, charged its kernels'
/// GPU time: holding a trainer back for the rest would idle the GPU.
pub const LATENCY_PRIVILEGE_NS: u64 = 20_000_000;

/// A latency process's privilege budget (ns; negative: spent beyond it by
/// a call that ran long) after `elapsed` more ns of wall time at a share of
/// `share` percent: refilled at half the share, up to
/// `LATENCY_PRIVILEGE_NS`. Over a long run a latency tenant holds others
/// back at most half its share of the time, however often it comes.
pub fn privilege_refill(tokens: i64, elapsed: u64, share: u32) -> i64 {
    let cap = LATENCY_PRIVILEGE_NS as i64;
    let add =
        (elapsed as u128 * u128::from(bounds::percent(share)) / 200).min(cap as u128 * 2) as i64;
    tokens.clamp(-cap * 50, cap).saturating_add(add).min(cap)
}

impl GpuSegment {
    /// Whether `tenant` is a latency tenant under its share (its
    /// processes stamp their work in flight).
    pub fn latency_privileged(&self, tenant: usize) -> bool {
        self.tenant(tenant)
            .is_some_and(|t| is_latency(t) && !is_heavy(t))
    }

    /// A latency tenant's work is in flight until `until`.
    pub fn latency_stamp(&self, tenant: usize, until: u64) {
        if let Some(t) = self.tenant(tenant) {
            t.active_until.fetch_max(until, Ordering::AcqRel);
            self.sched().lat_until.fetch_max(until, Ordering::AcqRel);
        }
    }

    /// A thread of latency process `slot` enters a synchronising call: its
    /// work is in flight until the call returns (at most
    /// `LATENCY_SYNC_CAP_NS`).
    pub fn latency_sync_begin(&self, slot: usize, tenant: usize, now: u64) {
        let (Some(p), Some(t)) = (self.proc_entry(slot), self.tenant(tenant)) else {
            return;
        };
        p.syncing.fetch_add(1, Ordering::AcqRel);
        t.in_sync.fetch_add(1, Ordering::AcqRel);
        self.latency_stamp(tenant, now.saturating_add(LATENCY_SYNC_CAP_NS));
    }

    /// The synchronising call returned. When no thread of the tenant is in
    /// one any more, its stamp comes down to `LATENCY_SYNC_TAIL_NS` from now
    /// and the hint is recomputed. Returns whether tenants holding back may be
    /// asleep on `latency_word` (the caller wakes them).
    pub fn latency_sync_end(&self, slot: usize, tenant: usize, now: u64) -> bool {
        let (Some(p), Some(t)) = (self.proc_entry(slot), self.tenant(tenant)) else {
            return false;
        };
        dec(&p.syncing);
        let before = t
            .in_sync
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(1))
            })
            .unwrap_or(0);
        if before > 1 {
            return false;
        }
        t.active_until
            .store(now.saturating_add(LATENCY_SYNC_TAIL_NS), Ordering::Release);
        let s = self.sched();
        // The hint only ever grows with stamps: recompute it from the
        // tenants, unless someone stamped meanwhile (then it stays).
        let hint = s.lat_until.load(Ordering::Acquire);
        let floor = self.latency_active_until(now).unwrap_or(0);
        if hint > floor {
            let _ = s
                .lat_until
                .compare_exchange(hint, floor, Ordering::AcqRel, Ordering::Acquire);
        }
        s.lat_gen.fetch_add(1, Ordering::AcqRel);
        s.lat_waiters.load(Ordering::Acquire) != 0
    }

    /// The latest time until which a privileged latency tenant with live
    /// processes has work in flight, if any is after `now`. A stamp further
    /// ahead than any call sets is corrupt and ignored.
    fn latency_active_until(&self, now: u64) -> Option<u64> {
        self.ready_tenants()
            .filter(|(_, t)| is_latency(t) && !is_heavy(t) && t.procs.load(Ordering::Acquire) > 0)
            .map(|(_, t)| t.active_until.load(Ordering::Acquire))
            .filter(|&a| a > now && !bounds::too_far_ahead(a, now, bounds::STAMP_AHEAD_NS))
            .max()
    }

    /// For a standard tenant's process at the end of a pass: Some(until)
    /// while a latency tenant has work in flight (launch nothing new before
    /// then, or before a wake-up on `latency_word`). One load while none
    /// has (the hint in `Sched`). Not a mere query: a hint that names no
    /// tenant with work in flight (stale or corrupt) is cleared.
    pub fn take_latency_hold(&self, now: u64) -> Option<u64> {
        let s = self.sched();
        let hint = s.lat_until.load(Ordering::Acquire);
        if hint <= now {
            return None;
        }
        let until = self.latency_active_until(now);
        if until.is_none() {
            // Stale or corrupt hint: nobody is active.
            let _ = s
                .lat_until
                .compare_exchange(hint, 0, Ordering::AcqRel, Ordering::Acquire);
        }
        until
    }

    /// Whether a privileged latency tenant has live processes on this GPU
    /// (standard tenants then keep their queues short).
    pub fn latency_present(&self) -> bool {
        self.ready_tenants()
            .any(|(_, t)| is_latency(t) && !is_heavy(t) && t.procs.load(Ordering::Acquire) > 0)
    }
}
