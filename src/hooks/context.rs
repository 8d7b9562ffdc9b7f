//! Driver initialisation and contexts.

#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::generated::{id, real};
use crate::quota;
use crate::sys::*;

const OK: CUresult = CUresult::CUDA_SUCCESS;

static REPORTED: AtomicBool = AtomicBool::new(false);

/// `cuInit`: the real driver first, then the quota (configuration, devices,
/// the container's segment). A bad configuration fails cuInit: never a
/// silently unlimited GPU.
pub unsafe fn cuInit(flags: c_uint) -> CUresult {
    // SAFETY: forwarding the caller's argument.
    let r = unsafe { real::cuInit(flags) };
    if r != OK {
        return r;
    }
    report_driver();
    match quota::init() {
        Ok(()) => OK,
        Err(e) => e,
    }
}

/// Says once (at info level) which driver cuslice forwards to.
fn report_driver() {
    if REPORTED.swap(true, Ordering::Relaxed) || !crate::log::enabled(crate::log::Level::Info) {
        return;
    }
    if let Some(p) = crate::real::get(id::cuInit) {
        let mut ver = 0i32;
        // SAFETY: real call with a valid out pointer.
        let r = unsafe { real::cuDriverGetVersion(&mut ver) };
        let path = crate::real::object_path(p).unwrap_or_else(|| "?".into());
        if r == OK {
            crate::info!(
                "forwarding to {path} (CUDA driver {}.{})",
                ver / 1000,
                (ver % 1000) / 10
            );
        } else {
            crate::info!("forwarding to {path}");
        }
    }
}

/// After a context is created or retained on `dev`: charge the context's
/// own device memory once per device per process. If that does not fit in
/// the quota, the context is given back and the call fails.
fn charge(r: CUresult, dev: CUdevice, undo: impl FnOnce()) -> CUresult {
    if r != OK {
        return r;
    }
    let Some(q) = quota::get() else {
        return if quota::failed() {
            CUresult::CUDA_ERROR_NOT_PERMITTED
        } else {
            r
        };
    };
    let Ok(d) = usize::try_from(dev) else {
        return r;
    };
    match q.charge_context(d) {
        Ok(()) => r,
        Err(e) => {
            undo();
            e
        }
    }
}

pub unsafe fn cuDevicePrimaryCtxRetain(
    r: CUresult,
    _pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    charge(r, dev, || unsafe {
        real::cuDevicePrimaryCtxRelease_v2(dev);
    })
}

fn destroy(pctx: *mut CUcontext) -> impl FnOnce() {
    move || unsafe {
        // SAFETY: the driver just created *pctx.
        real::cuCtxDestroy_v2(*pctx);
    }
}

pub unsafe fn cuCtxCreate(
    r: CUresult,
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    charge(r, dev, destroy(pctx))
}

pub unsafe fn cuCtxCreate_v2(
    r: CUresult,
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    charge(r, dev, destroy(pctx))
}

pub unsafe fn cuCtxCreate_v3(
    r: CUresult,
    pctx: *mut CUcontext,
    _params: *mut CUexecAffinityParam,
    _n: c_int,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    charge(r, dev, destroy(pctx))
}

pub unsafe fn cuCtxCreate_v4(
    r: CUresult,
    pctx: *mut CUcontext,
    _params: *mut CUctxCreateParams,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    charge(r, dev, destroy(pctx))
}
