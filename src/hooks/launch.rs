//! Every way of putting work on the GPU goes through the compute share's
//! gate first (a pre-step: the launch itself is the driver's).

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};

use crate::compute::gate;
use crate::sys::*;

pub unsafe fn cuLaunchKernel(
    _f: CUfunction,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> Result<(), CUresult> {
    gate(stream)
}

pub unsafe fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
}

fn config_stream(config: *const CUlaunchConfig) -> CUstream {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null launch config from the caller.
    unsafe { (*config).hStream }
}

pub unsafe fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    _f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> Result<(), CUresult> {
    gate(config_stream(config))
}

pub unsafe fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { cuLaunchKernelEx(config, f, params, extra) }
}

pub unsafe fn cuLaunchCooperativeKernel(
    _f: CUfunction,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
) -> Result<(), CUresult> {
    gate(stream)
}

pub unsafe fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
}

pub unsafe fn cuGraphLaunch(_exec: CUgraphExec, stream: CUstream) -> Result<(), CUresult> {
    // Before the gate: the meter never detaches CUPTI from a program
    // replaying graphs (`gputime::GRAPHS`).
    crate::gputime::note_graph_launch();
    gate(stream)
}

pub unsafe fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { cuGraphLaunch(exec, stream) }
}
