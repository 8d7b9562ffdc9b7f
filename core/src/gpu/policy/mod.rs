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
//! (`yield_to_tenant_ahead`), the grant (`grant`). At a slice end the
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
//!   ahead, other tenants launch nothing new ([`GpuSegment::take_latency_hold`]), and while a latency tenant is live
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
//!
//! Files, by concern (named as the shim's `src/compute/` names its own
//! where the concern is the same):
//! - `lease`: waiting for the lease and taking it (`try_acquire` in its
//!   steps; a holder judged by [`judge_holder`]), and the holder's side:
//!   drain and release or renew at a slice end
//!   ([`GpuSegment::decide_release`]), going idle and busy again;
//! - `ceiling`: the ceiling's token bucket (its refill, the burst a tenant
//!   saves up, admission by it: [`ceiling_wait`]);
//! - `demand`: heavy or light ([`heavy_after`]) from a closed demand
//!   window or a busy stretch;
//! - `routing`: how a process that does not hold the lease launches
//!   ([`GpuSegment::route`]), and who else competes for the GPU;
//! - `latency`: the latency class (its privilege budget, its stamps of
//!   work in flight, others holding back);
//! - `charge`: what a tenant is charged (under the lease, freely) and what
//!   every charge touches.

mod ceiling;
mod charge;
mod demand;
mod latency;
mod lease;
mod routing;
#[cfg(test)]
mod tests;

pub use ceiling::*;
pub use charge::*;
pub use demand::*;
pub use latency::*;
pub use lease::*;
pub use routing::*;

use std::sync::atomic::Ordering;

use super::layout::*;

fn is_latency(t: &Tenant) -> bool {
    t.class.load(Ordering::Relaxed) == CLASS_LATENCY
}

fn is_heavy(t: &Tenant) -> bool {
    t.heavy.load(Ordering::Relaxed) != 0
}
