//! The GPU's memory pool: one file per GPU, shared by every tenant of the
//! host (`<gpu_segment_dir>/<uuid>.memory`, beside the GPU's scheduling
//! segment), that says what each tenant is guaranteed and what it holds
//! beyond its guarantee (its *burst*), so that a tenant given `memory_max`
//! above its guarantee (`memory`) takes only memory no tenant is
//! guaranteed.
//!
//! Layout (`#[repr(C)]`, atomics only):
//!
//! ```text
//! Header                 magic "CUSLPOOL", layout version, sizes
//! Head                   capacity (the GPU's memory), wake-up word, waiters
//! Entry[MAX_ENTRIES]     per tenant (name + slice tag): guarantee, burst, max
//! Proc[MAX_PROCS]        per process: its entry (liveness: an OFD lock)
//! ```
//!
//! The rule, kept by [`Pool::reserve`] under the file's lock: the sum over
//! live entries of `guarantee + burst` never grows past `capacity`. A
//! container admits an allocation only within `guarantee + burst` of its
//! entry (`segment`), so the memory tenants hold together stays within the
//! GPU's, and a tenant below its guarantee can always reach it: nobody ever
//! needs memory back from anyone. Burst only grows under the lock (checked
//! against the sum), and shrinks anywhere (a free, a dead process swept).
//!
//! An entry lives while a process of its tenant does, and lingers
//! [`LINGER_NS`] after its last one is gone: each process holds an OFD lock
//! on its process slot's byte; a sweep (at a join, a reservation short of
//! room, or a look at the room, [`Pool::tidy`]: sweeps are lazy, under the
//! file's lock, never on the allocation path) that finds an entry with no live process releases its
//! burst at once (that memory went with the process) and stamps when
//! ([`Entry::lingering_since`], CLOCK_MONOTONIC: host wide, the clock of
//! the GPU segment); its guarantee stays in the sum, so that a process of
//! the tenant that restarts (a crash loop, a reload, a job's next step)
//! finds it whole instead of lent to another tenant's burst meanwhile. A
//! process of the tenant joining within the linger takes the same entry
//! back; a sweep after it frees the entry (its guarantee leaves the sum).
//! Observers see a lingering entry with no process ([`EntryView::procs`]
//! 0), its guarantee counted in [`Pool::room`] as a live one's. Where every
//! entry is taken, a joining tenant takes the one that lingered longest.
//!
//! Allocations waiting for memory (`memory_wait`) sleep on the wake-up word
//! (a futex on the shared file) instead of polling: every free of every
//! tenant on the GPU bumps it and wakes them, but only while the head's
//! waiter count is above 0 (a fence and a load otherwise, see
//! [`Pool::freed`]).
//!
//! A waiter counts itself twice: in the head (what frees read) and in its
//! process's slot (`Proc::waiting`), so that a process killed while it
//! waits, which never uncounts itself, is uncounted when its slot is
//! swept (at the next join, or the next reservation short of room).
//! Otherwise the count would stay raised until the file is made anew, and
//! every free of every tenant would write the shared line and make the
//! wake-up syscall for nobody.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub use crate::shm::SegmentError;
use crate::shm::{Header, Layout, ROOT_WAIT, Shm, TENANT_WAIT};

pub const MAGIC: [u8; 8] = *b"CUSLPOOL";
pub const VERSION: u32 = 1;
pub const MAX_ENTRIES: usize = 64;
pub const MAX_PROCS: usize = 1024;
const KEY_WORDS: usize = 8;

const EMPTY: u32 = 0;
const READY: u32 = 2;

/// How long a tenant's entry keeps its guarantee in the pool once its last
/// process is gone, before a sweep frees it. A process of a crash loop, a
/// server's reload, a job script's next step comes back within seconds;
/// without the linger, another tenant's burst could take its guarantee in
/// between, and the tenant, back, would find it held by a borrower. A
/// minute covers such restarts with room to spare (an image pulled again,
/// a slow start of an interpreter) and costs little: a guarantee kept only
/// delays bursts into it (what the others may borrow), never takes from
/// another tenant's guarantee.
pub const LINGER_NS: u64 = 60_000_000_000;

/// How often one process may sweep the pool through [`Pool::tidy`]: a
/// program that asks for the GPU's free memory in a loop sweeps at most
/// ten times a second (a sweep tests the lock of every process slot in
/// use, one `fcntl` each).
pub const TIDY_EVERY_NS: u64 = 100_000_000;

#[repr(C, align(64))]
pub struct Head {
    /// The GPU's memory, bytes (set by the first process, from the driver).
    pub capacity: AtomicU64,
    /// Futex word: bumped at every free while `waiters` is above 0.
    pub freed_gen: AtomicU32,
    /// Threads waiting for memory ([`Pool::waiting`]; a free skips the
    /// bump and the wake-up syscall at 0): at least the sum of the process
    /// slots' `waiting` (each waiter counts itself here first).
    pub waiters: AtomicU32,
}

#[repr(C, align(64))]
pub struct Entry {
    pub state: AtomicU32,
    /// The tenant's key: its name (bytes 0..56) and slice tag (56..64), as
    /// in the GPU segment's tenant entries.
    pub key: [AtomicU64; KEY_WORDS],
    /// What the tenant is guaranteed (its `memory`), bytes.
    pub guarantee: AtomicU64,
    /// What it holds beyond its guarantee, bytes.
    pub burst: AtomicU64,
    /// The most it may use (`memory_max`; display and the watch's check).
    pub max: AtomicU64,
    /// When the entry lost its last process (ns, CLOCK_MONOTONIC as the
    /// sweep that found it so read it; 0: it has one, or no sweep has
    /// looked since it lost it): it lingers, its guarantee kept, until
    /// [`LINGER_NS`] after this. In what was padding: the layout and its
    /// version are unchanged; an older library's sweep ignores it and
    /// frees such an entry at once (its guarantee with it, as before), and
    /// an older library's join that takes the entry back leaves it set,
    /// which the next sweep of this one clears (the entry has a process).
    pub lingering_since: AtomicU64,
    /// The part of its guarantee it has not reserved yet, bytes: where the
    /// tenant arrived (or its guarantee grew) while that memory was lent
    /// to others' bursts, it reserved at once what was free and the rest
    /// is pending, taken as the borrowers free ([`Pool::reserve`]) before
    /// any new burst. Its *reserved* part is `guarantee - pending`. In
    /// what was padding (an older library reads the whole guarantee as
    /// reserved, as before).
    pub pending: AtomicU64,
    /// 1: registered by whoever made the slice ([`Pool::register`]: the
    /// OCI hook, the DRA plugin): the entry and its guarantee stay, with
    /// or without a process, until [`Pool::release`]. In what was padding.
    pub held: AtomicU32,
}

#[repr(C, align(16))]
pub struct Proc {
    pub state: AtomicU32,
    pub entry: AtomicU32,
    /// 0: the slot of the slice's maker (`cuslice run`, [`Pool::register`]
    /// with [`Maker::Process`]), which keeps the entry while it lives but
    /// holds no memory and frees none.
    pub pid: AtomicU32,
    /// How many of the head's `waiters` are this process's threads: taken
    /// off the head when the slot is freed (a sweep, a claim, a leave), so
    /// that a process killed while it waits leaves nobody counted. In what
    /// was padding: the layout and its version are unchanged, and an older
    /// library's slots read 0 (its waiters are not recovered, as before).
    pub waiting: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Head>() == 64);
const _: () = assert!(std::mem::size_of::<Entry>() == 128);
const _: () = assert!(std::mem::size_of::<Proc>() == 16);

const HEADER: usize = std::mem::size_of::<Header>();
const HEAD: usize = std::mem::size_of::<Head>();
const ENTRY: usize = std::mem::size_of::<Entry>();
const PROC: usize = std::mem::size_of::<Proc>();
pub const SIZE: usize = HEADER + HEAD + MAX_ENTRIES * ENTRY + MAX_PROCS * PROC;

fn layout() -> Layout {
    Layout {
        what: "GPU memory pool",
        header: Header {
            magic: MAGIC,
            version: VERSION,
            header_size: HEADER as u32,
            total_size: SIZE as u64,
            params: [
                MAX_ENTRIES as u32,
                MAX_PROCS as u32,
                HEAD as u32,
                ENTRY as u32,
                PROC as u32,
                0,
                0,
                0,
            ],
        },
        param_names: [
            "entry count",
            "process count",
            "head size",
            "entry size",
            "process size",
            "-",
            "-",
            "-",
        ],
    }
}

/// The pool's file for the GPU `uuid` in `gpu_segment_dir`.
pub fn path(gpu_segment_dir: &Path, uuid: &[u8; 16]) -> PathBuf {
    gpu_segment_dir.join(format!("{}.memory", crate::config::format_uuid(uuid)))
}

pub struct Pool {
    shm: Shm,
    pub path: PathBuf,
    /// The GPU's memory as this process's own driver (or root's NVML)
    /// gives it, set at [`Pool::join`] / [`Pool::register`]: what every
    /// decision of this process counts against. The head's `capacity` is
    /// a tenant-writable copy for display (0 here: observers use it).
    capacity: AtomicU64,
    /// When this process last swept through [`Pool::tidy`] (CLOCK_MONOTONIC
    /// ns; 0: never): this mapping's own, not the file's.
    tidied_at: AtomicU64,
}

