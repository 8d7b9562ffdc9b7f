//! Device memory allocation families under the quota.
//!
//! Every allocation is admitted before the driver call (an
//! [`Admission`]: reserved in the container's segment, atomically against
//! the quota) and what was charged is remembered per pointer / handle /
//! array so that the free credits exactly that. The admission is committed
//! only once that record exists; on every other way out (the driver
//! failed, the table is full) it is dropped and gives the charge back, so
//! each family below is an adapter: reserve, call, `keep`. Memory allocated
//! before the shim was initialised, or on a path we do not see, is not in
//! the tables and its free passes through without a credit.

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_ulonglong};
use std::sync::atomic::Ordering;

use crate::generated::real;
use crate::quota::{self, Admission, Quota, meta};
use crate::sys::*;
use crate::table::Table;

const OK: CUresult = CUresult::CUDA_SUCCESS;

/// The quota and the current device, or None to pass straight through.
/// After a failed initialisation every allocation is refused.
#[inline]
fn policed() -> Result<Option<(&'static Quota, usize)>, CUresult> {
    match quota::get() {
        Some(q) => Ok(q.current().map(|d| (q, d))),
        None if quota::failed() => Err(CUresult::CUDA_ERROR_NOT_PERMITTED),
        None => Ok(None),
    }
}

/// Admit what the driver takes for a linear allocation of `size` (whole
/// pages from one page up), run `call`, record the new pointer (read by
/// `ptr` after success) or give the charge back.
#[inline]
fn alloc_ptr(size: u64, mut call: impl FnMut() -> CUresult, ptr: impl FnOnce() -> u64) -> CUresult {
    let (q, d) = match policed() {
        Ok(Some(x)) => x,
        Ok(None) => return call(),
        Err(e) => return e,
    };
    let a = match q.reserve(d, q.linear_charge(d, size)) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let mut r = call();
    if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        // The GPU is full (the quota admitted it): with memory_wait, try
        // again as memory is freed on the GPU, until the deadline.
        let _ = q.wait(d, a.bytes(), quota::Short::Driver, || {
            r = call();
            if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Err(quota::Short::Driver)
            } else {
                Ok(())
            }
        });
    }
    if r != OK {
        return r;
    }
    let p = ptr();
    keep(&q.ptrs, "allocation", p, a, || {
        // SAFETY: freeing the pointer the driver just returned.
        unsafe { real::cuMemFree_v2(p) };
    })
}

/// Records what the driver just returned under `key` with the admission's
/// size and device, and commits the admission. A full table refuses the
/// allocation instead of losing track of its charge: `undo` frees it
/// again, then the admission gives the charge back.
fn keep(table: &Table, what: &str, key: u64, a: Admission<'_>, undo: impl FnOnce()) -> CUresult {
    if table.insert(key, a.bytes(), meta::plain(a.ordinal())) {
        a.commit();
        return OK;
    }
    crate::error!(
        "cuslice's {what} table is full: the new {what} ({} bytes on GPU {}) was freed again, its charge given back to the quota, and the call refused with CUDA_ERROR_OUT_OF_MEMORY",
        a.bytes(),
        a.ordinal()
    );
    undo();
    // Given back only now that the memory is: the quota never counts less
    // than the device holds.
    drop(a);
    CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Frees through `call`, crediting what the pointer was charged.
#[inline]
fn free_ptr(p: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(q) = quota::get() else { return call() };
    // Remove first: once the driver has freed it, another thread may get
    // the same address back and record it.
    let rec = q.ptrs.remove(p);
    let r = call();
    match rec {
        Some((size, m)) if r == OK => match meta::pool(m) {
            Some(i) => {
                // Back to its pool, which keeps the memory reserved: the
                // charge moves with the pool's reservation (trim/sync).
                if let Some(pool) = q.pools.get(i) {
                    pool.used.fetch_sub(
                        size.min(pool.used.load(Ordering::Relaxed)),
                        Ordering::AcqRel,
                    );
                }
            }
            None => q.credit(meta::ordinal(m), size),
        },
        Some((size, m)) => {
            // The driver refused the free: the allocation is still live.
            q.ptrs.insert(p, size, m);
        }
        None => {}
    }
    r
}

pub unsafe fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    alloc_ptr(
        bytesize as u64,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAlloc_v2(dptr, bytesize) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr },
    )
}

