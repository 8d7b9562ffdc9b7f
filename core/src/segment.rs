//! The per-container memory segment: a file-backed shared mapping that all
//! processes of one container open, holding each GPU's quota and usage and
//! one slot per live process.
//!
//! Layout (`#[repr(C)]`, atomics only, little-endian x86_64):
//!
//! ```text
//! Header                      magic "CUSLMEM\0", layout version, sizes
//! Device[MAX_DEVICES]         uuid, limit, used, peak, refused, admission lock
//! Slot[MAX_SLOTS]             per process: state, pid, start time, used per device
//! ```
//!
//! Invariants, kept under each device's admission lock:
//! `device.used == sum over live slots of slot.used[device]`, and no
//! admission makes `used` exceed `limit`.
//!
//! Liveness without PIDs: a process owns its slot by holding an OFD
//! byte-range write lock on byte `LOCK_BASE + slot` of the segment file. The
//! kernel drops the lock when the process dies (whatever its PID namespace
//! or PID reuse), so a slot whose lock can be taken belongs to a dead process
//! and its usage is reclaimed by whoever notices.
//!
//! The admission lock is a word in the device entry, held for a handful of
//! loads and stores (never across a syscall or a driver call). A process
//! killed while holding it is detected the same way (its slot lock is gone)
//! and the lock is taken over; the new holder recomputes `used` from the
//! slots, which restores the invariant whatever the dead holder had written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::shm::{HEADER_SPARE, Header, Layout, ROOT_WAIT, Shm, TENANT_WAIT};
pub use crate::shm::{LockBusy, SegmentError};

pub const MAGIC: [u8; 8] = *b"CUSLMEM\0";
pub const VERSION: u32 = 1;
pub const MAX_DEVICES: usize = 16;
pub const MAX_SLOTS: usize = 1024;
/// `limit` value of a device without a memory quota.
pub const UNLIMITED: u64 = u64::MAX;

/// The header's spare word ([`HEADER_SPARE`]) holds which device entries
/// `cuslice resize` set: this tag in the high half (a word left by an
/// older version that did not zero the padding is taken for no mark), a
/// bit per entry in the low half.
const RESIZED_TAG: u64 = 0x5253_5a44 << 32;
const _: () = assert!(MAX_DEVICES <= 32);

const DEV_EMPTY: u32 = 0;
const DEV_READY: u32 = 2;

#[repr(C, align(64))]
pub struct Device {
    pub state: AtomicU32,
    /// Admission lock: 0 free, else owner slot + 1.
    pub lock: AtomicU32,
    pub uuid: [AtomicU32; 4],
    pub limit: AtomicU64,
    pub used: AtomicU64,
    pub peak: AtomicU64,
    pub refused: AtomicU64,
    /// What the container is guaranteed, bytes, where it may use more
    /// (`limit`, its `memory_max`) while memory no tenant is guaranteed is
    /// free (the GPU's memory pool, [`crate::pool`]); 0: `limit` is all of
    /// it (in what was padding: the layout and its version are unchanged,
    /// and an older library reads 0).
    pub guarantee: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Device>() == 64);

/// A process slot's `state`: free (never used, or given back).
pub const SLOT_FREE: u32 = 0;
const SLOT_LIVE: u32 = 1;
/// Being given back: counted (by `recompute`) but admitting nothing more.
const SLOT_LEAVING: u32 = 2;

#[repr(C, align(64))]
pub struct Slot {
    pub state: AtomicU32,
    /// PID in the owner's namespace: for display only, never for liveness.
    pub pid: AtomicU32,
    /// CLOCK_REALTIME seconds at registration (display).
    pub started: AtomicU64,
    pub used: [AtomicU64; MAX_DEVICES],
}

const HEADER: usize = std::mem::size_of::<Header>();
pub const SIZE: usize =
    HEADER + MAX_DEVICES * std::mem::size_of::<Device>() + MAX_SLOTS * std::mem::size_of::<Slot>();

