//! Launching in passes: the fast path's budget of launches until a
//! deadline, the slow path at a pass's end (charge, renew or release the
//! lease, bound the queue), and the queue bound itself (checkpoint events).

use std::sync::atomic::Ordering;

use cuslice_core::gpu::{LATENCY_LINGER_NS, futex_wake_all};

use super::*;
use crate::gputime::{self, ratio::WHOLE_PPM};

/// Launches let through in the first slice under the lease, before any
/// measurement. The budget then follows the measured GPU time per launch
/// but at most doubles from one pass to the next (a slow start: a first
/// estimate taken before the GPU queue filled would be far too optimistic
/// for long kernels).
const FIRST_BUDGET: u64 = 4;
/// The first budget of a free pass. A light tenant (a service launching a
/// few dozen kernels per request) stays under it and never touches an
/// event; a launcher that outruns the GPU reaches it within microseconds,
/// and from then on its budget follows its GPU time per launch.
const FREE_FIRST_BUDGET: u64 = 64;
/// A free pass: how long a process that launches freely goes before it is
/// charged and asked again how to go on.
const FREE_PASS_NS: u64 = 2_000_000;
/// Beside a latency tenant: the GPU work a standard process lets through
/// per pass. With the queue bounded to about two passes, a latency tenant
/// waits for well under a millisecond of others' work (kernels longer than
/// this run one at a time). Measured on an H100 with 0.2 ms matmuls: two in
/// flight cost the service nothing and the trainer nothing; with 1.6 ms
/// matmuls, one at a time (docs/benchmarks/2026-11-23-h100-colocation-explore.md).
pub(super) const SHALLOW_PASS_NS: u64 = 250_000;
/// A latency tenant's pass: its stamp is renewed at least this often while
/// it launches.
const LATENCY_PASS_NS: u64 = LATENCY_LINGER_NS / 2;
/// A budget that never ends a pass before its deadline.
const UNBOUNDED: u64 = 1 << 40;
/// A holder that waited this long at a slice end for the checkpoint it
/// recorded a slice before keeps its GPU fed (`Queue::state`).
const QUEUE_FED_NS: u64 = 200_000;

/// The budget of a bounded pass of `horizon` ns: the launches that fill it
/// at `per_launch` ns of GPU time each (0: not measured yet, `first`),
/// plus `extra`, but at most twice the last bounded pass's budget `prev`
/// (or `first`): a slow start.
fn pass_budget(horizon: u64, per_launch: u64, prev: u64, first: u64, extra: u64) -> u64 {
    match horizon.checked_div(per_launch) {
        Some(n) => (n.max(1) + extra).min(prev.max(first).saturating_mul(2)),
        None => first,
    }
}

impl Gpu {
    #[cold]
    pub(super) fn slow_path(&self, stream: CUstream) {
        let _g = self.slow.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_ns();
        let mode = self.pass.mode.load(Ordering::Acquire);
        if mode != NONE
            && self.pass.credits.load(Ordering::Acquire) > 0
            && now < self.pass.deadline.load(Ordering::Relaxed)
        {
            return; // another thread opened a pass
        }
        // A holder that went idle (a synchronising call returned) launches
        // again: busy, unless a waiter took the lease meanwhile.
        if mode == HOLDING && !self.seg.mark_holder_busy(self.slot, now) {
            self.pass.credits.store(0, Ordering::Release);
            self.left_lease(now);
        }
        let mode = self.pass.mode.load(Ordering::Acquire);
        // Launches into a capturing stream are recorded, not run: they
        // neither end a pass nor wait.
        if capturing(stream) {
            return;
        }
        if mode != NONE {
            self.end_pass(stream, now, mode);
        }
        if self.pass.mode.load(Ordering::Acquire) == NONE {
            self.route();
        }
        self.hold_back();
        self.start_pass(now_ns());
    }

