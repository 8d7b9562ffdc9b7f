//! The lease: one process at a time has the GPU for a slice. Waiting for
//! it (`begin_wait`, `end_wait`); taking it, in steps (`try_acquire`: the
//! lease as it stands, a holder that lost it ([`judge_holder`]) taken
//! over, the ceiling, whose turn it is by virtual time, the grant); and the
//! holder's side: at a slice end, drain and release or renew
//! (`decide_release`, `renew`, `release`), going idle and busy again.

use super::*;
use crate::gpu::bounds;

/// How long past its deadline a live holder keeps the lease before a waiter
/// takes it (a holder that stopped launching never reaches its own slice
/// end).
pub const GRACE_NS: u64 = 50_000_000;
/// A tenant that has not held the lease for this long counts as having been
/// idle: when it comes back its virtual time is raised to the active ones'.
pub const IDLE_NS: u64 = 100_000_000;
/// Dead processes are swept at most this often while the lease waits on a
/// tenant that may have none left alive.
pub(super) const SWEEP_NS: u64 = 10_000_000;
/// How recent a waiter's last poll must be for others to defer to it.
pub const WAITER_FRESH_NS: u64 = 250_000_000;

/// A lease holder idle this long (its synchronising call returned and it
/// launched nothing since) loses the lease to a waiter, charged only up to
/// when it went idle: a service waiting for its next request must not
/// keep the GPU from a trainer for the rest of its slice, nor be charged
/// for it. Longer than a training loop's host gap between a step's
/// synchronisation and its next launch (tens of microseconds).
pub const IDLE_HANDOFF_NS: u64 = 1_000_000;

/// What a waiter decides about a lease another process holds
/// ([`judge_holder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The holder keeps it: come back at `until` (or at a release).
    Keeps { until: u64 },
    /// Take the lease over, charging the holder's tenant up to `end` (no
    /// further than its deadline); `idled`: a live holder that went idle
    /// (its tenant did not use all it was given).
    TakeOver { end: u64, idled: bool },
}

/// Whether a lease holder keeps the lease at `now`: one that is `dead`,
/// has a deadline no holder sets (`bounds::DEADLINE_AHEAD_NS`), has been
/// idle since `idle_since` (0: busy; a time ahead of now counts as busy)
/// for `IDLE_HANDOFF_NS`, or overstays its deadline by more than
/// `GRACE_NS` loses it.
pub fn judge_holder(dead: bool, deadline: u64, idle_since: u64, now: u64) -> Holder {
    let bogus = bounds::too_far_ahead(deadline, now, bounds::DEADLINE_AHEAD_NS);
    let idle = if idle_since > now { 0 } else { idle_since };
    let idled = idle != 0 && now - idle >= IDLE_HANDOFF_NS;
    if !dead && !bogus && !idled && now <= deadline.saturating_add(GRACE_NS) {
        let mut until = deadline.saturating_add(GRACE_NS).max(now + 1_000_000);
        if idle != 0 {
            until = until.min(idle + IDLE_HANDOFF_NS);
        }
        return Holder::Keeps { until };
    }
    let idled = idled && !dead;
    Holder::TakeOver {
        end: if idled { idle } else { now },
        idled,
    }
}

/// What `try_acquire` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// The lease is ours until `deadline`.
    Granted { deadline: u64 },
    /// Not now: wait for a release (futex on `generation`) or until `until`.
    Wait { until: u64 },
}

impl GpuSegment {
    /// Marks process `slot` of `tenant` as waiting for the lease. A tenant
    /// that was idle comes back at the smallest active virtual time.
    pub fn begin_wait(&self, slot: usize, tenant: usize, now: u64) {
        let (Some(p), Some(t)) = (self.proc_entry(slot), self.tenant(tenant)) else {
            return;
        };
        p.polled_at.store(now, Ordering::Relaxed);
        // It wanted the GPU and had to wait: it competes (demand window).
        t.win_waited.fetch_or(WAITED, Ordering::Relaxed);
        if p.waiting.swap(1, Ordering::AcqRel) != 0 {
            return;
        }
        let holder = self.sched().lease.load(Ordering::Acquire);
        let holds =
            holder != 0 && self.sched().holder_tenant.load(Ordering::Relaxed) as usize == tenant;
        let was_idle = now.saturating_sub(t.last_active.load(Ordering::Relaxed)) > IDLE_NS;
        if t.waiting.fetch_add(1, Ordering::AcqRel) == 0
            && !holds
            && was_idle
            && let Some(floor) = self.min_active_vtime(Some(tenant))
        {
            t.vtime.fetch_max(floor, Ordering::AcqRel);
        }
    }