/// A tenant's entry as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryView {
    pub index: usize,
    pub name: String,
    pub tag: u64,
    pub guarantee: u64,
    /// The part of the guarantee still lent out to others' bursts (see
    /// [`Entry::pending`]).
    pub pending: u64,
    pub burst: u64,
    pub max: u64,
    /// Registered by the slice's maker (root's hook or DRA plugin): kept
    /// without a process until released.
    pub held: bool,
    /// Processes of the tenant in the pool (slots in use: a process dead
    /// since the last sweep still counts). 0: the entry lingers, or will
    /// at the next sweep ([`LINGER_NS`]), its guarantee still counted.
    pub procs: u32,
    /// When its linger started (CLOCK_MONOTONIC ns), where a sweep found
    /// it without a process.
    pub lingering_since: Option<u64>,
}

impl Pool {
    /// Opens (creating if absent) the pool file at `path`; refuses a file
    /// that is not ours (owner, size, magic, version).
    pub fn open_or_create(path: &Path) -> Result<Pool, SegmentError> {
        let shm = Shm::open_or_create(path, &layout(), 0o1777)?;
        Ok(Pool {
            shm,
            path: path.to_path_buf(),
            capacity: AtomicU64::new(0),
            tidied_at: AtomicU64::new(0),
        })
    }

    /// Opens an existing pool read-write whoever owns it, never creating
    /// it (`cuslice resize`, root's).
    pub fn open_existing(path: &Path) -> Result<Pool, SegmentError> {
        let shm = Shm::open_existing(path, &layout(), true)?;
        Ok(Pool {
            shm,
            path: path.to_path_buf(),
            capacity: AtomicU64::new(0),
            tidied_at: AtomicU64::new(0),
        })
    }

    /// An existing pool from `fd`, a descriptor of it the caller opened
    /// (the host's file layer, from its directory's descriptor without
    /// following a link: `Dir::open_segment`), whoever owns it, never
    /// creating it: writable where `fd` was opened read-write, else
    /// read-only (see [`Shm::from_fd`]). `path` names it in messages.
    pub fn from_fd(fd: std::os::fd::OwnedFd, path: &Path) -> Result<Pool, SegmentError> {
        let shm = Shm::from_fd(fd, path, &layout())?;
        Ok(Pool {
            shm,
            path: path.to_path_buf(),
            capacity: AtomicU64::new(0),
            tidied_at: AtomicU64::new(0),
        })
    }

    /// Opens an existing pool read-only (`cuslice status`, the watch).
    pub fn open_read_only(path: &Path) -> Result<Pool, SegmentError> {
        let shm = Shm::open_read_only(path, &layout())?;
        Ok(Pool {
            shm,
            path: path.to_path_buf(),
            capacity: AtomicU64::new(0),
            tidied_at: AtomicU64::new(0),
        })
    }

    pub fn head(&self) -> &Head {
        // SAFETY: the head follows the header; aligned; atomics only.
        unsafe { self.shm.at::<Head>(HEADER) }
    }

    pub fn entry(&self, i: usize) -> Option<&Entry> {
        (i < MAX_ENTRIES).then(|| {
            // SAFETY: in bounds, aligned (64-byte entries after a 64-byte
            // aligned head), atomics only.
            unsafe { self.shm.at::<Entry>(HEADER + HEAD + i * ENTRY) }
        })
    }

    fn proc_slot(&self, i: usize) -> Option<&Proc> {
        (i < MAX_PROCS).then(|| {
            // SAFETY: as in entry().
            unsafe {
                self.shm
                    .at::<Proc>(HEADER + HEAD + MAX_ENTRIES * ENTRY + i * PROC)
            }
        })
    }

    /// Registers this process under tenant `name` of slice `tag`, which is
    /// guaranteed `guarantee` bytes and may use `max`, on a GPU of
    /// `capacity` bytes (as this process's driver gives it). Returns
    /// (entry, process slot). The last process of a tenant to join sets
    /// its guarantee and max (a resize), except in an entry its slice's
    /// maker registered ([`Pool::register`]), whose guarantee is the
    /// maker's. A guarantee that arrives while its memory is lent out is
    /// reserved as far as the pool has room and pending for the rest
    /// ([`Entry::pending`]).
    pub fn join(
        &self,
        name: &str,
        tag: u64,
        guarantee: u64,
        max: u64,
        capacity: u64,
        pid: u32,
    ) -> Result<(usize, usize), SegmentError> {
        self.set_capacity(capacity);
        // A tenant may keep the lock: a start waits a bounded time, then
        // fails closed naming the file and the holder.
        self.shm.with_flock_bounded(TENANT_WAIT, || {
            self.sweep_locked();
            let i = self.entry_locked(name, tag)?;
            let e = self.entry(i).expect("in bounds");
            if e.held.load(Ordering::Acquire) == 0 {
                self.set_guarantee_locked(i, guarantee);
                e.max.store(max, Ordering::Release);
            }
            let slot = self.claim_proc_locked(i, pid)?;
            Ok((i, slot))
        })?
    }

    /// Registers the slice `name`/`tag` before any of its processes runs,
    /// as whoever makes the slice (issue: "a guarantee belongs to its
    /// slice, not to its processes"): its guarantee is reserved now as far
    /// as the pool has room, the rest pending; it stays whole between the
    /// slice's processes. Refuses a guarantee that could never fit: the
    /// guarantees registered on the GPU would then exceed `capacity` (the
    /// GPU's memory as NVML or the driver gives it, never the file's).
    /// [`Maker::Root`] (the OCI hook, the DRA plugin): kept until
    /// [`Pool::release`]. [`Maker::Process`] (`cuslice run`): kept while
    /// the calling process lives, through a process slot of its own
    /// (returned: give it back with [`Pool::leave`]), then as a tenant
    /// whose last process is gone (the linger).
    pub fn register(
        &self,
        name: &str,
        tag: u64,
        guarantee: u64,
        max: u64,
        capacity: u64,
        maker: Maker,
    ) -> Result<Registered, SegmentError> {
        self.set_capacity(capacity);
        // Root (the hook, the plugin) waits at most ROOT_WAIT for a lock a
        // tenant can keep, a session's maker as a starting tenant does.
        let wait = match maker {
            Maker::Root => ROOT_WAIT,
            Maker::Process => TENANT_WAIT,
        };
        self.shm.with_flock_bounded(wait, || {
            self.sweep_locked();
            let key = crate::gpu::layout::encode_name(name, tag);
            let others: u64 = (0..MAX_ENTRIES)
                .filter_map(|i| self.entry(i))
                .filter(|e| e.state.load(Ordering::Acquire) == READY && key_of(e) != key)
                .map(|e| e.guarantee.load(Ordering::Acquire))
                .fold(0u64, u64::saturating_add);
            if others.saturating_add(guarantee) > capacity {
                return Err(SegmentError(format!(
                    "{}: a guarantee of {guarantee} bytes does not fit: the GPU has {capacity} bytes and its other tenants are guaranteed {others}",
                    self.path.display()
                )));
            }
            let i = self.entry_locked(name, tag)?;
            let e = self.entry(i).expect("in bounds");
            self.set_guarantee_locked(i, guarantee);
            e.max.store(max, Ordering::Release);
            let slot = match maker {
                Maker::Root => {
                    e.held.store(1, Ordering::Release);
                    None
                }
                Maker::Process => Some(self.claim_proc_locked(i, 0)?),
            };
            Ok(Registered {
                entry: i,
                slot,
                pending: pending_of(e),
            })
        })?
    }

    /// The slice `name`/`tag` is gone (the hook's poststop, the DRA
    /// plugin's unprepare, the end of `cuslice run`): its entry is freed
    /// now where no process of it is left (its guarantee leaves the sum),
    /// else it becomes a tenant's entry like any other (freed after its
    /// last process and the linger). Whether there was such an entry, and
    /// the lock a tenant kept past [`ROOT_WAIT`] where one did: then it is
    /// released without the lock (a few stores; a join of the slice at
    /// that instant could find its entry freed under it, and makes it
    /// afresh at its next start).
    pub fn release(&self, name: &str, tag: u64) -> (bool, Option<crate::shm::LockBusy>) {
        let key = crate::gpu::layout::encode_name(name, tag);
        self.shm.with_flock_or_without(ROOT_WAIT, || {
            self.sweep_locked();
            let live = self.procs_per_entry();
            let Some(i) = (0..MAX_ENTRIES).find(|&i| {
                self.entry(i)
                    .is_some_and(|e| e.state.load(Ordering::Acquire) == READY && key_of(e) == key)
            }) else {
                return false;
            };
            let e = self.entry(i).expect("in bounds");
            e.held.store(0, Ordering::Release);
            if live[i] == 0 {
                free_entry(e);
                self.freed();
            }
            true
        })
    }

    /// Sets the capacity this process's decisions count against.
    fn set_capacity(&self, capacity: u64) {
        if capacity > 0 {
            self.capacity.store(capacity, Ordering::Relaxed);
        }
        let h = self.head();
        if h.capacity.load(Ordering::Acquire) == 0 {
            h.capacity.store(capacity, Ordering::Release);
        }
    }