fn layout() -> Layout {
    Layout {
        what: "memory segment",
        header: Header {
            magic: MAGIC,
            version: VERSION,
            header_size: HEADER as u32,
            total_size: SIZE as u64,
            params: [
                MAX_DEVICES as u32,
                MAX_SLOTS as u32,
                std::mem::size_of::<Device>() as u32,
                std::mem::size_of::<Slot>() as u32,
                0,
                0,
                0,
                0,
            ],
        },
        param_names: [
            "device count",
            "slot count",
            "device entry size",
            "slot size",
            "-",
            "-",
            "-",
            "-",
        ],
    }
}

/// An open, validated memory segment.
pub struct Segment {
    shm: Shm,
    pub path: PathBuf,
    /// Per device entry, this process's link to the GPU's memory pool
    /// (null: none): where the container's burst is held, and whom a free
    /// wakes. Process-local. See [`Segment::link_pool`].
    pools: [std::sync::atomic::AtomicPtr<PoolLink>; MAX_DEVICES],
}

/// A device entry's link to its GPU's memory pool.
pub struct PoolLink {
    pub pool: &'static crate::pool::Pool,
    /// The container's entry in the pool.
    pub entry: usize,
}

/// What an admission decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Granted,
    /// Within the container's `memory_max`, but past its guarantee and
    /// what it holds of the pool by `short` bytes: granted once the pool
    /// gives it that much more ([`crate::pool::Pool::reserve`]).
    Burst {
        short: u64,
    },
    /// Refused: usage and limit at the time of the decision.
    Refused {
        used: u64,
        limit: u64,
    },
}

impl Segment {
    /// Opens the segment at `path`, creating it (and its directory) if
    /// absent. Refuses a file that is not ours: another owner, another
    /// layout version, a wrong size or magic.
    pub fn open_or_create(path: &Path) -> Result<Segment, SegmentError> {
        let shm = Shm::open_or_create(path, &layout(), 0o700)?;
        Ok(Segment {
            shm,
            path: path.to_path_buf(),
            pools: Default::default(),
        })
    }

    /// Opens an existing segment read-write whoever owns it, never
    /// creating it: for the host watchdog, which puts back a quota a
    /// process of the container overwrote.
    pub fn open_existing(path: &Path) -> Result<Segment, SegmentError> {
        let shm = Shm::open_existing(path, &layout(), true)?;
        Ok(Segment {
            shm,
            path: path.to_path_buf(),
            pools: Default::default(),
        })
    }

    /// An existing segment from `fd`, a descriptor of it the caller opened
    /// (the host's file layer, from its directory's descriptor without
    /// following a link: `Dir::open_segment`), whoever owns it, never
    /// creating it: writable where `fd` was opened read-write, else
    /// read-only (see [`Shm::from_fd`]). `path` names it in messages.
    pub fn from_fd(fd: std::os::fd::OwnedFd, path: &Path) -> Result<Segment, SegmentError> {
        let shm = Shm::from_fd(fd, path, &layout())?;
        Ok(Segment {
            shm,
            path: path.to_path_buf(),
            pools: Default::default(),
        })
    }

    /// Opens an existing segment read-only (for `cuslice status`).
    pub fn open_read_only(path: &Path) -> Result<Segment, SegmentError> {
        let shm = Shm::open_read_only(path, &layout())?;
        Ok(Segment {
            shm,
            path: path.to_path_buf(),
            pools: Default::default(),
        })
    }

    pub fn device(&self, i: usize) -> Option<&Device> {
        if i >= MAX_DEVICES {
            return None;
        }
        // SAFETY: in bounds (i < MAX_DEVICES) and aligned (the mapping is
        // page aligned, entries are 64-byte multiples); atomics only.
        Some(unsafe {
            self.shm
                .at::<Device>(HEADER + i * std::mem::size_of::<Device>())
        })
    }

    pub fn slot(&self, i: usize) -> Option<&Slot> {
        if i >= MAX_SLOTS {
            return None;
        }
        let off =
            HEADER + MAX_DEVICES * std::mem::size_of::<Device>() + i * std::mem::size_of::<Slot>();
        // SAFETY: as in device().
        Some(unsafe { self.shm.at::<Slot>(off) })
    }

