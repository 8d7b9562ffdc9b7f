//! Waiting for memory: the wake-up word, [`Pool::waiting`] and its
//! guard, [`Waiting`].

use super::*;

impl Pool {
    /// Memory was freed on this GPU: wakes whoever waits for it.
    ///
    /// With nobody waiting (the common case) this is a fence and a load: no
    /// write to the line every tenant of the GPU shares. Against
    /// [`Pool::waiting`]: the freer's fence orders its free before its look
    /// at `waiters`, the waiter's orders its count before its look at the
    /// memory, so either the freer sees the waiter and bumps the word, or
    /// the waiter sees the memory freed.
    pub fn freed(&self) {
        let h = self.head();
        std::sync::atomic::fence(Ordering::SeqCst);
        if h.waiters.load(Ordering::Relaxed) > 0 {
            h.freed_gen.fetch_add(1, Ordering::AcqRel);
            crate::gpu::futex_wake_all(&h.freed_gen);
        }
    }

    /// Counts the caller among the pool's waiters until the guard drops:
    /// take it before the first look at whether memory is available. None
    /// where this process holds no slot in the pool (never joined, or gave
    /// it back): a waiter is counted in its process's slot too, or a death
    /// while it waits could never be uncounted.
    ///
    /// The head's count first, then the slot's (the guard's drop undoes
    /// them in the other order): a process killed between the two leaves
    /// the head one too high (frees wake nobody in vain until the file is
    /// made anew), never one too low, which would let a free skip waking a
    /// live waiter (it would then sleep to its timeout).
    pub fn waiting(&self) -> Option<Waiting<'_>> {
        let slot = self.shm.own();
        let p = self.proc_slot(slot)?;
        let h = self.head();
        h.waiters.fetch_add(1, Ordering::SeqCst);
        p.waiting.fetch_add(1, Ordering::AcqRel);
        std::sync::atomic::fence(Ordering::SeqCst);
        Some(Waiting { pool: self, slot })
    }

    /// Whether a process other than this one is registered in the pool
    /// (one that may free memory; a process never waits for itself; a
    /// slice's maker holds none).
    pub fn others_live(&self) -> bool {
        let own = self.shm.own();
        (0..MAX_PROCS).any(|s| {
            s != own
                && self.proc_slot(s).is_some_and(|p| {
                    p.state.load(Ordering::Acquire) != EMPTY && p.pid.load(Ordering::Relaxed) != 0
                })
                && self.shm.slot_alive(s)
        })
    }
}

/// A waiter of the pool ([`Pool::waiting`]): frees bump the wake-up word
/// while it lives.
pub struct Waiting<'a> {
    pool: &'a Pool,
    /// The process slot it is counted in.
    slot: usize,
}

impl Waiting<'_> {
    /// The wake-up word's value, read before looking whether memory is
    /// available (a free after this read ends the next sleep at once).
    pub fn generation(&self) -> u32 {
        self.pool.head().freed_gen.load(Ordering::Acquire)
    }

    /// Sleeps until a free after `seen` was read (or `timeout` passed).
    pub fn sleep(&self, seen: u32, timeout: std::time::Duration) {
        crate::gpu::futex_wait(
            &self.pool.head().freed_gen,
            seen,
            u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        );
    }
}

impl Drop for Waiting<'_> {
    /// The slot's count first, then the head's (see [`Pool::waiting`]).
    /// Whoever takes a waiter out of the slot takes it off the head: this
    /// drop, or [`Pool::leave`] (at exit, from another thread) where it
    /// came first, in which case there is nothing left to take. A slot
    /// given back (no longer ours) is not touched: another process may
    /// hold it now. Left open: a leave and that process's claim and wait,
    /// all between this drop's look at the slot and its decrement, would
    /// uncount that process's waiter (woken then at its 1 s timeout).
    fn drop(&mut self) {
        if self.pool.shm.own() != self.slot {
            return;
        }
        let Some(p) = self.pool.proc_slot(self.slot) else {
            return;
        };
        if p.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
            .is_ok()
        {
            sub_saturating(&self.pool.head().waiters, 1);
        }
    }
}