    /// The entry of `name`/`tag`, made where there is none (in a free
    /// entry, or the one that has lingered longest). Under the lock.
    fn entry_locked(&self, name: &str, tag: u64) -> Result<usize, SegmentError> {
        let key = crate::gpu::layout::encode_name(name, tag);
        let mut free = None;
        let mut found = None;
        // The entry that has lingered longest (its start, index).
        let mut oldest: Option<(u64, usize)> = None;
        for i in 0..MAX_ENTRIES {
            let Some(e) = self.entry(i) else { break };
            match e.state.load(Ordering::Acquire) {
                READY if key_of(e) == key => {
                    found = Some(i);
                    break;
                }
                READY => {
                    let since = e.lingering_since.load(Ordering::Acquire);
                    if since != 0 && oldest.is_none_or(|(t, _)| since < t) {
                        oldest = Some((since, i));
                    }
                }
                _ if free.is_none() => free = Some(i),
                _ => {}
            }
        }
        // Every entry taken: one that only lingers gives way to a tenant
        // with a process (its guarantee leaves the pool, as it did at once
        // before the linger), so the linger never shuts a tenant out of
        // the pool.
        let free = free.or(oldest.map(|(_, i)| i));
        let i = match (found, free) {
            (Some(i), _) => i,
            (None, Some(i)) => {
                let e = self.entry(i).expect("in bounds");
                // (A lingering entry given way is READY: readers skip it
                // while its key is rewritten.)
                e.state.store(EMPTY, Ordering::Release);
                for (w, k) in e.key.iter().zip(key) {
                    w.store(k, Ordering::Relaxed);
                }
                e.burst.store(0, Ordering::Relaxed);
                e.guarantee.store(0, Ordering::Relaxed);
                e.pending.store(0, Ordering::Relaxed);
                e.held.store(0, Ordering::Relaxed);
                e.state.store(READY, Ordering::Release);
                i
            }
            (None, None) => {
                return Err(SegmentError(format!(
                    "{}: all {MAX_ENTRIES} tenant entries are in use by live processes or registered slices",
                    self.path.display()
                )));
            }
        };
        // Its process is back (or it is new): no longer lingering, the
        // same entry and guarantee, counted once.
        self.entry(i)
            .expect("in bounds")
            .lingering_since
            .store(0, Ordering::Release);
        Ok(i)
    }

    /// Claims a process slot under entry `i` for `pid` (0: the slice's
    /// maker). Under the lock.
    fn claim_proc_locked(&self, i: usize, pid: u32) -> Result<usize, SegmentError> {
        self.shm.claim_first(MAX_PROCS, "pool process slot", |s| {
            if let Some(p) = self.proc_slot(s) {
                // A process that died after the last sweep left its slot
                // as it was: its waiters go back first.
                self.uncount_waiting(p);
                p.entry.store(i as u32, Ordering::Relaxed);
                p.pid.store(pid, Ordering::Relaxed);
                p.state.store(READY, Ordering::Release);
            }
        })
    }

    /// Sets entry `i`'s guarantee to `g` (under the lock). What it already
    /// reserved stays reserved (up to `g`); a larger guarantee takes the
    /// rest from the entry's own burst first (memory it holds already),
    /// then from what the pool has that nobody is guaranteed or waits for
    /// ([`Pool::room`]); what is still missing is pending.
    fn set_guarantee_locked(&self, i: usize, g: u64) {
        let Some(e) = self.entry(i) else { return };
        let (reserved, burst) = regrant(
            reserved_of(e),
            e.burst.load(Ordering::Acquire),
            g,
            self.room_excluding(Some(i)),
        );
        e.burst.store(burst, Ordering::Release);
        e.guarantee.store(g, Ordering::Release);
        e.pending.store(g - reserved, Ordering::Release);
    }

    /// Root's resize of entry `i` (`cuslice resize`): guarantee `g`, most
    /// `max`, and a burst of at least `need` (use past a lowered
    /// guarantee is burst at once, whether the pool had room or not: the
    /// operator's resize is what the host goes by). A raised guarantee is
    /// reserved as [`Pool::join`] reserves one, from the room left on a
    /// GPU of `capacity` bytes (NVML's; 0: unknown, no room taken), the
    /// rest pending. Without
    /// the file's lock, which a tenant can hold: a few stores, racing at
    /// worst one tenant's reservation made at the same instant (the sum
    /// then over by what both took, until a free).
    pub fn resize_entry(&self, i: usize, g: u64, max: u64, need: u64, capacity: u64) {
        let Some(e) = self.entry(i) else { return };
        let room = capacity
            .saturating_sub(self.committed())
            .saturating_sub(self.pending_total(Some(i)));
        let (reserved, burst) = regrant(reserved_of(e), e.burst.load(Ordering::Acquire), g, room);
        e.guarantee.store(g, Ordering::Release);
        e.pending.store(g - reserved, Ordering::Release);
        e.max.store(max, Ordering::Release);
        e.burst.store(burst.max(need), Ordering::Release);
        self.freed();
    }

    /// Gives this process's slot back (normal exit). A thread of ours
    /// still waiting is no longer counted (the exit ends it anyway; its
    /// guard then takes nothing off: see [`Waiting`]'s drop).
    pub fn leave(&self, slot: usize) {
        self.shm.release_own(slot, |s| self.free_proc(s));
        self.freed();
    }

    /// Frees process slot `s`, whose lock the caller holds (its own, or a
    /// dead owner's), with what its threads counted among the waiters.
    fn free_proc(&self, s: usize) {
        if let Some(p) = self.proc_slot(s) {
            p.state.store(EMPTY, Ordering::Release);
            self.uncount_waiting(p);
        }
    }

    /// Takes slot `p`'s waiters off the head's count (its lock held).
    /// Saturating: a count from a file a tenant scribbled on, or from an
    /// older library (which counted only in the head), never wraps.
    fn uncount_waiting(&self, p: &Proc) {
        let n = p.waiting.swap(0, Ordering::AcqRel);
        if n > 0 {
            sub_saturating(&self.head().waiters, n);
        }
    }

    /// Frees the slots of dead processes; starts the linger of the entries
    /// that lost their last process (their burst released: the memory was
    /// freed with the process) and frees those whose linger is over. How
    /// many slots and entries it freed or released a burst of. Under the
    /// file's lock.
    fn sweep_locked(&self) -> usize {
        self.sweep_locked_at(crate::gpu::monotonic_ns())
    }

    /// [`sweep_locked`](Self::sweep_locked) at `now` (CLOCK_MONOTONIC ns,
    /// read under the lock: a linger's start, stamped under it too, is
    /// never after it, unless stamped in another time namespace or by a
    /// tenant writing the file; see [`linger_over`]).
    fn sweep_locked_at(&self, now: u64) -> usize {
        let in_use = |s: usize| {
            self.proc_slot(s)
                .is_some_and(|p| p.state.load(Ordering::Acquire) != EMPTY)
        };
        let swept = self
            .shm
            .sweep_dead(MAX_PROCS, in_use, |s| self.free_proc(s));
        let live = self.procs_per_entry();
        let mut changed = 0;
        for (i, n) in live.iter().enumerate() {
            let Some(e) = self.entry(i) else { break };
            let state = e.state.load(Ordering::Acquire);
            if state == EMPTY {
                continue;
            }
            if *n > 0 {
                if e.lingering_since.load(Ordering::Acquire) != 0 {
                    e.lingering_since.store(0, Ordering::Release);
                }
                continue;
            }
            if state == READY && e.held.load(Ordering::Acquire) != 0 {
                // Its maker keeps it until it releases it: no linger, but
                // no burst either without a process to hold it.
                if e.burst.swap(0, Ordering::AcqRel) != 0 {
                    changed += 1;
                }
                continue;
            }
            let since = e.lingering_since.load(Ordering::Acquire);
            if state != READY || (since != 0 && linger_over(since, now)) {
                free_entry(e);
                changed += 1;
                continue;
            }
            if since == 0 {
                // 0 means "has a process": a clock at 0 never stamps it.
                e.lingering_since.store(now.max(1), Ordering::Release);
            }
            // No process holds memory under it: its burst goes back now,
            // and whatever wrote one since (a resize, a tenant) too.
            if e.burst.swap(0, Ordering::AcqRel) != 0 {
                changed += 1;
            }
        }
        if swept + changed > 0 {
            self.freed();
        }
        swept + changed
    }

    /// Per entry, how many process slots are in use under it (after a
    /// sweep: live processes).
    fn procs_per_entry(&self) -> [u32; MAX_ENTRIES] {
        let mut n = [0u32; MAX_ENTRIES];
        for s in 0..MAX_PROCS {
            if let Some(p) = self.proc_slot(s)
                && p.state.load(Ordering::Acquire) != EMPTY
                && let Some(c) = n.get_mut(p.entry.load(Ordering::Relaxed) as usize)
            {
                *c += 1;
            }
        }
        n
    }