    /// Whether the process that owns `slot` is alive. Our own slot reads
    /// as alive.
    pub fn slot_alive(&self, slot: usize) -> bool {
        self.shm.slot_alive(slot)
    }

    /// Registers this process: takes the first slot whose lock is free,
    /// reclaiming what a dead previous owner left in it.
    pub fn claim_slot(&self, pid: u32) -> Result<usize, SegmentError> {
        self.shm.claim_first(MAX_SLOTS, "process slot", |i| {
            let Some(s) = self.slot(i) else { return };
            self.finish_dead_holder(i);
            if s.state.load(Ordering::Acquire) != SLOT_FREE {
                self.reclaim_locked(i);
            }
            s.pid.store(pid, Ordering::Relaxed);
            s.started.store(now_secs(), Ordering::Relaxed);
            s.state.store(SLOT_LIVE, Ordering::Release);
        })
    }

    /// A dead previous owner of `slot` may have died holding a device lock:
    /// that lock word carries the slot's id, which `lock_device` on behalf of
    /// the slot would wait on for ever (it takes the id for its own). Finish
    /// its critical section for it (recompute), then let go. The caller holds
    /// the slot's lock (so nobody else takes the device lock over meanwhile).
    fn finish_dead_holder(&self, slot: usize) {
        let me = slot as u32 + 1;
        for d in 0..MAX_DEVICES {
            if let Some(dev) = self.device(d)
                && dev.lock.load(Ordering::Acquire) == me
            {
                self.recompute(dev);
                dev.lock.store(0, Ordering::Release);
            }
        }
    }

    /// Gives our slot back (normal exit): usage is credited, the lock dropped.
    pub fn release_slot(&self, slot: usize) {
        self.shm.release_own(slot, |i| self.reclaim_locked(i));
    }

    /// Credits everything `slot` holds and frees it. The caller holds the
    /// slot's lock (it is ours, or its owner is dead).
    ///
    /// At a normal exit other threads of the process may still be
    /// allocating: the slot stops admitting first (`admit` refuses a slot
    /// that is leaving or free), and every registered device's lock is
    /// taken, so that an admission that got in before is credited too, and
    /// nothing is left on a free slot, where no sweep would ever find it.
    fn reclaim_locked(&self, slot: usize) {
        let Some(s) = self.slot(slot) else { return };
        s.state.store(SLOT_LEAVING, Ordering::SeqCst);
        for d in 0..MAX_DEVICES {
            let Some(dev) = self.device(d) else { continue };
            if dev.state.load(Ordering::Acquire) != DEV_READY
                && s.used[d].load(Ordering::Acquire) == 0
            {
                continue;
            }
            let g = self.lock_device(dev, slot);
            let n = s.used[d].swap(0, Ordering::AcqRel);
            let u = dev.used.load(Ordering::Relaxed);
            dev.used.store(u.saturating_sub(n), Ordering::Release);
            self.settle_burst(d, dev);
            drop(g);
            if n > 0 {
                self.notify_freed(d);
            }
        }
        s.state.store(SLOT_FREE, Ordering::Release);
    }

    /// Reclaims every slot whose owner is dead. Returns how many.
    pub fn reclaim_dead(&self) -> usize {
        let in_use = |i: usize| {
            self.slot(i)
                .is_some_and(|s| s.state.load(Ordering::Acquire) != SLOT_FREE)
        };
        self.shm.sweep_dead(MAX_SLOTS, in_use, |i| {
            self.finish_dead_holder(i);
            self.reclaim_locked(i)
        })
    }

    /// Finds the device entry for `uuid`, creating it with `limit` if absent.
    /// Returns the entry and, where the segment already holds another finite
    /// quota for the GPU than `limit`, that quota: it is the one that
    /// applies (`cuslice resize` changes the segment of a running
    /// container, and the quota file the host restores it from; a process
    /// that read the file just before a resize meets the new value here).
    /// A quota on one side only is an error: every process sharing a
    /// segment must agree on which GPUs have a quota.
    pub fn register_device(
        &self,
        uuid: &[u8; 16],
        limit: u64,
    ) -> Result<(usize, Option<u64>), SegmentError> {
        self.register_device_with(uuid, 0, limit)
    }

