//! A process that reads segments other users can write (the host's
//! `cuslice watch`, `status`, `top`, `exporter`) must not die when one of
//! them truncates a file it has mapped: touching a page past the new end
//! of a `MAP_SHARED` file raises SIGBUS, whose default action ends the
//! process. With [`guard`] on, every segment mapping ([`crate::shm::Shm`])
//! is listed here, and a SIGBUS at an address inside one replaces that
//! whole mapping with private zero pages and marks it hit: the access
//! that faulted completes (it reads zeros, a write goes nowhere), and the
//! owner asks [`hit`] after reading to throw the reading away and map the
//! file afresh. A SIGBUS anywhere else goes to the handler that was there
//! before (Rust's own, or the default action).
//!
//! The shim does not turn this on: a program's own signal handlers are
//! its business, and a tenant that truncates a segment its processes map
//! harms those processes (see docs/threat-model.md).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Mappings listed at once, at most (the watch maps two per container
/// and GPU; beyond this, mapping fails with an error rather than run
/// unguarded).
const SLOTS: usize = 4096;

/// Linux's `si_code` for an access to a page of a mapping that no longer
/// has a file page behind it (`asm-generic/siginfo.h`; libc lacks it).
const BUS_ADRERR: i32 = 2;

struct Range {
    start: AtomicUsize,
    /// 0: the slot is free.
    len: AtomicUsize,
    hit: AtomicBool,
}

static RANGES: [Range; SLOTS] = [const {
    Range {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        hit: AtomicBool::new(false),
    }
}; SLOTS];

/// Taken around a change of the table and by the handler while it swaps a
/// mapping out. The handler only runs for a fault of this thread's own
/// access to a mapping, never inside [`register`] / [`unregister`], so it
/// cannot wait on its own thread.
static LOCK: AtomicBool = AtomicBool::new(false);

static ON: AtomicBool = AtomicBool::new(false);

/// The SIGBUS action there was before [`guard`] (for faults not ours).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Serialises [`guard`] (installing twice would chain to ourselves).
static INSTALL: Mutex<()> = Mutex::new(());

fn lock() {
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

fn unlock() {
    LOCK.store(false, Ordering::Release);
}

/// Installs the handler, once per process; mappings made from then on are
/// guarded.
pub fn guard() -> Result<(), String> {
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if ON.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: a zeroed sigaction for the old action; sigemptyset on ours.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to sigaction structs.
    let r = unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGBUS, &act, &mut old)
    };
    if r != 0 {
        return Err(format!(
            "cannot install the SIGBUS handler that keeps a truncated segment from killing this process: {}",
            std::io::Error::last_os_error()
        ));
    }
    let _ = PREVIOUS.set(old);
    ON.store(true, Ordering::Release);
    Ok(())
}

/// Lists the mapping `[start, start + len)`: its slot, None where the
/// guard is off.
pub(crate) fn register(start: usize, len: usize) -> Result<Option<usize>, String> {
    if !ON.load(Ordering::Acquire) || len == 0 {
        return Ok(None);
    }
    lock();
    let free = RANGES
        .iter()
        .position(|r| r.len.load(Ordering::Relaxed) == 0);
    if let Some(i) = free {
        let r = &RANGES[i];
        r.start.store(start, Ordering::Relaxed);
        r.hit.store(false, Ordering::Relaxed);
        r.len.store(len, Ordering::Release);
    }
    unlock();
    match free {
        Some(i) => Ok(Some(i)),
        None => Err(format!(
            "{SLOTS} segments are mapped already: refusing to map another unguarded"
        )),
    }
}

/// Takes slot `i` off the list (before its mapping goes).
pub(crate) fn unregister(i: usize) {
    lock();
    RANGES[i].len.store(0, Ordering::Release);
    unlock();
}

/// Whether the mapping of slot `i` lost its file since it was listed.
pub(crate) fn hit(i: usize) -> bool {
    RANGES[i].hit.load(Ordering::Acquire)
}

/// Replaces the listed mapping holding `addr` with zero pages; false where
/// none holds it.
fn swap_out(addr: usize) -> bool {
    lock();
    let mut done = false;
    for r in &RANGES {
        let len = r.len.load(Ordering::Acquire);
        let start = r.start.load(Ordering::Relaxed);
        if len != 0 && addr >= start && addr - start < len {
            // SAFETY: replaces pages of a mapping this process made and
            // still lists (unregistered only under LOCK, before munmap);
            // mmap is a plain system call, safe in a signal handler.
            let p = unsafe {
                libc::mmap(
                    start as *mut c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                r.hit.store(true, Ordering::Release);
                done = true;
            }
            break;
        }
    }
    unlock();
    done
}

extern "C" fn on_sigbus(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == BUS_ADRERR && swap_out(addr) {
        return;
    }
    // Not a listed mapping: what would have happened without the guard.
    match PREVIOUS.get() {
        Some(old) if old.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler, installed as an SA_SIGINFO one.
            let f = unsafe {
                std::mem::transmute::<
                    libc::sighandler_t,
                    extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void),
                >(old.sa_sigaction)
            };
            f(sig, info, ctx);
        }
        Some(old) if old.sa_sigaction == libc::SIG_IGN => {}
        Some(old) if old.sa_sigaction != libc::SIG_DFL => {
            // SAFETY: the previous plain handler.
            let f = unsafe {
                std::mem::transmute::<libc::sighandler_t, extern "C" fn(i32)>(old.sa_sigaction)
            };
            f(sig);
        }
        _ => {
            // The default action: for a fault, returning re-runs the access,
            // which faults again and ends the process; a SIGBUS sent by
            // someone is raised again.
            // SAFETY: signal and raise are async-signal-safe.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                if code <= 0 {
                    libc::raise(sig);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::gpu::GpuSegment;
    use crate::segment::{MAX_DEVICES, Segment};

    #[test]
    fn a_segment_truncated_under_a_guarded_reader_voids_the_reading_not_the_process() {
        super::guard().expect("guard");
        let dir = std::env::temp_dir().join(format!("cuslice-sigbus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mem = dir.join("memory.seg");
        let w = Segment::open_or_create(&mem).expect("memory segment");
        w.register_device(&[7; 16], 1 << 30).expect("device");
        let gpu = dir.join("GPU-x.seg");
        drop(GpuSegment::open_or_create(&gpu).expect("gpu segment"));

        let r = Segment::open_read_only(&mem).expect("reader");
        let g = GpuSegment::open_read_only(&gpu).expect("gpu reader");
        assert_eq!(r.device_usage(0).map(|u| u.limit), Some(1 << 30));
        assert!(!r.truncated() && !g.truncated());
        // A tenant truncates both files (it can write them): the reads
        // that follow complete, find nothing, and say the mapping is void.
        for p in [&mem, &gpu] {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .and_then(|f| f.set_len(0))
                .expect("truncate");
        }
        assert!((0..MAX_DEVICES).all(|d| r.device_usage(d).is_none()));
        assert!(r.truncated());
        assert!(g.tenants().is_empty());
        assert!(g.truncated());
        // A mapping made afresh of a whole file is sound again; one of the
        // truncated file is refused by its size check.
        drop(r);
        assert!(Segment::open_read_only(&mem).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