    pub fn end_wait(&self, slot: usize, tenant: usize) {
        let (Some(p), Some(t)) = (self.proc_entry(slot), self.tenant(tenant)) else {
            return;
        };
        if p.waiting.swap(0, Ordering::AcqRel) != 0 {
            dec(&t.waiting);
        }
    }

    /// Smallest virtual time among tenants that are waiting or hold the
    /// lease, other than `except`.
    pub(in crate::gpu) fn min_active_vtime(&self, except: Option<usize>) -> Option<u64> {
        let s = self.sched();
        let holder = (s.lease.load(Ordering::Acquire) != 0)
            .then(|| s.holder_tenant.load(Ordering::Relaxed) as usize);
        (0..MAX_TENANTS)
            .filter(|&i| Some(i) != except)
            .filter_map(|i| self.tenant(i).map(|t| (i, t)))
            .filter(|(i, t)| {
                t.state.load(Ordering::Acquire) == READY
                    && (t.waiting.load(Ordering::Acquire) > 0 || holder == Some(*i))
            })
            .map(|(_, t)| t.vtime.load(Ordering::Acquire))
            .min()
    }

    /// One attempt to take the lease for `slot` of `tenant` (which must be
    /// waiting, see `begin_wait`): the lease as it stands (ours already, a
    /// holder that keeps it, or one that lost it), the ceiling, whose turn
    /// it is, the grant.
    pub fn try_acquire(&self, slot: usize, tenant: usize, now: u64, slice: u64) -> Acquire {
        self.restate_waiter(slot, tenant, now);
        if let Some(answer) = self.settle_lease(slot, now, slice) {
            return answer;
        }
        let Some(t) = self.tenant(tenant) else {
            return Acquire::Wait {
                until: now + 1_000_000,
            };
        };
        if let Some(until) = self.ceiling_hold(t, now, slice) {
            return Acquire::Wait { until };
        }
        if let Some(until) = self.yield_to_tenant_ahead(tenant, t, now, slice) {
            return Acquire::Wait { until };
        }
        self.grant(slot, tenant, t, now, slice)
    }

    /// Restates our own process entry (we wait) on every poll, so that
    /// whatever another writer put there (another tenant's index, a state,
    /// no waiting flag) is healed at once. Left alone, our fresh polls
    /// would make us a live waiter of some other tenant, which everyone
    /// (we included) would wait for.
    fn restate_waiter(&self, slot: usize, tenant: usize, now: u64) {
        if let Some(p) = self.proc_entry(slot) {
            p.state.store(PROC_LIVE, Ordering::Relaxed);
            p.tenant.store(tenant as u32, Ordering::Relaxed);
            p.waiting.store(1, Ordering::Relaxed);
            p.polled_at.store(now, Ordering::Release);
        }
    }

    /// Settles the lease as it stands for `slot` at `now`: ours already
    /// (granted again, to at most one slice from now), or held by a process
    /// that keeps it ([`judge_holder`]: wait), decide the attempt. A lease
    /// held by one that lost it is taken over ([`Self::take_over`]); then,
    /// as for a free lease, None: the attempt goes on.
    fn settle_lease(&self, slot: usize, now: u64, slice: u64) -> Option<Acquire> {
        let s = self.sched();
        let lease = s.lease.load(Ordering::Acquire);
        if lease == slot as u32 + 1 {
            self.held_since.store(now, Ordering::Relaxed);
            return Some(Acquire::Granted {
                deadline: s
                    .deadline
                    .load(Ordering::Acquire)
                    .min(now.saturating_add(slice)),
            });
        }
        if lease == 0 {
            return None;
        }
        let holder = (lease - 1) as usize;
        let deadline = s.deadline.load(Ordering::Acquire);
        let dead = holder >= MAX_PROCS || !self.shm.slot_alive(holder);
        let idle_since = self
            .proc_entry(holder)
            .map_or(0, |p| p.idle_since.load(Ordering::Acquire));
        match judge_holder(dead, deadline, idle_since, now) {
            Holder::Keeps { until } => Some(Acquire::Wait { until }),
            Holder::TakeOver { end, idled } => {
                self.take_over(lease, deadline, end, idled, dead, now);
                None
            }
        }
    }