    /// Sweeps the pool where this process has not in the last
    /// [`TIDY_EVERY_NS`] and nobody holds the pool's lock now (it never
    /// waits for it); whether it swept. For the readers of the room
    /// (`cuMemGetInfo`, NVML's memory info: what a framework sizes its
    /// caches by), so that a dead process's burst and a guarantee whose
    /// linger is over stop counting as taken as soon as someone looks,
    /// not only at the next join or reservation short of room. Never on
    /// the allocation path.
    pub fn tidy(&self) -> bool {
        self.tidy_at(crate::gpu::monotonic_ns())
    }

    /// [`tidy`](Self::tidy) as if at `now` (its rate only: the sweep reads
    /// the clock under the lock, as every sweep does).
    fn tidy_at(&self, now: u64) -> bool {
        let last = self.tidied_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < TIDY_EVERY_NS {
            return false;
        }
        self.tidied_at.store(now.max(1), Ordering::Relaxed);
        self.shm.try_with_flock(|| self.sweep_locked()).is_some()
    }

    /// A sweep at `now`, under the lock: a linger's end without waiting
    /// for it.
    #[cfg(test)]
    fn sweep_at(&self, now: u64) -> usize {
        self.shm
            .with_flock_bounded(TENANT_WAIT, || self.sweep_locked_at(now))
            .expect("nobody keeps the lock in a test")
    }

    /// What live entries have taken together: the part of their
    /// guarantees they reserved, and their bursts. The pool's rule: never
    /// more than the GPU's memory, whatever the order of arrival.
    pub fn committed(&self) -> u64 {
        (0..MAX_ENTRIES)
            .filter_map(|i| self.entry(i))
            .filter(|e| e.state.load(Ordering::Acquire) == READY)
            .map(|e| reserved_of(e).saturating_add(e.burst.load(Ordering::Acquire)))
            .fold(0u64, u64::saturating_add)
    }

    /// The guarantees still lent out (pending) of every live entry but
    /// `except`.
    fn pending_total(&self, except: Option<usize>) -> u64 {
        (0..MAX_ENTRIES)
            .filter(|&i| Some(i) != except)
            .filter_map(|i| self.entry(i))
            .filter(|e| e.state.load(Ordering::Acquire) == READY)
            .map(pending_of)
            .fold(0u64, u64::saturating_add)
    }

    /// The GPU's memory this process counts against: what its driver (or
    /// root's NVML) gave at join or register; an observer that gave none
    /// reads the file's.
    pub fn capacity(&self) -> u64 {
        match self.capacity.load(Ordering::Relaxed) {
            0 => self.head().capacity.load(Ordering::Acquire),
            c => c,
        }
    }

    /// Memory no tenant has reserved, holds or waits for: what a burst can
    /// still take (a pending guarantee goes first).
    pub fn room(&self) -> u64 {
        self.room_excluding(None)
    }

    /// [`room`](Self::room), not counting entry `except`'s pending part.
    fn room_excluding(&self, except: Option<usize>) -> u64 {
        self.capacity()
            .saturating_sub(self.committed())
            .saturating_sub(self.pending_total(except))
    }

    /// Entry `i`'s guarantee still lent out (0: all of it reserved).
    pub fn pending(&self, i: usize) -> u64 {
        self.entry(i).map_or(0, pending_of)
    }

    /// Takes `bytes` more for entry `i`: first of its pending guarantee
    /// (from memory nobody has reserved or holds: as borrowers free), then
    /// as burst, only from what nobody reserved, holds or waits for
    /// ([`Pool::room`]). A pending part taken stays taken even where the
    /// rest is refused (it is the tenant's). Err: the room for a burst
    /// there is (0 while its own guarantee is still partly pending: see
    /// [`Pool::pending`]).
    pub fn reserve(&self, i: usize, bytes: u64) -> Result<(), u64> {
        let Some(e) = self.entry(i) else {
            return Err(0);
        };
        // A tenant keeping the lock holds a burst a bounded time: refused
        // then (past its guarantee, nothing taken).
        self.shm
            .with_flock_bounded(TENANT_WAIT, || {
                let want = bytes.min(pending_of(e));
                let rest = bytes - want;
                let short = |p: &Self| {
                    p.capacity().saturating_sub(p.committed()) < want
                        || p.room_excluding(Some(i)) < rest
                };
                // Short of room: dead processes' bursts and the entries whose
                // linger is over may give it.
                if short(self) {
                    self.sweep_locked();
                }
                if want > 0 {
                    let free = self.capacity().saturating_sub(self.committed());
                    let take = want.min(free);
                    if take > 0 {
                        e.pending.fetch_sub(take, Ordering::AcqRel);
                    }
                    if take < want {
                        return Err(0);
                    }
                }
                if rest > 0 {
                    let room = self.room_excluding(Some(i));
                    if room < rest {
                        return Err(room);
                    }
                    e.burst.fetch_add(rest, Ordering::AcqRel);
                }
                Ok(())
            })
            .unwrap_or(Err(0))
    }

    /// The entries that hold a burst now (name, bytes), largest first: who
    /// borrows what a pending guarantee waits for. The names are other
    /// tenants' writing, for another tenant's log: control characters are
    /// shown as `?`.
    pub fn borrowers(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .entries()
            .into_iter()
            .filter(|e| e.burst > 0)
            .map(|e| {
                let name = e
                    .name
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                (name, e.burst)
            })
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        v
    }

    /// Memory was freed on this GPU: wakes whoever waits for it.
    ///
    /// With nobody waiting (the common case) this is a fence and a load: no
    /// write to the line every tenant of the GPU shares. Against
    /// [`Pool::waiting`]: the freer's fence orders its free before its look
    /// at `waiters`, the waiter's orders its count before its look at the
    /// memory, so either the freer sees the waiter and bumps the word, or
    /// the waiter sees the memory freed.
    pub fn freed(&self) {
        let h = self.head();
        std::sync::atomic::fence(Ordering::SeqCst);
        if h.waiters.load(Ordering::Relaxed) > 0 {
            h.freed_gen.fetch_add(1, Ordering::AcqRel);
            crate::gpu::futex_wake_all(&h.freed_gen);
        }
    }

    /// Counts the caller among the pool's waiters until the guard drops:
    /// take it before the first look at whether memory is available. None
    /// where this process holds no slot in the pool (never joined, or gave
    /// it back): a waiter is counted in its process's slot too, or a death
    /// while it waits could never be uncounted.
    ///
    /// The head's count first, then the slot's (the guard's drop undoes
    /// them in the other order): a process killed between the two leaves
    /// the head one too high (frees wake nobody in vain until the file is
    /// made anew), never one too low, which would let a free skip waking a
    /// live waiter (it would then sleep to its timeout).
    pub fn waiting(&self) -> Option<Waiting<'_>> {
        let slot = self.shm.own();
        let p = self.proc_slot(slot)?;
        let h = self.head();
        h.waiters.fetch_add(1, Ordering::SeqCst);
        p.waiting.fetch_add(1, Ordering::AcqRel);
        std::sync::atomic::fence(Ordering::SeqCst);
        Some(Waiting { pool: self, slot })
    }

    /// Whether a process other than this one is registered in the pool
    /// (one that may free memory; a process never waits for itself; a
    /// slice's maker holds none).
    pub fn others_live(&self) -> bool {
        let own = self.shm.own();
        (0..MAX_PROCS).any(|s| {
            s != own
                && self.proc_slot(s).is_some_and(|p| {
                    p.state.load(Ordering::Acquire) != EMPTY && p.pid.load(Ordering::Relaxed) != 0
                })
                && self.shm.slot_alive(s)
        })
    }

    /// The entries in the pool, lingering ones among them (`procs` 0: their
    /// guarantee is still counted), for observers.
    pub fn entries(&self) -> Vec<EntryView> {
        let procs = self.procs_per_entry();
        (0..MAX_ENTRIES)
            .filter_map(|i| self.entry(i).map(|e| (i, e)))
            .filter(|(_, e)| e.state.load(Ordering::Acquire) == READY)
            .map(|(i, e)| {
                let (name, tag) = crate::gpu::layout::decode_key(&key_of(e));
                EntryView {
                    index: i,
                    name,
                    tag,
                    guarantee: e.guarantee.load(Ordering::Acquire),
                    pending: pending_of(e),
                    burst: e.burst.load(Ordering::Acquire),
                    max: e.max.load(Ordering::Acquire),
                    held: e.held.load(Ordering::Acquire) != 0,
                    procs: procs[i],
                    lingering_since: match e.lingering_since.load(Ordering::Acquire) {
                        0 => None,
                        t => Some(t),
                    },
                }
            })
            .collect()
    }

    /// True once the file was truncated under this mapping (see
    /// [`crate::sigbus`]): what was read from it since is void.
    pub fn truncated(&self) -> bool {
        self.shm.truncated()
    }

    /// The fd, for a fork child that must not keep its parent's lock alive.
    pub fn raw_fd(&self) -> i32 {
        self.shm.raw_fd()
    }
}

/// A waiter of the pool ([`Pool::waiting`]): frees bump the wake-up word
/// while it lives.
pub struct Waiting<'a> {
    pool: &'a Pool,
    /// The process slot it is counted in.
    slot: usize,
}