pub unsafe fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    alloc_ptr(
        bytesize as u64,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAlloc(dptr, bytesize) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr } as u64,
    )
}

pub unsafe fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    // Managed memory is counted as device memory: it can all migrate there.
    alloc_ptr(
        bytesize as u64,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocManaged(dptr, bytesize, flags) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr },
    )
}

pub unsafe fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    free_ptr(dptr, || unsafe { real::cuMemFree_v2(dptr) })
}

pub unsafe fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    free_ptr(dptr as u64, || unsafe { real::cuMemFree(dptr) })
}

/// Pitch is chosen by the driver: admit an upper bound (rows padded to
/// 512 bytes, more than any current GPU's pitch alignment), then settle to
/// pitch x height (each in whole pages from one page up, as any linear
/// allocation).
fn alloc_pitch(
    width: u64,
    height: u64,
    call: impl FnOnce() -> CUresult,
    out: impl FnOnce() -> (u64, u64),
) -> CUresult {
    let (q, d) = match policed() {
        Ok(Some(x)) => x,
        Ok(None) => return call(),
        Err(e) => return e,
    };
    let bound = width
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height);
    let mut a = match q.reserve(d, q.linear_charge(d, bound)) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let r = call();
    if r != OK {
        return r;
    }
    let (p, pitch) = out();
    if let Err(e) = a.settle(q.linear_charge(d, pitch.saturating_mul(height))) {
        // SAFETY: freeing what the driver just returned (the bound is given
        // back when `a` drops, after the free).
        unsafe { real::cuMemFree_v2(p) };
        return e;
    }
    keep(&q.ptrs, "allocation", p, a, || {
        // SAFETY: freeing what the driver just returned.
        unsafe { real::cuMemFree_v2(p) };
    })
}

pub unsafe fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    alloc_pitch(
        width as u64,
        height as u64,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocPitch_v2(dptr, pitch, width, height, elem) },
        // SAFETY: read only after success, when the driver has written both.
        || unsafe { (*dptr, *pitch as u64) },
    )
}

pub unsafe fn cuMemAllocPitch(
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    alloc_pitch(
        width as u64,
        height as u64,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocPitch(dptr, pitch, width, height, elem) },
        // SAFETY: read only after success, when the driver has written both.
        || unsafe { (*dptr as u64, *pitch as u64) },
    )
}

// ---- stream-ordered allocator -------------------------------------------

