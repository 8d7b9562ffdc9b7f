//! The stream-ordered memory pools this process allocates from: their
//! entries, and their reservations moved to the quota.

use std::sync::atomic::Ordering;

use cuslice_core::segment::Admit;

use super::{Pool, Quota};
use crate::generated::real;
use crate::sys::CUresult;

impl Quota {
    /// The pool entry for `handle` (created on first use). None if more
    /// than MAX_POOLS pools are in use.
    pub fn pool(&self, handle: u64, ordinal: usize) -> Option<&Pool> {
        if handle == 0 {
            return None;
        }
        for p in &self.pools {
            let h = p.handle.load(Ordering::Acquire);
            if h == handle {
                return Some(p);
            }
            if h == 0 {
                p.ordinal.store(ordinal as u32, Ordering::Relaxed);
                match p
                    .handle
                    .compare_exchange(0, handle, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return Some(p),
                    Err(other) if other == handle => return Some(p),
                    Err(_) => continue,
                }
            }
        }
        None
    }

    /// Index of a pool entry (stored in allocation records).
    pub fn pool_index(&self, p: &Pool) -> usize {
        (p as *const Pool as usize - self.pools.as_ptr() as usize) / std::mem::size_of::<Pool>()
    }

    /// Re-reads the pool's reservation from the driver and moves the quota
    /// charge to it. Err if the pool grew past the quota.
    pub fn sync_pool(&self, p: &Pool) -> Result<(), CUresult> {
        let _g = self.pool_sync.lock().unwrap_or_else(|e| e.into_inner());
        let handle = p.handle.load(Ordering::Acquire);
        if handle == 0 {
            return Ok(());
        }
        let mut reserved: u64 = 0;
        // SAFETY: real driver call; the attribute is a cuuint64_t.
        let r = unsafe {
            real::cuMemPoolGetAttribute(
                handle as crate::sys::CUmemoryPool,
                crate::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        };
        if r != CUresult::CUDA_SUCCESS {
            return Ok(()); // keep the current charge (conservative)
        }
        let ordinal = p.ordinal.load(Ordering::Relaxed) as usize;
        let charged = p.charged.load(Ordering::Acquire);
        if reserved > charged {
            // Not self.admit: its retry path syncs pools, i.e. this lock.
            let dev = self.devs.get(ordinal).map(|d| d.seg).unwrap_or(usize::MAX);
            if let Admit::Refused { .. } = self.seg.admit(dev, self.slot, reserved - charged) {
                return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            }
        } else {
            self.credit(ordinal, charged - reserved);
        }
        p.charged.store(reserved, Ordering::Release);
        Ok(())
    }

    pub(super) fn sync_all_pools(&self) {
        for p in &self.pools {
            if p.handle.load(Ordering::Acquire) != 0 {
                let _ = self.sync_pool(p);
            }
        }
    }
}