impl Waiting<'_> {
    /// The wake-up word's value, read before looking whether memory is
    /// available (a free after this read ends the next sleep at once).
    pub fn generation(&self) -> u32 {
        self.pool.head().freed_gen.load(Ordering::Acquire)
    }

    /// Sleeps until a free after `seen` was read (or `timeout` passed).
    pub fn sleep(&self, seen: u32, timeout: std::time::Duration) {
        crate::gpu::futex_wait(
            &self.pool.head().freed_gen,
            seen,
            u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        );
    }
}

impl Drop for Waiting<'_> {
    /// The slot's count first, then the head's (see [`Pool::waiting`]).
    /// Whoever takes a waiter out of the slot takes it off the head: this
    /// drop, or [`Pool::leave`] (at exit, from another thread) where it
    /// came first, in which case there is nothing left to take. A slot
    /// given back (no longer ours) is not touched: another process may
    /// hold it now. Left open: a leave and that process's claim and wait,
    /// all between this drop's look at the slot and its decrement, would
    /// uncount that process's waiter (woken then at its 1 s timeout).
    fn drop(&mut self) {
        if self.pool.shm.own() != self.slot {
            return;
        }
        let Some(p) = self.pool.proc_slot(self.slot) else {
            return;
        };
        if p.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
            .is_ok()
        {
            sub_saturating(&self.pool.head().waiters, 1);
        }
    }
}

/// Whether a linger that started at `since` is over at `now`. A start
/// after `now` is over too: stamped with another clock (a file kept across
/// a reboot, a sweeper in a time namespace of its own) or written by a
/// tenant, it could otherwise keep a guarantee for ever; a linger is only
/// ever cut short this way, never drawn out.
fn linger_over(since: u64, now: u64) -> bool {
    since > now || now - since >= LINGER_NS
}

/// Who registers a slice ([`Pool::register`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Maker {
    /// Root's OCI hook or DRA plugin: the entry is kept until released.
    Root,
    /// A process that lives as long as the slice (`cuslice run`): the
    /// entry is kept while it lives, through a process slot of its own.
    Process,
}

/// A slice registered in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    pub entry: usize,
    /// The maker's process slot ([`Maker::Process`]).
    pub slot: Option<usize>,
    /// The part of its guarantee lent out to others' bursts when it
    /// registered: taken as they free.
    pub pending: u64,
}

/// An entry's (reserved, burst) once its guarantee becomes `g`: what it
/// reserved stays reserved up to `g`; a larger guarantee takes the rest
/// from its own burst first (memory it holds already), then from `room`
/// (what nobody reserved, holds or waits for); what is still missing is
/// pending (`g - reserved`).
fn regrant(reserved: u64, burst: u64, g: u64, room: u64) -> (u64, u64) {
    if g <= reserved {
        return (g, burst);
    }
    let from_burst = burst.min(g - reserved);
    let from_room = (g - reserved - from_burst).min(room);
    (reserved + from_burst + from_room, burst - from_burst)
}

/// An entry's pending part, never more than its guarantee (a tenant may
/// have written anything there).
fn pending_of(e: &Entry) -> u64 {
    e.pending
        .load(Ordering::Acquire)
        .min(e.guarantee.load(Ordering::Acquire))
}

/// What an entry has reserved of its guarantee.
fn reserved_of(e: &Entry) -> u64 {
    let g = e.guarantee.load(Ordering::Acquire);
    g.saturating_sub(e.pending.load(Ordering::Acquire).min(g))
}

/// Empties an entry (under the lock): its guarantee and burst leave the
/// sum.
fn free_entry(e: &Entry) {
    e.state.store(EMPTY, Ordering::Release);
    e.burst.store(0, Ordering::Release);
    e.guarantee.store(0, Ordering::Release);
    e.pending.store(0, Ordering::Release);
    e.held.store(0, Ordering::Release);
    e.lingering_since.store(0, Ordering::Release);
}

/// `a -= n`, stopping at 0.
fn sub_saturating(a: &AtomicU32, n: u32) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(n))
    });
}