    /// [`register_device`](Self::register_device) with a guarantee below
    /// the limit (`memory` below `memory_max`; 0: none). A new entry takes
    /// it; an existing one keeps the segment's (as for the limit).
    ///
    /// The segment's figures hold only within the slice they belong to:
    /// while another live process is registered in the segment, or where
    /// `cuslice resize` set them ([`Segment::resize_device`]). An entry
    /// with neither (a job that ended, and another in the same segment
    /// directory with its own configuration) takes this process's limit
    /// and guarantee, silently.
    ///
    /// Waits at most [`TENANT_WAIT`] for the segment's lock (another
    /// process of the slice may keep it): then an error naming the file
    /// and the holder.
    pub fn register_device_with(
        &self,
        uuid: &[u8; 16],
        guarantee: u64,
        limit: u64,
    ) -> Result<(usize, Option<u64>), SegmentError> {
        // Registration is rare (once per device per process at cuInit).
        self.shm.with_flock_bounded(TENANT_WAIT, || {
            self.register_device_locked(uuid, guarantee, limit)
        })?
    }

    /// The header's resize marks word.
    fn resized_word(&self) -> &AtomicU64 {
        // SAFETY: HEADER_SPARE + 8 is the header's size, within the
        // mapping; 8-aligned (56 of a page-aligned mapping); an atomic.
        unsafe { self.shm.at::<AtomicU64>(HEADER_SPARE) }
    }

    /// Whether `cuslice resize` set entry `i`'s figures (and no process
    /// has registered them since with its own configuration agreeing).
    pub fn resized(&self, i: usize) -> bool {
        let w = self.resized_word().load(Ordering::Acquire);
        w & !0xffff_ffff == RESIZED_TAG && w & (1 << i) != 0
    }

