//! Admission on the allocation path: what an allocation is charged, the
//! admission itself (with its slow path and the refusal's message), the
//! context overhead, and the `Admission` guard that gives a charge back
//! unless it is committed.

use std::sync::atomic::Ordering;

use cuslice_core::config::format_uuid;
use cuslice_core::segment::{Admit, UNLIMITED};

use super::setup::FALLBACK_PAGE;
use super::{Dev, Quota, Short};
use crate::generated::real;
use crate::sys::{CUdevice, CUresult};

impl Quota {
    /// The device of the calling thread's current context.
    #[inline]
    pub fn current(&self) -> Option<usize> {
        let mut d: CUdevice = 0;
        // SAFETY: real driver call with a valid out pointer.
        let r = unsafe { real::cuCtxGetDevice(&mut d) };
        if r != CUresult::CUDA_SUCCESS || d < 0 || d as usize >= self.devs.len() {
            return None;
        }
        Some(d as usize)
    }

    /// Admits `bytes` on device `ordinal`, or returns the status to fail the
    /// allocation with (after one retry that reclaims dead processes' usage
    /// and re-reads pool reservations, and, with `memory_wait`, after
    /// waiting for memory to be freed).
    pub fn admit(&self, ordinal: usize, bytes: u64) -> Result<(), CUresult> {
        let Some(dev) = self.devs.get(ordinal) else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        if let Admit::Granted = self.seg.admit(dev.seg, self.slot, bytes) {
            return Ok(());
        }
        // Slow path: maybe others died, or pools released memory, or the
        // GPU's pool has room for a burst.
        self.seg.reclaim_dead();
        self.sync_all_pools();
        let why = match self.try_admit(dev, bytes) {
            Ok(()) => return Ok(()),
            Err(w) => w,
        };
        let why = match self.wait(ordinal, bytes, why, || self.try_admit(dev, bytes)) {
            Ok(()) => return Ok(()),
            Err(w) => w,
        };
        if !self.refusal_logged.swap(true, Ordering::Relaxed) {
            match why {
                Short::Pool { short, room } => crate::error!(
                    "out of memory on GPU {ordinal} ({}): asked for {bytes} bytes past this container's guarantee, {short} more than it holds of the memory no tenant is guaranteed, which has {room} bytes free (further refusals are not logged)",
                    format_uuid(&dev.uuid)
                ),
                Short::Lent { pending } => {
                    // The error path only: who borrows it, from the pool.
                    let borrowers = dev
                        .pool
                        .map(|(p, _)| {
                            p.borrowers()
                                .iter()
                                .map(|(n, b)| format!("{n} {b}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default();
                    crate::error!(
                        "out of memory on GPU {ordinal} ({}): asked for {bytes} bytes within this container's guarantee, {pending} bytes of which are still lent out to tenants that burst before it arrived ({}); they come back as those free (set memory_wait to wait for them; further refusals are not logged)",
                        format_uuid(&dev.uuid),
                        if borrowers.is_empty() {
                            "none bursts now".to_string()
                        } else {
                            format!("borrowers, bytes: {borrowers}")
                        }
                    )
                }
                Short::Quota { used, limit } => crate::error!(
                    "out of memory under the quota on GPU {ordinal} ({}): asked for {bytes} bytes with {used} of {limit} bytes in use by this container (further refusals are not logged)",
                    format_uuid(&dev.uuid)
                ),
                Short::Driver => {}
            }
        }
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Admission in the segment, reserving from the GPU's pool what a
    /// burst past the guarantee needs.
    fn try_admit(&self, dev: &Dev, bytes: u64) -> Result<(), Short> {
        match self.seg.admit_or_burst(dev.seg, self.slot, bytes) {
            (Admit::Granted, _) => Ok(()),
            (Admit::Refused { used, limit }, _) => Err(Short::Quota { used, limit }),
            (Admit::Burst { short }, room) => {
                let pending = self
                    .seg
                    .pool_link(dev.seg)
                    .map_or(0, |l| l.pool.pending(l.entry));
                if pending > 0 {
                    Err(Short::Lent { pending })
                } else {
                    Err(Short::Pool { short, room })
                }
            }
        }
    }

    /// What the driver takes for a linear allocation (`cuMemAlloc*`,
    /// `cuMemAllocManaged`, `cuMemAllocPitch*`) of `size` bytes on device
    /// `ordinal`: whole pages from one page up. A smaller one is
    /// sub-allocated from a page the driver shares between small
    /// allocations, and charged as asked.
    pub fn linear_charge(&self, ordinal: usize, size: u64) -> u64 {
        let page = self.devs.get(ordinal).map_or(FALLBACK_PAGE, |d| d.page);
        if size < page {
            return size;
        }
        size.div_ceil(page).saturating_mul(page)
    }

    /// The page of device `ordinal` (see [`Dev::page`]).
    pub fn page(&self, ordinal: usize) -> u64 {
        self.devs.get(ordinal).map_or(FALLBACK_PAGE, |d| d.page)
    }

    /// Admits `bytes` on device `ordinal` as an [`Admission`]: the charge
    /// is given back when it is dropped, unless committed first.
    pub fn reserve(&self, ordinal: usize, bytes: u64) -> Result<Admission<'_>, CUresult> {
        self.admit(ordinal, bytes)?;
        Ok(Admission {
            q: self,
            ordinal,
            bytes,
        })
    }

    pub fn credit(&self, ordinal: usize, bytes: u64) {
        if let Some(dev) = self.devs.get(ordinal)
            && bytes > 0
        {
            self.seg.credit(dev.seg, self.slot, bytes);
        }
    }

    /// (limit, used by the container) of device `ordinal`, if it has a quota.
    /// The limit is the segment's, as admission reads it: a quota resized
    /// while this process runs (`cuslice resize`) shows at the next call.
    pub fn usage(&self, ordinal: usize) -> Option<(u64, u64)> {
        let dev = self.devs.get(ordinal)?;
        if dev.limit == UNLIMITED {
            return None;
        }
        let u = self.seg.device_usage(dev.seg)?;
        (u.limit != UNLIMITED).then_some((u.limit, u.used))
    }

    /// Quota by UUID (NVML identifies devices by UUID, not CUDA ordinal).
    pub fn ordinal_of_uuid(&self, uuid: &[u8; 16]) -> Option<usize> {
        self.devs.iter().position(|d| &d.uuid == uuid)
    }

    /// Charges the context overhead the first time this process creates or
    /// retains a context on `ordinal`, before the driver makes it. Ok(true):
    /// this call charged it (give it back with `uncharge_context` if the
    /// driver then fails). Refused: the context must not be created.
    pub fn charge_context(&self, ordinal: usize) -> Result<bool, CUresult> {
        let Some(dev) = self.devs.get(ordinal) else {
            return Ok(false);
        };
        if dev.ctx_charged.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        let r = self.admit(ordinal, self.ctx_overhead);
        if r.is_err() {
            dev.ctx_charged.store(false, Ordering::Release);
        }
        r.map(|()| true)
    }

    /// Undoes a `charge_context` that returned Ok(true).
    pub fn uncharge_context(&self, ordinal: usize) {
        if let Some(dev) = self.devs.get(ordinal)
            && dev.ctx_charged.swap(false, Ordering::AcqRel)
        {
            self.credit(ordinal, self.ctx_overhead);
        }
    }
}

/// Memory admitted under the quota that nothing owns yet. An allocation
/// reserves before its driver call and commits once what the driver
/// returned is recorded, so that its free credits the charge; every other
/// way out (the driver failed, the record could not be made, a panic)
/// drops the admission, which gives the charge back. Being a guard, no
/// failure path can forget to.
#[must_use = "dropping an admission gives its charge back"]
pub struct Admission<'q> {
    q: &'q Quota,
    ordinal: usize,
    bytes: u64,
}

impl Admission<'_> {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Moves the charge to `bytes` (what the driver really allocated):
    /// admits the difference or gives the excess back. Refused: the
    /// admission keeps what it had (dropping it gives that back).
    pub fn settle(&mut self, bytes: u64) -> Result<(), CUresult> {
        if bytes > self.bytes {
            self.q.admit(self.ordinal, bytes - self.bytes)?;
        } else {
            self.q.credit(self.ordinal, self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// The charge now belongs to a record (or a pool) whose release
    /// credits it.
    pub fn commit(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.q.credit(self.ordinal, self.bytes);
    }
}