fn key_of(e: &Entry) -> [u64; KEY_WORDS] {
    let mut w = [0u64; KEY_WORDS];
    for (i, a) in e.key.iter().enumerate() {
        w[i] = a.load(Ordering::Relaxed);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{Admit, Segment};
    use crate::testdir::TestDir;

    const MIB: u64 = 1 << 20;
    const UUID: [u8; 16] = [0x5a; 16];

    /// A tenant: its container's memory segment, and one process (its own
    /// open file descriptions of the segment and of the pool, as in a
    /// process of its own) per `procs`.
    struct Tenant {
        guarantee: u64,
        procs: Vec<(Segment, usize, usize)>,
        /// Per process, the sizes it holds.
        held: Vec<Vec<u64>>,
    }

    fn tenant(dir: &TestDir, pool_path: &Path, i: usize, g: u64, max: u64, procs: usize) -> Tenant {
        let seg_path = dir.path().join(format!("t{i}/memory.seg"));
        let mut v = Vec::new();
        for p in 0..procs {
            let seg = Segment::open_or_create(&seg_path).expect("segment");
            let slot = seg.claim_slot(p as u32 + 1).expect("slot");
            let (d, _) = seg.register_device_with(&UUID, g, max).expect("device");
            let pool: &'static Pool =
                Box::leak(Box::new(Pool::open_or_create(pool_path).expect("pool")));
            let (entry, _) = pool
                .join(&format!("t{i}"), 0, g, max, 1024 * MIB, 1)
                .expect("join");
            seg.link_pool(d, pool, entry);
            v.push((seg, slot, d));
        }
        Tenant {
            guarantee: g,
            held: vec![Vec::new(); procs],
            procs: v,
        }
    }

    fn used(t: &Tenant) -> u64 {
        let (seg, _, d) = &t.procs[0];
        seg.device_usage(*d).expect("usage").used
    }

    /// The promise of guaranteed memory: whatever the others burst, and
    /// whatever order allocations and frees come in from several processes
    /// of several tenants, the tenants together never hold more than the
    /// GPU, and a tenant below its guarantee always gets up to it.
    #[test]
    fn bursts_never_take_what_another_tenant_is_guaranteed() {
        let dir = TestDir::new("pool", "random");
        let pool_path = path(dir.path(), &UUID);
        // 1 GiB GPU; guarantees 128+192+256+64 = 640 MiB; maxima up to all.
        let spec = [(128, 1024), (192, 512), (256, 256), (64, 900)];
        let ts: Vec<Tenant> = spec
            .iter()
            .enumerate()
            .map(|(i, (g, m))| tenant(&dir, &pool_path, i, g * MIB, m * MIB, 2))
            .collect();
        let mut ts = ts;
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut granted, mut refused, mut probes) = (0, 0, 0);
        for _ in 0..20_000 {
            let t = rnd(ts.len() as u64) as usize;
            let p = rnd(2) as usize;
            let tn = &mut ts[t];
            if rnd(3) > 0 || tn.held[p].is_empty() {
                let size = (1 + rnd(96)) * MIB;
                let (seg, slot, d) = &tn.procs[p];
                match seg.admit_or_burst(*d, *slot, size).0 {
                    Admit::Granted => {
                        tn.held[p].push(size);
                        granted += 1;
                    }
                    _ => refused += 1,
                }
            } else {
                let k = rnd(tn.held[p].len() as u64) as usize;
                let size = tn.held[p].swap_remove(k);
                let (seg, slot, d) = &tn.procs[p];
                seg.credit(*d, *slot, size);
            }
            let total: u64 = ts.iter().map(used).sum();
            assert!(
                total <= 1024 * MIB,
                "tenants hold {total} bytes of a 1 GiB GPU"
            );
            // A tenant below its guarantee reaches it at once.
            let q = rnd(ts.len() as u64) as usize;
            let tq = &ts[q];
            let short = tq.guarantee.saturating_sub(used(tq));
            if short > 0 {
                let (seg, slot, d) = &tq.procs[0];
                assert_eq!(
                    seg.admit_or_burst(*d, *slot, short).0,
                    Admit::Granted,
                    "tenant {q} at {} of its {} guaranteed could not reach it",
                    used(tq),
                    tq.guarantee
                );
                seg.credit(*d, *slot, short);
                probes += 1;
            }
        }
        assert!(
            granted > 1000 && refused > 100 && probes > 1000,
            "{granted} {refused} {probes}"
        );
    }

    /// A burst is given back as the tenant frees, and a tenant whose
    /// processes are all gone leaves the pool (its guarantee too) once its
    /// linger is over.
    #[test]
    fn a_burst_is_given_back_as_it_is_freed_and_a_gone_tenant_leaves_the_pool() {
        let dir = TestDir::new("pool", "giveback");
        let pool_path = path(dir.path(), &UUID);
        let a = tenant(&dir, &pool_path, 0, 256 * MIB, 1024 * MIB, 1);
        let b = tenant(&dir, &pool_path, 1, 512 * MIB, 512 * MIB, 1);
        let (seg, slot, d) = &a.procs[0];
        let pool = seg.pool_link(*d).expect("linked").pool;
        assert_eq!(pool.room(), 256 * MIB);
        assert_eq!(seg.admit_or_burst(*d, *slot, 400 * MIB).0, Admit::Granted);
        assert_eq!(pool.room(), 112 * MIB, "144 MiB of burst taken");
        // Past the room: refused, with what there was.
        let (r, room) = seg.admit_or_burst(*d, *slot, 200 * MIB);
        assert_eq!((r, room), (Admit::Burst { short: 200 * MIB }, 112 * MIB));
        let waiter = pool.waiting().expect("joined");
        let seen = waiter.generation();
        seg.credit(*d, *slot, 300 * MIB);
        assert_ne!(waiter.generation(), seen, "a free wakes the pool's waiters");
        drop(waiter);
        assert_eq!(
            pool.room(),
            256 * MIB,
            "back to its guarantee: no burst held"
        );
        // A third tenant joins (128 MiB guaranteed) and its process ends:
        // its guarantee lingers, then goes back to the pool.
        let c: &'static Pool = Box::leak(Box::new(Pool::open_or_create(&pool_path).expect("c")));
        let (_, cs) = c
            .join("t9", 0, 128 * MIB, 128 * MIB, 1024 * MIB, 9)
            .expect("join");
        assert_eq!(pool.room(), 128 * MIB);
        assert_eq!(pool.entries().len(), 3);
        c.leave(cs);
        // A holds 100 MiB: 356 more need 200 MiB of burst, which only fits
        // once the gone tenant's guarantee is back: not within its linger.
        let (r, room) = seg.admit_or_burst(*d, *slot, 356 * MIB);
        assert_eq!((r, room), (Admit::Burst { short: 200 * MIB }, 128 * MIB));
        assert_eq!(pool.entries().len(), 3, "{:?}", pool.entries());
        let since = pool
            .entries()
            .iter()
            .find(|e| e.name == "t9")
            .and_then(|e| e.lingering_since)
            .expect("t9 lingers");
        pool.sweep_at(since + LINGER_NS);
        assert_eq!(pool.entries().len(), 2);
        assert_eq!(seg.admit_or_burst(*d, *slot, 356 * MIB).0, Admit::Granted);
        assert_eq!(pool.room(), 56 * MIB);
        let _ = b;
    }

    /// A process killed while it waits for memory never drops its waiter
    /// guard: once its slot is swept, the pool's waiter count is back to
    /// what live waiters account for, so frees stop writing the shared
    /// wake-up word (and making the wake-up syscall) for nobody.
    #[test]
    fn a_waiter_killed_while_it_waits_is_no_longer_counted_once_swept() {
        let dir = TestDir::new("pool", "killedwaiter");
        let pool_path = path(dir.path(), &UUID);
        let pool = Pool::open_or_create(&pool_path).expect("pool");
        let (entry, mine) = pool
            .join("live", 0, 64 * MIB, 64 * MIB, 1024 * MIB, 1)
            .expect("join");
        let live = pool.waiting().expect("joined");
        let mut fds = [0i32; 2];
        // SAFETY: pipe into a two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        let [rfd, wfd] = fds;
        // SAFETY: fork in a test; the child opens the pool (the parent's
        // mapping is not inherited: MADV_DONTFORK), joins it, counts two
        // waiters, says so and sleeps until killed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let child = Pool::open_or_create(&pool_path);
            let joined = child.as_ref().is_ok_and(|c| {
                c.join("dead", 0, 64 * MIB, 128 * MIB, 1024 * MIB, 2)
                    .is_ok()
            });
            if let (Ok(c), true) = (&child, joined)
                && let (Some(_a), Some(_b)) = (c.waiting(), c.waiting())
            {
                // SAFETY: one byte from a local to our pipe's write end.
                unsafe { libc::write(wfd, b"w".as_ptr().cast(), 1) };
                loop {
                    // SAFETY: sleeps until a signal (the parent's SIGKILL).
                    unsafe { libc::pause() };
                }
            }
            // SAFETY: leaving the child without running the test harness.
            unsafe { libc::_exit(1) };
        }
        assert!(pid > 0, "fork");
        // SAFETY: closing our copy of the write end, then one byte from
        // the read end into a local (0 bytes: the child failed and exited).
        let got = unsafe {
            libc::close(wfd);
            let mut b = 0u8;
            libc::read(rfd, (&mut b as *mut u8).cast(), 1)
        };
        // SAFETY: our pipe's read end.
        unsafe { libc::close(rfd) };
        assert_eq!(got, 1, "the child could not join the pool and wait");
        let h = pool.head();
        assert_eq!(h.waiters.load(Ordering::Acquire), 3);
        // SAFETY: killing and reaping our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
        assert_eq!(
            h.waiters.load(Ordering::Acquire),
            3,
            "nothing recovers the count before a sweep"
        );
        // A reservation short of room sweeps the dead process's slot.
        assert!(pool.reserve(entry, 2048 * MIB).is_err());
        let dead: Vec<u32> = pool
            .entries()
            .iter()
            .filter(|e| e.name == "dead")
            .map(|e| e.procs)
            .collect();
        assert_eq!(dead, [0], "the dead tenant's slot was swept (it lingers)");
        assert_eq!(
            h.waiters.load(Ordering::Acquire),
            1,
            "the killed process's waiters are still counted after its slot was swept"
        );
        for s in 0..MAX_PROCS {
            let w = pool
                .proc_slot(s)
                .expect("slot")
                .waiting
                .load(Ordering::Acquire);
            assert_eq!(w, u32::from(s == mine), "slot {s}");
        }
        let seen = live.generation();
        pool.freed();
        assert_ne!(live.generation(), seen, "the live waiter is still woken");
        drop(live);
        assert_eq!(h.waiters.load(Ordering::Acquire), 0);
        let before = h.freed_gen.load(Ordering::Acquire);
        pool.freed();
        assert_eq!(
            h.freed_gen.load(Ordering::Acquire),
            before,
            "a free with nobody waiting writes nothing"
        );
    }

    /// A slot given back while a thread of its process still waits (an
    /// exit) takes that waiter off the count, and the waiter's guard then
    /// takes nothing more (another process's waiter stays counted); a slot
    /// claimed with waiters of a dead owner in it gives them back.
    #[test]
    fn a_slot_given_back_or_claimed_again_takes_its_waiters_off_the_count() {
        let dir = TestDir::new("pool", "leavewaiter");
        let pool_path = path(dir.path(), &UUID);
        let a = Pool::open_or_create(&pool_path).expect("a");
        let b = Pool::open_or_create(&pool_path).expect("b");
        let (_, sa) = a.join("a", 0, 0, MIB, 1024 * MIB, 1).expect("join a");
        b.join("b", 0, 0, MIB, 1024 * MIB, 2).expect("join b");
        let h = a.head();
        let wa = a.waiting().expect("a joined");
        let wb = b.waiting().expect("b joined");
        assert_eq!(h.waiters.load(Ordering::Acquire), 2);
        a.leave(sa);
        assert_eq!(
            h.waiters.load(Ordering::Acquire),
            1,
            "a's waiter left with it"
        );
        assert!(
            a.waiting().is_none(),
            "no slot: nothing to count a waiter in"
        );
        drop(wa);
        assert_eq!(
            h.waiters.load(Ordering::Acquire),
            1,
            "a's late guard uncounted b's waiter"
        );
        drop(wb);
        assert_eq!(h.waiters.load(Ordering::Acquire), 0);
        // A free slot with a dead owner's waiters still in it (its owner
        // died after a join's sweep, before its claim): the next claim,
        // which takes the first free slot, gives them back.
        let stale = (0..MAX_PROCS)
            .find(|&s| a.proc_slot(s).expect("slot").state.load(Ordering::Acquire) == EMPTY)
            .expect("a free slot");
        a.proc_slot(stale)
            .expect("slot")
            .waiting
            .store(2, Ordering::Release);
        h.waiters.fetch_add(3, Ordering::AcqRel);
        let c = Pool::open_or_create(&pool_path).expect("c");
        let (_, sc) = c.join("c", 0, 0, MIB, 1024 * MIB, 3).expect("join c");
        assert_eq!(sc, stale);
        assert_eq!(h.waiters.load(Ordering::Acquire), 1);
        assert_eq!(
            c.proc_slot(sc)
                .expect("slot")
                .waiting
                .load(Ordering::Acquire),
            0
        );
    }

    fn view(p: &Pool, name: &str) -> Option<EntryView> {
        p.entries().into_iter().find(|e| e.name == name)
    }

    /// A tenant whose last process died keeps its guarantee in the pool
    /// for the linger (what bursts may take leaves it out), its burst
    /// released at once; its next process takes the same entry back,
    /// counted once; a sweep after the linger frees it.
    #[test]
    fn a_gone_tenants_guarantee_lingers_and_its_next_process_takes_it_back() {
        let dir = TestDir::new("pool", "linger");
        let pool_path = path(dir.path(), &UUID);
        let b = Pool::open_or_create(&pool_path).expect("b");
        let (eb, _) = b
            .join("b", 0, 256 * MIB, 1024 * MIB, 1024 * MIB, 2)
            .expect("join b");
        // A: 512 MiB guaranteed; its process bursts 100 MiB and dies (its
        // descriptor closed: its slot's lock goes with it, as at a death).
        let a = Pool::open_or_create(&pool_path).expect("a");
        let (ea, _) = a
            .join("a", 0, 512 * MIB, 1024 * MIB, 1024 * MIB, 1)
            .expect("join a");
        a.reserve(ea, 100 * MIB).expect("a's burst");
        assert_eq!(b.room(), 156 * MIB);
        drop(a);
        // B, short of room, sweeps: A's burst comes back, its guarantee
        // does not.
        assert_eq!(b.reserve(eb, 300 * MIB), Err(256 * MIB));
        let va = view(&b, "a").expect("a lingers");
        assert_eq!((va.procs, va.guarantee, va.burst), (0, 512 * MIB, 0));
        let since = va.lingering_since.expect("its linger's start");
        assert_eq!(b.reserve(eb, 256 * MIB), Ok(()));
        assert_eq!(b.room(), 0);
        // Within the linger, a sweep keeps it.
        b.sweep_at(since + LINGER_NS - 1);
        assert_eq!(b.committed(), 1024 * MIB);
        // A's next process: the same entry, its guarantee counted once.
        let a2 = Pool::open_or_create(&pool_path).expect("a2");
        let (ea2, _) = a2
            .join("a", 0, 512 * MIB, 1024 * MIB, 1024 * MIB, 3)
            .expect("join a again");
        assert_eq!(ea2, ea);
        assert_eq!(b.entries().len(), 2);
        assert_eq!(b.committed(), 1024 * MIB);
        let va = view(&b, "a").expect("a");
        assert_eq!((va.procs, va.lingering_since), (1, None));
        // Gone again: a sweep after the linger frees it.
        drop(a2);
        b.sweep_at(crate::gpu::monotonic_ns());
        let since = view(&b, "a")
            .and_then(|v| v.lingering_since)
            .expect("a lingers again");
        b.sweep_at(since + LINGER_NS - 1);
        assert!(view(&b, "a").is_some(), "freed before its linger was over");
        b.sweep_at(since + LINGER_NS);
        assert_eq!(view(&b, "a"), None);
        assert_eq!(b.room(), 512 * MIB);
        // A start after the sweeper's clock (another clock's stamp, or a
        // tenant's) ends the linger at once rather than never.
        let c = Pool::open_or_create(&pool_path).expect("c");
        c.join("c", 0, 64 * MIB, 64 * MIB, 1024 * MIB, 4)
            .expect("join c");
        drop(c);
        let now = crate::gpu::monotonic_ns();
        b.sweep_at(now);
        assert!(view(&b, "c").is_some_and(|v| v.lingering_since == Some(now)));
        b.sweep_at(now - 1);
        assert_eq!(view(&b, "c"), None);
    }

    /// A look at the room (`cuMemGetInfo`) tidies the pool: a dead
    /// process's burst stops counting as taken at once, without waiting
    /// for a join or a reservation short of room; at most once every
    /// [`TIDY_EVERY_NS`] per process, and never waiting for a lock another
    /// holds.
    #[test]
    fn a_look_at_the_room_gives_back_a_dead_processs_burst() {
        let dir = TestDir::new("pool", "tidy");
        let pool_path = path(dir.path(), &UUID);
        let b = Pool::open_or_create(&pool_path).expect("b");
        b.join("b", 0, 256 * MIB, 1024 * MIB, 1024 * MIB, 2)
            .expect("join b");
        let a = Pool::open_or_create(&pool_path).expect("a");
        let (ea, _) = a
            .join("a", 0, 512 * MIB, 1024 * MIB, 1024 * MIB, 1)
            .expect("join a");
        a.reserve(ea, 100 * MIB).expect("a's burst");
        // A's process dies (its descriptor closed: its slot's lock goes).
        drop(a);
        assert_eq!(b.room(), 156 * MIB, "nothing swept before anyone looks");
        // Another holds the pool's lock: no wait, no sweep.
        let other = Pool::open_or_create(&pool_path).expect("other");
        let t0 = 1_000_000_000_000;
        assert!(
            !other.shm.with_flock(|| b.tidy_at(t0)),
            "swept under another's lock"
        );
        assert_eq!(b.room(), 156 * MIB);
        // Within TIDY_EVERY_NS of that try: not again.
        assert!(!b.tidy_at(t0 + TIDY_EVERY_NS - 1));
        assert_eq!(b.room(), 156 * MIB);
        assert!(b.tidy_at(t0 + TIDY_EVERY_NS));
        assert_eq!(b.room(), 256 * MIB, "a's burst is back, its guarantee kept");
        let va = view(&b, "a").expect("a lingers");
        assert_eq!((va.procs, va.burst, va.guarantee), (0, 0, 512 * MIB));
    }

    /// With every entry taken, a new tenant's process takes the entry that
    /// lingered longest: the linger never shuts a tenant out of the pool.
    #[test]
    fn a_lingering_entry_gives_way_when_every_entry_is_taken() {
        let dir = TestDir::new("pool", "full");
        let pool_path = path(dir.path(), &UUID);
        let open = || Pool::open_or_create(&pool_path).expect("pool");
        let mut live = Vec::new();
        for i in 0..MAX_ENTRIES - 2 {
            let p = open();
            p.join(&format!("live{i}"), 0, MIB, MIB, 1024 * MIB, 1)
                .expect("join");
            live.push(p);
        }
        for name in ["old", "young"] {
            let p = open();
            p.join(name, 0, MIB, MIB, 1024 * MIB, 1).expect("join");
            drop(p);
            live[0].sweep_at(crate::gpu::monotonic_ns());
        }
        assert_eq!(live[0].entries().len(), MAX_ENTRIES);
        let new = open();
        new.join("new", 0, MIB, MIB, 1024 * MIB, 1)
            .expect("a new tenant joins a full pool");
        let names: Vec<String> = live[0].entries().into_iter().map(|e| e.name).collect();
        assert!(
            names.contains(&"new".into())
                && names.contains(&"young".into())
                && !names.contains(&"old".into()),
            "{names:?}"
        );
        let other = open();
        let e = other
            .join("another", 0, MIB, MIB, 1024 * MIB, 1)
            .expect("the young one gives way too");
        assert!(view(&other, "young").is_none(), "{e:?}");
        let err = open()
            .join("one-more", 0, MIB, MIB, 1024 * MIB, 1)
            .expect_err("every entry has a live process");
        assert!(err.0.contains("in use by live processes"), "{}", err.0);
    }

    /// A tenant that arrives while its guarantee is lent out (issue 41's
    /// late arrival): it reserves at once only what nobody reserved or
    /// holds, the rest is pending; the earlier tenant's guarantee is
    /// reachable at once; the borrower keeps its burst; what the borrower
    /// frees goes to the pending guarantee before any new burst.
    #[test]
    fn a_late_guarantee_is_pending_while_lent_out_and_taken_back_as_the_borrower_frees() {
        let dir = TestDir::new("pool", "late");
        let pool_path = path(dir.path(), &UUID);
        // 1 GiB GPU. C is guaranteed 512 MiB (holds nothing yet); A is
        // guaranteed 128 MiB and bursts into all that nobody is
        // guaranteed: 384 MiB more.
        let c = tenant(&dir, &pool_path, 0, 512 * MIB, 512 * MIB, 1);
        let a = tenant(&dir, &pool_path, 1, 128 * MIB, 1024 * MIB, 1);
        let (aseg, aslot, ad) = &a.procs[0];
        assert_eq!(
            aseg.admit_or_burst(*ad, *aslot, 512 * MIB).0,
            Admit::Granted
        );
        // B, guaranteed 256 MiB, arrives now: nothing is free for it.
        let b = tenant(&dir, &pool_path, 2, 256 * MIB, 256 * MIB, 1);
        let (bseg, bslot, bd) = &b.procs[0];
        let pool = bseg.pool_link(*bd).expect("linked").pool;
        let e = view(pool, "t2").expect("B's entry");
        assert_eq!((e.guarantee, e.pending), (256 * MIB, 256 * MIB));
        assert!(pool.committed() <= 1024 * MIB, "{}", pool.committed());
        // B is refused (the driver would have given it C's memory before).
        assert!(matches!(
            bseg.admit_or_burst(*bd, *bslot, 64 * MIB).0,
            Admit::Burst { .. }
        ));
        assert_eq!(pool.borrowers(), vec![("t1".to_string(), 384 * MIB)]);
        // C reaches all of its guarantee at once, beside the borrower.
        let (cseg, cslot, cd) = &c.procs[0];
        assert_eq!(
            cseg.admit_or_burst(*cd, *cslot, 512 * MIB).0,
            Admit::Granted
        );
        assert_eq!(used(&c) + used(&a), 1024 * MIB);
        // A frees 200 MiB: they go to B's pending guarantee, not to a new
        // burst (A's own, here).
        aseg.credit(*ad, *aslot, 200 * MIB);
        assert!(matches!(
            aseg.admit_or_burst(*ad, *aslot, 8 * MIB).0,
            Admit::Burst { .. }
        ));
        assert_eq!(
            bseg.admit_or_burst(*bd, *bslot, 200 * MIB).0,
            Admit::Granted
        );
        assert_eq!(view(pool, "t2").expect("B").pending, 56 * MIB);
        assert!(matches!(
            bseg.admit_or_burst(*bd, *bslot, 40 * MIB).0,
            Admit::Burst { .. }
        ));
        // The borrower frees the rest of its burst: B reaches its whole
        // guarantee; nobody ever held more than the GPU.
        aseg.credit(*ad, *aslot, 184 * MIB);
        assert_eq!(bseg.admit_or_burst(*bd, *bslot, 56 * MIB).0, Admit::Granted);
        assert_eq!(view(pool, "t2").expect("B").pending, 0);
        assert_eq!(used(&a) + used(&b) + used(&c), 896 * MIB);
        assert!(pool.committed() <= 1024 * MIB);
    }

    /// A slice registered by its maker holds its guarantee before its first
    /// process and between its processes (no linger runs out on it), and
    /// leaves the pool when released; a guarantee that could never fit is
    /// refused, counted against the capacity the maker gives, not the
    /// file's.
    #[test]
    fn a_registered_slice_keeps_its_guarantee_without_a_process_until_released() {
        let dir = TestDir::new("pool", "registered");
        let pool_path = path(dir.path(), &UUID);
        let root = Pool::open_or_create(&pool_path).expect("pool");
        let r = root
            .register("c", 7, 600 * MIB, 600 * MIB, 1024 * MIB, Maker::Root)
            .expect("fits");
        assert_eq!((r.pending, r.slot), (0, None));
        // A forged capacity in the file changes nothing root decides.
        root.head().capacity.store(1 << 62, Ordering::Release);
        let err = root
            .register("d", 0, 500 * MIB, 500 * MIB, 1024 * MIB, Maker::Root)
            .expect_err("600 + 500 MiB guaranteed on a 1 GiB GPU");
        assert!(err.0.contains("does not fit"), "{}", err.0);
        // No process, long past any linger: still there.
        root.sweep_at(crate::gpu::monotonic_ns() + 10 * LINGER_NS);
        let e = view(&root, "c").expect("kept");
        assert!(e.held && e.procs == 0 && e.guarantee == 600 * MIB, "{e:?}");
        // A burster next to it gets only what is left.
        let a = tenant(&dir, &pool_path, 1, 64 * MIB, 1024 * MIB, 1);
        let (aseg, aslot, ad) = &a.procs[0];
        let (r, room) = aseg.admit_or_burst(*ad, *aslot, 512 * MIB);
        assert_eq!((r, room), (Admit::Burst { short: 448 * MIB }, 360 * MIB));
        // A process of the slice joins (from the root-written quota file)
        // and leaves: the guarantee is the maker's, and stays.
        let p = Pool::open_or_create(&pool_path).expect("pool");
        let (_, slot) = p.join("c", 7, MIB, MIB, 1024 * MIB, 42).expect("join");
        assert_eq!(view(&p, "c").expect("c").guarantee, 600 * MIB);
        p.leave(slot);
        root.sweep_at(crate::gpu::monotonic_ns() + 10 * LINGER_NS);
        assert_eq!(view(&root, "c").expect("kept").guarantee, 600 * MIB);
        assert_eq!(root.release("c", 7), (true, None));
        assert!(view(&root, "c").is_none());
        assert_eq!(root.room(), 1024 * MIB - 64 * MIB);
        // A maker process (`cuslice run`): kept while it lives, not a
        // process others wait on.
        let run = Pool::open_or_create(&pool_path).expect("pool");
        let r = run
            .register("r", 0, 256 * MIB, 256 * MIB, 1024 * MIB, Maker::Process)
            .expect("fits");
        assert!(r.slot.is_some());
        assert!(!p.others_live() || a.procs.len() == 1);
        run.sweep_at(crate::gpu::monotonic_ns() + 10 * LINGER_NS);
        assert_eq!(view(&run, "r").expect("kept").guarantee, 256 * MIB);
    }

    /// The promise in any order: tenants arrive (some registered before
    /// their first process, some not), burst, free and leave at random;
    /// the tenants together never hold more than the GPU, and a tenant
    /// below what it reserved of its guarantee always gets up to it at
    /// once, and a pending part is only ever lent to bursts taken before
    /// it arrived.
    #[test]
    fn guarantees_hold_in_any_order_of_arrival() {
        let dir = TestDir::new("pool", "anyorder");
        let pool_path = path(dir.path(), &UUID);
        let spec = [(128, 1024), (192, 512), (256, 256), (64, 900), (300, 300)];
        let mut ts: Vec<Option<Tenant>> = spec.iter().map(|_| None).collect();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut granted, mut probes, mut pendings) = (0, 0, 0);
        for step in 0..20_000 {
            let t = rnd(ts.len() as u64) as usize;
            if ts[t].is_none() {
                if rnd(50) == 0 || step == 0 {
                    let (g, m) = spec[t];
                    ts[t] = Some(tenant(&dir, &pool_path, t, g * MIB, m * MIB, 2));
                }
                continue;
            }
            let tn = ts[t].as_mut().expect("arrived");
            let p = rnd(2) as usize;
            if rnd(3) > 0 || tn.held[p].is_empty() {
                let size = (1 + rnd(96)) * MIB;
                let (seg, slot, d) = &tn.procs[p];
                if seg.admit_or_burst(*d, *slot, size).0 == Admit::Granted {
                    tn.held[p].push(size);
                    granted += 1;
                }
            } else {
                let k = rnd(tn.held[p].len() as u64) as usize;
                let size = tn.held[p].swap_remove(k);
                let (seg, slot, d) = &tn.procs[p];
                seg.credit(*d, *slot, size);
            }
            let total: u64 = ts.iter().flatten().map(used).sum();
            assert!(total <= 1024 * MIB, "tenants hold {total} bytes of 1 GiB");
            let q = rnd(ts.len() as u64) as usize;
            let Some(tq) = ts[q].as_ref() else { continue };
            let (seg, slot, d) = &tq.procs[0];
            let link = seg.pool_link(*d).expect("linked");
            let pending = link.pool.pending(link.entry);
            if pending > 0 {
                pendings += 1;
            }
            let short = (tq.guarantee - pending).saturating_sub(used(tq));
            if short > 0 {
                assert_eq!(
                    seg.admit_or_burst(*d, *slot, short).0,
                    Admit::Granted,
                    "tenant {q} at {} of its {} reserved could not reach it",
                    used(tq),
                    tq.guarantee - pending
                );
                seg.credit(*d, *slot, short);
                probes += 1;
            }
        }
        assert!(
            granted > 1000 && probes > 500 && pendings > 0,
            "{granted} {probes} {pendings}"
        );
    }

    #[test]
    fn a_raised_guarantee_takes_its_own_burst_then_the_room_and_the_rest_is_pending() {
        // Lowered: reserved down to it, burst untouched.
        assert_eq!(regrant(500, 100, 300, 0), (300, 100));
        // Raised by 300: 100 of its own burst, 150 of room, 50 pending.
        assert_eq!(regrant(500, 100, 800, 150), (750, 0));
        // Room enough: all reserved.
        assert_eq!(regrant(500, 0, 800, 1000), (800, 0));
    }

    /// H4 for the pool: a tenant keeping the pool file's lock holds
    /// another tenant's start and burst only a bounded time (the start
    /// then fails closed naming the file and the holder), and root's
    /// release goes on without it.
    #[test]
    fn a_tenant_keeping_the_pools_lock_holds_a_start_and_a_release_only_a_bounded_time() {
        let dir = TestDir::new("pool", "kept");
        let pool_path = path(dir.path(), &UUID);
        let root = Pool::open_or_create(&pool_path).expect("pool");
        root.register("c", 1, 64 * MIB, 64 * MIB, 1024 * MIB, Maker::Root)
            .expect("fits");
        let hostile = Pool::open_or_create(&pool_path).expect("pool");
        // SAFETY: flock on the hostile tenant's own descriptor.
        assert_eq!(unsafe { libc::flock(hostile.raw_fd(), libc::LOCK_EX) }, 0);
        let t0 = std::time::Instant::now();
        let err = Pool::open_or_create(&pool_path)
            .expect("pool")
            .join("t", 0, 64 * MIB, 64 * MIB, 1024 * MIB, 1)
            .expect_err("the lock is kept");
        let waited = t0.elapsed();
        assert!(
            waited >= TENANT_WAIT && waited < TENANT_WAIT * 6,
            "{waited:?}"
        );
        assert!(
            err.0.contains(&pool_path.display().to_string())
                && err.0.contains(&format!("pid {}", std::process::id())),
            "{}",
            err.0
        );
        let (found, busy) = root.release("c", 1);
        assert!(found && busy.is_some());
        assert!(view(&root, "c").is_none(), "released without the lock");
    }

    /// A borrower's name reaches another tenant's log line: whatever the
    /// borrower wrote there, no control character gets through.
    #[test]
    fn a_borrowers_name_reaches_a_log_without_control_characters() {
        let dir = TestDir::new("pool", "names");
        let p = Pool::open_or_create(&path(dir.path(), &UUID)).expect("pool");
        let (i, _) = p
            .join("a\x1b[2Jb", 0, MIB, 8 * MIB, 1024 * MIB, 1)
            .expect("join");
        p.entry(i)
            .expect("entry")
            .burst
            .store(MIB, Ordering::Release);
        assert_eq!(p.borrowers(), vec![("a?[2Jb".to_string(), MIB)]);
    }
}
