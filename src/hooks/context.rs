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

/// Creating or retaining a context on `dev`: the context's own device
/// memory is charged once per device per process *before* the driver makes
/// it (so a process never holds an uncharged context, not even for the
/// duration of the call), and given back if the driver fails.
fn charged(dev: CUdevice, create: impl FnOnce() -> CUresult) -> CUresult {
    let Some(q) = quota::get() else {
        return if quota::failed() {
            CUresult::CUDA_ERROR_NOT_PERMITTED
        } else {
            create()
        };
    };
    let Ok(d) = usize::try_from(dev) else {
        return create();
    };
    let fresh = match q.charge_context(d) {
        Ok(fresh) => fresh,
        Err(e) => return e,
    };
    let r = create();
    if r != OK && fresh {
        q.uncharge_context(d);
    }
    r
}

pub unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    charged(dev, || unsafe { real::cuDevicePrimaryCtxRetain(pctx, dev) })
}

pub unsafe fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    charged(dev, || unsafe { real::cuCtxCreate(pctx, flags, dev) })
}

pub unsafe fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    charged(dev, || unsafe { real::cuCtxCreate_v2(pctx, flags, dev) })
}

pub unsafe fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    charged(dev, || unsafe {
        real::cuCtxCreate_v3(pctx, params, n, flags, dev)
    })
}

pub unsafe fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    charged(dev, || unsafe {
        real::cuCtxCreate_v4(pctx, params, flags, dev)
    })
}
