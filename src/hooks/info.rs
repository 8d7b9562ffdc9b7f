//! "How much memory is there": answered with the quota, so frameworks size
//! their pools to it. Saturating arithmetic; never an error the real call
//! would not return; with no quota for the device, the real values.

#![allow(non_snake_case)]

use std::ffi::c_uint;

use crate::quota;
use crate::sys::*;

const OK: CUresult = CUresult::CUDA_SUCCESS;

/// (total, free) to report for the current device, given the real free.
fn spoof_current(real_free: u64) -> Option<(u64, u64)> {
    let q = quota::get()?;
    let d = q.current()?;
    let (limit, used) = q.usage(d)?;
    // With a guarantee below the limit: what the pool can really give.
    let free = limit
        .saturating_sub(used)
        .min(q.headroom(d).unwrap_or(u64::MAX));
    Some((limit, free.min(real_free)))
}

pub unsafe fn cuMemGetInfo_v2(r: CUresult, free: *mut usize, total: *mut usize) -> CUresult {
    if r == OK && !free.is_null() && !total.is_null() {
        // SAFETY: the real call succeeded and wrote both.
        if let Some((t, f)) = spoof_current(unsafe { *free } as u64) {
            // SAFETY: the same two pointers, which the driver just wrote.
            unsafe {
                *total = t as usize;
                *free = f as usize;
            }
        }
    }
    r
}

pub unsafe fn cuMemGetInfo(r: CUresult, free: *mut c_uint, total: *mut c_uint) -> CUresult {
    if r == OK && !free.is_null() && !total.is_null() {
        // SAFETY: as above; the legacy entry point reports 32-bit values.
        if let Some((t, f)) = spoof_current(unsafe { *free } as u64) {
            // SAFETY: the same two pointers, which the driver just wrote.
            unsafe {
                *total = t.min(c_uint::MAX as u64) as c_uint;
                *free = f.min(c_uint::MAX as u64) as c_uint;
            }
        }
    }
    r
}

fn spoof_total(dev: CUdevice, real_total: u64) -> Option<u64> {
    let q = quota::get()?;
    let (limit, _) = q.usage(usize::try_from(dev).ok()?)?;
    Some(limit.min(real_total))
}

pub unsafe fn cuDeviceTotalMem_v2(r: CUresult, bytes: *mut usize, dev: CUdevice) -> CUresult {
    if r == OK && !bytes.is_null() {
        // SAFETY: the real call succeeded and wrote it.
        if let Some(t) = spoof_total(dev, unsafe { *bytes } as u64) {
            // SAFETY: the same pointer, which the driver just wrote.
            unsafe { *bytes = t as usize };
        }
    }
    r
}

pub unsafe fn cuDeviceTotalMem(r: CUresult, bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    if r == OK && !bytes.is_null() {
        // SAFETY: the real call succeeded and wrote it.
        if let Some(t) = spoof_total(dev, unsafe { *bytes } as u64) {
            // SAFETY: the same pointer, which the driver just wrote.
            unsafe { *bytes = t.min(c_uint::MAX as u64) as c_uint };
        }
    }
    r
}
