//! Entries and process slots: a tenant's join, a slice's registration
//! and release by its maker, root's resize, a process's leave.

use super::*;

impl Pool {
    /// Registers this process under tenant `name` of slice `tag`, which is
    /// guaranteed `guarantee` bytes and may use `max`, on a GPU of
    /// `capacity` bytes (as this process's driver gives it). Returns
    /// (entry, process slot). The last process of a tenant to join sets
    /// its guarantee and max (a resize), except in an entry its slice's
    /// maker registered ([`Pool::register`]), whose guarantee is the
    /// maker's. A guarantee that arrives while its memory is lent out is
    /// reserved as far as the pool has room and pending for the rest
    /// ([`Entry::pending`]).
    pub fn join(
        &self,
        name: &str,
        tag: u64,
        guarantee: u64,
        max: u64,
        capacity: u64,
        pid: u32,
    ) -> Result<(usize, usize), SegmentError> {
        self.set_capacity(capacity);
        // A tenant may keep the lock: a start waits a bounded time, then
        // fails closed naming the file and the holder.
        self.shm.with_flock_bounded(TENANT_WAIT, || {
            self.sweep_locked();
            let i = self.entry_locked(name, tag)?;
            let e = self.entry(i).expect("in bounds");
            if e.held.load(Ordering::Acquire) == 0 {
                self.set_guarantee_locked(i, guarantee);
                e.max.store(max, Ordering::Release);
            }
            let slot = self.claim_proc_locked(i, pid)?;
            Ok((i, slot))
        })?
    }

    /// Registers the slice `name`/`tag` before any of its processes runs,
    /// as whoever makes the slice (issue: "a guarantee belongs to its
    /// slice, not to its processes"): its guarantee is reserved now as far
    /// as the pool has room, the rest pending; it stays whole between the
    /// slice's processes. Refuses a guarantee that could never fit: the
    /// guarantees registered on the GPU would then exceed `capacity` (the
    /// GPU's memory as NVML or the driver gives it, never the file's).
    /// [`Maker::Root`] (the OCI hook, the DRA plugin): kept until
    /// [`Pool::release`]. [`Maker::Process`] (`cuslice run`): kept while
    /// the calling process lives, through a process slot of its own
    /// (returned: give it back with [`Pool::leave`]), then as a tenant
    /// whose last process is gone (the linger).
    pub fn register(
        &self,
        name: &str,
        tag: u64,
        guarantee: u64,
        max: u64,
        capacity: u64,
        maker: Maker,
    ) -> Result<Registered, SegmentError> {
        self.set_capacity(capacity);
        // Root (the hook, the plugin) waits at most ROOT_WAIT for a lock a
        // tenant can keep, a session's maker as a starting tenant does.
        let wait = match maker {
            Maker::Root => ROOT_WAIT,
            Maker::Process => TENANT_WAIT,
        };
        self.shm.with_flock_bounded(wait, || {
            self.sweep_locked();
            let key = crate::gpu::layout::encode_name(name, tag);
            let others: u64 = (0..MAX_ENTRIES)
                .filter_map(|i| self.entry(i))
                .filter(|e| e.state.load(Ordering::Acquire) == READY && key_of(e) != key)
                .map(|e| e.guarantee.load(Ordering::Acquire))
                .fold(0u64, u64::saturating_add);
            if others.saturating_add(guarantee) > capacity {
                return Err(SegmentError(format!(
                    "{}: a guarantee of {guarantee} bytes does not fit: the GPU has {capacity} bytes and its other tenants are guaranteed {others}",
                    self.path.display()
                )));
            }
            let i = self.entry_locked(name, tag)?;
            let e = self.entry(i).expect("in bounds");
            self.set_guarantee_locked(i, guarantee);
            e.max.store(max, Ordering::Release);
            let slot = match maker {
                Maker::Root => {
                    e.held.store(1, Ordering::Release);
                    None
                }
                Maker::Process => Some(self.claim_proc_locked(i, 0)?),
            };
            Ok(Registered {
                entry: i,
                slot,
                pending: pending_of(e),
            })
        })?
    }

