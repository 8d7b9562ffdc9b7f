//! The scheduling policy over the per-GPU segment ([`super::layout`]):
//! every decision a process takes about putting work on the GPU. Decided
//! here, on plain integers, so it is unit-tested without a GPU; the shim
//! (`src/compute/`) supplies the clock, the draining and the waiting.
//!
//! Two ways to launch:
//! - **Freely.** A tenant whose demand is under its share launches at once,
//!   beside whoever else runs (the GPU time-slices between contexts, and a
//!   light tenant waits at most about one time-slice, ~2 ms, measured on an
//!   H100: docs/benchmarks/2026-11-23-h100-colocation-explore.md). It is
//!   charged (`charge_free`) the wall time its work is in flight, an upper
//!   bound of its GPU time, or, where that bound could make it heavy on a
//!   contended GPU, its kernels' GPU time as the shim's meter measures it
//!   (kernel records in probes, and their ratio of GPU time to time in
//!   flight between them: `src/gputime/`).
//! - **Through the lease**, for tenants that compete for a saturated GPU
//!   ("heavy"): one process at a time has the GPU for a slice, drains it
//!   before handing it over, and so measures its own GPU time exactly.
//!   Shares are weights: each tenant has a virtual time, advanced by the
//!   GPU time it is charged divided by its share; a free lease goes to a
//!   waiting process of the tenant with the smallest virtual time (stride
//!   scheduling), so busy tenants split the GPU in proportion to their
//!   shares.
//!
//! Which way ([`GpuSegment::route`]): one rule, [`heavy_after`], decides
//! heavy and light from the evidence both places gather (a closed demand
//! window, `roll_demand`; a busy stretch, `note_busy`): a tenant is heavy
//! once it is charged at least its share over a demand window
//! (`DEMAND_WINDOW_NS`), or once one of its processes has had work in
//! flight without a break for `HEAVY_BUSY_NS` and (where measured) ran
//! enough of it on the GPU (a saturating launcher); it is light again once
//! a whole window shows it under `LIGHT_PERMILLE` of its share without
//! having waited for the lease.
//!
//! The lease ([`GpuSegment::try_acquire`]), in steps: the lease as it
//! stands (`settle_lease`: ours already; a holder that keeps it, or one
//! that lost it, [`judge_holder`], taken over), the ceiling (`ceiling_hold`,
//! [`ceiling_wait`]), whose turn it is by virtual time
//! (`defer_to_tenant_ahead`), the grant (`grant`). At a slice end the
//! holder asks [`GpuSegment::decide_release`] whether to drain and release
//! or renew.
//!
//! Every value read from the segment is bounded as [`super::bounds`] says
//! (what a real cuslice process can write): one beyond is not honoured.
//!
//! - Work conservation: only tenants with waiting processes compete, so an
//!   idle tenant's share goes to the others. A tenant that comes back has its
//!   virtual time raised to the smallest among the active ones, so it gets
//!   its share again at once but cannot claim back what it did not use.
//! - Ceiling (`compute_max`): a token bucket refilled at the ceiling's rate;
//!   a tenant with no tokens launches neither freely nor through the lease,
//!   even on an idle GPU. Once its ceiling ends a hold, a standard tenant
//!   waits until it has saved up a whole burst (`compute_burst_ms`, default
//!   200 ms), so that a ceiling-bound tenant alternates long stretches on
//!   and off the GPU (see `tokens_needed` for why). A latency tenant never
//!   saves up: it runs again as soon as its bucket is above zero.
//! - A holder renews its slice without draining when nobody else waits and
//!   it has tokens; otherwise it drains and releases.
//! - A holder that dies, or overstays its deadline by `GRACE_NS`, loses the
//!   lease to the next waiter, which charges it up to its deadline.
//! - **Latency class.** A latency tenant under its share always launches
//!   freely, and stamps how long its work is in flight (`active_until`:
//!   each launch for `LATENCY_LINGER_NS`, a synchronising call until it
//!   returns, then `LATENCY_SYNC_TAIL_NS`). While such a stamp lies
//!   ahead, other tenants launch nothing new ([`GpuSegment::latency_hold`]), and while a latency tenant is live
//!   they keep their queues short (the shim's business), so its kernels
//!   find the GPU at the next kernel boundary. The first privilege is a
//!   budget per process ([`privilege_refill`]: up to
//!   `LATENCY_PRIVILEGE_NS` at once, refilled at half the tenant's share):
//!   spent, the process launches as a standard one until it has refilled
//!   (charged its kernels' GPU time where measured), and the others keep
//!   only their short queues. Its share is charged like anyone's (its
//!   kernels' GPU time where measured): the privilege is paid for in
//!   privilege, not in share. A latency tenant over its share is heavy
//!   like any other and loses both privileges.

use std::sync::atomic::Ordering;

use super::bounds;
use super::layout::*;

/// How long past its deadline a live holder keeps the lease before a waiter
/// takes it (a holder that stopped launching never reaches its own slice
/// end).
pub const GRACE_NS: u64 = 50_000_000;
/// A tenant that has not held the lease for this long counts as having been
/// idle: when it comes back its virtual time is raised to the active ones'.
pub const IDLE_NS: u64 = 100_000_000;
/// Dead processes are swept at most this often while the lease waits on a
/// tenant that may have none left alive.
const SWEEP_NS: u64 = 10_000_000;
/// How recent a waiter's last poll must be for others to defer to it.
pub const WAITER_FRESH_NS: u64 = 250_000_000;
/// The window over which a tenant's demand is measured.
pub const DEMAND_WINDOW_NS: u64 = 100_000_000;
/// A process whose work has been in flight without a break this long
/// saturates the GPU: its tenant is heavy at once.
pub const HEAVY_BUSY_NS: u64 = 50_000_000;
/// A heavy tenant is light again below this fraction of its share (per
/// mille), so that one held exactly at its share stays heavy.
pub const LIGHT_PERMILLE: u64 = 800;
/// A process in flight without a break for `HEAVY_BUSY_NS` saturates the
/// GPU if its kernels ran at least this share (per mille) of its fair
/// time-slice share of that stretch (`note_busy`).
pub const SATURATING_PERMILLE: u64 = 500;
/// A lease holder idle this long (its synchronising call returned and it
/// launched nothing since) loses the lease to a waiter, charged only up to
/// when it went idle: a service waiting for its next request must not
/// keep the GPU from a trainer for the rest of its slice, nor be charged
/// for it. Longer than a training loop's host gap between a step's
/// synchronisation and its next launch (tens of microseconds).
pub const IDLE_HANDOFF_NS: u64 = 1_000_000;
/// `win_waited` bits: a process of the tenant waited for the lease in this
/// window; one of them lost the lease for being idle in it (it did not use
/// all the GPU time it was given: no evidence it saturates the GPU).
const WAITED: u32 = 1;
const IDLED: u32 = 2;
/// A hold charged whole (`renew_measured`, `release_measured`).
pub const WHOLE_PPM: u64 = 1_000_000;

/// `ns` of a hold charged at `ppm` parts per million (at most all of it).
fn of_hold(ns: u64, ppm: u64) -> u64 {
    (u128::from(ns) * u128::from(ppm.min(WHOLE_PPM)) / u128::from(WHOLE_PPM)) as u64
}

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

/// The ceiling bucket's burst of tenant `t`, ns (one slice where its
/// entry's is unset or out of bounds: `bounds::burst_or_slice`).
fn burst_of(t: &Tenant, slice: u64) -> i64 {
    bounds::burst_or_slice(t.burst_ns.load(Ordering::Relaxed), slice).min(i64::MAX as u64) as i64
}

/// Heals `t`'s bucket if it holds a value no bucket can hold (out of
/// `bounds::tokens_in_bounds`): it restarts at 0. Returns the tokens.
fn heal_tokens(t: &Tenant) -> i64 {
    let v = t.tokens.load(Ordering::Acquire);
    if bounds::tokens_in_bounds(v) {
        return v;
    }
    let _ = t
        .tokens
        .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Acquire);
    0
}

/// How long (ns) a ceiling bucket refilled at `max` percent of wall time
/// takes to go from `tokens` to `need` (0 if it is there).
pub fn refill_wait(tokens: i64, need: i64, max: u32) -> u64 {
    if tokens >= need {
        return 0;
    }
    need.saturating_sub(tokens)
        .unsigned_abs()
        .saturating_mul(100)
        / u64::from(bounds::percent(max))
}

/// The tokens a tenant under a ceiling needs before it may take the lease:
/// after its ceiling ended a hold (`recharging`), a whole `burst`; a tenant
/// that merely waited for others, one. Waiting for a whole burst makes a
/// ceiling-bound tenant run in long stretches, long enough for the GPU's
/// clocks to settle where they are under sustained load (short bursts on a
/// mostly idle GPU run at boost clocks, and a 30 % ceiling of GPU time
/// would give ~35 % of the throughput).
pub fn tokens_needed(recharging: bool, burst: i64) -> i64 {
    if recharging { burst } else { 1 }
}

/// None when a ceiling of `max` percent lets a tenant with `tokens` saved
/// go, needing `need` ([`tokens_needed`]); else how long until it does
/// (ns). No ceiling (100) never waits.
pub fn ceiling_wait(max: u32, tokens: i64, need: i64) -> Option<u64> {
    (max < 100 && tokens < need).then(|| refill_wait(tokens, need, max))
}

/// Admits `t`, with `tokens` saved, by its ceiling ([`ceiling_wait`]):
/// None when it may take the lease, ending its recharge if it was saving
/// up a burst; else how long until it may (ns).
fn admit_by_ceiling(t: &Tenant, tokens: i64, slice: u64) -> Option<u64> {
    let max = t.max.load(Ordering::Relaxed);
    if max >= 100 {
        return None;
    }
    let recharging = t.recharging.load(Ordering::Acquire) != 0;
    let need = tokens_needed(recharging, burst_of(t, slice));
    let wait = ceiling_wait(max, tokens, need);
    if wait.is_none() && recharging {
        t.recharging.store(0, Ordering::Release);
    }
    wait
}

/// What tells whether a tenant saturates the GPU ([`heavy_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    /// Its demand window closed: it was charged `demand_pm` per mille of
    /// the window's wall time, its share is `share_pm` per mille;
    /// `saturated`: it waited for the lease (or waits) and never went idle
    /// holding it in the window.
    Window {
        demand_pm: u64,
        share_pm: u64,
        saturated: bool,
    },
    /// A process of it had work in flight without a break for `ns`;
    /// `gpu`: where measured, the GPU time its kernels ran in that stretch
    /// and how many other tenants compete for the GPU.
    Busy { ns: u64, gpu: Option<(u64, u64)> },
}