    /// Closes the pass that ended at `now`: charges a free one, renews or
    /// releases the lease at a slice's end, bounds the queue.
    fn end_pass(&self, stream: CUstream, now: u64, mode: u8) {
        let (left, launches) = self.take_launches();
        let shallow = self.shallow_now(now);
        if mode == FREE {
            // A free pass that used up its budget before its deadline
            // launches more than it runs: bound its queue like a holder's
            // (and learn its GPU time per launch). One that ran into its
            // deadline is light and pays nothing more.
            let by_budget = left <= 0 && now < self.pass.deadline.load(Ordering::Relaxed);
            self.close_free_pass(now);
            if !self.latency && (by_budget || shallow) {
                let _ = self.bound_queue(stream, shallow);
                // Beside a latency tenant a trainer's passes are short and
                // its kernels run while it waits here for them: the wait
                // is work in flight (charged only its passes, it was
                // charged a seventh of its GPU time and never measured).
                let t = now_ns();
                if shallow {
                    self.charge_in_flight(now, t, t);
                }
                if by_budget {
                    self.measure(t, launches);
                }
            }
            return;
        }
        if now >= self.pass.lease_deadline.load(Ordering::Relaxed) {
            let ppm = self.hold_ppm(now);
            if !self.booting()
                && self
                    .seg
                    .decide_release_measured(self.tenant, now, self.slice_ns, ppm)
            {
                // SAFETY: real driver call; drains this context's work.
                unsafe { real::cuCtxSynchronize() };
                let t = now_ns();
                let ppm = self.settle_slice(t, launches, ppm);
                // Whatever waits next (its ceiling, others) is no time to
                // measure it in.
                gputime::cancel_probe();
                self.left_lease(t);
                if self.seg.release_measured(self.slot, self.tenant, t, ppm) {
                    futex_wake_all(self.seg.generation_word());
                }
                return;
            }
            // Nobody else waits: keep about one slice queued (wait for what
            // the previous pass submitted), then renew.
            let (k, waited) = self.bound_queue(stream, shallow);
            if k > self.queue.hold_checkpoint.load(Ordering::Relaxed) {
                let fed = if waited >= QUEUE_FED_NS {
                    QUEUE_FED
                } else {
                    QUEUE_DRAINED
                };
                self.queue.state.store(fed, Ordering::Relaxed);
            }
            let t = now_ns();
            let ppm = self.settle_slice(t, launches, ppm);
            match self
                .seg
                .renew_measured(self.slot, self.tenant, t, self.slice_ns, ppm)
            {
                Some(deadline) => self.pass.lease_deadline.store(deadline, Ordering::Relaxed),
                None => self.left_lease(t), // taken from us
            }
            return;
        }
        let _ = self.bound_queue(stream, shallow);
        self.measure(now_ns(), launches);
    }

    /// A slice ends at `t` (its work drained or its queue bounded): the GPU
    /// time per launch is learned, the hold counted into the probe, and
    /// the share of the hold charged (`hold_ppm`, taken again at `t` unless
    /// the hold was charged whole at the slice's end).
    fn settle_slice(&self, t: u64, launches: u64, ppm: u64) -> u64 {
        self.measure(t, launches);
        let ppm = if ppm == WHOLE_PPM {
            ppm
        } else {
            self.hold_ppm(t)
        };
        self.count_held(t);
        ppm
    }

    /// The pass's credits left, and the launches it made (counted for the
    /// meter's records-stopped check), wherever a pass ends: at the next
    /// launch's slow path or at a synchronising call.
    pub(super) fn take_launches(&self) -> (i64, u64) {
        let left = self.pass.credits.swap(0, Ordering::AcqRel);
        let launches = (self.pass.budget.load(Ordering::Relaxed) as i64 - left).max(1) as u64;
        self.time.launches.fetch_add(launches, Ordering::Relaxed);
        (left, launches)
    }

