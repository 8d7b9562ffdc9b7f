//! The latency class: a latency process's privilege budget, standard
//! processes holding back while its work is in flight and keeping short
//! queues while it is live, and the synchronising calls that stamp (and
//! charge) work in flight.

use std::sync::atomic::Ordering;

use cuslice_core::gpu::{futex_wait, futex_wake_all, privilege_refill};

use super::*;

/// How often a standard process looks whether a latency tenant is live.
const PRESENCE_CHECK_NS: u64 = 50_000_000;
/// Longest single sleep while holding back for a latency tenant (it wakes
/// us when its work is done; this bounds a missed wake-up).
const HOLD_SLEEP_NS: u64 = 2_000_000;

impl Gpu {
    /// A latency process: refills its privilege budget to `now` and decides
    /// whether its next passes are privileged (budget left, tenant not
    /// heavy).
    pub(super) fn privilege(&self, now: u64) -> bool {
        let elapsed = now.saturating_sub(self.lat.at.swap(now, Ordering::Relaxed));
        let tokens = privilege_refill(self.lat.tokens.load(Ordering::Relaxed), elapsed, self.share);
        self.lat.tokens.store(tokens, Ordering::Relaxed);
        let p = tokens > 0 && self.seg.latency_privileged(self.tenant);
        self.lat.privileged.store(p, Ordering::Relaxed);
        p
    }

    /// A standard process waits while a latency tenant has work in flight
    /// (it wakes us when that work is done).
    pub(super) fn hold_back(&self) {
        if self.latency {
            return;
        }
        let begin = now_ns();
        let mut now = begin;
        while let Some(until) = self.seg.take_latency_hold(now) {
            let s = self.seg.sched();
            let generation = s.lat_gen.load(Ordering::Acquire);
            s.lat_waiters.fetch_add(1, Ordering::AcqRel);
            let timeout = until.saturating_sub(now).clamp(20_000, HOLD_SLEEP_NS);
            futex_wait(self.seg.latency_word(), generation, timeout);
            let _ = s
                .lat_waiters
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_sub(1))
                });
            now = now_ns();
        }
        if now > begin {
            self.seg.add_throttled(self.tenant, now - begin);
            self.stats
                .held_back_ns
                .fetch_add(now - begin, Ordering::Relaxed);
        }
    }

    /// Whether standard tenants should keep short queues now (a latency
    /// tenant is live on this GPU); looked up every `PRESENCE_CHECK_NS`, and
    /// at once when a latency tenant stamped work (or registered) since the
    /// last look, so that its first request finds short queues.
    pub(super) fn shallow_now(&self, now: u64) -> bool {
        if self.latency {
            return false;
        }
        let at = self.lat.shallow_at.load(Ordering::Relaxed);
        let stamped = self.seg.sched().lat_until.load(Ordering::Relaxed) > at;
        if stamped || now.saturating_sub(at) >= PRESENCE_CHECK_NS {
            self.lat
                .shallow
                .store(self.seg.latency_present(), Ordering::Relaxed);
            self.lat.shallow_at.store(now, Ordering::Relaxed);
        }
        self.lat.shallow.load(Ordering::Relaxed)
    }

    /// A thread enters a synchronising call. Never blocks: a thread that
    /// waits for the lease (holding `slow`) must not delay another's
    /// synchronisation, which did not wait for cuslice before.
    pub(super) fn sync_begin(&self) {
        if self.lat.syncing.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        let now = now_ns();
        // A free pass ends here; the wait is charged as work in flight.
        // (If another thread is in the slow path, it closes the pass.)
        let free = match self.slow.try_lock() {
            Ok(_g) if self.pass.mode.load(Ordering::Acquire) == FREE => {
                // (Its launches count here: a process that synchronises
                // after every few launches ends all its passes here.)
                self.take_launches();
                self.close_free_pass(now);
                true
            }
            _ => false,
        };
        self.lat.sync_charged.store(free, Ordering::Relaxed);
        self.lat.sync_start.store(now, Ordering::Relaxed);
        let stamp = self.latency
            && self.lat.privileged.load(Ordering::Relaxed)
            && self.seg.latency_privileged(self.tenant);
        if stamp {
            self.seg.latency_sync_begin(self.slot, self.tenant, now);
        }
        self.lat.sync_stamped.store(stamp, Ordering::Relaxed);
    }

    /// The last thread inside a synchronising call returns from it.
    pub(super) fn sync_end(&self) {
        if self.lat.syncing.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let now = now_ns();
        if self.lat.sync_charged.swap(false, Ordering::Relaxed) {
            let start = self.lat.sync_start.load(Ordering::Relaxed);
            self.charge_in_flight(start, now, now);
        }
        if self.lat.sync_stamped.swap(false, Ordering::Relaxed)
            && self.seg.latency_sync_end(self.slot, self.tenant, now)
        {
            futex_wake_all(self.seg.latency_word());
        }
        // A holder whose work is done may go idle (a service waiting for
        // its next request): its next launch takes the slow path (which
        // says it is busy again), and a waiter may take the lease once it
        // has been idle for `IDLE_HANDOFF_NS`, charging it only up to now.
        if self.pass.mode.load(Ordering::Acquire) == HOLDING {
            self.pass.credits.store(0, Ordering::Release);
            if self.seg.mark_holder_idle(self.slot, now) {
                futex_wake_all(self.seg.generation_word());
            }
        }
    }
}