/// The one rule for heavy (competes through the lease) and light (launches
/// freely): whether a tenant that was heavy (`was_heavy`), latency class
/// or not, is heavy after `evidence`; None when the evidence says nothing
/// either way (it stays as it was).
///
/// - A closed window: heavy once charged at least its share; a heavy
///   tenant stays heavy while at `LIGHT_PERMILLE` of it or saturated
///   (waiting counts only from a tenant that used all it was given: a
///   heavy tenant always waits, so counted alone, waiting kept a service
///   that was heavy once heavy for ever).
/// - A busy stretch of at least `HEAVY_BUSY_NS`: heavy at once, unless
///   latency class (one long request is no reason to lose its class) or
///   measured to run under `SATURATING_PERMILLE` of its fair time-slice
///   share (1 / the tenants competing, itself included) of the stretch:
///   two saturating tenants time-sliced run ~500 per mille each, a
///   launch-bound decode loop ~50. A short stretch says nothing.
pub fn heavy_after(was_heavy: bool, latency: bool, evidence: Demand) -> Option<bool> {
    match evidence {
        Demand::Window {
            demand_pm: pm,
            share_pm,
            saturated,
        } => Some(
            pm >= share_pm
                || (was_heavy
                    && (u128::from(pm) * 1000
                        >= u128::from(share_pm) * u128::from(LIGHT_PERMILLE)
                        || saturated)),
        ),
        Demand::Busy { ns, gpu } => {
            if ns < HEAVY_BUSY_NS || latency {
                return None;
            }
            if let Some((gpu, competitors)) = gpu {
                let fair = SATURATING_PERMILLE / competitors.saturating_add(1);
                if u128::from(gpu) * 1000 < u128::from(ns) * u128::from(fair) {
                    return None;
                }
            }
            Some(true)
        }
    }
}

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

fn is_latency(t: &Tenant) -> bool {
    t.class.load(Ordering::Relaxed) == CLASS_LATENCY
}

fn is_heavy(t: &Tenant) -> bool {
    t.heavy.load(Ordering::Relaxed) != 0
}

/// What `try_acquire` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// The lease is ours until `deadline`.
    Granted { deadline: u64 },
    /// Not now: wait for a release (futex on `generation`) or until `until`.
    Wait { until: u64 },
}

