//! The fake driver's shared state (`FAKE_CUDA_STATE`), read directly: the
//! ground truth of what its processes hold on the simulated GPU. Its layout
//! is C's (tests/fake/fake_common.h; no Rust type describes it), written
//! down here once.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;

/// `struct fake_state` of tests/fake/fake_common.h (version 5): a 64-byte
/// header, 16 device entries of 64 bytes, 128 process slots of 472 bytes
/// (`int32 pid; u32 gen; u64 used[16];` then what the fake NVML reports,
/// not read here: `u64 pidns, start_ticks; u32 ctxs[16]; u64 run_ns[16],
/// first_ns[16]`), then the timeline (from byte 61504) and the fake CUPTI's
/// records (from byte 4263536) and the NVML samples' boundaries (from byte
/// 21044344), not read here. The OFD lock on byte
/// `FAKE_LOCK_BASE + slot` proves a slot's process alive.
const FAKE_SIZE: usize = 21_617_784;
const FAKE_VERSION: u32 = 5;
pub const FAKE_SLOTS: usize = 128;
const FAKE_SLOT_OFF: usize = 1088;
const FAKE_SLOT_SIZE: usize = 472;
const FAKE_LOCK_BASE: i64 = 1 << 20;
const FAKE_MAGIC: u64 = 0x3155_5047_454B_4146; // "FAKEGPU1"

pub struct Fake {
    file: File,
    base: *mut u8,
    /// The header was valid once: from then on it must stay valid.
    seen: std::cell::Cell<bool>,
}

// SAFETY: a shared mapping read only through atomics.
unsafe impl Send for Fake {}

impl Fake {
    /// Opens the state file; with `init`, creates it (sized, all zero: the
    /// counters and slots read as empty until the first fake process
    /// initialises it, timeline mutex included, which only the fake can do),
    /// so that a test can watch it from the start; else it must be
    /// valid.
    pub fn open(path: &Path, init: bool) -> Fake {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .expect("open the fake state");
        let fd = file.as_raw_fd();
        // SAFETY: flock / mmap on our own fd; the mapping is FAKE_SIZE bytes
        // of a file at least that long.
        unsafe {
            assert_eq!(libc::flock(fd, libc::LOCK_EX), 0, "flock");
            if file.metadata().expect("stat").len() < FAKE_SIZE as u64 {
                file.set_len(FAKE_SIZE as u64).expect("size the fake state");
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                FAKE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "mmap the fake state");
            let f = Fake {
                file,
                base: p.cast(),
                seen: std::cell::Cell::new(false),
            };
            if let Err(e) = f.header() {
                assert!(init, "{}: {e}", path.display());
            }
            libc::flock(fd, libc::LOCK_UN);
            f
        }
    }

    fn u64_at(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        debug_assert!(off + 8 <= FAKE_SIZE && off.is_multiple_of(8));
        // SAFETY: in bounds, aligned, in a live shared mapping.
        unsafe { &*self.base.add(off).cast() }
    }

    pub fn header(&self) -> Result<(), String> {
        let magic = self.u64_at(0).load(Ordering::Acquire);
        let word = self.u64_at(8).load(Ordering::Acquire);
        let (version, size) = (word as u32, (word >> 32) as u32);
        if magic == 0 && !self.seen.get() {
            // Created by us; no fake process has initialised it yet (the
            // fake writes the magic last).
            return Ok(());
        }
        self.seen.set(true);
        if magic != FAKE_MAGIC || version != FAKE_VERSION || size as usize != FAKE_SIZE {
            return Err(format!(
                "fake GPU state header: magic {magic:#x} version {version} size {size}"
            ));
        }
        Ok(())
    }

    /// Device 0's usage counter (all processes, dead ones not yet reclaimed
    /// included).
    pub fn used_bytes(&self) -> u64 {
        self.u64_at(64).load(Ordering::Acquire)
    }

    /// (pid, bytes held on device 0) of fake slot `i`.
    pub fn slot(&self, i: usize) -> (i32, u64) {
        let off = FAKE_SLOT_OFF + i * FAKE_SLOT_SIZE;
        let pid = self.u64_at(off).load(Ordering::Acquire) as u32 as i32;
        (pid, self.u64_at(off + 8).load(Ordering::Acquire))
    }

    /// Whether the process owning fake slot `i` is alive (holds its lock).
    pub fn alive(&self, i: usize) -> bool {
        // SAFETY: zeroed flock is valid; F_OFD_GETLK on our fd.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = FAKE_LOCK_BASE + i as i64;
        fl.l_len = 1;
        // SAFETY: F_OFD_GETLK on our own descriptor, with that flock.
        let r = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        assert_eq!(r, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
        fl.l_type != libc::F_UNLCK as libc::c_short
    }

    /// pid -> bytes held, over the live slots.
    pub fn live_usage(&self) -> HashMap<i32, u64> {
        let mut m = HashMap::new();
        for i in 0..FAKE_SLOTS {
            let (pid, used) = self.slot(i);
            if pid != 0 && self.alive(i) {
                *m.entry(pid).or_insert(0) += used;
            }
        }
        m
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.base.cast(), FAKE_SIZE) };
    }
}

impl Fake {
    /// What processes `pids` hold on device 0, by the slots that name them
    /// and whose lock is held (all of them stopped, or it is not one
    /// snapshot). A slot is counted by its pid: one being claimed, or
    /// reclaimed, is locked while it still names its dead owner and holds
    /// what that owner left, until the claimer clears it.
    pub fn held_by(&self, pids: &[u32]) -> u64 {
        (0..FAKE_SLOTS)
            .filter_map(|i| {
                let (pid, used) = self.slot(i);
                (u32::try_from(pid).is_ok_and(|p| pids.contains(&p)) && self.alive(i))
                    .then_some(used)
            })
            .sum()
    }
}
