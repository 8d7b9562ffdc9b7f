//! `cuGetProcAddress` / `cuGetProcAddress_v2`: the third way a program
//! reaches the driver (cudart >= 11.3, PyTorch, JAX, CuPy).
//!
//! The real driver answers first, so it alone interprets `cudaVersion` and
//! the per-thread-default-stream `flags` and picks the right `_v2` / `_v3` /
//! `_ptsz` entry. If the pointer it returns is the real address of a
//! function cuslice hooks, the caller gets the hook instead (pointer
//! identity; no version tables to keep in sync with NVIDIA's).

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use crate::generated::real;
use crate::real::{Lib, map_to_hook};
use crate::sys::{CUdriverProcAddressQueryResult, CUresult, cuuint64_t};

unsafe fn map_out(r: CUresult, pfn: *mut *mut c_void) -> CUresult {
    if r == CUresult::CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: the driver succeeded, so pfn is a valid out pointer it
        // just wrote.
        unsafe { *pfn = map_to_hook(*pfn, Lib::Cuda) };
    }
    r
}

pub unsafe fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe {
        map_out(
            real::cuGetProcAddress(symbol, pfn, cuda_version, flags),
            pfn,
        )
    }
}

pub unsafe fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe {
        map_out(
            real::cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status),
            pfn,
        )
    }
}