/// How a process that does not hold the lease puts its next work on the
/// GPU ([`GpuSegment::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// At once, without the lease (charged with `charge_free`).
    Free,
    /// Through the lease (`begin_wait` / `try_acquire`).
    Lease,
    /// A latency tenant out of ceiling tokens: freely, once `until` has
    /// passed.
    Throttle { until: u64 },
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
    pub(super) fn min_active_vtime(&self, except: Option<usize>) -> Option<u64> {
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

    /// Refills the ceiling bucket up to `now`; returns the tokens (ns). The
    /// burst cap (one slice) applies to what a tenant saves up while it waits
    /// (`capped`), not to what it earns while it holds the GPU: a slice longer
    /// than the burst (long kernels) must not lose the tokens it accrued.
    /// Either way no bucket holds more than `bounds::MAX_SAVED_NS`.
    fn refill(&self, t: &Tenant, now: u64, slice: u64, capped: bool) -> i64 {
        let max = t.max.load(Ordering::Relaxed);
        if max >= 100 {
            return i64::MAX;
        }
        // 0 is out of range: the tightest ceiling (`bounds::percent`),
        // not a bucket that never refills.
        let max = u64::from(bounds::percent(max));
        let at = t.tokens_at.load(Ordering::Acquire);
        if bounds::too_far_ahead(at, now, bounds::CLOCK_AHEAD_NS) {
            // A refill time in the future is corrupt: restart the bucket's
            // clock now (nothing is earned for the bogus interval).
            let _ = t
                .tokens_at
                .compare_exchange(at, now, Ordering::AcqRel, Ordering::Acquire);
        } else if now > at
            && t.tokens_at
                .compare_exchange(at, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let add = ((now - at) as u128 * max as u128 / 100).min(i64::MAX as u128) as i64;
            let burst = if capped { burst_of(t, slice) } else { i64::MAX };
            let _ = t
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    // A corrupt bucket (see `heal_tokens`) restarts at 0.
                    let v = if bounds::tokens_in_bounds(v) { v } else { 0 };
                    let n = v.saturating_add(add);
                    Some(bounds::saved_at_most(if n > burst {
                        burst.max(v)
                    } else {
                        n
                    }))
                });
        }
        heal_tokens(t)
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
        if let Some(until) = self.defer_to_tenant_ahead(tenant, t, now, slice) {
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

    /// Refills `t`'s bucket and admits it by its ceiling
    /// ([`admit_by_ceiling`]): None when it may take the lease, else until
    /// when to wait (at least 100 µs).
    fn ceiling_hold(&self, t: &Tenant, now: u64, slice: u64) -> Option<u64> {
        let tokens = self.refill(t, now, slice, true);
        admit_by_ceiling(t, tokens, slice).map(|wait| now.saturating_add(wait.max(100_000)))
    }

    /// Picks the next tenant by virtual time: if another waiting tenant
    /// goes before ours (`t`, index `tenant`), until when to wait. One goes
    /// first with a smaller virtual time, ties going to the one served
    /// longest ago, then to the lower index, if its ceiling admits it and a
    /// live process of it waits. Sweeps dead processes now and then
    /// ([`Self::sweep_if_due`]): that tenant's waiters may all be dead
    /// (killed while waiting).
    fn defer_to_tenant_ahead(
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

    /// Charges `ns` of GPU time measured under the lease to `tenant`: its
    /// virtual time, and what every charge touches (`charge_usage`).
    fn charge(&self, tenant: usize, ns: u64, now: u64) {
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

    /// Refills the bucket of holder `t` (uncapped: see `refill`) and, if
    /// `used` of its hold spends it, starts its recharge; whether it did
    /// (the holder must release). No ceiling: never.
    fn recharge_if_spent(&self, t: &Tenant, now: u64, slice: u64, used: u64) -> bool {
        if t.max.load(Ordering::Relaxed) >= 100 {
            return false;
        }
        let spent = self
            .refill(t, now, slice, false)
            .saturating_sub(used.min(i64::MAX as u64) as i64)
            <= 0;
        if spent {
            t.recharging.store(1, Ordering::Release);
        }
        spent
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

    pub fn add_throttled(&self, tenant: usize, ns: u64) {
        if let Some(t) = self.tenant(tenant) {
            t.throttled_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Rolls tenant `t`'s demand window if it is over, and judges from it
    /// whether the tenant is heavy ([`heavy_after`]).
    fn roll_demand(&self, t: &Tenant, now: u64) {
        let start = t.win_start.load(Ordering::Acquire);
        if bounds::too_far_ahead(start, now, bounds::CLOCK_AHEAD_NS) {
            // A window starting in the future is corrupt: restart it.
            if t.win_start
                .compare_exchange(start, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                t.win_used.store(0, Ordering::Relaxed);
            }
            return;
        }
        let span = now.saturating_sub(start);
        if span < DEMAND_WINDOW_NS
            || t.win_start
                .compare_exchange(start, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let used = t.win_used.swap(0, Ordering::AcqRel);
        let pm = (used as u128 * 1000 / span as u128).min(u32::MAX as u128) as u64;
        t.demand_pm.store(pm as u32, Ordering::Relaxed);
        let flags = t.win_waited.swap(0, Ordering::AcqRel);
        // Waiting is evidence of saturation only from a tenant that used
        // all it was given (see `heavy_after`).
        let saturated =
            flags & IDLED == 0 && (flags & WAITED != 0 || t.waiting.load(Ordering::Acquire) > 0);
        let share_pm = u64::from(bounds::percent(t.share.load(Ordering::Relaxed))) * 10;
        self.judge_heavy(
            t,
            Demand::Window {
                demand_pm: pm,
                share_pm,
                saturated,
            },
        );
    }

    /// Sets `t` heavy or light as [`heavy_after`] judges `evidence` (the
    /// only place the flag is written by a process).
    fn judge_heavy(&self, t: &Tenant, evidence: Demand) {
        if let Some(heavy) = heavy_after(is_heavy(t), is_latency(t), evidence) {
            t.heavy.store(u32::from(heavy), Ordering::Release);
        }
    }

    /// How a process of `tenant` that does not hold the lease launches
    /// next: freely while the tenant's demand is under its share and its
    /// ceiling has tokens, else through the lease. A latency tenant under
    /// its share never takes the lease: out of tokens, it waits for them.
    pub fn route(&self, tenant: usize, now: u64, slice: u64) -> Route {
        let Some(t) = self.tenant(tenant) else {
            return Route::Lease;
        };
        self.roll_demand(t, now);
        let max = t.max.load(Ordering::Relaxed);
        // Heavy matters only where someone else wants the GPU (or a
        // ceiling needs the lease's accounting): alone, a heavy tenant
        // launches freely, as it would without cuslice.
        if is_heavy(t) && (max < 100 || self.contended(tenant, now)) {
            return Route::Lease;
        }
        if max >= 100 {
            return Route::Free;
        }
        let tokens = self.refill(t, now, slice, true);
        if is_latency(t) {
            // It never saves up a burst: one token lets it go.
            return match ceiling_wait(max, tokens, 1) {
                None => Route::Free,
                Some(wait) => Route::Throttle {
                    until: now.saturating_add(wait.max(100_000)),
                },
            };
        }
        match admit_by_ceiling(t, tokens, slice) {
            None => Route::Free,
            Some(_) => Route::Lease,
        }
    }

    /// Whether a tenant other than `tenant` competes for this GPU now: one
    /// of its processes waits for the lease or holds it, or it had GPU time
    /// charged in its current or last demand window (with a live process).
    pub fn contended(&self, tenant: usize, now: u64) -> bool {
        let s = self.sched();
        let lease = s.lease.load(Ordering::Acquire);
        if lease != 0 && s.holder_tenant.load(Ordering::Relaxed) as usize != tenant {
            return true;
        }
        (0..MAX_TENANTS).any(|i| i != tenant && self.competes(i, now))
    }

    /// How many tenants other than `tenant` compete for this GPU now.
    pub fn competitors(&self, tenant: usize, now: u64) -> u64 {
        (0..MAX_TENANTS)
            .filter(|&i| i != tenant && self.competes(i, now))
            .count() as u64
    }

    /// Who else competes for this GPU now: how many tenants other than
    /// `tenant` compete, and how many of those are heavy (go through the
    /// lease). A change in either changes what a free process's kernels
    /// get of the GPU (its ratio of GPU time to time in flight).
    pub fn competition(&self, tenant: usize, now: u64) -> (u64, u64) {
        (0..MAX_TENANTS)
            .filter(|&i| i != tenant && self.competes(i, now))
            .fold((0, 0), |(n, heavy), i| {
                let h = self.tenant(i).is_some_and(is_heavy);
                (n + 1, heavy + u64::from(h))
            })
    }

    /// Whether tenant `i` competes for the GPU: a live process of it waits
    /// for the lease, or it was charged GPU time recently.
    fn competes(&self, i: usize, now: u64) -> bool {
        self.tenant(i).is_some_and(|o| {
            // A window is rolled by its own tenant's charges: one that
            // started long ago belongs to a tenant gone idle.
            let recent =
                now.saturating_sub(o.win_start.load(Ordering::Relaxed)) < 2 * DEMAND_WINDOW_NS;
            o.state.load(Ordering::Acquire) == READY
                && o.procs.load(Ordering::Acquire) > 0
                && (o.waiting.load(Ordering::Acquire) > 0
                    || (recent
                        && (o.win_used.load(Ordering::Relaxed) > 0
                            || o.demand_pm.load(Ordering::Relaxed) > 0)))
        })
    }

    /// Whether `tenant` has no ceiling on this GPU.
    pub fn uncapped(&self, tenant: usize) -> bool {
        self.tenant(tenant)
            .is_some_and(|t| t.max.load(Ordering::Relaxed) >= 100)
    }

    /// Whether a process of `tenant` that launches freely may do so in
    /// long passes: no ceiling to account for, and nobody else competing.
    pub fn free_alone(&self, tenant: usize, now: u64) -> bool {
        self.tenant(tenant)
            .is_some_and(|t| t.max.load(Ordering::Relaxed) >= 100)
            && !self.contended(tenant, now)
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

    /// A process of `tenant` has had work in flight without a break for
    /// `ns`: past `HEAVY_BUSY_NS` it saturates the GPU, and its tenant
    /// competes through the lease from its next launch on ([`heavy_after`]:
    /// a latency tenant only by its charged share).
    ///
    /// `gpu_ns`: the GPU time its kernels ran in that stretch, where it is
    /// measured (kernel records). In flight is not on the GPU: a launch-bound
    /// decode loop beside a trainer is in flight most of the time and runs
    /// 4.5 % of it; measured, it is judged against its fair time-slice
    /// share among the tenants competing now.
    pub fn note_busy(&self, tenant: usize, ns: u64, gpu_ns: Option<u64>, now: u64) {
        let Some(t) = self.tenant(tenant) else { return };
        // (`heavy_after` ignores these; counting the competitors, a pass
        // over every tenant entry, is left to stretches it judges.)
        if ns < HEAVY_BUSY_NS || is_latency(t) {
            return;
        }
        let gpu = gpu_ns.map(|gpu| (gpu, self.competitors(tenant, now)));
        self.judge_heavy(t, Demand::Busy { ns, gpu });
    }

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
    /// has (the hint in `Sched`).
    pub fn latency_hold(&self, now: u64) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::bounds::{MAX_BURST_NS, MAX_SLICE_NS};

    #[test]
    fn a_latency_privilege_refills_at_half_the_share_up_to_its_budget() {
        let cap = LATENCY_PRIVILEGE_NS as i64;
        // Spent, at a 50 % share: a quarter of the wall time comes back.
        assert_eq!(privilege_refill(0, 40_000_000, 50), 10_000_000);
        // Never beyond the budget, however long it was idle.
        assert_eq!(privilege_refill(cap, 10_000_000_000, 50), cap);
        assert_eq!(privilege_refill(0, u64::MAX, 100), cap);
        // A debt (a synchronising call that ran long) is paid back first.
        assert_eq!(privilege_refill(-10_000_000, 40_000_000, 50), 0);
        // A share out of range counts as 1..=100; a corrupt debt is bounded.
        assert_eq!(privilege_refill(0, 200_000_000, 0), 1_000_000);
        assert_eq!(privilege_refill(i64::MIN, 0, 50), -cap * 50);
        // Over a long run: a tenant that spends its budget whenever it has
        // some is privileged at most half its share of the time.
        let (mut tokens, mut privileged) = (cap, 0u64);
        for _ in 0..10_000 {
            if tokens > 0 {
                tokens -= 1_000_000;
                privileged += 1_000_000;
            }
            tokens = privilege_refill(tokens, 1_000_000, 30);
        }
        let fraction = privileged as f64 / 1e10;
        assert!((0.15..0.153).contains(&fraction), "{fraction}");
    }

    #[test]
    fn a_ceiling_waits_for_the_tokens_it_needs_at_its_rate() {
        // One token owed 3 ms at 20 %: 15 ms (and the token itself).
        assert_eq!(refill_wait(-3_000_000, 1, 20), 15_000_005);
        assert_eq!(refill_wait(1, 1, 20), 0, "there already");
        assert_eq!(refill_wait(i64::MIN, i64::MAX, 0), u64::MAX, "saturates");
        // A ceiling of 0 refills as the tightest (1 %), not never.
        assert_eq!(refill_wait(0, 1_000, 0), 100_000);
        assert_eq!(tokens_needed(false, 200), 1);
        assert_eq!(tokens_needed(true, 200), 200, "recharging: a burst");
        assert_eq!(ceiling_wait(100, i64::MIN, 1), None, "no ceiling");
        assert_eq!(ceiling_wait(50, 200, 200), None);
        assert_eq!(ceiling_wait(50, 199, 200), Some(2));
    }

    #[test]
    fn one_rule_decides_heavy_and_light() {
        let window = |pm, saturated| Demand::Window {
            demand_pm: pm,
            share_pm: 500,
            saturated,
        };
        // A window: at its share heavy, under it light, held at 80 % of
        // it (or saturated) a heavy tenant stays heavy.
        assert_eq!(heavy_after(false, false, window(500, false)), Some(true));
        assert_eq!(heavy_after(false, false, window(499, true)), Some(false));
        assert_eq!(heavy_after(true, false, window(400, false)), Some(true));
        assert_eq!(heavy_after(true, false, window(399, false)), Some(false));
        assert_eq!(heavy_after(true, false, window(0, true)), Some(true));
        assert_eq!(
            heavy_after(false, true, window(500, false)),
            Some(true),
            "latency too"
        );
        // A busy stretch: heavy at HEAVY_BUSY_NS, says nothing before it,
        // nor for a latency tenant, nor when measured to run little.
        let busy = |ns, gpu| Demand::Busy { ns, gpu };
        assert_eq!(
            heavy_after(false, false, busy(HEAVY_BUSY_NS, None)),
            Some(true)
        );
        assert_eq!(
            heavy_after(true, false, busy(HEAVY_BUSY_NS - 1, None)),
            None
        );
        assert_eq!(heavy_after(false, true, busy(u64::MAX, None)), None);
        let ns = 4 * HEAVY_BUSY_NS;
        assert_eq!(
            heavy_after(false, false, busy(ns, Some((ns / 4, 1)))),
            Some(true)
        );
        assert_eq!(
            heavy_after(false, false, busy(ns, Some((ns / 4 - 1, 1)))),
            None
        );
        assert_eq!(
            heavy_after(false, false, busy(ns, Some((0, u64::MAX)))),
            Some(true)
        );
    }

    #[test]
    fn a_holder_keeps_the_lease_until_it_dies_idles_or_overstays() {
        let now = 1_000_000_000;
        let deadline = now + SLICE;
        let keeps = |until| Holder::Keeps { until };
        assert_eq!(
            judge_holder(false, deadline, 0, now),
            keeps(deadline + GRACE_NS)
        );
        assert_eq!(
            judge_holder(true, deadline, 0, now),
            Holder::TakeOver {
                end: now,
                idled: false
            }
        );
        // Overstayed: kept through the grace, lost past it.
        let late = deadline + GRACE_NS;
        assert_eq!(
            judge_holder(false, deadline, 0, late),
            keeps(late + 1_000_000)
        );
        assert_eq!(
            judge_holder(false, deadline, 0, late + 1),
            Holder::TakeOver {
                end: late + 1,
                idled: false
            }
        );
        // Idle: until the hand-off; then lost, charged up to when it idled.
        let idle = now - IDLE_HANDOFF_NS / 2;
        assert_eq!(
            judge_holder(false, deadline, idle, now),
            keeps(idle + IDLE_HANDOFF_NS)
        );
        assert_eq!(
            judge_holder(false, deadline, idle, idle + IDLE_HANDOFF_NS),
            Holder::TakeOver {
                end: idle,
                idled: true
            }
        );
        assert_eq!(
            judge_holder(false, deadline, now + 1, now),
            keeps(deadline + GRACE_NS),
            "idle ahead: busy"
        );
        // A deadline no holder sets.
        let far = now + bounds::DEADLINE_AHEAD_NS;
        assert_eq!(judge_holder(false, far, 0, now), keeps(far + GRACE_NS));
        assert_eq!(
            judge_holder(false, far + 1, 0, now),
            Holder::TakeOver {
                end: now,
                idled: false
            }
        );
    }

    #[test]
    fn a_holder_charged_little_saves_no_more_than_a_bucket_holds() {
        // Alone under a ceiling (half the wall time), charged a tenth of each slice, a
        // holder earns more than it spends: its bucket stops at what a
        // bucket holds (the bound the watchdog judges by), not beyond.
        let (g, a, t, p) = one_waiter("saved", 30);
        let e = g.tenant(t).expect("t");
        let t0 = 5_000_000_000;
        e.tokens.store(SLICE as i64, Ordering::Relaxed);
        e.tokens_at.store(t0, Ordering::Relaxed);
        assert!(matches!(
            a.try_acquire(p, t, t0, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(p, t);
        let mut now = t0;
        for _ in 0..4_000 {
            now += SLICE;
            assert!(!a.decide_release_measured(t, now, SLICE, 100_000));
            assert!(a.renew_measured(p, t, now, SLICE, 100_000).is_some());
        }
        let tokens = e.tokens.load(Ordering::Relaxed);
        assert!(bounds::tokens_in_bounds(tokens), "{tokens}");
        assert!(
            tokens > bounds::MAX_SAVED_NS as i64 - SLICE as i64,
            "{tokens}"
        );
    }

    const SLICE: u64 = 20_000_000;

    /// A test's segment; its directory is removed when it is dropped.
    struct Seg(GpuSegment);

    impl std::ops::Deref for Seg {
        type Target = GpuSegment;
        fn deref(&self) -> &GpuSegment {
            &self.0
        }
    }

    impl Drop for Seg {
        fn drop(&mut self) {
            if let Some(d) = self.0.path.parent() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }

    fn seg(name: &str) -> Seg {
        let d =
            std::env::temp_dir().join(format!("cuslice-gpu-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Seg(GpuSegment::open_or_create(&d.join("gpu.seg")).expect("open"))
    }

    /// Simulates busy tenants on a saturated GPU for `ms` of virtual time;
    /// returns each tenant's share of the charged time, in percent.
    fn simulate(shares: &[(u32, u32)], ms: u64) -> Vec<f64> {
        let g = seg(&format!(
            "sim-{}",
            shares
                .iter()
                .map(|s| s.0.to_string())
                .collect::<Vec<_>>()
                .join("-")
        ));
        // One "process" per tenant; process slots need real OFD locks, so
        // use separate open file descriptions.
        let extra: Vec<GpuSegment> = shares
            .iter()
            .map(|_| GpuSegment::open_or_create(&g.path).expect("open"))
            .collect();
        let mut ts = Vec::new();
        for (k, (share, max)) in shares.iter().enumerate() {
            let (t, _) = g
                .register_tenant(&format!("t{k}"), *share, *max, 0, 0)
                .expect("tenant");
            let p = extra[k].claim_proc(t, k as u32).expect("proc");
            extra[k].begin_wait(p, t, 0);
            ts.push((t, p));
        }
        let mut now = 0u64;
        let end = ms * 1_000_000;
        while now < end {
            let mut progressed = false;
            for (k, &(t, p)) in ts.iter().enumerate() {
                if let Acquire::Granted { deadline } = extra[k].try_acquire(p, t, now, SLICE) {
                    extra[k].end_wait(p, t);
                    now = deadline; // run a full slice
                    extra[k].release(p, t, now);
                    extra[k].begin_wait(p, t, now);
                    progressed = true;
                    break;
                }
            }
            if !progressed {
                now += 1_000_000; // everyone throttled: the GPU idles
            }
        }
        let used: Vec<u64> = ts
            .iter()
            .map(|&(t, _)| g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed))
            .collect();
        used.iter()
            .map(|&u| 100.0 * u as f64 / now as f64)
            .collect()
    }

    #[test]
    fn busy_tenants_split_by_share() {
        let r = simulate(&[(30, 100), (70, 100)], 10_000);
        assert!(
            (r[0] - 30.0).abs() < 1.0 && (r[1] - 70.0).abs() < 1.0,
            "{r:?}"
        );
        let r = simulate(&[(20, 100), (30, 100), (50, 100)], 10_000);
        assert!(
            (r[0] - 20.0).abs() < 1.0 && (r[1] - 30.0).abs() < 1.0 && (r[2] - 50.0).abs() < 1.0,
            "{r:?}"
        );
    }

    #[test]
    fn ceiling_holds_on_an_idle_gpu() {
        for cap in [10, 25, 50, 75] {
            let r = simulate(&[(cap, cap)], 20_000);
            assert!((r[0] - cap as f64).abs() < 1.0, "cap {cap}: {r:?}");
        }
    }

    #[test]
    fn long_slices_under_a_high_ceiling_keep_their_tokens() {
        // 30 ms slices (three 10 ms kernels) under a 75 % ceiling: tokens
        // earned during the slice beyond the one-slice burst count.
        let g = seg("longslice");
        let (t, _) = g.register_tenant("t", 75, 75, 0, 0).expect("t");
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let p = a.claim_proc(t, 1).expect("p");
        a.begin_wait(p, t, 0);
        let (mut now, mut busy) = (0u64, 0u64);
        while now < 60_000_000_000 {
            match a.try_acquire(p, t, now, SLICE) {
                Acquire::Granted { .. } => {
                    a.end_wait(p, t);
                    loop {
                        now += 30_000_000;
                        busy += 30_000_000;
                        if a.decide_release(t, now, SLICE) {
                            break;
                        }
                        a.renew(p, t, now, SLICE).expect("renew");
                    }
                    a.release(p, t, now);
                    a.begin_wait(p, t, now);
                }
                Acquire::Wait { until } => now = until,
            }
        }
        let pct = 100.0 * busy as f64 / now as f64;
        assert!((pct - 75.0).abs() < 1.0, "{pct}");
    }

    /// Busy tenants (share, max, burst ms) with renewals as the shim does
    /// them: a holder runs slice after slice, renewing while
    /// `decide_release` says it may. Returns each tenant's percent of the
    /// time and its holds as (start, end) ns.
    fn simulate_holds(
        name: &str,
        tenants: &[(u32, u32, u64)],
        ms: u64,
    ) -> (Vec<f64>, Vec<Vec<(u64, u64)>>) {
        let g = seg(name);
        let procs: Vec<GpuSegment> = tenants
            .iter()
            .map(|_| GpuSegment::open_or_create(&g.path).expect("open"))
            .collect();
        let mut ids = Vec::new();
        for (k, &(share, max, burst)) in tenants.iter().enumerate() {
            let (t, _) = g
                .register_tenant(&format!("t{k}"), share, max, burst * 1_000_000, 0)
                .expect("tenant");
            let p = procs[k].claim_proc(t, k as u32).expect("proc");
            procs[k].begin_wait(p, t, 0);
            ids.push((t, p));
        }
        let mut holds = vec![Vec::new(); tenants.len()];
        let mut busy = vec![0u64; tenants.len()];
        let (mut now, end) = (0u64, ms * 1_000_000);
        while now < end {
            let mut next = u64::MAX;
            let mut granted = None;
            for (k, &(t, p)) in ids.iter().enumerate() {
                match procs[k].try_acquire(p, t, now, SLICE) {
                    Acquire::Granted { .. } => {
                        granted = Some(k);
                        break;
                    }
                    Acquire::Wait { until } => next = next.min(until),
                }
            }
            let Some(k) = granted else {
                now = next.max(now + 1);
                continue;
            };
            let (t, p) = ids[k];
            procs[k].end_wait(p, t);
            let start = now;
            loop {
                now += SLICE;
                if procs[k].decide_release(t, now, SLICE) {
                    break;
                }
                procs[k].renew(p, t, now, SLICE).expect("renew");
            }
            procs[k].release(p, t, now);
            procs[k].begin_wait(p, t, now);
            busy[k] += now - start;
            holds[k].push((start, now));
        }
        (
            busy.iter()
                .map(|&b| 100.0 * b as f64 / now as f64)
                .collect(),
            holds,
        )
    }

    #[test]
    fn a_ceiling_bound_tenant_runs_whole_bursts() {
        // 30 % ceiling, 200 ms burst: pauses until 200 ms of tokens are
        // saved (667 ms), holds while they last, tokens still accruing
        // (200 / (1 - 0.3) = 286 ms, in whole 20 ms slices): 30 % overall.
        // The first hold starts at once (no saving up first).
        let (pct, holds) = simulate_holds("burst", &[(30, 30, 200)], 60_000);
        let h = &holds[0];
        assert!(h[0].0 <= 1_000_000, "first hold at once: {}", h[0].0);
        assert!((pct[0] - 30.0).abs() < 0.5, "{pct:?}");
        for w in h[1..h.len() - 1].windows(2) {
            let (len, gap) = (w[0].1 - w[0].0, w[1].0 - w[0].1);
            assert!((280_000_000..=300_000_000).contains(&len), "hold {len} ns");
            assert!((620_000_000..=700_000_000).contains(&gap), "pause {gap} ns");
        }
        // A 10 % ceiling with the old one-slice burst (0): 20 ms holds.
        let (pct, holds) = simulate_holds("burst0", &[(10, 10, 0)], 20_000);
        assert!((pct[0] - 10.0).abs() < 0.5, "{pct:?}");
        assert!(
            holds[0][1..].iter().all(|&(a, b)| b - a <= 2 * SLICE),
            "{:?}",
            &holds[0][..4]
        );
    }

    #[test]
    fn a_recharging_tenant_does_not_hold_up_others() {
        // A (50 % share, 50 % ceiling, 200 ms burst) and B (50 %, no
        // ceiling): while A saves up its burst, B has the GPU; the GPU is
        // never idle and A stays at its ceiling.
        let (pct, _) = simulate_holds("recharge", &[(50, 50, 200), (50, 100, 0)], 30_000);
        assert!(pct[0] <= 50.5 && pct[0] >= 45.0, "{pct:?}");
        assert!(pct[0] + pct[1] > 99.5, "{pct:?}");
    }

    #[test]
    fn lone_tenant_without_ceiling_gets_everything() {
        let r = simulate(&[(30, 100)], 2_000);
        assert!(r[0] > 99.0, "{r:?}");
    }

    #[test]
    fn a_returning_tenant_cannot_claim_back_idle_time() {
        let g = seg("return");
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let (ta, _) = g.register_tenant("a", 30, 100, 0, 0).expect("a");
        let (tb, _) = g.register_tenant("b", 70, 100, 0, 0).expect("b");
        let pa = a.claim_proc(ta, 1).expect("pa");
        let pb = b.claim_proc(tb, 2).expect("pb");
        // A runs alone for 10 s.
        a.begin_wait(pa, ta, 0);
        let mut now = 0;
        assert!(matches!(
            a.try_acquire(pa, ta, now, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(pa, ta);
        while now < 10_000_000_000 {
            now += SLICE;
            assert!(!a.decide_release(ta, now, SLICE));
            a.renew(pa, ta, now, SLICE);
        }
        // B arrives: it must get the next slice, and then the split is
        // 30/70 from there on, not B-only until it "catches up".
        b.begin_wait(pb, tb, now);
        assert!(a.decide_release(ta, now, SLICE));
        a.release(pa, ta, now);
        a.begin_wait(pa, ta, now);
        assert!(matches!(
            a.try_acquire(pa, ta, now, SLICE),
            Acquire::Wait { .. }
        ));
        assert!(matches!(
            b.try_acquire(pb, tb, now, SLICE),
            Acquire::Granted { .. }
        ));
        let va = g.tenant(ta).expect("a").vtime.load(Ordering::Relaxed);
        let vb = g.tenant(tb).expect("b").vtime.load(Ordering::Relaxed);
        assert!(vb >= va, "B starts at A's virtual time ({vb} vs {va})");
    }

    #[test]
    fn a_dead_holder_loses_the_lease_at_once() {
        let g = seg("dead");
        let (t, _) = g.register_tenant("t", 50, 100, 0, 0).expect("t");
        let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let pb = b.claim_proc(u, 2).expect("pb");
        {
            let a = GpuSegment::open_or_create(&g.path).expect("a");
            let pa = a.claim_proc(t, 1).expect("pa");
            a.begin_wait(pa, t, 0);
            assert!(matches!(
                a.try_acquire(pa, t, 0, SLICE),
                Acquire::Granted { .. }
            ));
        } // a dies holding the lease
        b.begin_wait(pb, u, 0);
        // Well before the deadline, but the holder is dead: taken over.
        assert!(matches!(
            b.try_acquire(pb, u, 1_000_000, SLICE),
            Acquire::Granted { .. }
        ));
        assert_eq!(
            g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
            1_000_000
        );
    }

    #[test]
    fn a_dead_waiter_of_a_better_tenant_does_not_block() {
        let g = seg("deadwaiter");
        let (t, _) = g.register_tenant("t", 50, 100, 0, 0).expect("t");
        let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let pb = b.claim_proc(u, 2).expect("pb");
        // u has run more: t would win the next slice...
        g.tenant(u)
            .expect("u")
            .vtime
            .store(1_000_000_000, Ordering::Relaxed);
        {
            let a = GpuSegment::open_or_create(&g.path).expect("a");
            let pa = a.claim_proc(t, 1).expect("pa");
            a.begin_wait(pa, t, 0);
        } // ...but its only process dies while waiting.
        b.begin_wait(pb, u, 0);
        let mut now = SWEEP_NS + 1;
        let granted = (0..3).any(|_| {
            now += 1_000_000;
            matches!(b.try_acquire(pb, u, now, SLICE), Acquire::Granted { .. })
        });
        assert!(granted, "a dead waiter must not hold the GPU back");
        assert_eq!(g.tenant(t).expect("t").waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_overstaying_live_holder_loses_it_after_the_grace() {
        let g = seg("overstay");
        let (t, _) = g.register_tenant("t", 50, 100, 0, 0).expect("t");
        let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let pa = a.claim_proc(t, 1).expect("pa");
        let pb = b.claim_proc(u, 2).expect("pb");
        a.begin_wait(pa, t, 0);
        assert!(matches!(
            a.try_acquire(pa, t, 0, SLICE),
            Acquire::Granted { .. }
        ));
        b.begin_wait(pb, u, 0);
        assert!(matches!(
            b.try_acquire(pb, u, SLICE + GRACE_NS, SLICE),
            Acquire::Wait { .. }
        ));
        assert!(matches!(
            b.try_acquire(pb, u, SLICE + GRACE_NS + 1, SLICE),
            Acquire::Granted { .. }
        ));
        // Charged up to its deadline, no more.
        assert_eq!(
            g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
            SLICE
        );
        assert!(
            !a.release(pa, t, SLICE + GRACE_NS + 2),
            "the lease is no longer a's"
        );
    }

    #[test]
    fn share_change_takes_effect() {
        let g = seg("change");
        let (t, old) = g.register_tenant("t", 30, 100, 0, 0).expect("t");
        assert_eq!(old, None);
        let (t2, old) = g.register_tenant("t", 60, 80, 0, 0).expect("t");
        assert_eq!((t2, old), (t, Some((30, 100))));
        assert_eq!(g.tenants()[0].share, 60);
        assert_eq!(g.tenants()[0].max, 80);
        assert_eq!(g.tenants()[0].name, "t");
    }

    // A hostile (or buggy) tenant can write anything into this segment:
    // the values below must neither panic (debug builds check overflow)
    // nor keep the lease from a waiting process once they stop changing.

    /// A segment with tenant "t" (share 50, ceiling `max`) and one live
    /// process of it waiting since 0: (observer, the process's open, t, p).
    fn one_waiter(name: &str, max: u32) -> (Seg, GpuSegment, usize, usize) {
        let g = seg(&format!("hostile-{name}"));
        let (t, _) = g.register_tenant("t", 50, max, 0, 0).expect("t");
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let p = a.claim_proc(t, 1).expect("p");
        a.begin_wait(p, t, 0);
        (g, a, t, p)
    }

    /// When (simulated ns) `p` of `t` gets the lease trying from `from`,
    /// sleeping until each `Wait`'s `until`; None if not within `limit`.
    fn granted_at(a: &GpuSegment, p: usize, t: usize, from: u64, limit: u64) -> Option<u64> {
        let mut now = from;
        for _ in 0..100_000 {
            match a.try_acquire(p, t, now, SLICE) {
                Acquire::Granted { deadline } => {
                    assert!(deadline <= now + SLICE, "deadline {deadline} at {now}");
                    return Some(now);
                }
                Acquire::Wait { until } => now = until.max(now.saturating_add(1)),
            }
            if now > from + limit {
                return None;
            }
        }
        None
    }

    #[test]
    fn a_corrupt_ceiling_bucket_neither_panics_nor_starves() {
        // tokens beyond what a bucket holds (bounds) restart at 0; a ceiling of 0 is the
        // tightest (1 %), not a bucket that never refills. Before: with a
        // ceiling of 0 or 1 % and tokens = i64::MIN, `now + wait` overflowed
        // (a panic in the launch gate); with 50 % the tenant waited 585
        // years.
        for max in [0u32, 1, 50] {
            for tokens in [i64::MIN, i64::MAX, -(bounds::MAX_DEBT_NS as i64) - 1] {
                let (g, a, t, p) = one_waiter(&format!("tokens-{max}-{tokens}"), 50);
                let e = g.tenant(t).expect("t");
                e.max.store(max, Ordering::Relaxed);
                e.tokens.store(tokens, Ordering::Relaxed);
                let at = granted_at(&a, p, t, 1_000_000_000, 1_000_000);
                assert!(
                    at.is_some(),
                    "max {max}, tokens {tokens}: no lease within 1 ms"
                );
                let left = e.tokens.load(Ordering::Relaxed);
                assert!(left.unsigned_abs() <= SLICE, "max {max}: tokens {left}");
            }
        }
        // A debt within the bound is honoured: 100 ms owed at 50 % is a
        // 200 ms wait.
        let (g, a, t, p) = one_waiter("debt", 50);
        g.tenant(t)
            .expect("t")
            .tokens
            .store(-100_000_000, Ordering::Relaxed);
        let at = granted_at(&a, p, t, 0, 1_000_000_000).expect("granted");
        assert!((200_000_000..=201_000_000).contains(&at), "{at}");
    }

    #[test]
    fn a_bucket_clock_or_burst_out_of_range_does_not_starve() {
        // Refill time in the future (u64::MAX): restarted at now. Before,
        // the bucket never refilled again.
        let (g, a, t, p) = one_waiter("tokens-at", 50);
        let e = g.tenant(t).expect("t");
        e.tokens_at.store(u64::MAX, Ordering::Relaxed);
        let at = granted_at(&a, p, t, 1_000_000_000, 10_000_000).expect("granted");
        assert!(at <= 1_001_000_000, "{at}");
        assert!(e.tokens_at.load(Ordering::Relaxed) <= at);
        // Burst beyond MAX_BURST_NS while recharging: counts as one slice
        // (20 ms of tokens at 50 %: 40 ms). Before: it waited for i64::MAX.
        let (g, a, t, p) = one_waiter("burst", 50);
        let e = g.tenant(t).expect("t");
        e.burst_ns.store(u64::MAX, Ordering::Relaxed);
        e.recharging.store(1, Ordering::Relaxed);
        e.tokens_at.store(0, Ordering::Relaxed);
        let at = granted_at(&a, p, t, 0, 1_000_000_000).expect("granted");
        assert!((40_000_000..=41_000_000).contains(&at), "{at}");
        // The largest legitimate burst (10 s) is honoured as it is.
        let (g, a, t, p) = one_waiter("burst-max", 50);
        let e = g.tenant(t).expect("t");
        e.burst_ns.store(MAX_BURST_NS, Ordering::Relaxed);
        e.recharging.store(1, Ordering::Relaxed);
        e.tokens_at.store(0, Ordering::Relaxed);
        let at = granted_at(&a, p, t, 0, 30_000_000_000).expect("granted");
        assert!((20_000_000_000..=20_001_000_000).contains(&at), "{at}");
    }

    #[test]
    fn a_deadline_no_slice_reaches_does_not_keep_the_lease() {
        // The lease names a live process that never launches, with a
        // deadline of u64::MAX. Before: every waiter waited for ever.
        let (g, a, t, p) = one_waiter("deadline", 100);
        let idle = GpuSegment::open_or_create(&g.path).expect("idle");
        let q = idle.claim_proc(t, 2).expect("q");
        let s = g.sched();
        s.lease.store(q as u32 + 1, Ordering::Release);
        s.slice_start.store(0, Ordering::Release);
        s.deadline.store(u64::MAX, Ordering::Release);
        assert_eq!(granted_at(&a, p, t, 5_000_000_000, 0), Some(5_000_000_000));
        // A legitimate deadline (one maximal slice ahead) is respected
        // until it and the grace have passed.
        s.lease.store(q as u32 + 1, Ordering::Release);
        s.deadline
            .store(6_000_000_000 + MAX_SLICE_NS, Ordering::Release);
        let at = granted_at(&a, p, t, 6_000_000_000, 2_000_000_000).expect("granted");
        assert_eq!(at, 6_000_000_000 + MAX_SLICE_NS + GRACE_NS + 1_000_000);
        // A lease naming our own slot with a garbage deadline: granted with
        // a deadline of at most one slice (checked in granted_at).
        s.lease.store(p as u32 + 1, Ordering::Release);
        s.deadline.store(u64::MAX, Ordering::Release);
        assert_eq!(granted_at(&a, p, t, 9_000_000_000, 0), Some(9_000_000_000));
    }

    #[test]
    fn a_live_process_that_does_not_poll_does_not_hold_the_gpu_back() {
        // A live process of tenant u (its lock held) that never launches,
        // whose slot someone marked waiting, with u's virtual time the
        // smallest: t waits for it only while that mark looks fresh.
        let (g, a, t, p) = one_waiter("stale", 100);
        let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let q = b.claim_proc(u, 3).expect("q");
        b.begin_wait(q, u, 1_000_000_000);
        g.tenant(u).expect("u").vtime.store(0, Ordering::Relaxed);
        g.tenant(t)
            .expect("t")
            .vtime
            .store(1 << 40, Ordering::Relaxed);
        assert!(matches!(
            a.try_acquire(p, t, 1_000_000_000, SLICE),
            Acquire::Wait { .. }
        ));
        let later = 1_000_000_000 + WAITER_FRESH_NS + 1;
        assert!(matches!(
            a.try_acquire(p, t, later, SLICE),
            Acquire::Granted { .. }
        ));
    }

    #[test]
    fn a_waiter_whose_entry_names_another_tenant_heals_it() {
        // Someone rewrote our own process entry to name tenant u (ahead of
        // us): polling must not make us u's live waiter, waiting on
        // ourselves for ever.
        let (g, a, t, p) = one_waiter("ownentry", 100);
        let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
        g.tenant(u).expect("u").vtime.store(0, Ordering::Relaxed);
        g.tenant(u).expect("u").waiting.store(1, Ordering::Relaxed);
        g.tenant(t)
            .expect("t")
            .vtime
            .store(1 << 40, Ordering::Relaxed);
        g.proc_entry(p)
            .expect("p")
            .tenant
            .store(u as u32, Ordering::Relaxed);
        assert!(granted_at(&a, p, t, 1_000_000_000, 10_000_000).is_some());
    }

    #[test]
    fn waiting_counts_without_live_waiters_do_not_hold_the_gpu_back() {
        // Every other tenant entry claims waiters and the smallest virtual
        // time; process slots claim to be their live waiters (no process
        // holds their locks); the sweep time is in the future. Before: the
        // real tenant waited for ever.
        let (g, a, t, p) = one_waiter("phantoms", 100);
        let (u, _) = g.register_tenant("u", 50, 100, 0, 0).expect("u");
        g.tenant(t)
            .expect("t")
            .vtime
            .store(u64::MAX, Ordering::Relaxed);
        for i in (0..MAX_TENANTS).filter(|&i| i != t && i != u) {
            let o = g.tenant(i).expect("o");
            o.state.store(READY, Ordering::Release);
            o.name[0].store(i as u64 + 1, Ordering::Relaxed);
            o.waiting.store(u32::MAX, Ordering::Relaxed);
            o.procs.store(u32::MAX, Ordering::Relaxed);
            o.vtime.store(0, Ordering::Relaxed);
            o.max.store(100, Ordering::Relaxed);
        }
        let phantom =
            |k: usize| (k % MAX_TENANTS != t && k % MAX_TENANTS != u).then_some(k % MAX_TENANTS);
        for k in (0..MAX_PROCS).filter(|&k| k != p) {
            let Some(i) = phantom(k) else { continue };
            let e = g.proc_entry(k).expect("proc");
            e.state.store(PROC_LIVE, Ordering::Release);
            e.tenant.store(i as u32, Ordering::Relaxed);
            e.waiting.store(1, Ordering::Relaxed);
        }
        g.sched().swept_at.store(u64::MAX, Ordering::Relaxed);
        assert!(granted_at(&a, p, t, 1_000_000_000, 10_000_000).is_some());
        // A live waiter of a tenant ahead still goes first.
        let s = g.sched();
        s.lease.store(0, Ordering::Release);
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let q = b.claim_proc(u, 3).expect("q");
        g.tenant(u).expect("u").vtime.store(0, Ordering::Relaxed);
        b.begin_wait(q, u, 2_000_000_000);
        assert!(matches!(
            a.try_acquire(p, t, 2_000_000_000, SLICE),
            Acquire::Wait { .. }
        ));
        assert!(matches!(
            b.try_acquire(q, u, 2_000_000_000, SLICE),
            Acquire::Granted { .. }
        ));
    }

    #[test]
    fn a_holder_charged_a_measured_part_of_its_hold_keeps_its_ceiling_longer() {
        // Alone under a ceiling, a launch-bound holder is charged what its
        // kernels ran of its hold (the limiter's measurement, in ppm): a
        // tenth of each slice here, well under its ceiling (its bucket
        // refills at half the wall time); charged whole (a ppm beyond the
        // whole is whole), the same hold spends it.
        let (g, a, t, p) = one_waiter("measured", 30);
        let e = g.tenant(t).expect("t");
        let used = || e.used_ns.load(Ordering::Relaxed);
        let t0 = 5_000_000_000;
        e.tokens.store(SLICE as i64, Ordering::Relaxed);
        e.tokens_at.store(t0, Ordering::Relaxed);
        assert!(matches!(
            a.try_acquire(p, t, t0, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(p, t);
        for k in 1..=10 {
            let now = t0 + k * SLICE;
            assert!(
                !a.decide_release_measured(t, now, SLICE, 100_000),
                "slice {k}"
            );
            assert!(a.renew_measured(p, t, now, SLICE, 100_000).is_some());
        }
        assert_eq!(used(), SLICE);
        // Twenty slices on without a charge: a tenth of them is under the
        // ceiling, all of them is not.
        let now = t0 + 30 * SLICE;
        assert!(!a.decide_release_measured(t, now, SLICE, 100_000));
        assert!(a.decide_release_measured(t, now, SLICE, 2 * WHOLE_PPM));
        assert!(a.release_measured(p, t, now, 2 * WHOLE_PPM));
        assert_eq!(used(), 21 * SLICE);
    }

    #[test]
    fn a_corrupt_slice_start_does_not_inflate_a_charge() {
        // The holder charges itself from when it took the lease, not from
        // the shared slice_start. Before: slice_start = 0 charged it the
        // host's uptime (a debt of hours under a ceiling).
        let (g, a, t, p) = one_waiter("slice-start", 100);
        let e = g.tenant(t).expect("t");
        let s = g.sched();
        let used = || e.used_ns.load(Ordering::Relaxed);
        assert!(matches!(
            a.try_acquire(p, t, 5_000_000_000, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(p, t);
        s.slice_start.store(0, Ordering::Release);
        assert!(!a.decide_release(t, 5_000_000_000 + SLICE / 2, SLICE));
        assert!(a.renew(p, t, 5_000_000_000 + SLICE, SLICE).is_some());
        assert_eq!(used(), SLICE);
        s.slice_start.store(0, Ordering::Release);
        assert!(a.release(p, t, 5_000_000_000 + 2 * SLICE));
        assert_eq!(used(), 2 * SLICE);
        // A lease naming our slot that we never took: released, uncharged.
        s.lease.store(p as u32 + 1, Ordering::Release);
        assert!(a.release(p, t, 6_000_000_000));
        assert_eq!(used(), 2 * SLICE);
        // A waiter taking the lease from an overstaying holder charges it
        // at most one maximal slice.
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let q = b.claim_proc(t, 2).expect("q");
        b.begin_wait(q, t, 7_000_000_000);
        assert!(matches!(
            b.try_acquire(q, t, 7_000_000_000, SLICE),
            Acquire::Granted { .. }
        ));
        s.slice_start.store(0, Ordering::Release);
        a.begin_wait(p, t, 7_000_000_000);
        let at = 7_000_000_000 + SLICE + GRACE_NS + 1;
        assert!(matches!(
            a.try_acquire(p, t, at, SLICE),
            Acquire::Granted { .. }
        ));
        assert_eq!(used(), 2 * SLICE + MAX_SLICE_NS);
    }

    #[test]
    fn tenant_entries_in_a_state_nobody_writes_are_free() {
        let g = seg("hostile-states");
        for i in 0..MAX_TENANTS {
            let t = g.tenant(i).expect("t");
            t.state.store(0xdead_beef ^ i as u32, Ordering::Relaxed);
            t.procs.store(u32::MAX, Ordering::Relaxed);
        }
        // Before: "all 32 tenant entries of this GPU are in use".
        let (t, old) = g.register_tenant("t", 30, 100, 0, 0).expect("registers");
        assert_eq!((t, old), (0, None));
        assert_eq!(g.tenants().len(), 1);
        // Entries that look registered and busy are not taken: a new tenant
        // is refused with one line (cuInit then fails closed).
        for i in 0..MAX_TENANTS {
            let e = g.tenant(i).expect("t");
            e.state.store(READY, Ordering::Relaxed);
            e.name[0].store(i as u64 + 1, Ordering::Relaxed);
            e.procs.store(1, Ordering::Relaxed);
        }
        let err = g.register_tenant("new", 30, 100, 0, 0).expect_err("full");
        assert!(
            err.0
                .ends_with("gpu.seg: all 32 tenant entries of this GPU are in use"),
            "{err}"
        );
    }

    #[test]
    fn garbage_anywhere_never_panics() {
        // Random bytes over the whole body, or every word set to one
        // extreme value, then every operation a process does, at times
        // from 0 to u64::MAX / 2 (debug build: overflow panics).
        let g = seg("hostile-garbage");
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let fills: Vec<Option<u64>> = vec![
            None,
            Some(0),
            Some(u64::MAX),
            Some(1 << 63),
            Some(0x0000_0002_0000_0002),
        ];
        for round in 0..60 {
            let fill = fills[round % fills.len()];
            for w in g.words() {
                w.store(fill.unwrap_or_else(&mut rnd), Ordering::Relaxed);
            }
            let now = [0, 1, GRACE_NS, 1 << 40, u64::MAX / 2][round % 5];
            let name = format!("t{}", round % 3);
            let Ok((t, _)) = a.register_tenant(&name, 50, 60, 200_000_000, now) else {
                continue;
            };
            let p = match a.claim_proc(t, 7) {
                Ok(p) => p,
                Err(e) => panic!("{e}"),
            };
            // Our own entries are garbage too from here on.
            for w in g.words() {
                w.store(fill.unwrap_or_else(&mut rnd), Ordering::Relaxed);
            }
            for k in 0..20u64 {
                let now = now + k * 3_000_000;
                a.begin_wait(p, t, now);
                if let Acquire::Granted { .. } = a.try_acquire(p, t, now, SLICE) {
                    a.end_wait(p, t);
                    if !a.decide_release(t, now + SLICE, SLICE) {
                        a.renew(p, t, now + SLICE, SLICE);
                    }
                    a.release(p, t, now + 2 * SLICE);
                }
                a.add_throttled(t, rnd());
                if k % 7 == 0 {
                    for w in g.words().skip((rnd() % 4000) as usize).take(64) {
                        w.store(rnd(), Ordering::Relaxed);
                    }
                }
            }
            let _ = a.tenants();
            a.reclaim_dead();
            // The free path and the latency class on the same garbage.
            let _ = a.route(t, now, SLICE);
            a.charge_free(t, rnd(), now);
            a.note_busy(t, rnd(), Some(rnd()), now);
            a.latency_stamp(t, rnd());
            a.latency_sync_begin(p, t, now);
            let _ = a.latency_hold(now);
            let _ = a.latency_present();
            a.latency_sync_end(p, t, now + 1);
            a.release_proc(p, now + 100 * SLICE);
        }
    }

    // ---- free launches, demand and the latency class ---------------------

    const MS: u64 = 1_000_000;

    /// A segment with tenant "t" (`share`, `max`, latency or not) and one
    /// live process of it: (observer, the process's open, t, p).
    fn tenant_with(
        name: &str,
        share: u32,
        max: u32,
        latency: bool,
    ) -> (Seg, GpuSegment, usize, usize) {
        let g = seg(&format!("free-{name}"));
        let spec = TenantSpec {
            share,
            max,
            burst_ns: 0,
            latency,
        };
        let (t, _) = g.register("t", 0, spec, 0).expect("t");
        let a = GpuSegment::open_or_create(&g.path).expect("a");
        let p = a.claim_proc(t, 1).expect("p");
        (g, a, t, p)
    }

    /// Another tenant, "other", with a live process waiting for the lease:
    /// `t` is contended (heavy then means the lease). Returns the other's
    /// segment handle, tenant and slot.
    fn contender(g: &Seg) -> (GpuSegment, usize, usize) {
        let (o, _) = g.register_tenant("other", 50, 100, 0, 0).expect("other");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let q = b.claim_proc(o, 2).expect("q");
        b.begin_wait(q, o, 0);
        (b, o, q)
    }

    /// Charges `pct` % of each demand window for `windows` windows from
    /// `from`; returns the time after.
    fn load(a: &GpuSegment, t: usize, pct: u64, from: u64, windows: u64) -> u64 {
        let mut now = from;
        for _ in 0..windows {
            for _ in 0..10 {
                now += DEMAND_WINDOW_NS / 10;
                a.charge_free(t, DEMAND_WINDOW_NS / 10 * pct / 100, now);
            }
        }
        now
    }

    #[test]
    fn a_tenant_under_its_share_launches_freely_and_one_over_it_through_the_lease() {
        let (g, a, t, _) = tenant_with("share", 50, 100, false);
        let _other = contender(&g);
        assert_eq!(
            a.route(t, 0, SLICE),
            Route::Free,
            "a new tenant starts free"
        );
        let now = load(&a, t, 30, 0, 3);
        assert_eq!(a.route(t, now, SLICE), Route::Free, "30 % of a 50 % share");
        assert_eq!(g.tenants()[0].demand_pm, 300);
        let now = load(&a, t, 60, now, 2);
        assert_eq!(
            a.route(t, now, SLICE),
            Route::Lease,
            "60 % is over its share"
        );
        assert!(g.tenants()[0].heavy);
        // Exactly at its share is at its share: heavy (not `>`).
        let (g, a, t, _) = tenant_with("share-edge", 50, 100, false);
        let _other = contender(&g);
        let now = load(&a, t, 50, 0, 2);
        assert_eq!(g.tenants()[0].demand_pm, 500);
        assert_eq!(a.route(t, now, SLICE), Route::Lease, "50 % of a 50 % share");
        let (g, a, t, _) = tenant_with("share-under", 50, 100, false);
        let _other = contender(&g);
        let now = load(&a, t, 49, 0, 2);
        assert_eq!(a.route(t, now, SLICE), Route::Free, "49 % of a 50 % share");
    }

    #[test]
    fn a_heavy_tenant_alone_launches_freely_and_through_the_lease_once_contended() {
        // Arbitrating a GPU nobody else wants only costs the tenant (its
        // queue bounded, its passes charged): alone it launches as without
        // cuslice, heavy or not; a ceiling still needs the lease.
        let (g, a, t, _) = tenant_with("alone", 30, 100, false);
        let now = load(&a, t, 90, 0, 2);
        assert!(g.tenants()[0].heavy, "90 % on a 30 % share");
        assert_eq!(a.route(t, now, SLICE), Route::Free, "alone");
        assert!(a.free_alone(t, now), "long free passes");
        let (b, o, q) = contender(&g);
        assert!(!a.free_alone(t, now));
        assert_eq!(a.route(t, now, SLICE), Route::Lease, "another tenant waits");
        b.end_wait(q, o);
        assert_eq!(a.route(t, now, SLICE), Route::Free, "it stopped waiting");
        // Another tenant that had GPU time in its window contends too.
        b.charge_free(o, MS, now);
        assert_eq!(a.route(t, now + MS, SLICE), Route::Lease);
        // ... until it has been idle for two windows (nothing rolls its
        // window any more).
        let later = now + 3 * DEMAND_WINDOW_NS;
        let now = load(&a, t, 90, later, 1);
        assert_eq!(a.route(t, now, SLICE), Route::Free);
        // With a ceiling, alone: the lease (which waits for tokens).
        let (g, a, t, _) = tenant_with("alone-ceil", 30, 50, false);
        let now = load(&a, t, 90, 0, 2);
        assert!(g.tenants()[0].heavy);
        assert_eq!(a.route(t, now, SLICE), Route::Lease);
        assert!(!a.free_alone(t, now), "a ceiling keeps free passes short");
    }

    #[test]
    fn a_tenant_held_at_its_share_stays_heavy_and_one_well_under_it_is_light_again() {
        let (g, a, t, p) = tenant_with("hyst", 30, 100, false);
        let _other = contender(&g);
        let e = g.tenant(t).expect("t");
        e.heavy.store(1, Ordering::Relaxed);
        // Held at its share by the lease: stays heavy (no flapping).
        let now = load(&a, t, 30, 0, 5);
        assert_eq!(a.route(t, now, SLICE), Route::Lease);
        // Under 80 % of its share but it waited for the lease: still heavy.
        a.begin_wait(p, t, now);
        let now = load(&a, t, 20, now, 1);
        assert_eq!(a.route(t, now, SLICE), Route::Lease);
        a.end_wait(p, t);
        // Under 80 % of its share, not waiting: light.
        let now = load(&a, t, 20, now, 2);
        assert_eq!(a.route(t, now, SLICE), Route::Free);
        // Heavy, then idle for a while: light again at its next launch.
        e.heavy.store(1, Ordering::Relaxed);
        assert_eq!(a.route(t, now + 5 * DEMAND_WINDOW_NS, SLICE), Route::Free);
    }

    #[test]
    fn an_idle_holder_loses_the_lease_to_a_waiter_charged_up_to_when_it_went_idle() {
        let (g, a, t, p) = tenant_with("idle", 50, 100, false);
        let (b, o, q) = contender(&g);
        b.end_wait(q, o);
        a.begin_wait(p, t, 0);
        assert!(matches!(
            a.try_acquire(p, t, 0, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(p, t);
        b.begin_wait(q, o, MS);
        // Busy holder: the waiter waits for its slice.
        assert!(matches!(
            b.try_acquire(q, o, MS, SLICE),
            Acquire::Wait { .. }
        ));
        // It went idle at 2 ms, with a waiter: the waiter is told to come
        // back when the hand-off is due, and takes it then.
        assert!(a.mark_holder_idle(p, 2 * MS), "someone waits");
        match b.try_acquire(q, o, 2 * MS + 10_000, SLICE) {
            Acquire::Wait { until } => assert_eq!(until, 2 * MS + IDLE_HANDOFF_NS),
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            b.try_acquire(q, o, 2 * MS + IDLE_HANDOFF_NS, SLICE),
            Acquire::Granted { .. }
        ));
        // Charged the 2 ms it used, not its slice.
        assert_eq!(
            g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
            2 * MS
        );
        assert!(!a.mark_holder_busy(p, 4 * MS), "it lost the lease");
        // A holder back to work within the hand-off time keeps it, and
        // is not charged the gap.
        b.end_wait(q, o);
        assert!(b.release(q, o, 5 * MS));
        a.begin_wait(p, t, 6 * MS);
        assert!(matches!(
            a.try_acquire(p, t, 6 * MS, SLICE),
            Acquire::Granted { .. }
        ));
        a.end_wait(p, t);
        a.mark_holder_idle(p, 7 * MS);
        assert!(a.mark_holder_busy(p, 7 * MS + IDLE_HANDOFF_NS / 2));
        b.begin_wait(q, o, 8 * MS);
        assert!(matches!(
            b.try_acquire(q, o, 8 * MS + IDLE_HANDOFF_NS, SLICE),
            Acquire::Wait { .. }
        ));
        assert!(a.release(p, t, 10 * MS));
        assert_eq!(
            g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed),
            2 * MS + 4 * MS - IDLE_HANDOFF_NS / 2
        );
    }

    #[test]
    fn a_heavy_tenant_that_idled_holding_the_lease_is_light_again_after_a_window() {
        // A service made heavy once (a long start) waits for the lease at
        // every request, and goes idle holding it. Waiting alone is no
        // evidence it saturates the GPU: under its share, it is light after
        // one window. A tenant that waited and used all it was given is
        // held at its share: it stays heavy.
        let (g, a, t, p) = tenant_with("idled", 50, 100, false);
        let (b, o, q) = contender(&g);
        g.tenant(t).expect("t").heavy.store(1, Ordering::Relaxed);
        let mut now = 0;
        for _ in 0..2 * (DEMAND_WINDOW_NS / (10 * MS)) {
            // A request every 10 ms: waits, holds 1 ms, goes idle, loses it.
            b.end_wait(q, o);
            a.begin_wait(p, t, now);
            assert!(matches!(
                a.try_acquire(p, t, now, SLICE),
                Acquire::Granted { .. }
            ));
            a.end_wait(p, t);
            a.mark_holder_idle(p, now + MS);
            b.begin_wait(q, o, now + MS);
            assert!(matches!(
                b.try_acquire(q, o, now + MS + IDLE_HANDOFF_NS, SLICE),
                Acquire::Granted { .. }
            ));
            b.release(q, o, now + 9 * MS);
            now += 10 * MS;
        }
        assert_eq!(a.route(t, now, SLICE), Route::Free, "light again");
        // The same waits with full use of each slice: stays heavy.
        let (g, a, t, p) = tenant_with("full", 30, 100, false);
        let _other = contender(&g);
        g.tenant(t).expect("t").heavy.store(1, Ordering::Relaxed);
        a.begin_wait(p, t, 0);
        let now = load(&a, t, 20, 0, 1);
        assert_eq!(a.route(t, now, SLICE), Route::Lease, "it waited, used all");
    }

    #[test]
    fn work_in_flight_without_a_break_makes_a_standard_tenant_heavy_at_once() {
        let (g, a, t, _) = tenant_with("busy", 50, 100, false);
        let _other = contender(&g);
        a.note_busy(t, HEAVY_BUSY_NS - 1, None, MS);
        assert_eq!(a.route(t, MS, SLICE), Route::Free);
        a.note_busy(t, HEAVY_BUSY_NS, None, MS);
        assert_eq!(a.route(t, 2 * MS, SLICE), Route::Lease);
        // A latency tenant's long request is no reason to lose its class.
        let (_, b, u, _) = tenant_with("busy-lat", 50, 100, true);
        b.note_busy(u, 10 * HEAVY_BUSY_NS, None, MS);
        assert_eq!(b.route(u, MS, SLICE), Route::Free);
    }

    #[test]
    fn work_in_flight_that_ran_little_on_the_gpu_is_not_saturating() {
        // One competitor: the fair time-slice share is half the stretch, a
        // saturating process runs at least half of that (250 per mille).
        let (g, a, t, _) = tenant_with("decode", 50, 100, false);
        let _other = contender(&g);
        let stretch = 4 * HEAVY_BUSY_NS;
        // A decode loop: in flight all along, its kernels ran 5 %.
        a.note_busy(t, stretch, Some(stretch / 20), MS);
        assert_eq!(a.route(t, MS, SLICE), Route::Free, "launch-bound: light");
        // Just under the bar, then at it.
        a.note_busy(t, stretch, Some(stretch / 4 - 1_000), MS);
        assert_eq!(a.route(t, MS, SLICE), Route::Free);
        a.note_busy(t, stretch, Some(stretch / 4), MS);
        assert_eq!(
            a.route(t, 2 * MS, SLICE),
            Route::Lease,
            "time-sliced saturator"
        );
        // With three competitors the bar is an eighth of the stretch.
        let (h, b, u, _) = tenant_with("decode4", 50, 100, false);
        let _others: Vec<_> = ["o1", "o2", "o3"]
            .iter()
            .map(|n| {
                let (o, _) = h.register_tenant(n, 10, 100, 0, 0).expect("o");
                let c = GpuSegment::open_or_create(&h.path).expect("c");
                let q = c.claim_proc(o, 3).expect("q");
                c.begin_wait(q, o, 0);
                (c, o, q)
            })
            .collect();
        assert_eq!(b.competitors(u, MS), 3);
        assert_eq!(b.competition(u, MS), (3, 0), "three, none heavy");
        b.note_busy(u, stretch, Some(stretch / 8 - 1_000), MS);
        assert_eq!(b.route(u, MS, SLICE), Route::Free);
        b.note_busy(u, stretch, Some(stretch / 8), MS);
        assert_eq!(b.route(u, 2 * MS, SLICE), Route::Lease);
        // Seen by one of the others, once the decode tenant was charged
        // GPU time (it competes): three, one heavy.
        b.charge_free(u, MS, 2 * MS);
        let (c, o, _) = &_others[0];
        assert_eq!(c.competition(*o, 2 * MS), (3, 1));
    }

    #[test]
    fn what_nothing_measured_is_charged_and_counted_apart_per_process() {
        // The charge is the same either way (shares and ceilings count it);
        // the process entry counts the part that is an upper bound, for
        // status to check against NVML, and a new process starts at 0.
        let (g, a, t, p) = tenant_with("bound", 50, 30, false);
        let used = |g: &GpuSegment| g.tenant(t).expect("t").used_ns.load(Ordering::Relaxed);
        let bound =
            |g: &GpuSegment, p: usize| g.proc_entry(p).expect("p").bound_ns.load(Ordering::Relaxed);
        let tokens = || g.tenant(t).expect("t").tokens.load(Ordering::Relaxed);
        let before = tokens();
        a.charge_free(t, 2 * MS, MS);
        a.charge_bound(p, t, 3 * MS, 2 * MS);
        assert_eq!(used(&g), 5 * MS);
        assert_eq!(bound(&g, p), 3 * MS);
        assert_eq!(before - tokens(), 5 * MS as i64, "the ceiling counts both");
        // One charge counts at most a slice's worth, as every free charge.
        a.charge_bound(p, t, 10 * MAX_SLICE_NS, 3 * MS);
        assert_eq!(bound(&g, p), 3 * MS + MAX_SLICE_NS);
        a.release_proc(p, 4 * MS);
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        let q = b.claim_proc(t, 2).expect("q");
        assert_eq!(bound(&g, q), 0);
    }

    #[test]
    fn a_ceiling_applies_to_free_launches() {
        // Standard tenant, 20 % ceiling: free while it has tokens, through
        // the lease (which waits for tokens) without.
        let (g, a, t, _) = tenant_with("ceil", 20, 20, false);
        assert_eq!(
            a.route(t, 0, SLICE),
            Route::Lease,
            "the bucket starts empty"
        );
        assert_eq!(a.route(t, 10 * MS, SLICE), Route::Free);
        a.charge_free(t, 5 * MS, 10 * MS);
        assert_eq!(a.route(t, 10 * MS, SLICE), Route::Lease);
        assert!(g.tenant(t).expect("t").tokens.load(Ordering::Relaxed) < 0);
        // A latency tenant out of tokens is throttled until it has one, not
        // sent to the lease (where it would wait for others' slices).
        let (_, b, u, _) = tenant_with("ceil-lat", 20, 20, true);
        match b.route(u, 0, SLICE) {
            Route::Throttle { until } => assert!((100_000..=MS).contains(&until), "{until}"),
            r => panic!("{r:?}"),
        }
        assert_eq!(b.route(u, 10 * MS, SLICE), Route::Free);
        b.charge_free(u, 5 * MS, 10 * MS);
        match b.route(u, 10 * MS, SLICE) {
            // 2 ms saved by then, 5 ms charged: 3 ms of debt (and one
            // token to earn) at 20 %, 15 ms.
            Route::Throttle { until } => assert_eq!(until, 10 * MS + 15 * MS + 5),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn others_hold_back_while_a_latency_tenant_has_work_in_flight() {
        let (g, a, l, p) = tenant_with("hold", 50, 100, true);
        let (s, _) = g.register_tenant("std", 50, 100, 0, 0).expect("std");
        let b = GpuSegment::open_or_create(&g.path).expect("b");
        b.claim_proc(s, 2).expect("q");
        assert!(b.latency_present());
        assert_eq!(b.latency_hold(MS), None, "nothing in flight yet");
        // A launch: in flight for one linger.
        a.latency_stamp(l, MS + LATENCY_LINGER_NS);
        assert_eq!(b.latency_hold(MS), Some(MS + LATENCY_LINGER_NS));
        assert_eq!(b.latency_hold(MS + LATENCY_LINGER_NS), None);
        // A synchronising call: until it returns (however long, up to the
        // cap), then one linger.
        a.latency_sync_begin(p, l, 2 * MS);
        assert!(b.latency_hold(2 * MS + 5 * MS).is_some());
        let sleeper = g.sched().lat_waiters.fetch_add(1, Ordering::Relaxed);
        assert!(a.latency_sync_end(p, l, 8 * MS), "sleepers are woken");
        g.sched().lat_waiters.store(sleeper, Ordering::Relaxed);
        assert_eq!(b.latency_hold(8 * MS), Some(8 * MS + LATENCY_SYNC_TAIL_NS));
        assert_eq!(b.latency_hold(9 * MS), None);
        // Two threads in calls: the first to return does not end it.
        a.latency_sync_begin(p, l, 10 * MS);
        a.latency_sync_begin(p, l, 10 * MS);
        a.latency_sync_end(p, l, 11 * MS);
        assert!(b.latency_hold(12 * MS).is_some());
        a.latency_sync_end(p, l, 12 * MS);
        assert_eq!(b.latency_hold(13 * MS), None);
        // Never past the cap, even if the call does not return.
        a.latency_sync_begin(p, l, 20 * MS);
        assert!(b.latency_hold(20 * MS + LATENCY_SYNC_CAP_NS - 1).is_some());
        assert_eq!(b.latency_hold(20 * MS + LATENCY_SYNC_CAP_NS), None);
    }

    #[test]
    fn a_latency_tenant_over_its_share_holds_nobody_back() {
        let (g, a, l, _) = tenant_with("over", 20, 100, true);
        let _other = contender(&g);
        let now = load(&a, l, 50, 0, 2);
        assert!(g.tenants()[0].heavy, "50 % of GPU time on a 20 % share");
        assert!(!a.latency_privileged(l));
        assert!(!a.latency_present());
        a.latency_stamp(l, now + LATENCY_LINGER_NS);
        assert_eq!(a.latency_hold(now), None);
        assert_eq!(a.route(l, now, SLICE), Route::Lease);
    }

    #[test]
    fn a_latency_process_that_dies_in_a_synchronising_call_holds_nobody_back() {
        let (g, _live, l, _) = tenant_with("died", 50, 100, true);
        {
            let d = GpuSegment::open_or_create(&g.path).expect("d");
            let q = d.claim_proc(l, 9).expect("q");
            d.latency_sync_begin(q, l, MS);
        } // dies inside the call (its slot lock goes with its descriptor)
        let obs = GpuSegment::open_or_create(&g.path).expect("obs");
        assert!(obs.latency_hold(2 * MS).is_some(), "in flight until swept");
        assert_eq!(obs.reclaim_dead(), 1);
        assert_eq!(g.tenant(l).expect("l").in_sync.load(Ordering::Relaxed), 0);
        // Its stamp (the call's cap) still lies ahead, but nothing renews
        // it and the live process of the tenant is not in a call: the
        // tenant's next call ends it.
        assert!(obs.latency_present(), "the tenant's other process lives");
        assert!(obs.latency_hold(3 * MS).is_some());
        assert_eq!(
            obs.latency_hold(MS + LATENCY_SYNC_CAP_NS),
            None,
            "bounded by the cap"
        );
        drop(_live);
        obs.reclaim_dead();
        assert!(!obs.latency_present(), "no live latency process");
        assert_eq!(obs.latency_hold(3 * MS), None);
    }

    #[test]
    fn latency_values_nobody_writes_hold_nobody_back() {
        let (g, a, l, _) = tenant_with("corrupt", 50, 100, true);
        let s = g.sched();
        // A stamp or a hint an hour ahead: no call sets that.
        g.tenant(l)
            .expect("l")
            .active_until
            .store(u64::MAX, Ordering::Relaxed);
        s.lat_until.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(a.latency_hold(MS), None);
        assert_eq!(
            s.lat_until.load(Ordering::Relaxed),
            0,
            "the stale hint is cleared"
        );
        // A class no cuslice writes is a standard tenant.
        g.tenant(l).expect("l").class.store(7, Ordering::Relaxed);
        assert!(!a.latency_present());
        // A demand window starting in the future restarts.
        let e = g.tenant(l).expect("l");
        e.win_start.store(u64::MAX, Ordering::Relaxed);
        e.win_used.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(a.route(l, MS, SLICE), Route::Free);
        assert_eq!(e.win_start.load(Ordering::Relaxed), MS);
        let now = load(&a, l, 10, MS, 2);
        assert_eq!(a.route(l, now, SLICE), Route::Free);
    }
}
