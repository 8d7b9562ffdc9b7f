//! Driver initialisation and contexts.

#![allow(non_snake_case)]

use std::sync::atomic::{AtomicBool, Ordering};

use crate::generated::{id, real};
use crate::sys::CUresult;

static REPORTED: AtomicBool = AtomicBool::new(false);

/// `cuInit` pre-step: make sure the real driver is there and say which one
/// cuslice forwards to (once per process, at info level).
pub unsafe fn cuInit(_flags: u32) -> Result<(), CUresult> {
    if !REPORTED.swap(true, Ordering::Relaxed) && crate::log::enabled(crate::log::Level::Info) {
        // When the driver is missing, real::get has already said why.
        if let Some(p) = crate::real::get(id::cuInit) {
            let mut ver = 0i32;
            // SAFETY: real cuDriverGetVersion with a valid out pointer;
            // it needs no prior cuInit.
            let r = unsafe { real::cuDriverGetVersion(&mut ver) };
            let path = crate::real::object_path(p).unwrap_or_else(|| "?".into());
            if r == CUresult::CUDA_SUCCESS {
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
    Ok(())
}