    /// Opens a pass at `now` for the current mode.
    pub(super) fn start_pass(&self, now: u64) {
        let mode = self.pass.mode.load(Ordering::Acquire);
        let shallow = self.shallow_now(now);
        let per = self.pass.per_launch_ns.load(Ordering::Relaxed);
        // Slow start: a budget at most doubles from one bounded pass to the
        // next (an estimate taken before the GPU queue filled would be far
        // too optimistic for long kernels).
        let prev = self.pass.bounded_budget.load(Ordering::Relaxed);
        let bounded =
            |horizon: u64, first: u64, extra: u64| pass_budget(horizon, per, prev, first, extra);
        let (horizon, budget) = if self.latency && mode == FREE {
            if self.lat.privileged.load(Ordering::Relaxed) {
                self.seg
                    .latency_stamp(self.tenant, now.saturating_add(LATENCY_LINGER_NS));
                self.stats.priv_passes.fetch_add(1, Ordering::Relaxed);
            }
            (LATENCY_PASS_NS, UNBOUNDED)
        } else if shallow {
            (SHALLOW_PASS_NS, bounded(SHALLOW_PASS_NS, 1, 0))
        } else if mode == HOLDING {
            (self.slice_ns, bounded(self.slice_ns, FIRST_BUDGET, 1))
        } else if self.pass.alone.load(Ordering::Relaxed) {
            (self.slice_ns, bounded(self.slice_ns, FREE_FIRST_BUDGET, 1))
        } else {
            (FREE_PASS_NS, bounded(FREE_PASS_NS, FREE_FIRST_BUDGET, 1))
        };
        if budget != UNBOUNDED {
            self.pass.bounded_budget.store(budget, Ordering::Relaxed);
        }
        let mut deadline = now.saturating_add(horizon);
        if mode == HOLDING {
            deadline = deadline.min(self.pass.lease_deadline.load(Ordering::Relaxed));
        }
        if mode == FREE && now.saturating_sub(self.busy.last.load(Ordering::Relaxed)) > BUSY_GAP_NS
        {
            self.busy.since.store(now, Ordering::Relaxed);
            self.busy
                .metered
                .store(self.time.metered.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if mode == HOLDING {
            self.stats.held_passes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.free_passes.fetch_add(1, Ordering::Relaxed);
        }
        self.pass.start.store(now, Ordering::Relaxed);
        self.pass.budget.store(budget, Ordering::Relaxed);
        self.pass.deadline.store(deadline, Ordering::Relaxed);
        self.pass
            .clock_mask
            .store(if self.latency { 0 } else { 15 }, Ordering::Relaxed);
        // The launch that called us is the pass's first.
        self.pass
            .credits
            .store(budget.min(i64::MAX as u64) as i64 - 1, Ordering::Release);
    }

    /// GPU time per launch over the pass that just ended, its queue bound
    /// included (what the GPU took to run it, once the queue is full).
    fn measure(&self, now: u64, launches: u64) {
        let start = self.pass.start.load(Ordering::Relaxed);
        self.pass.per_launch_ns.store(
            now.saturating_sub(start) / launches.max(1),
            Ordering::Relaxed,
        );
    }

    /// Records a checkpoint on `stream` and waits for an earlier one: the
    /// previous pass's (about one pass stays queued), or, in a short queue
    /// with launches longer than a shallow pass, this one (one at a time).
    /// Returns the checkpoint's number and how long it waited (ns).
    fn bound_queue(&self, stream: CUstream, shallow: bool) -> (u64, u64) {
        let k = self.queue.checkpoint.fetch_add(1, Ordering::Relaxed);
        let (cur, prev) = (
            self.event((k % 2) as usize),
            self.event(((k + 1) % 2) as usize),
        );
        if cur.is_null() || prev.is_null() {
            return (k, 0);
        }
        let one_at_a_time =
            shallow && self.pass.per_launch_ns.load(Ordering::Relaxed) >= SHALLOW_PASS_NS;
        let begin = now_ns();
        // SAFETY: real driver calls on our own events (an event never
        // recorded synchronises at once).
        unsafe {
            real::cuEventRecord(cur, stream);
            real::cuEventSynchronize(if one_at_a_time { cur } else { prev });
        }
        let waited = now_ns().saturating_sub(begin);
        self.stats
            .queue_wait_ns
            .fetch_add(waited, Ordering::Relaxed);
        (k, waited)
    }

    fn event(&self, i: usize) -> CUevent {
        let slot = &self.queue.events[i];
        let e = slot.load(Ordering::Acquire);
        if !e.is_null() {
            return e;
        }
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: real driver call with a valid out pointer; the process's
        // context is current on this (launching) thread.
        let r = unsafe { real::cuEventCreate(&mut e, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) };
        if r != CUresult::CUDA_SUCCESS {
            return std::ptr::null_mut();
        }
        slot.store(e, Ordering::Release);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_budget_fills_its_horizon_but_at_most_doubles() {
        // Not measured yet: the first budget.
        assert_eq!(pass_budget(20_000_000, 0, 0, FIRST_BUDGET, 1), FIRST_BUDGET);
        // 1 ms per launch in a 20 ms slice: 20 (+1), once the slow start
        // allows it.
        assert_eq!(pass_budget(20_000_000, 1_000_000, 4, FIRST_BUDGET, 1), 8);
        assert_eq!(pass_budget(20_000_000, 1_000_000, 16, FIRST_BUDGET, 1), 21);
        // Launches longer than the horizon: one at a time.
        assert_eq!(pass_budget(SHALLOW_PASS_NS, 1_000_000, 8, 1, 0), 1);
        // Tiny launches: bounded by twice the previous budget.
        assert_eq!(
            pass_budget(FREE_PASS_NS, 10, 1000, FREE_FIRST_BUDGET, 1),
            2000
        );
    }
}