    /// Takes the lease `lease` from a dead, idle or overstaying holder (or
    /// one with a corrupt deadline), charging its tenant up to its
    /// `deadline`, or up to `end` if that is sooner (when it went idle),
    /// at most one slice (a slice start far back is corrupt); wakes the
    /// waiters' generation and sweeps a `dead` holder's entry. Another
    /// waiter may have taken it first: then nothing.
    fn take_over(&self, lease: u32, deadline: u64, end: u64, idled: bool, dead: bool, now: u64) {
        let s = self.sched();
        let ht = s.holder_tenant.load(Ordering::Relaxed) as usize;
        let start = s.slice_start.load(Ordering::Acquire);
        if s.lease
            .compare_exchange(lease, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let ns = deadline.min(end).saturating_sub(start);
        self.charge(ht, bounds::charge_ns(ns), now);
        if idled && let Some(h) = self.tenant(ht) {
            h.win_waited.fetch_or(IDLED, Ordering::Relaxed);
        }
        s.generation.fetch_add(1, Ordering::AcqRel);
        if dead {
            self.reclaim_dead();
        }
    }

    /// Picks the next tenant by virtual time: if another waiting tenant
    /// goes before ours (`t`, index `tenant`), until when to wait. One goes
    /// first with a smaller virtual time, ties going to the one served
    /// longest ago, then to the lower index, if its ceiling admits it and a
    /// live process of it waits. Not a mere query: it refills the bucket
    /// of each tenant ahead that it weighs, ends the recharge of one whose
    /// ceiling admits it ([`admit_by_ceiling`]), and sweeps dead processes
    /// now and then ([`Self::sweep_if_due`]): that tenant's waiters may all
    /// be dead (killed while waiting).
    fn yield_to_tenant_ahead(
        &self,
        tenant: usize,
        t: &Tenant,
        now: u64,
        slice: u64,
    ) -> Option<u64> {
        let turn = |x: &Tenant, i: usize| {
            (
                x.vtime.load(Ordering::Acquire),
                x.last_active.load(Ordering::Relaxed),
                i,
            )
        };
        let mine = turn(t, tenant);
        for i in 0..MAX_TENANTS {
            if i == tenant {
                continue;
            }
            let Some(o) = self.tenant(i) else { break };
            if o.state.load(Ordering::Acquire) != READY || o.waiting.load(Ordering::Acquire) == 0 {
                continue;
            }
            if turn(o, i) < mine
                && admit_by_ceiling(o, self.refill(o, now, slice, true), slice).is_none()
            {
                if self.sweep_if_due(now) {
                    return Some(now + 50_000);
                }
                // Its `waiting` count is only a claim (any tenant can write
                // it): without a live waiting process behind it, it does
                // not hold the GPU back.
                if !self.has_live_waiter(i, now) {
                    continue;
                }
                return Some(now + 2_000_000);
            }
        }
        None
    }

    /// Sweeps dead processes if none swept for `SWEEP_NS` (a sweep time in
    /// the future is corrupt: swept too); whether it freed any.
    fn sweep_if_due(&self, now: u64) -> bool {
        let s = self.sched();
        let swept = s.swept_at.load(Ordering::Relaxed);
        now.abs_diff(swept) > SWEEP_NS
            && s.swept_at
                .compare_exchange(swept, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            && self.reclaim_dead() > 0
    }

    /// Grants the free lease to `slot` of `tenant` (`t`) for one slice from
    /// `now`; another process may have taken it first (then wait).
    fn grant(&self, slot: usize, tenant: usize, t: &Tenant, now: u64, slice: u64) -> Acquire {
        let s = self.sched();
        if s.lease
            .compare_exchange(0, slot as u32 + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Acquire::Wait {
                until: now + 1_000_000,
            };
        }
        s.holder_tenant.store(tenant as u32, Ordering::Relaxed);
        s.slice_start.store(now, Ordering::Release);
        self.held_since.store(now, Ordering::Relaxed);
        let deadline = now + slice;
        s.deadline.store(deadline, Ordering::Release);
        s.handovers.fetch_add(1, Ordering::Relaxed);
        t.last_active.store(now, Ordering::Relaxed);
        Acquire::Granted { deadline }
    }

    /// Whether a live process of tenant `i` waits for the lease: its slot
    /// says so, it tried within `WAITER_FRESH_NS`, and its lock is held. (A
    /// live process that never launches, with a `waiting` flag written into
    /// its slot by someone else, would otherwise hold everyone back for as
    /// long as it lives.)
    fn has_live_waiter(&self, i: usize, now: u64) -> bool {
        (0..MAX_PROCS).any(|k| {
            self.proc_entry(k).is_some_and(|p| {
                p.state.load(Ordering::Acquire) == PROC_LIVE
                    && p.tenant.load(Ordering::Relaxed) as usize == i
                    && p.waiting.load(Ordering::Acquire) != 0
                    && now.abs_diff(p.polled_at.load(Ordering::Relaxed)) <= WAITER_FRESH_NS
            }) && self.shm.slot_alive(k)
        })
    }

    /// Decides, at the end of a slice, whether the holder drains and
    /// releases (true: a waiting tenant is owed the GPU, or its ceiling is
    /// reached) or may renew. A holder its ceiling stops starts to recharge
    /// (it saves up a burst before its next hold), and its bucket is
    /// refilled up to `now`. Called by the holder (its slice began at its
    /// own `held_since`).
    ///
    /// A waiter is owed the GPU when its virtual time is at most the
    /// holder's with this slice charged. A holder still behind every
    /// waiter renews: it would win the next acquire anyway, and releasing
    /// made the turn go to whichever waiter's thread ran first. On a
    /// CPU-starved host the releasing holder's thread often ran late, a
    /// waiter ahead of it took the lease, and splits drifted (30/70 ran
    /// 40/60 beside busy processes on the fake GPU).
    pub fn decide_release(&self, tenant: usize, now: u64, slice: u64) -> bool {
        self.decide_release_measured(tenant, now, slice, WHOLE_PPM)
    }

    /// `decide_release` for a holder charged `ppm` parts per million of
    /// its hold (see `renew_measured`).
    pub fn decide_release_measured(&self, tenant: usize, now: u64, slice: u64, ppm: u64) -> bool {
        let Some(t) = self.tenant(tenant) else {
            return true;
        };
        let used = of_hold(
            now.saturating_sub(self.held_since.load(Ordering::Relaxed)),
            ppm,
        );
        let share = u64::from(bounds::percent(t.share.load(Ordering::Relaxed)));
        let mine = t
            .vtime
            .load(Ordering::Acquire)
            .saturating_add(bounds::charge_ns(used).saturating_mul(100) / share);
        if self.waiter_owed(tenant, mine) {
            return true;
        }
        self.recharge_if_spent(t, now, slice, used)
    }

    /// Whether a waiting tenant other than `tenant` is owed the GPU by a
    /// holder whose virtual time, this slice charged, is `holder_vtime`.
    fn waiter_owed(&self, tenant: usize, holder_vtime: u64) -> bool {
        (0..MAX_TENANTS).any(|i| {
            i != tenant
                && self.tenant(i).is_some_and(|o| {
                    o.state.load(Ordering::Acquire) == READY
                        && o.waiting.load(Ordering::Acquire) > 0
                        && o.vtime.load(Ordering::Acquire) <= holder_vtime
                })
        })
    }

    /// While this process holds the lease: where the span its next charge
    /// (`renew`, `release`) covers begins (its last charge, moved on past
    /// the time it was idle since, see `mark_holder_busy`).
    pub fn charged_from(&self) -> Option<u64> {
        let h = self.held_since.load(Ordering::Relaxed);
        (h != NOT_HELD).then_some(h)
    }

    /// Charges the current slice and extends it (no drain needed: nobody
    /// else waits). Returns the new deadline.
    pub fn renew(&self, slot: usize, tenant: usize, now: u64, slice: u64) -> Option<u64> {
        self.renew_measured(slot, tenant, now, slice, WHOLE_PPM)
    }

    /// `renew`, charging `ppm` parts per million of the slice: what the
    /// holder's kernels ran of its hold where that was measured (a
    /// launch-bound process alone under a ceiling), `WHOLE_PPM` otherwise.
    pub fn renew_measured(
        &self,
        slot: usize,
        tenant: usize,
        now: u64,
        slice: u64,
        ppm: u64,
    ) -> Option<u64> {
        let s = self.sched();
        if s.lease.load(Ordering::Acquire) != slot as u32 + 1 {
            return None;
        }
        s.slice_start.store(now, Ordering::Release);
        let start = self.held_since.swap(now, Ordering::Relaxed);
        self.charge(tenant, of_hold(now.saturating_sub(start), ppm), now);
        let deadline = now + slice;
        s.deadline.store(deadline, Ordering::Release);
        if let Some(t) = self.tenant(tenant) {
            t.last_active.store(now, Ordering::Relaxed);
        }
        Some(deadline)
    }

    /// Charges the slice up to `now` (after the holder drained) and frees
    /// the lease. The caller wakes the waiters (futex on `generation`).
    pub fn release(&self, slot: usize, tenant: usize, now: u64) -> bool {
        self.release_measured(slot, tenant, now, WHOLE_PPM)
    }

    /// `release`, charging `ppm` parts per million of the slice (see
    /// `renew_measured`).
    pub fn release_measured(&self, slot: usize, tenant: usize, now: u64, ppm: u64) -> bool {
        let s = self.sched();
        let start = self.held_since.swap(NOT_HELD, Ordering::Relaxed);
        if s.lease
            .compare_exchange(slot as u32 + 1, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false; // taken from us already (we overstayed)
        }
        // NOT_HELD: a lease naming our slot that we never took (written by
        // someone else): nothing to charge.
        if start != NOT_HELD {
            self.charge(tenant, of_hold(now.saturating_sub(start), ppm), now);
        }
        if let Some(t) = self.tenant(tenant) {
            t.last_active.store(now, Ordering::Relaxed);
        }
        s.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// The holder `slot` went idle at `now` (its synchronising call
    /// returned): from `IDLE_HANDOFF_NS` on, a waiter may take the lease.
    /// Returns whether some tenant waits (the caller wakes the waiters).
    pub fn mark_holder_idle(&self, slot: usize, now: u64) -> bool {
        if let Some(p) = self.proc_entry(slot) {
            p.idle_since.store(now.max(1), Ordering::Release);
        }
        (0..MAX_TENANTS).any(|i| {
            self.tenant(i).is_some_and(|o| {
                o.state.load(Ordering::Acquire) == READY && o.waiting.load(Ordering::Acquire) > 0
            })
        })
    }

    /// The holder `slot` launches again at `now`: it is busy. Whether it
    /// still holds the lease (a waiter may have taken it while it was
    /// idle); if so, the time it was idle is not charged to it.
    pub fn mark_holder_busy(&self, slot: usize, now: u64) -> bool {
        let idle = self
            .proc_entry(slot)
            .map_or(0, |p| p.idle_since.swap(0, Ordering::AcqRel));
        let s = self.sched();
        let holds = s.lease.load(Ordering::Acquire) == slot as u32 + 1;
        if holds && idle != 0 && idle <= now {
            let gap = now - idle;
            let _ = self
                .held_since
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                    (h != NOT_HELD).then(|| h.saturating_add(gap).min(now))
                });
            let _ = s
                .slice_start
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_add(gap).min(now))
                });
        }
        holds
    }
}
