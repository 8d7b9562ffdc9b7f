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

mod file;
mod register;
mod reserve;
mod sweep;
mod wait;

pub use wait::Waiting;

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
mod tests;