fn alloc_pooled(
    size: u64,
    pool_of: impl FnOnce(usize) -> Option<u64>,
    call: impl FnOnce() -> CUresult,
    ptr: impl FnOnce() -> u64,
    free: impl FnOnce(u64),
) -> CUresult {
    let (q, d) = match policed() {
        Ok(Some(x)) => x,
        Ok(None) => return call(),
        Err(e) => return e,
    };
    let Some(pool) = pool_of(d).and_then(|h| q.pool(h, d)) else {
        // Unknown pool (or too many): charge the allocation itself.
        // Stream-ordered: never waits (so `call` runs once).
        let mut call = Some(call);
        return quota::without_waiting(|| {
            alloc_ptr(
                size,
                || {
                    call.take()
                        .map_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY, |c| c())
                },
                ptr,
            )
        });
    };
    let idx = q.pool_index(pool);
    // Growth the pool may need beyond what is already charged to it.
    let used_after = pool.used.load(Ordering::Acquire).saturating_add(size);
    let charged = pool.charged.load(Ordering::Acquire);
    // Pools reserve in whole pages of the device: growth is admitted
    // rounded up to that, so the reservation never outruns the quota
    // between syncs.
    let page = q.page(d);
    let pre = if used_after > charged {
        (used_after - charged).div_ceil(page).saturating_mul(page)
    } else {
        0
    };
    // The growth is charged to the pool, not to this pointer: a pooled
    // free returns the memory to the pool, which keeps it reserved.
    // Stream-ordered: never waits for memory (it may be captured).
    let growth = match quota::without_waiting(|| q.reserve(d, pre)) {
        Ok(a) => a,
        Err(e) => return e,
    };
    if pre > 0 {
        pool.charged.fetch_add(pre, Ordering::AcqRel);
    }
    let r = call();
    if r != OK {
        if pre > 0 {
            pool.charged.fetch_sub(pre, Ordering::AcqRel);
        }
        return r;
    }
    growth.commit();
    let p = ptr();
    pool.used.fetch_add(size, Ordering::AcqRel);
    if !q.ptrs.insert(p, size, meta::pooled(d, idx)) {
        // Nothing of this pointer was charged to it (its memory is the
        // pool's): only the pool's use is undone.
        crate::error!(
            "cuslice's allocation table is full: the new allocation ({size} bytes from a memory pool on GPU {d}) was freed again and the call refused with CUDA_ERROR_OUT_OF_MEMORY"
        );
        free(p);
        pool.used.fetch_sub(size, Ordering::AcqRel);
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    // Settle the charge on the pool's real reservation when it may have grown.
    if (pre > 0 || pool.used.load(Ordering::Acquire) > pool.charged.load(Ordering::Acquire))
        && q.sync_pool(pool).is_err()
    {
        // The reservation outgrew the quota: undo this allocation.
        q.ptrs.remove(p);
        pool.used.fetch_sub(size, Ordering::AcqRel);
        free(p);
        let _ = q.sync_pool(pool);
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    OK
}

fn current_pool(d: usize) -> Option<u64> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: real driver call with a valid out pointer.
    let r = unsafe { real::cuDeviceGetMemPool(&mut pool, d as CUdevice) };
    (r == OK).then_some(pool as u64)
}

pub unsafe fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_pooled(
        bytesize as u64,
        current_pool,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocAsync(dptr, bytesize, stream) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr },
        // SAFETY: freeing, on the caller's stream, what the driver just returned.
        |p| unsafe {
            real::cuMemFreeAsync(p, stream);
        },
    )
}

pub unsafe fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_pooled(
        bytesize as u64,
        current_pool,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocAsync_ptsz(dptr, bytesize, stream) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr },
        // SAFETY: freeing, on the caller's stream, what the driver just returned.
        |p| unsafe {
            real::cuMemFreeAsync_ptsz(p, stream);
        },
    )
}

pub unsafe fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_pooled(
        bytesize as u64,
        |_| Some(pool as u64),
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr },
        // SAFETY: freeing, on the caller's stream, what the driver just returned.
        |p| unsafe {
            real::cuMemFreeAsync(p, stream);
        },
    )
}

pub unsafe fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_pooled(
        bytesize as u64,
        |_| Some(pool as u64),
        // SAFETY: forwarding the caller's arguments.
        || unsafe { real::cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream) },
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *dptr },
        // SAFETY: freeing, on the caller's stream, what the driver just returned.
        |p| unsafe {
            real::cuMemFreeAsync_ptsz(p, stream);
        },
    )
}

pub unsafe fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    free_ptr(dptr, || unsafe { real::cuMemFreeAsync(dptr, stream) })
}

pub unsafe fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    free_ptr(dptr, || unsafe { real::cuMemFreeAsync_ptsz(dptr, stream) })
}

