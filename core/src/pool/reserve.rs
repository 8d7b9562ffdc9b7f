//! Admission: what is taken, the room left, [`Pool::reserve`], and who
//! borrows.

use super::*;

impl Pool {
    /// What live entries have taken together: the part of their
    /// guarantees they reserved, and their bursts. The pool's rule: never
    /// more than the GPU's memory, whatever the order of arrival.
    pub fn committed(&self) -> u64 {
        (0..MAX_ENTRIES)
            .filter_map(|i| self.entry(i))
            .filter(|e| e.state.load(Ordering::Acquire) == READY)
            .map(|e| reserved_of(e).saturating_add(e.burst.load(Ordering::Acquire)))
            .fold(0u64, u64::saturating_add)
    }

    /// The guarantees still lent out (pending) of every live entry but
    /// `except`.
    pub(super) fn pending_total(&self, except: Option<usize>) -> u64 {
        (0..MAX_ENTRIES)
            .filter(|&i| Some(i) != except)
            .filter_map(|i| self.entry(i))
            .filter(|e| e.state.load(Ordering::Acquire) == READY)
            .map(pending_of)
            .fold(0u64, u64::saturating_add)
    }

    /// The GPU's memory this process counts against: what its driver (or
    /// root's NVML) gave at join or register; an observer that gave none
    /// reads the file's.
    pub fn capacity(&self) -> u64 {
        match self.capacity.load(Ordering::Relaxed) {
            0 => self.head().capacity.load(Ordering::Acquire),
            c => c,
        }
    }

    /// Memory no tenant has reserved, holds or waits for: what a burst can
    /// still take (a pending guarantee goes first).
    pub fn room(&self) -> u64 {
        self.room_excluding(None)
    }

    /// [`room`](Self::room), not counting entry `except`'s pending part.
    pub(super) fn room_excluding(&self, except: Option<usize>) -> u64 {
        self.capacity()
            .saturating_sub(self.committed())
            .saturating_sub(self.pending_total(except))
    }

    /// Entry `i`'s guarantee still lent out (0: all of it reserved).
    pub fn pending(&self, i: usize) -> u64 {
        self.entry(i).map_or(0, pending_of)
    }

    /// Takes `bytes` more for entry `i`: first of its pending guarantee
    /// (from memory nobody has reserved or holds: as borrowers free), then
    /// as burst, only from what nobody reserved, holds or waits for
    /// ([`Pool::room`]). A pending part taken stays taken even where the
    /// rest is refused (it is the tenant's). Err: the room for a burst
    /// there is (0 while its own guarantee is still partly pending: see
    /// [`Pool::pending`]).
    pub fn reserve(&self, i: usize, bytes: u64) -> Result<(), u64> {
        let Some(e) = self.entry(i) else {
            return Err(0);
        };
        // A tenant keeping the lock holds a burst a bounded time: refused
        // then (past its guarantee, nothing taken).
        self.shm
            .with_flock_bounded(TENANT_WAIT, || {
                let want = bytes.min(pending_of(e));
                let rest = bytes - want;
                let short = |p: &Self| {
                    p.capacity().saturating_sub(p.committed()) < want
                        || p.room_excluding(Some(i)) < rest
                };
                // Short of room: dead processes' bursts and the entries whose
                // linger is over may give it.
                if short(self) {
                    self.sweep_locked();
                }
                if want > 0 {
                    let free = self.capacity().saturating_sub(self.committed());
                    let take = want.min(free);
                    if take > 0 {
                        e.pending.fetch_sub(take, Ordering::AcqRel);
                    }
                    if take < want {
                        return Err(0);
                    }
                }
                if rest > 0 {
                    let room = self.room_excluding(Some(i));
                    if room < rest {
                        return Err(room);
                    }
                    e.burst.fetch_add(rest, Ordering::AcqRel);
                }
                Ok(())
            })
            .unwrap_or(Err(0))
    }

    /// The entries that hold a burst now (name, bytes), largest first: who
    /// borrows what a pending guarantee waits for. The names are other
    /// tenants' writing, for another tenant's log: control characters are
    /// shown as `?`.
    pub fn borrowers(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .entries()
            .into_iter()
            .filter(|e| e.burst > 0)
            .map(|e| {
                let name = e
                    .name
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                (name, e.burst)
            })
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        v
    }
}