    /// The slice `name`/`tag` is gone (the hook's poststop, the DRA
    /// plugin's unprepare, the end of `cuslice run`): its entry is freed
    /// now where no process of it is left (its guarantee leaves the sum),
    /// else it becomes a tenant's entry like any other (freed after its
    /// last process and the linger). Whether there was such an entry, and
    /// the lock a tenant kept past [`ROOT_WAIT`] where one did: then it is
    /// released without the lock (a few stores; a join of the slice at
    /// that instant could find its entry freed under it, and makes it
    /// afresh at its next start).
    pub fn release(&self, name: &str, tag: u64) -> (bool, Option<crate::shm::LockBusy>) {
        let key = crate::gpu::layout::encode_name(name, tag);
        self.shm.with_flock_or_without(ROOT_WAIT, || {
            self.sweep_locked();
            let live = self.procs_per_entry();
            let Some(i) = (0..MAX_ENTRIES).find(|&i| {
                self.entry(i)
                    .is_some_and(|e| e.state.load(Ordering::Acquire) == READY && key_of(e) == key)
            }) else {
                return false;
            };
            let e = self.entry(i).expect("in bounds");
            e.held.store(0, Ordering::Release);
            if live[i] == 0 {
                free_entry(e);
                self.freed();
            }
            true
        })
    }

    /// Sets the capacity this process's decisions count against.
    fn set_capacity(&self, capacity: u64) {
        if capacity > 0 {
            self.capacity.store(capacity, Ordering::Relaxed);
        }
        let h = self.head();
        if h.capacity.load(Ordering::Acquire) == 0 {
            h.capacity.store(capacity, Ordering::Release);
        }
    }

    /// The entry of `name`/`tag`, made where there is none (in a free
    /// entry, or the one that has lingered longest). Under the lock.
    fn entry_locked(&self, name: &str, tag: u64) -> Result<usize, SegmentError> {
        let key = crate::gpu::layout::encode_name(name, tag);
        let mut free = None;
        let mut found = None;
        // The entry that has lingered longest (its start, index).
        let mut oldest: Option<(u64, usize)> = None;
        for i in 0..MAX_ENTRIES {
            let Some(e) = self.entry(i) else { break };
            match e.state.load(Ordering::Acquire) {
                READY if key_of(e) == key => {
                    found = Some(i);
                    break;
                }
                READY => {
                    let since = e.lingering_since.load(Ordering::Acquire);
                    if since != 0 && oldest.is_none_or(|(t, _)| since < t) {
                        oldest = Some((since, i));
                    }
                }
                _ if free.is_none() => free = Some(i),
                _ => {}
            }
        }
        // Every entry taken: one that only lingers gives way to a tenant
        // with a process (its guarantee leaves the pool, as it did at once
        // before the linger), so the linger never shuts a tenant out of
        // the pool.
        let free = free.or(oldest.map(|(_, i)| i));
        let i = match (found, free) {
            (Some(i), _) => i,
            (None, Some(i)) => {
                let e = self.entry(i).expect("in bounds");
                // (A lingering entry given way is READY: readers skip it
                // while its key is rewritten.)
                e.state.store(EMPTY, Ordering::Release);
                for (w, k) in e.key.iter().zip(key) {
                    w.store(k, Ordering::Relaxed);
                }
                e.burst.store(0, Ordering::Relaxed);
                e.guarantee.store(0, Ordering::Relaxed);
                e.pending.store(0, Ordering::Relaxed);
                e.held.store(0, Ordering::Relaxed);
                e.state.store(READY, Ordering::Release);
                i
            }
            (None, None) => {
                return Err(SegmentError(format!(
                    "{}: all {MAX_ENTRIES} tenant entries are in use by live processes or registered slices",
                    self.path.display()
                )));
            }
        };
        // Its process is back (or it is new): no longer lingering, the
        // same entry and guarantee, counted once.
        self.entry(i)
            .expect("in bounds")
            .lingering_since
            .store(0, Ordering::Release);
        Ok(i)
    }