pub unsafe fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::cuMemPoolTrimTo(pool, keep) };
    if r == OK
        && let Some(q) = quota::get()
        && let Some(p) = q
            .pools
            .iter()
            .find(|p| p.handle.load(Ordering::Acquire) == pool as u64)
    {
        // Credit what the trim released.
        let _ = q.sync_pool(p);
    }
    r
}

// ---- virtual memory management (PyTorch expandable segments, NCCL) --------

const RELEASED: u64 = 1 << 63;
const MAP_ONE: u64 = 1 << 16;
const MAP_MASK: u64 = 0xffff_ffff << 16;

/// Handle meta: ordinal in the low 16 bits, live mapping count above, and
/// RELEASED once cuMemRelease was called. The physical memory (and the
/// quota charge) lives until both: released and unmapped everywhere.
fn handle_done(m: u64) -> bool {
    m & RELEASED != 0 && m & MAP_MASK == 0
}

pub unsafe fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: prop is the caller's valid pointer (or null: the driver
    // rejects that and so do we, by passing through).
    let on_device = !prop.is_null()
        && unsafe { (*prop).location.type_ } == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    // SAFETY: forwarding the caller's arguments.
    let call = || unsafe { real::cuMemCreate(handle, size, prop, flags) };
    let Some(q) = quota::get() else {
        return if quota::failed() {
            CUresult::CUDA_ERROR_NOT_PERMITTED
        } else {
            call()
        };
    };
    if !on_device {
        return call();
    }
    // SAFETY: on_device implies prop is non-null.
    let d = unsafe { (*prop).location.__bindgen_anon_1.id };
    if d < 0 || d as usize >= q.devs.len() {
        return call();
    }
    let d = d as usize;
    let a = match q.reserve(d, size as u64) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let r = call();
    if r != OK {
        return r;
    }
    // SAFETY: the driver wrote the handle.
    let h = unsafe { *handle };
    keep(&q.handles, "handle", h, a, || {
        // SAFETY: releasing the handle the driver just made.
        unsafe { real::cuMemRelease(h) };
    })
}

/// Applies `f` to a handle's meta; credits and forgets it once done.
fn update_handle(q: &Quota, h: u64, f: impl Fn(u64) -> u64) {
    // Handle updates race only with the caller's own misuse (mapping a
    // handle while releasing it on another thread); a retry loop keeps the
    // counts right anyway.
    for _ in 0..64 {
        let Some((size, m)) = q.handles.get(h) else {
            return;
        };
        let n = f(m);
        if !q.handles.update(h, size, n) {
            return;
        }
        if handle_done(n) {
            if q.handles.remove(h).is_some() {
                q.credit((n & 0xffff) as usize, size);
            }
            return;
        }
        if q.handles.get(h).map(|x| x.1) == Some(n) {
            return;
        }
    }
}

pub unsafe fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::cuMemRelease(handle) };
    if r == OK
        && let Some(q) = quota::get()
    {
        update_handle(q, handle, |m| m | RELEASED);
    }
    r
}

pub unsafe fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::cuMemMap(ptr, size, offset, handle, flags) };
    if r == OK
        && let Some(q) = quota::get()
        && q.handles.get(handle).is_some()
        && q.maps.insert(ptr, size as u64, handle)
    {
        // Mapping a counted handle costs nothing more: it only counts the
        // mapping, so the handle's charge outlives its release until unmap.
        update_handle(q, handle, |m| m + MAP_ONE);
    }
    r
}

pub unsafe fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::cuMemUnmap(ptr, size) };
    if r == OK
        && let Some(q) = quota::get()
        && let Some((_, handle)) = q.maps.remove(ptr)
    {
        update_handle(
            q,
            handle,
            |m| if m & MAP_MASK != 0 { m - MAP_ONE } else { m },
        );
    }
    r
}

// ---- arrays ---------------------------------------------------------------