    fn set_resized(&self, i: usize, on: bool) {
        let _ = self
            .resized_word()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let marks = if w & !0xffff_ffff == RESIZED_TAG {
                    w & 0xffff_ffff
                } else {
                    0
                };
                let marks = if on {
                    marks | 1 << i
                } else {
                    marks & !(1 << i)
                };
                let new = if marks == 0 { 0 } else { RESIZED_TAG | marks };
                (new != w).then_some(new)
            });
    }

    /// Whether a process other than this one is registered in the segment
    /// and alive.
    fn others_live(&self) -> bool {
        (0..MAX_SLOTS).any(|i| {
            i != self.shm.own()
                && self
                    .slot(i)
                    .is_some_and(|s| s.state.load(Ordering::Acquire) != SLOT_FREE)
                && self.slot_alive(i)
        })
    }

    fn register_device_locked(
        &self,
        uuid: &[u8; 16],
        guarantee: u64,
        limit: u64,
    ) -> Result<(usize, Option<u64>), SegmentError> {
        let mut empty = None;
        for i in 0..MAX_DEVICES {
            let Some(d) = self.device(i) else { break };
            match d.state.load(Ordering::Acquire) {
                DEV_READY if &device_uuid(d) == uuid => {
                    let have = d.limit.load(Ordering::Relaxed);
                    let want_g = if guarantee < limit { guarantee } else { 0 };
                    if have == limit && d.guarantee.load(Ordering::Relaxed) == want_g {
                        // This process's configuration has what a resize
                        // set: the mark has done its work.
                        self.set_resized(i, false);
                        return Ok((i, None));
                    }
                    if adopts(self.others_live(), self.resized(i)) {
                        d.limit.store(limit, Ordering::Release);
                        d.guarantee.store(want_g, Ordering::Release);
                        return Ok((i, None));
                    }
                    if have == limit {
                        return Ok((i, None));
                    }
                    if have == UNLIMITED || limit == UNLIMITED {
                        return Err(SegmentError(format!(
                            "{}: GPU {} already has a memory quota of {} in this segment, but this process's configuration says {}; all processes sharing a segment must agree on which GPUs have a quota",
                            self.path.display(),
                            crate::config::format_uuid(uuid),
                            fmt_limit(have),
                            fmt_limit(limit)
                        )));
                    }
                    return Ok((i, Some(have)));
                }
                DEV_EMPTY if empty.is_none() => empty = Some(i),
                _ => {}
            }
        }
        let Some(i) = empty else {
            return Err(SegmentError(format!(
                "{}: no free device entry (at most {MAX_DEVICES} GPUs)",
                self.path.display()
            )));
        };
        let Some(d) = self.device(i) else {
            unreachable!("i < MAX_DEVICES")
        };
        store_uuid(d, uuid);
        d.limit.store(limit, Ordering::Relaxed);
        d.guarantee.store(
            if guarantee < limit { guarantee } else { 0 },
            Ordering::Relaxed,
        );
        d.state.store(DEV_READY, Ordering::Release);
        Ok((i, None))
    }

    /// Takes a device's admission lock on behalf of `slot`. If the holder
    /// died inside its critical section, takes the lock over and recomputes
    /// `used` from the slots.
    pub fn lock_device<'a>(&'a self, dev: &'a Device, slot: usize) -> DeviceGuard<'a> {
        let me = slot as u32 + 1;
        let mut spins: u32 = 0;
        loop {
            let cur = dev.lock.load(Ordering::Relaxed);
            if cur == 0 {
                if dev
                    .lock
                    .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return DeviceGuard { dev };
                }
                continue;
            }
            // A lock word naming no slot at all is corrupt (its "holder" is
            // dead): taken over at once, not after spinning (a segment
            // scribbled over leaves one in every device entry, and an exit
            // that walks them all crawled on a loaded host: a thousand
            // yields each).
            let owner = (cur - 1) as usize;
            if owner >= MAX_SLOTS
                && dev
                    .lock
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.recompute(dev);
                return DeviceGuard { dev };
            }
            spins = spins.wrapping_add(1);
            if spins < 100 {
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            // After the spins and every ~100 yields, check the holder is
            // alive. A holder in our own process (another thread) is alive
            // by definition.
            if spins.is_multiple_of(100)
                && cur != me
                && !self.slot_alive(owner)
                && dev
                    .lock
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.recompute(dev);
                return DeviceGuard { dev };
            }
        }
    }

    /// Restores `used = sum of slots` for one device (under its lock).
    fn recompute(&self, dev: &Device) {
        let idx = self.device_index(dev);
        let mut sum = 0u64;
        for i in 0..MAX_SLOTS {
            let Some(s) = self.slot(i) else { break };
            if s.state.load(Ordering::Acquire) != SLOT_FREE {
                sum = sum.saturating_add(s.used[idx].load(Ordering::Acquire));
            }
        }
        dev.used.store(sum, Ordering::Release);
    }

    fn device_index(&self, dev: &Device) -> usize {
        let first = self.device(0).map_or(0, |d| d as *const Device as usize);
        ((dev as *const Device as usize - first) / std::mem::size_of::<Device>())
            .min(MAX_DEVICES - 1)
    }

    /// Links device entry `d` to its GPU's memory pool (once, at start):
    /// admission past the guarantee then counts on the container's burst
    /// there, and every free gives back what the container no longer
    /// needs of it and wakes the pool's waiters.
    pub fn link_pool(&self, d: usize, pool: &'static crate::pool::Pool, entry: usize) {
        if let Some(p) = self.pools.get(d) {
            let link = Box::into_raw(Box::new(PoolLink { pool, entry }));
            let old = p.swap(link, Ordering::AcqRel);
            if !old.is_null() {
                // SAFETY: links are made only here, from Box::into_raw, and
                // the old one is no longer reachable through `pools`.
                // Leaked rather than freed: another thread may still read it.
                let _ = old;
            }
        }
    }

    /// Device entry `d`'s link to its pool, if any.
    pub fn pool_link(&self, d: usize) -> Option<&PoolLink> {
        let p = self.pools.get(d)?.load(Ordering::Acquire);
        // SAFETY: non-null links come from Box::into_raw and are never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The burst word of device entry `d` in its pool.
    fn burst_of(&self, d: usize) -> Option<&AtomicU64> {
        let l = self.pool_link(d)?;
        Some(&l.pool.entry(l.entry)?.burst)
    }

    /// What device entry `d` may hold now, its guarantee, and its limit:
    /// the guarantee (less its part still pending in the pool: lent out to
    /// others' bursts, not its to use until the pool gives it back,
    /// [`crate::pool::Pool::reserve`]) plus what it holds of the pool,
    /// never past `limit`. Without a guarantee below the limit, the limit
    /// (less its pending part). Under the lock; one look at the pool link.
    fn cap(&self, d: usize, dev: &Device) -> (u64, u64, u64) {
        let limit = dev.limit.load(Ordering::Relaxed);
        let g = dev.guarantee.load(Ordering::Relaxed);
        let entry = self
            .pool_link(d)
            .and_then(|l| Some((l.pool, l.pool.entry(l.entry)?, l.entry)));
        let pending = entry.map_or(0, |(p, _, i)| p.pending(i));
        if g == 0 || g >= limit {
            return (limit.saturating_sub(pending), limit, limit);
        }
        let burst = entry.map_or(0, |(_, e, _)| e.burst.load(Ordering::Acquire));
        (
            g.saturating_sub(pending).saturating_add(burst).min(limit),
            g,
            limit,
        )
    }

    /// Gives back to the pool what device entry `d` holds of it beyond its
    /// use (under the lock, after usage fell), and wakes its waiters.
    fn settle_burst(&self, d: usize, dev: &Device) {
        let g = dev.guarantee.load(Ordering::Relaxed);
        if g != 0
            && let Some(b) = self.burst_of(d)
        {
            let need = dev.used.load(Ordering::Relaxed).saturating_sub(g);
            let _ = b.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v > need).then_some(need)
            });
        }
    }

    /// A free on device entry `d`: whoever waits for memory on its GPU
    /// looks again. (Outside the admission lock: may be a syscall.)
    fn notify_freed(&self, d: usize) {
        if let Some(l) = self.pool_link(d) {
            l.pool.freed();
        }
    }

    /// Admits `bytes` on device entry `d` for `slot`, or refuses.
    pub fn admit(&self, d: usize, slot: usize, bytes: u64) -> Admit {
        let (Some(dev), Some(s)) = (self.device(d), self.slot(slot)) else {
            return Admit::Refused { used: 0, limit: 0 };
        };
        let g = self.lock_device(dev, slot);
        let used = dev.used.load(Ordering::Relaxed);
        let (cap, _, limit) = self.cap(d, dev);
        let after = used.saturating_add(bytes);
        // A slot being (or already) given back admits nothing: another
        // thread of a process that is exiting.
        if matches!(s.state.load(Ordering::SeqCst), SLOT_LEAVING | SLOT_FREE) {
            drop(g);
            return Admit::Refused { used, limit };
        }
        if after > limit {
            dev.refused.fetch_add(1, Ordering::Relaxed);
            drop(g);
            return Admit::Refused { used, limit };
        }
        if after > cap {
            drop(g);
            return Admit::Burst { short: after - cap };
        }
        s.used[d].fetch_add(bytes, Ordering::Relaxed);
        dev.used.store(after, Ordering::Release);
        if after > dev.peak.load(Ordering::Relaxed) {
            dev.peak.store(after, Ordering::Relaxed);
        }
        drop(g);
        Admit::Granted
    }

    /// [`admit`](Self::admit), taking from the GPU's pool what a burst past
    /// the guarantee needs (the pool's lock: a syscall, only past the
    /// guarantee). `Burst { short }` now means the pool had not `short`
    /// bytes that no tenant is guaranteed (`room`: what it had).
    pub fn admit_or_burst(&self, d: usize, slot: usize, bytes: u64) -> (Admit, u64) {
        let mut last = (Admit::Burst { short: bytes }, 0);
        // A free in another process of the container may give back what
        // this one reserved before it admits (its use has not grown yet):
        // some rounds, then a refusal.
        for _ in 0..16 {
            match self.admit(d, slot, bytes) {
                Admit::Burst { short } => {
                    let Some(link) = self.pool_link(d) else {
                        return (Admit::Burst { short }, 0);
                    };
                    if let Err(room) = link.pool.reserve(link.entry, short) {
                        return (Admit::Burst { short }, room);
                    }
                    last = (Admit::Burst { short }, 0);
                }
                other => return (other, 0),
            }
        }
        last
    }

    /// Credits `bytes` on device entry `d` for `slot` (a free, or the roll
    /// back of an admission whose driver call failed).
    pub fn credit(&self, d: usize, slot: usize, bytes: u64) {
        let (Some(dev), Some(s)) = (self.device(d), self.slot(slot)) else {
            return;
        };
        let g = self.lock_device(dev, slot);
        let mine = s.used[d].load(Ordering::Relaxed);
        let n = bytes.min(mine);
        s.used[d].store(mine - n, Ordering::Relaxed);
        let u = dev.used.load(Ordering::Relaxed);
        dev.used.store(u.saturating_sub(n), Ordering::Release);
        self.settle_burst(d, dev);
        drop(g);
        if n > 0 {
            self.notify_freed(d);
        }
    }

    /// A consistent-enough snapshot of one device for display and info.
    pub fn device_usage(&self, d: usize) -> Option<DeviceUsage> {
        let dev = self.device(d)?;
        if dev.state.load(Ordering::Acquire) != DEV_READY {
            return None;
        }
        Some(DeviceUsage {
            uuid: device_uuid(dev),
            limit: dev.limit.load(Ordering::Relaxed),
            guarantee: dev.guarantee.load(Ordering::Relaxed),
            used: dev.used.load(Ordering::Relaxed),
            peak: dev.peak.load(Ordering::Relaxed),
            refused: dev.refused.load(Ordering::Relaxed),
        })
    }

    /// Every device entry that is not all zero, whatever its state: what a
    /// process may be admitting against. A process keeps the entry index it
    /// registered and reads its limit whatever the entry's state word or
    /// UUID say, so a tenant that raised its limit could hide the raise from
    /// readers that skip entries not READY (`device_usage`) by writing the
    /// state word or a UUID byte; the host watchdog audits these instead.
    pub fn raw_devices(&self) -> Vec<RawDevice> {
        (0..MAX_DEVICES)
            .filter_map(|i| {
                let d = self.device(i)?;
                let r = RawDevice {
                    index: i,
                    state: d.state.load(Ordering::Acquire),
                    uuid: device_uuid(d),
                    limit: d.limit.load(Ordering::Relaxed),
                    used: d.used.load(Ordering::Relaxed),
                };
                (r.state != DEV_EMPTY || r.uuid != [0; 16] || r.limit != 0 || r.used != 0)
                    .then_some(r)
            })
            .collect()
    }

    /// The host watchdog's repair of entry `i`: its limit, and where given
    /// its UUID, and the READY state (a process registering that GPU finds
    /// it again, instead of a second entry that would split the quota).
    ///
    /// Root's: waits at most [`ROOT_WAIT`] for the segment's lock, then
    /// writes all the same ([`Shm::with_flock_or_without`] says why that is
    /// sound) and returns who kept the lock. Err: no such entry.
    pub fn restore_device(
        &self,
        i: usize,
        uuid: Option<&[u8; 16]>,
        limit: u64,
    ) -> Result<Option<LockBusy>, SegmentError> {
        let d = self.device_or_err(i)?;
        let ((), busy) = self.shm.with_flock_or_without(ROOT_WAIT, || {
            if let Some(uuid) = uuid {
                store_uuid(d, uuid);
            }
            d.limit.store(limit, Ordering::Release);
            if uuid.is_some() || d.state.load(Ordering::Acquire) != DEV_EMPTY {
                d.state.store(DEV_READY, Ordering::Release);
            }
        });
        Ok(busy)
    }

    /// `cuslice resize`'s new limit for entry `i`: as
    /// [`restore_device`](Self::restore_device), and the entry marked as
    /// resized, so that a process that starts while none of the slice
    /// lives is held to it too (not only one that meets a live process).
    pub fn resize_device(&self, i: usize, limit: u64) -> Result<Option<LockBusy>, SegmentError> {
        let busy = self.restore_device(i, None, limit)?;
        self.set_resized(i, true);
        Ok(busy)
    }

    /// A resize of entry `i`'s guarantee below its limit (0: none), marked
    /// as [`resize_device`](Self::resize_device) marks; the lock as there.
    pub fn set_guarantee(
        &self,
        i: usize,
        guarantee: u64,
    ) -> Result<Option<LockBusy>, SegmentError> {
        let d = self.device_or_err(i)?;
        let ((), busy) = self.shm.with_flock_or_without(ROOT_WAIT, || {
            d.guarantee.store(guarantee, Ordering::Release)
        });
        self.set_resized(i, true);
        Ok(busy)
    }

    fn device_or_err(&self, i: usize) -> Result<&Device, SegmentError> {
        self.device(i).ok_or_else(|| {
            SegmentError(format!(
                "{}: no device entry {i} (at most {MAX_DEVICES})",
                self.path.display()
            ))
        })
    }

    /// Live-looking slots: (slot, pid, started, used per device, alive).
    pub fn processes(&self) -> Vec<ProcessUsage> {
        let mut v = Vec::new();
        for i in 0..MAX_SLOTS {
            let Some(s) = self.slot(i) else { break };
            if s.state.load(Ordering::Acquire) == SLOT_FREE {
                continue;
            }
            let mut used = [0u64; MAX_DEVICES];
            for (d, u) in used.iter_mut().enumerate() {
                *u = s.used[d].load(Ordering::Relaxed);
            }
            v.push(ProcessUsage {
                slot: i,
                pid: s.pid.load(Ordering::Relaxed),
                started: s.started.load(Ordering::Relaxed),
                used,
                alive: self.slot_alive(i),
            });
        }
        v
    }

    /// The fd, for a fork child that must not keep its parent's lock alive.
    pub fn raw_fd(&self) -> i32 {
        self.shm.raw_fd()
    }

    /// True once the file was truncated under this mapping: what was read
    /// from it since is void (see [`crate::sigbus`]).
    pub fn truncated(&self) -> bool {
        self.shm.truncated()
    }
}

