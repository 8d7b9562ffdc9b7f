//! Heavy or light: the one rule ([`heavy_after`]) and the evidence it
//! judges, a closed demand window (`roll_demand`, rolled by the tenant's
//! charges) or a busy stretch of one of its processes (`note_busy`).

use super::*;
use crate::gpu::bounds;

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

/// `win_waited` bits: a process of the tenant waited for the lease in this
/// window; one of them lost the lease for being idle in it (it did not use
/// all the GPU time it was given: no evidence it saturates the GPU).
pub(super) const WAITED: u32 = 1;
pub(super) const IDLED: u32 = 2;

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

impl GpuSegment {
    /// Rolls tenant `t`'s demand window if it is over, and judges from it
    /// whether the tenant is heavy ([`heavy_after`]).
    pub(super) fn roll_demand(&self, t: &Tenant, now: u64) {
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
}
