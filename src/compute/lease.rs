//! Without the lease: routing (freely, through the lease, or a throttled
//! wait, as the policy says) and waiting for the lease.

use std::sync::atomic::Ordering;

use cuslice_core::gpu::{Acquire, Route, futex_wait};

use super::*;
use crate::gputime;

impl Gpu {
    /// Without the lease: how to go on (waits while the policy says so).
    pub(super) fn route(&self) {
        let begin = now_ns();
        loop {
            let now = now_ns();
            match self.seg.route(self.tenant, now, self.slice_ns) {
                Route::Free => {
                    let contended = self.seg.contended(self.tenant, now);
                    let uncapped = self.seg.uncapped(self.tenant);
                    if self.latency {
                        self.privilege(now);
                    }
                    // Charge what the GPU ran, not the time in flight,
                    // where the difference can matter. (Alone under a
                    // ceiling, a process soon holds the lease, and is
                    // measured there: `hold_ppm`.)
                    if contended {
                        if self.needs_probe(now) {
                            gputime::want_probe(now);
                        } else {
                            gputime::load_cupti();
                        }
                    }
                    self.pass
                        .alone
                        .store(!contended && uncapped, Ordering::Relaxed);
                    self.pass.mode.store(FREE, Ordering::Release);
                    break;
                }
                Route::Throttle { until } => {
                    // A latency tenant out of ceiling tokens.
                    let generation = self.seg.generation_word().load(Ordering::Acquire);
                    let timeout = until.saturating_sub(now).clamp(50_000, 2_000_000);
                    futex_wait(self.seg.generation_word(), generation, timeout);
                }
                Route::Lease => {
                    self.stats.leases.fetch_add(1, Ordering::Relaxed);
                    self.acquire();
                    let t = now_ns();
                    self.time.held_counted.store(t, Ordering::Relaxed);
                    self.queue.hold_checkpoint.store(
                        self.queue.checkpoint.load(Ordering::Relaxed),
                        Ordering::Relaxed,
                    );
                    self.time.hold_to.store(u64::MAX, Ordering::Release);
                    self.time.hold_from.store(t, Ordering::Release);
                    // A probe may begin at once (alone under a ceiling).
                    self.hold_ppm(t);
                    self.pass.mode.store(HOLDING, Ordering::Release);
                    break;
                }
            }
        }
        let waited = now_ns().saturating_sub(begin);
        self.stats.held_back_ns.fetch_add(waited, Ordering::Relaxed);
        if waited > 50_000 && self.pass.mode.load(Ordering::Relaxed) == FREE {
            self.seg.add_throttled(self.tenant, waited);
        }
    }

    /// Waits for the lease (futex on the segment's generation word).
    fn acquire(&self) {
        let seg = &self.seg;
        let begin = now_ns();
        seg.begin_wait(self.slot, self.tenant, begin);
        loop {
            let generation = seg.generation_word().load(Ordering::Acquire);
            let now = now_ns();
            match seg.try_acquire(self.slot, self.tenant, now, self.slice_ns) {
                Acquire::Granted { deadline } => {
                    seg.end_wait(self.slot, self.tenant);
                    seg.add_throttled(self.tenant, now.saturating_sub(begin));
                    self.pass.lease_deadline.store(deadline, Ordering::Relaxed);
                    return;
                }
                Acquire::Wait { until } => {
                    let timeout = until.saturating_sub(now).clamp(50_000, 2_000_000);
                    futex_wait(seg.generation_word(), generation, timeout);
                }
            }
        }
    }

    /// The process no longer holds the lease (released, taken, or handed
    /// over while it was idle) as of `now`.
    pub(super) fn left_lease(&self, now: u64) {
        self.time.hold_to.store(now, Ordering::Release);
        self.pass.mode.store(NONE, Ordering::Release);
    }
}