/// Guard of a device admission lock.
pub struct DeviceGuard<'a> {
    dev: &'a Device,
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        self.dev.lock.store(0, Ordering::Release);
    }
}

/// A device entry as it is in the segment ([`Segment::raw_devices`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDevice {
    pub index: usize,
    /// `READY_STATE` for an entry a process registered; anything else
    /// there was written by someone else.
    pub state: u32,
    pub uuid: [u8; 16],
    pub limit: u64,
    pub used: u64,
}

/// The state of a registered device entry.
pub const READY_STATE: u32 = DEV_READY;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceUsage {
    pub uuid: [u8; 16],
    pub limit: u64,
    /// The guarantee below `limit` (0: none; `limit` is all of it).
    pub guarantee: u64,
    pub used: u64,
    pub peak: u64,
    pub refused: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUsage {
    pub slot: usize,
    pub pid: u32,
    pub started: u64,
    pub used: [u64; MAX_DEVICES],
    pub alive: bool,
}

/// Writes `uuid` into `d`'s UUID words (the inverse of [`device_uuid`]).
fn store_uuid(d: &Device, uuid: &[u8; 16]) {
    for (k, w) in d.uuid.iter().enumerate() {
        w.store(
            u32::from_le_bytes([
                uuid[4 * k],
                uuid[4 * k + 1],
                uuid[4 * k + 2],
                uuid[4 * k + 3],
            ]),
            Ordering::Relaxed,
        );
    }
}

fn device_uuid(d: &Device) -> [u8; 16] {
    let mut u = [0u8; 16];
    for (k, w) in d.uuid.iter().enumerate() {
        u[4 * k..4 * k + 4].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    u
}

/// Whether a process registering a GPU whose entry holds other figures
/// than its configuration takes its own: only where no other process of
/// the segment lives and no resize set them (the figures are a finished
/// job's, not the slice's).
fn adopts(others_live: bool, resized: bool) -> bool {
    !others_live && !resized
}

fn fmt_limit(l: u64) -> String {
    if l == UNLIMITED {
        "none".into()
    } else {
        format!("{l} bytes")
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
