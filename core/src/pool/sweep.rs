//! Sweeps: dead processes' slots, lingering entries, [`Pool::tidy`].

use super::*;

impl Pool {
    /// Frees the slots of dead processes; starts the linger of the entries
    /// that lost their last process (their burst released: the memory was
    /// freed with the process) and frees those whose linger is over. How
    /// many slots and entries it freed or released a burst of. Under the
    /// file's lock.
    pub(super) fn sweep_locked(&self) -> usize {
        self.sweep_locked_at(crate::gpu::monotonic_ns())
    }

    /// [`sweep_locked`](Self::sweep_locked) at `now` (CLOCK_MONOTONIC ns,
    /// read under the lock: a linger's start, stamped under it too, is
    /// never after it, unless stamped in another time namespace or by a
    /// tenant writing the file; see [`linger_over`]).
    fn sweep_locked_at(&self, now: u64) -> usize {
        let in_use = |s: usize| {
            self.proc_slot(s)
                .is_some_and(|p| p.state.load(Ordering::Acquire) != EMPTY)
        };
        let swept = self
            .shm
            .sweep_dead(MAX_PROCS, in_use, |s| self.free_proc(s));
        let live = self.procs_per_entry();
        let mut changed = 0;
        for (i, n) in live.iter().enumerate() {
            let Some(e) = self.entry(i) else { break };
            let state = e.state.load(Ordering::Acquire);
            if state == EMPTY {
                continue;
            }
            if *n > 0 {
                if e.lingering_since.load(Ordering::Acquire) != 0 {
                    e.lingering_since.store(0, Ordering::Release);
                }
                continue;
            }
            if state == READY && e.held.load(Ordering::Acquire) != 0 {
                // Its maker keeps it until it releases it: no linger, but
                // no burst either without a process to hold it.
                if e.burst.swap(0, Ordering::AcqRel) != 0 {
                    changed += 1;
                }
                continue;
            }
            let since = e.lingering_since.load(Ordering::Acquire);
            if state != READY || (since != 0 && linger_over(since, now)) {
                free_entry(e);
                changed += 1;
                continue;
            }
            if since == 0 {
                // 0 means "has a process": a clock at 0 never stamps it.
                e.lingering_since.store(now.max(1), Ordering::Release);
            }
            // No process holds memory under it: its burst goes back now,
            // and whatever wrote one since (a resize, a tenant) too.
            if e.burst.swap(0, Ordering::AcqRel) != 0 {
                changed += 1;
            }
        }
        if swept + changed > 0 {
            self.freed();
        }
        swept + changed
    }

    /// Per entry, how many process slots are in use under it (after a
    /// sweep: live processes).
    pub(super) fn procs_per_entry(&self) -> [u32; MAX_ENTRIES] {
        let mut n = [0u32; MAX_ENTRIES];
        for s in 0..MAX_PROCS {
            if let Some(p) = self.proc_slot(s)
                && p.state.load(Ordering::Acquire) != EMPTY
                && let Some(c) = n.get_mut(p.entry.load(Ordering::Relaxed) as usize)
            {
                *c += 1;
            }
        }
        n
    }

    /// Sweeps the pool where this process has not in the last
    /// [`TIDY_EVERY_NS`] and nobody holds the pool's lock now (it never
    /// waits for it); whether it swept. For the readers of the room
    /// (`cuMemGetInfo`, NVML's memory info: what a framework sizes its
    /// caches by), so that a dead process's burst and a guarantee whose
    /// linger is over stop counting as taken as soon as someone looks,
    /// not only at the next join or reservation short of room. Never on
    /// the allocation path.
    pub fn tidy(&self) -> bool {
        self.tidy_at(crate::gpu::monotonic_ns())
    }

    /// [`tidy`](Self::tidy) as if at `now` (its rate only: the sweep reads
    /// the clock under the lock, as every sweep does).
    pub(super) fn tidy_at(&self, now: u64) -> bool {
        let last = self.tidied_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < TIDY_EVERY_NS {
            return false;
        }
        self.tidied_at.store(now.max(1), Ordering::Relaxed);
        self.shm.try_with_flock(|| self.sweep_locked()).is_some()
    }

    /// A sweep at `now`, under the lock: a linger's end without waiting
    /// for it.
    #[cfg(test)]
    pub(super) fn sweep_at(&self, now: u64) -> usize {
        self.shm
            .with_flock_bounded(TENANT_WAIT, || self.sweep_locked_at(now))
            .expect("nobody keeps the lock in a test")
    }
}
