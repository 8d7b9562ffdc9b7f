//! Synchronising calls: the caller waits for its work on the GPU. Around
//! them the compute share learns when that work is in flight (see
//! `compute::synchronized`); the call itself is the driver's.

#![allow(non_snake_case)]

use crate::compute::synchronized;
use crate::generated::real;
use crate::sys::*;

pub unsafe fn cuCtxSynchronize() -> CUresult {
    // SAFETY: the caller's call, unchanged.
    synchronized(|| unsafe { real::cuCtxSynchronize() })
}

pub unsafe fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    // SAFETY: the caller's call, unchanged.
    synchronized(|| unsafe { real::cuCtxSynchronize_v2(ctx) })
}

pub unsafe fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    // SAFETY: the caller's call, unchanged.
    synchronized(|| unsafe { real::cuStreamSynchronize(stream) })
}

pub unsafe fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    // SAFETY: the caller's call, unchanged.
    synchronized(|| unsafe { real::cuStreamSynchronize_ptsz(stream) })
}

pub unsafe fn cuEventSynchronize(event: CUevent) -> CUresult {
    // SAFETY: the caller's call, unchanged.
    synchronized(|| unsafe { real::cuEventSynchronize(event) })
}
