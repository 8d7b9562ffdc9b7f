//! NVML memory information: the quota as the device's size, for the GPUs
//! this process's CUDA initialisation registered. NVML names devices by
//! handle; we match them to quotas by UUID.

#![allow(non_snake_case)]

use std::ffi::c_char;

use crate::generated::real;
use crate::quota;
use crate::sys::*;

const OK: nvmlReturn_t = nvmlReturn_t::NVML_SUCCESS;

/// (limit, used) for an NVML device, if it has a quota here.
fn usage(device: nvmlDevice_t) -> Option<(u64, u64, u64)> {
    let q = quota::get()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: real NVML call with a buffer of the stated length.
    let r = unsafe { real::nvmlDeviceGetUUID(device, buf.as_mut_ptr(), buf.len() as u32) };
    if r != OK {
        return None;
    }
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let uuid = cuslice_core::config::parse_uuid(std::str::from_utf8(&bytes).ok()?).ok()?;
    let d = q.ordinal_of_uuid(&uuid)?;
    let (limit, used) = q.usage(d)?;
    Some((limit, used, q.headroom(d).unwrap_or(u64::MAX)))
}

/// Total = the quota (never more than the real total), used = the
/// container's usage, free = the rest; `reserved` (v2) is driver memory
/// outside the quota, reported as 0. With a guarantee below the quota
/// (`memory_max`), free is at most what the GPU's pool can really give.
/// Returns whether the device has a quota.
fn spoof(device: nvmlDevice_t, total: &mut u64, used: &mut u64, free: &mut u64) -> bool {
    let Some((limit, u, headroom)) = usage(device) else {
        return false;
    };
    *total = limit.min(*total);
    *used = u.min(*total);
    *free = (*total - *used).min(headroom);
    true
}

pub unsafe fn nvmlDeviceGetMemoryInfo(
    r: nvmlReturn_t,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    if r == OK && !memory.is_null() {
        // SAFETY: the real call succeeded and filled the struct.
        let m = unsafe { &mut *memory };
        spoof(device, &mut m.total, &mut m.used, &mut m.free);
    }
    r
}

pub unsafe fn nvmlDeviceGetMemoryInfo_v2(
    r: nvmlReturn_t,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    if r == OK && !memory.is_null() {
        // SAFETY: the real call succeeded and filled the struct.
        let m = unsafe { &mut *memory };
        if spoof(device, &mut m.total, &mut m.used, &mut m.free) {
            m.reserved = 0;
        }
    }
    r
}