fn element_bytes(f: CUarray_format) -> u64 {
    match f {
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8 | CUarray_format::CU_AD_FORMAT_SIGNED_INT8 => 1,
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT16
        | CUarray_format::CU_AD_FORMAT_SIGNED_INT16
        | CUarray_format::CU_AD_FORMAT_HALF => 2,
        // 32-bit formats, and an upper bound for the packed and compressed
        // formats we do not list.
        _ => 4,
    }
}

fn array_bytes(w: u64, h: u64, depth: u64, channels: u64, f: CUarray_format) -> u64 {
    w.max(1)
        .saturating_mul(h.max(1))
        .saturating_mul(depth.max(1))
        .saturating_mul(channels.max(1))
        .saturating_mul(element_bytes(f))
}

fn alloc_array(
    size: u64,
    call: impl FnOnce() -> CUresult,
    handle: impl FnOnce() -> u64,
    destroy: impl FnOnce(u64),
) -> CUresult {
    let (q, d) = match policed() {
        Ok(Some(x)) => x,
        Ok(None) => return call(),
        Err(e) => return e,
    };
    let a = match q.reserve(d, size) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let r = call();
    if r != OK {
        return r;
    }
    let h = handle();
    keep(&q.arrays, "array", h, a, || destroy(h))
}

fn free_array(h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if r == OK
        && let Some(q) = quota::get()
        && let Some((size, d)) = q.arrays.remove(h)
    {
        q.credit(d as usize, size);
    }
    r
}

pub unsafe fn cuArrayCreate_v2(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let call = || unsafe { real::cuArrayCreate_v2(handle, desc) };
    if desc.is_null() {
        return call();
    }
    // SAFETY: non-null descriptor from the caller.
    let a = unsafe { &*desc };
    let size = array_bytes(
        a.Width as u64,
        a.Height as u64,
        1,
        a.NumChannels as u64,
        a.Format,
    );
    alloc_array(
        size,
        call,
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *handle } as u64,
        |h| {
            // SAFETY: destroying the array the driver just created.
            unsafe { real::cuArrayDestroy(h as CUarray) };
        },
    )
}

pub unsafe fn cuArray3DCreate_v2(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let call = || unsafe { real::cuArray3DCreate_v2(handle, desc) };
    if desc.is_null() {
        return call();
    }
    // SAFETY: non-null descriptor from the caller.
    let a = unsafe { &*desc };
    let size = array_bytes(
        a.Width as u64,
        a.Height as u64,
        a.Depth as u64,
        a.NumChannels as u64,
        a.Format,
    );
    alloc_array(
        size,
        call,
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *handle } as u64,
        |h| {
            // SAFETY: destroying the array the driver just created.
            unsafe { real::cuArrayDestroy(h as CUarray) };
        },
    )
}

pub unsafe fn cuMipmappedArrayCreate(
    handle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let call = || unsafe { real::cuMipmappedArrayCreate(handle, desc, levels) };
    if desc.is_null() {
        return call();
    }
    // SAFETY: non-null descriptor from the caller.
    let a = unsafe { &*desc };
    let (mut w, mut h, mut dp) = (a.Width as u64, a.Height as u64, a.Depth as u64);
    let mut size = 0u64;
    for _ in 0..levels.max(1) {
        size = size.saturating_add(array_bytes(w, h, dp, a.NumChannels as u64, a.Format));
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        dp = if dp == 0 { 0 } else { (dp / 2).max(1) };
    }
    alloc_array(
        size,
        call,
        // SAFETY: read only after success, when the driver has written it.
        || unsafe { *handle } as u64,
        |h| {
            // SAFETY: destroying the array the driver just created.
            unsafe { real::cuMipmappedArrayDestroy(h as CUmipmappedArray) };
        },
    )
}

pub unsafe fn cuArrayDestroy(h: CUarray) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    free_array(h as u64, || unsafe { real::cuArrayDestroy(h) })
}

pub unsafe fn cuMipmappedArrayDestroy(h: CUmipmappedArray) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    free_array(h as u64, || unsafe { real::cuMipmappedArrayDestroy(h) })
}