    /// Claims a process slot under entry `i` for `pid` (0: the slice's
    /// maker). Under the lock.
    fn claim_proc_locked(&self, i: usize, pid: u32) -> Result<usize, SegmentError> {
        self.shm.claim_first(MAX_PROCS, "pool process slot", |s| {
            if let Some(p) = self.proc_slot(s) {
                // A process that died after the last sweep left its slot
                // as it was: its waiters go back first.
                self.uncount_waiting(p);
                p.entry.store(i as u32, Ordering::Relaxed);
                p.pid.store(pid, Ordering::Relaxed);
                p.state.store(READY, Ordering::Release);
            }
        })
    }

    /// Sets entry `i`'s guarantee to `g` (under the lock). What it already
    /// reserved stays reserved (up to `g`); a larger guarantee takes the
    /// rest from the entry's own burst first (memory it holds already),
    /// then from what the pool has that nobody is guaranteed or waits for
    /// ([`Pool::room`]); what is still missing is pending.
    fn set_guarantee_locked(&self, i: usize, g: u64) {
        let Some(e) = self.entry(i) else { return };
        let (reserved, burst) = regrant(
            reserved_of(e),
            e.burst.load(Ordering::Acquire),
            g,
            self.room_excluding(Some(i)),
        );
        e.burst.store(burst, Ordering::Release);
        e.guarantee.store(g, Ordering::Release);
        e.pending.store(g - reserved, Ordering::Release);
    }

    /// Root's resize of entry `i` (`cuslice resize`): guarantee `g`, most
    /// `max`, and a burst of at least `need` (use past a lowered
    /// guarantee is burst at once, whether the pool had room or not: the
    /// operator's resize is what the host goes by). A raised guarantee is
    /// reserved as [`Pool::join`] reserves one, from the room left on a
    /// GPU of `capacity` bytes (NVML's; 0: unknown, no room taken), the
    /// rest pending. Without
    /// the file's lock, which a tenant can hold: a few stores, racing at
    /// worst one tenant's reservation made at the same instant (the sum
    /// then over by what both took, until a free).
    pub fn resize_entry(&self, i: usize, g: u64, max: u64, need: u64, capacity: u64) {
        let Some(e) = self.entry(i) else { return };
        let room = capacity
            .saturating_sub(self.committed())
            .saturating_sub(self.pending_total(Some(i)));
        let (reserved, burst) = regrant(reserved_of(e), e.burst.load(Ordering::Acquire), g, room);
        e.guarantee.store(g, Ordering::Release);
        e.pending.store(g - reserved, Ordering::Release);
        e.max.store(max, Ordering::Release);
        e.burst.store(burst.max(need), Ordering::Release);
        self.freed();
    }

    /// Gives this process's slot back (normal exit). A thread of ours
    /// still waiting is no longer counted (the exit ends it anyway; its
    /// guard then takes nothing off: see [`Waiting`]'s drop).
    pub fn leave(&self, slot: usize) {
        self.shm.release_own(slot, |s| self.free_proc(s));
        self.freed();
    }

    /// Frees process slot `s`, whose lock the caller holds (its own, or a
    /// dead owner's), with what its threads counted among the waiters.
    pub(super) fn free_proc(&self, s: usize) {
        if let Some(p) = self.proc_slot(s) {
            p.state.store(EMPTY, Ordering::Release);
            self.uncount_waiting(p);
        }
    }

    /// Takes slot `p`'s waiters off the head's count (its lock held).
    /// Saturating: a count from a file a tenant scribbled on, or from an
    /// older library (which counted only in the head), never wraps.
    fn uncount_waiting(&self, p: &Proc) {
        let n = p.waiting.swap(0, Ordering::AcqRel);
        if n > 0 {
            sub_saturating(&self.head().waiters, n);
        }
    }
}
