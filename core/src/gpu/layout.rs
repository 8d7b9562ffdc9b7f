//! The per-GPU segment's shared-memory format: the header, the scheduler
//! word block, the tenant and process entries, and what only touches the
//! format (opening the file, registering tenants and processes, sweeping
//! dead ones, reading entries for observers). What the fields *mean* to
//! the scheduler, and every decision taken on them, is in `policy`.
//!
//! The layout is version 1 and stays compatible: fields added since the
//! first release live in what was padding (the entry sizes, which the
//! header records, are unchanged), and a library that does not know them
//! leaves them at 0, which every policy reads as "nothing new" (no latency
//! class, no demand recorded). A field that does not fit in the padding
//! needs a new `VERSION`.
//!
//! Layout 1.4 changed no offset: a tenant entry's 64 name bytes are now
//! the name (bytes 0..56) and its slice's tag (bytes 56..64), so that
//! entries are per slice, not per name ([`Tenant::name`]).

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use crate::shm::{Header, Layout, ROOT_WAIT, Shm, TENANT_WAIT};
pub use crate::shm::{LockBusy, SegmentError};

pub const MAGIC: [u8; 8] = *b"CUSLGPU\0";
pub const VERSION: u32 = 1;
pub const MAX_TENANTS: usize = 32;
pub const MAX_PROCS: usize = 512;
pub const NAME_BYTES: usize = 64;
/// Of a tenant entry's `name`, the bytes that hold the tenant's name; the
/// last 8 hold its slice's tag (see [`Tenant::name`]).
pub const NAME_TEXT_BYTES: usize = 56;
const _: () = assert!(NAME_TEXT_BYTES + 8 == NAME_BYTES && NAME_TEXT_BYTES.is_multiple_of(8));

/// The lease and the hand-over words, one per GPU.
#[repr(C, align(64))]
pub struct Sched {
    /// 0: free; else the holder's process slot + 1.
    pub lease: AtomicU32,
    /// Futex word: bumped whenever the lease is released.
    pub generation: AtomicU32,
    pub slice_start: AtomicU64,
    pub deadline: AtomicU64,
    pub holder_tenant: AtomicU32,
    /// Lease hand-overs (display and tests).
    pub handovers: AtomicU64,
    /// Last sweep for dead processes (rate limit).
    pub swept_at: AtomicU64,
    /// Since layout 1.1 (padding before): a hint, the latest time until
    /// which some latency tenant has work in flight (ns, CLOCK_MONOTONIC).
    /// Only ever a shortcut: the tenants' own `active_until` decide.
    pub lat_until: AtomicU64,
    /// Futex word: bumped when a latency tenant's work in flight ends, so
    /// that tenants holding back for it resume at once.
    pub lat_gen: AtomicU32,
    /// Processes sleeping on `lat_gen` (the waker skips the syscall at 0).
    pub lat_waiters: AtomicU32,
}

/// A tenant entry's index, and its previous (share, max) where a
/// registration changed them.
pub type Registered = (usize, Option<(u32, u32)>);

/// A tenant entry's `state`.
pub const EMPTY: u32 = 0;
pub const READY: u32 = 2;

/// A tenant entry's `class`.
pub const CLASS_STANDARD: u32 = 0;
pub const CLASS_LATENCY: u32 = 1;

/// A share (1..=100) and ceiling (share..=100) as registration writes
/// them: the one clamp of both, for a quota file's ([`normalized`]) and
/// for an entry the audit finds out of range (`audit::check_tenants`).
pub(crate) fn share_and_ceiling(share: u32, max: u32) -> (u32, u32) {
    let share = share.clamp(1, 100);
    (share, max.clamp(share, 100))
}

/// A tenant's share (1..=100), ceiling (share..=100) and class word, as
/// its entry holds them (registration, and the audit that checks them).
pub(crate) fn normalized(spec: &TenantSpec) -> (u32, u32, u32) {
    let (share, max) = share_and_ceiling(spec.share, spec.max);
    let class = if spec.latency {
        CLASS_LATENCY
    } else {
        CLASS_STANDARD
    };
    (share, max, class)
}

#[repr(C, align(64))]
pub struct Tenant {
    pub state: AtomicU32,
    /// Guaranteed share, percent 1..=100: the weight.
    pub share: AtomicU32,
    /// Ceiling, percent 1..=100 (100: none).
    pub max: AtomicU32,
    /// Processes of this tenant waiting for the lease.
    pub waiting: AtomicU32,
    /// Live processes registered on this GPU.
    pub procs: AtomicU32,
    /// The entry's key. Bytes 0..56: the tenant's name, NUL-padded (names
    /// are at most 56 bytes: `config::TENANT_MAX_LEN`). Bytes 56..64
    /// (the last word): its slice's tag, little-endian
    /// (`Config::slice_tag`; 0: no slice). Processes share an entry only
    /// where both are theirs, so a container given another's tenant name
    /// gets an entry of its own (layout 1.4; up to 1.3 these 64 bytes were
    /// the name alone: an untagged name of up to 56 bytes reads the same in
    /// both, so a process of either build finds the other's entry).
    pub name: [AtomicU64; NAME_BYTES / 8],
    /// Virtual time: charged ns x 100 / share.
    pub vtime: AtomicU64,
    /// GPU time charged, ns.
    pub used_ns: AtomicU64,
    /// Time its processes spent waiting for the GPU, ns.
    pub throttled_ns: AtomicU64,
    /// Ceiling bucket, ns (may go negative: debt).
    pub tokens: AtomicI64,
    pub tokens_at: AtomicU64,
    /// Last time it held (or was granted) the lease (ns, CLOCK_MONOTONIC).
    pub last_active: AtomicU64,
    /// Ceiling bucket's burst, ns (0: one slice).
    pub burst_ns: AtomicU64,
    /// 1 after the tenant's ceiling ended its hold: it takes the lease again
    /// only once it has saved up a whole burst (long on/off periods).
    pub recharging: AtomicU32,
    // ---- layout 1.1: in what was padding -------------------------------
    /// `CLASS_STANDARD` or `CLASS_LATENCY` (set at registration).
    pub class: AtomicU32,
    /// 1 while the tenant competes for a saturated GPU: its launches go
    /// through the lease. 0: its demand is under its share and it launches
    /// freely (see `policy`).
    pub heavy: AtomicU32,
    /// Threads of latency processes of this tenant inside a synchronising
    /// call (their work is in flight).
    pub in_sync: AtomicU32,
    /// Latency class: work in flight until then (ns).
    pub active_until: AtomicU64,
    /// Demand window: start (ns) and GPU time charged since.
    pub win_start: AtomicU64,
    pub win_used: AtomicU64,
    /// 1 if a process of the tenant waited for the lease in this window.
    pub win_waited: AtomicU32,
    /// The last whole window's charged GPU time per wall time, per mille
    /// (display: what the tenant asks of the GPU).
    pub demand_pm: AtomicU32,
}

// The layout is part of the segment's version: the entry sizes are in the
// header, and every field that existed in the first release keeps its
// offset (a new field must fit in the padding, or bump VERSION).
const _: () = assert!(size_of::<Tenant>() == 192);
const _: () = assert!(offset_of!(Tenant, recharging) == 144);
const _: () = assert!(offset_of!(Tenant, demand_pm) == 188);
const _: () = assert!(size_of::<Sched>() == 64);
const _: () = assert!(offset_of!(Sched, swept_at) == 40);

pub const PROC_FREE: u32 = 0;
pub const PROC_LIVE: u32 = 1;

#[repr(C, align(64))]
pub struct Proc {
    pub state: AtomicU32,
    pub tenant: AtomicU32,
    pub pid: AtomicU32,
    pub waiting: AtomicU32,
    /// When this process last tried for the lease while waiting (ns).
    pub polled_at: AtomicU64,
    /// Layout 1.1: threads of this (latency) process inside a synchronising
    /// call; given back to its tenant's `in_sync` if the process dies.
    pub syncing: AtomicU32,
    /// Layout 1.2: while this process holds the lease, since when it has
    /// been idle (its synchronising call returned and it launched nothing
    /// since; ns, 0: not idle). A waiter takes the lease from a holder idle
    /// for `IDLE_HANDOFF_NS` (`policy`).
    pub idle_since: AtomicU64,
    /// Layout 1.3: GPU time charged to its tenant for this process's work
    /// in flight while nothing measured what its kernels ran (a process
    /// launching freely, alone: charged its wall time in flight, an upper
    /// bound; ns since it registered). Display only: `cuslice status` sets
    /// this part against NVML's per-process time.
    pub bound_ns: AtomicU64,
}

const _: () = assert!(size_of::<Proc>() == 64);
const _: () = assert!(offset_of!(Proc, polled_at) == 16);
const _: () = assert!(offset_of!(Proc, idle_since) == 32);
const _: () = assert!(offset_of!(Proc, bound_ns) == 40);

const HEADER: usize = size_of::<Header>();
const SCHED: usize = size_of::<Sched>();
pub const SIZE: usize =
    HEADER + SCHED + MAX_TENANTS * size_of::<Tenant>() + MAX_PROCS * size_of::<Proc>();

fn layout() -> Layout {
    Layout {
        what: "GPU segment",
        header: Header {
            magic: MAGIC,
            version: VERSION,
            header_size: HEADER as u32,
            total_size: SIZE as u64,
            params: [
                MAX_TENANTS as u32,
                MAX_PROCS as u32,
                SCHED as u32,
                size_of::<Tenant>() as u32,
                size_of::<Proc>() as u32,
                NAME_BYTES as u32,
                0,
                0,
            ],
        },
        param_names: [
            "tenant count",
            "process count",
            "scheduler size",
            "tenant size",
            "process size",
            "name size",
            "-",
            "-",
        ],
    }
}

/// What a tenant registers with (`Config::tenant_spec`: the quota file
/// decides it; the segment stores it).
pub use crate::config::TenantSpec;

/// What a tenant looks like from outside (status, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantView {
    pub index: usize,
    pub name: String,
    /// Its slice's tag (0: none): with the name, what the entry is found
    /// by (see [`Tenant::name`]).
    pub tag: u64,
    pub share: u32,
    pub max: u32,
    pub used_ns: u64,
    pub throttled_ns: u64,
    pub waiting: u32,
    pub procs: u32,
    pub last_active: u64,
    /// The latest sign of activity (ns, CLOCK_MONOTONIC): the later of
    /// `last_active` (lease) and the start of its demand window, which
    /// moves while a tenant launches freely (its `last_active` does not).
    pub last_activity: u64,
    /// Latency class.
    pub latency: bool,
    /// Competing for a saturated GPU (launches through the lease).
    pub heavy: bool,
    /// The last demand window's charged GPU time per wall time, per mille.
    pub demand_pm: u32,
}

pub struct GpuSegment {
    pub(super) shm: Shm,
    pub path: PathBuf,
    /// When this process's current hold began (ns; process-local;
    /// `NOT_HELD` if none). The holder charges itself from this, not from
    /// the shared `slice_start` that any tenant can write.
    pub(super) held_since: AtomicU64,
}

pub(super) const NOT_HELD: u64 = u64::MAX;

impl GpuSegment {
    /// Opens `<dir>/<uuid>.seg`, creating it if absent. The directory is
    /// shared by every tenant of the host, so it is created world-usable
    /// with the sticky bit; each file must belong to the opening user.
    pub fn open_or_create(path: &Path) -> Result<GpuSegment, SegmentError> {
        let shm = Shm::open_or_create(path, &layout(), 0o1777)?;
        Ok(GpuSegment {
            shm,
            path: path.to_path_buf(),
            held_since: AtomicU64::new(NOT_HELD),
        })
    }

    pub fn open_read_only(path: &Path) -> Result<GpuSegment, SegmentError> {
        let shm = Shm::open_read_only(path, &layout())?;
        Ok(GpuSegment {
            shm,
            path: path.to_path_buf(),
            held_since: AtomicU64::new(NOT_HELD),
        })
    }

    /// Opens an existing segment read-write whoever owns it, never
    /// creating it: for the host watchdog, which repairs what tenants
    /// wrote ([`super::audit::repair`]).
    pub fn open_existing(path: &Path) -> Result<GpuSegment, SegmentError> {
        let shm = Shm::open_existing(path, &layout(), true)?;
        Ok(GpuSegment {
            shm,
            path: path.to_path_buf(),
            held_since: AtomicU64::new(NOT_HELD),
        })
    }

    /// An existing segment from `fd`, a descriptor of it the caller opened
    /// (the host's file layer: `Dir::open_segment`, from its directory's
    /// descriptor without following a link), never creating it and whoever
    /// owns it: writable where `fd` was opened read-write, else read-only
    /// (see [`Shm::from_fd`]). `path` names it in messages.
    pub fn from_fd(fd: std::os::fd::OwnedFd, path: &Path) -> Result<GpuSegment, SegmentError> {
        let shm = Shm::from_fd(fd, path, &layout())?;
        Ok(GpuSegment {
            shm,
            path: path.to_path_buf(),
            held_since: AtomicU64::new(NOT_HELD),
        })
    }

    pub fn sched(&self) -> &Sched {
        // SAFETY: the Sched follows the header; aligned; atomics only.
        unsafe { self.shm.at::<Sched>(HEADER) }
    }

    pub fn tenant(&self, i: usize) -> Option<&Tenant> {
        if i >= MAX_TENANTS {
            return None;
        }
        // SAFETY: in bounds (i < MAX_TENANTS), aligned, atomics only.
        Some(unsafe {
            self.shm
                .at::<Tenant>(HEADER + SCHED + i * size_of::<Tenant>())
        })
    }

    pub fn proc_entry(&self, i: usize) -> Option<&Proc> {
        if i >= MAX_PROCS {
            return None;
        }
        let off = HEADER + SCHED + MAX_TENANTS * size_of::<Tenant>() + i * size_of::<Proc>();
        // SAFETY: as above.
        Some(unsafe { self.shm.at::<Proc>(off) })
    }

    /// Registered tenant entries (state READY), with their index.
    pub(super) fn ready_tenants(&self) -> impl Iterator<Item = (usize, &Tenant)> {
        (0..MAX_TENANTS)
            .filter_map(|i| self.tenant(i).map(|t| (i, t)))
            .filter(|(_, t)| t.state.load(Ordering::Acquire) == READY)
    }

    /// [`register`](Self::register) a standard tenant (share, ceiling,
    /// burst) of no slice (tag 0).
    pub fn register_tenant(
        &self,
        name: &str,
        share: u32,
        max: u32,
        burst_ns: u64,
        now: u64,
    ) -> Result<(usize, Option<(u32, u32)>), SegmentError> {
        let spec = TenantSpec {
            share,
            max,
            burst_ns,
            latency: false,
        };
        self.register(name, 0, spec, now)
    }

    /// Finds the tenant `name` of the slice tagged `tag` (0: none),
    /// creating it; sets its share, ceiling, burst and class (a change
    /// takes effect at once). Returns (index, previous (share, max) if it
    /// changed). The entry is found by both: another slice's entry of the
    /// same name is never touched. Waits at most [`TENANT_WAIT`] for the
    /// segment's lock, which any tenant of the GPU can take and keep: then
    /// an error naming the file and the holder.
    pub fn register(
        &self,
        name: &str,
        tag: u64,
        spec: TenantSpec,
        now: u64,
    ) -> Result<(usize, Option<(u32, u32)>), SegmentError> {
        let (share, max, class) = normalized(&spec);
        let encoded = encode_name(name, tag);
        self.shm.with_flock_bounded(TENANT_WAIT, || {
            let mut empty = None;
            for i in 0..MAX_TENANTS {
                let Some(t) = self.tenant(i) else { break };
                match t.state.load(Ordering::Acquire) {
                    READY if name_words(t) == encoded => {
                        t.burst_ns.store(spec.burst_ns, Ordering::Relaxed);
                        t.class.store(class, Ordering::Relaxed);
                        let old = (
                            t.share.swap(share, Ordering::AcqRel),
                            t.max.swap(max, Ordering::AcqRel),
                        );
                        return Ok((i, (old != (share, max)).then_some(old)));
                    }
                    EMPTY if empty.is_none() => empty = Some(i),
                    // A state no cuslice writes is corrupt: free as well.
                    st if st != READY && empty.is_none() => empty = Some(i),
                    _ => {}
                }
            }
            let Some(i) = empty.or_else(|| self.reuse_idle_tenant()) else {
                return Err(SegmentError(format!(
                    "{}: all {MAX_TENANTS} tenant entries of this GPU are in use",
                    self.path.display()
                )));
            };
            let Some(t) = self.tenant(i) else {
                unreachable!("i < MAX_TENANTS")
            };
            for (w, v) in t.name.iter().zip(encoded) {
                w.store(v, Ordering::Relaxed);
            }
            t.share.store(share, Ordering::Relaxed);
            t.max.store(max, Ordering::Relaxed);
            t.burst_ns.store(spec.burst_ns, Ordering::Relaxed);
            t.recharging.store(0, Ordering::Relaxed);
            t.waiting.store(0, Ordering::Relaxed);
            t.procs.store(0, Ordering::Relaxed);
            t.used_ns.store(0, Ordering::Relaxed);
            t.throttled_ns.store(0, Ordering::Relaxed);
            t.vtime
                .store(self.min_active_vtime(None).unwrap_or(0), Ordering::Relaxed);
            t.tokens.store(0, Ordering::Relaxed);
            t.tokens_at.store(now, Ordering::Relaxed);
            t.last_active.store(now, Ordering::Relaxed);
            t.class.store(class, Ordering::Relaxed);
            t.heavy.store(0, Ordering::Relaxed);
            t.in_sync.store(0, Ordering::Relaxed);
            t.active_until.store(0, Ordering::Relaxed);
            t.win_start.store(now, Ordering::Relaxed);
            t.win_used.store(0, Ordering::Relaxed);
            t.win_waited.store(0, Ordering::Relaxed);
            t.demand_pm.store(0, Ordering::Relaxed);
            t.state.store(READY, Ordering::Release);
            Ok((i, None))
        })?
    }

    /// `cuslice resize`'s new share, ceiling, burst and class for the
    /// registered tenant `name` of slice `tag`: never makes an entry.
    /// Returns (its index and previous (share, max) if they changed; None
    /// where it has no entry), and who kept the segment's lock past
    /// [`ROOT_WAIT`]: root writes then without it, as the watch's repair
    /// always does ([`Shm::with_flock_or_without`] says why that is sound).
    pub fn update_tenant(
        &self,
        name: &str,
        tag: u64,
        spec: TenantSpec,
    ) -> (Option<Registered>, Option<LockBusy>) {
        let (share, max, class) = normalized(&spec);
        let encoded = encode_name(name, tag);
        self.shm.with_flock_or_without(ROOT_WAIT, || {
            let (i, t) = self
                .ready_tenants()
                .find(|(_, t)| name_words(t) == encoded)?;
            t.burst_ns.store(spec.burst_ns, Ordering::Relaxed);
            t.class.store(class, Ordering::Relaxed);
            let old = (
                t.share.swap(share, Ordering::AcqRel),
                t.max.swap(max, Ordering::AcqRel),
            );
            Some((i, (old != (share, max)).then_some(old)))
        })
    }

    /// A tenant entry with no live process can be reused (its history is
    /// lost; a tenant that comes back starts afresh).
    fn reuse_idle_tenant(&self) -> Option<usize> {
        self.reclaim_dead();
        (0..MAX_TENANTS).find(|&i| {
            self.tenant(i)
                .is_some_and(|t| t.procs.load(Ordering::Acquire) == 0)
        })
    }

    /// Registers this process under `tenant`: takes the first process slot
    /// whose lock is free, cleaning what a dead owner left.
    pub fn claim_proc(&self, tenant: usize, pid: u32) -> Result<usize, SegmentError> {
        let Some(t) = self.tenant(tenant) else {
            return Err(SegmentError(format!(
                "{}: no tenant {tenant}",
                self.path.display()
            )));
        };
        self.shm.claim_first(MAX_PROCS, "process slot", |i| {
            let Some(p) = self.proc_entry(i) else { return };
            self.clean_proc(i);
            p.tenant.store(tenant as u32, Ordering::Relaxed);
            p.pid.store(pid, Ordering::Relaxed);
            p.waiting.store(0, Ordering::Relaxed);
            p.syncing.store(0, Ordering::Relaxed);
            p.idle_since.store(0, Ordering::Relaxed);
            p.bound_ns.store(0, Ordering::Relaxed);
            p.state.store(PROC_LIVE, Ordering::Release);
            t.procs.fetch_add(1, Ordering::AcqRel);
        })
    }

    /// Gives our process slot back (normal exit).
    pub fn release_proc(&self, slot: usize, now: u64) {
        let s = self.sched();
        if s.lease.load(Ordering::Acquire) == slot as u32 + 1 {
            let t = s.holder_tenant.load(Ordering::Relaxed) as usize;
            self.release(slot, t, now);
        }
        self.shm.release_own(slot, |i| self.clean_proc(i));
    }

    /// Undoes what process slot `i` contributed (the caller holds its lock).
    fn clean_proc(&self, i: usize) {
        let Some(p) = self.proc_entry(i) else { return };
        if p.state.swap(PROC_FREE, Ordering::AcqRel) == PROC_FREE {
            return;
        }
        if let Some(t) = self.tenant(p.tenant.load(Ordering::Relaxed) as usize) {
            if p.waiting.swap(0, Ordering::AcqRel) != 0 {
                dec(&t.waiting);
            }
            // A latency process that died inside a synchronising call: its
            // work is no longer in flight.
            let syncing = p.syncing.swap(0, Ordering::AcqRel);
            if syncing != 0 {
                let _ = t
                    .in_sync
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                        Some(v.saturating_sub(syncing))
                    });
            }
            dec(&t.procs);
        }
    }

    /// Cleans the slots of dead processes. Returns how many.
    pub fn reclaim_dead(&self) -> usize {
        let in_use = |i: usize| {
            self.proc_entry(i)
                .is_some_and(|p| p.state.load(Ordering::Acquire) != PROC_FREE)
        };
        self.shm
            .sweep_dead(MAX_PROCS, in_use, |i| self.clean_proc(i))
    }

    pub fn tenants(&self) -> Vec<TenantView> {
        self.ready_tenants()
            .map(|(i, t)| TenantView {
                index: i,
                name: decode_name(t),
                tag: t.name[NAME_BYTES / 8 - 1].load(Ordering::Relaxed),
                share: t.share.load(Ordering::Relaxed),
                max: t.max.load(Ordering::Relaxed),
                used_ns: t.used_ns.load(Ordering::Relaxed),
                throttled_ns: t.throttled_ns.load(Ordering::Relaxed),
                waiting: t.waiting.load(Ordering::Relaxed),
                procs: t.procs.load(Ordering::Relaxed),
                last_active: t.last_active.load(Ordering::Relaxed),
                last_activity: t
                    .last_active
                    .load(Ordering::Relaxed)
                    .max(t.win_start.load(Ordering::Relaxed)),
                latency: t.class.load(Ordering::Relaxed) == CLASS_LATENCY,
                heavy: t.heavy.load(Ordering::Relaxed) != 0,
                demand_pm: t.demand_pm.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The futex word waiters for the lease sleep on.
    pub fn generation_word(&self) -> &AtomicU32 {
        &self.sched().generation
    }

    /// The futex word tenants holding back for a latency tenant sleep on.
    pub fn latency_word(&self) -> &AtomicU32 {
        &self.sched().lat_gen
    }

    pub fn raw_fd(&self) -> i32 {
        self.shm.raw_fd()
    }

    /// True once the file was truncated under this mapping: what was read
    /// from it since is void (see [`crate::sigbus`]).
    pub fn truncated(&self) -> bool {
        self.shm.truncated()
    }

    /// Whether the process that owns process slot `i` is alive (another
    /// open file description holds its lock; our own slot reads as alive).
    /// Read-only, for observers (tests, status) that check the lease holder
    /// and the waiters.
    pub fn proc_alive(&self, i: usize) -> bool {
        self.shm.slot_alive(i)
    }

    /// Every 8 bytes after the header (hostile-input tests).
    #[cfg(test)]
    pub(super) fn words(&self) -> impl Iterator<Item = &AtomicU64> {
        (HEADER..SIZE)
            .step_by(8)
            // SAFETY: in bounds and 8-byte aligned; atomics only.
            .map(|off| unsafe { self.shm.at::<AtomicU64>(off) })
    }
}

/// Saturating decrement of a shared counter (it may hold garbage).
pub(super) fn dec(a: &AtomicU32) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(1))
    });
}

/// A tenant entry's key: the name in bytes 0..56 (NUL-padded, cut at 56),
/// the tag in 56..64.
pub(crate) fn encode_name(name: &str, tag: u64) -> [u64; NAME_BYTES / 8] {
    let mut bytes = [0u8; NAME_BYTES];
    let n = name.len().min(NAME_TEXT_BYTES);
    bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
    bytes[NAME_TEXT_BYTES..].copy_from_slice(&tag.to_le_bytes());
    let mut w = [0u64; NAME_BYTES / 8];
    for (i, c) in bytes.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        w[i] = u64::from_le_bytes(b);
    }
    w
}

fn name_words(t: &Tenant) -> [u64; NAME_BYTES / 8] {
    let mut w = [0u64; NAME_BYTES / 8];
    for (i, a) in t.name.iter().enumerate() {
        w[i] = a.load(Ordering::Relaxed);
    }
    w
}

/// A key's name (bytes 0..56 up to the first NUL) and tag (56..64).
pub(crate) fn decode_key(w: &[u64; NAME_BYTES / 8]) -> (String, u64) {
    let bytes: Vec<u8> = w.iter().flat_map(|w| w.to_le_bytes()).collect();
    let name: Vec<u8> = bytes[..NAME_TEXT_BYTES]
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .collect();
    (
        String::from_utf8_lossy(&name).into_owned(),
        w[NAME_BYTES / 8 - 1],
    )
}

/// The name of a tenant entry: bytes 0..56 up to the first NUL.
fn decode_name(t: &Tenant) -> String {
    let bytes: Vec<u8> = name_words(t)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(NAME_TEXT_BYTES)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment in a directory removed when the test ends.
    fn seg(name: &str) -> (crate::testdir::TestDir, GpuSegment) {
        crate::testdir::gpu_segment("layout", name)
    }

    fn spec(share: u32, max: u32) -> TenantSpec {
        TenantSpec {
            share,
            max,
            burst_ns: 0,
            latency: false,
        }
    }

    fn view(g: &GpuSegment, i: usize) -> TenantView {
        g.tenants()
            .into_iter()
            .find(|v| v.index == i)
            .expect("registered")
    }

    /// Issue #32 item 9: a container given another's tenant name (and so
    /// another slice) registered into the other's entry and set its share
    /// and ceiling. Entries are keyed by name and slice tag.
    #[test]
    fn one_name_in_two_slices_is_two_entries() {
        let (_d, g) = seg("slices");
        let (a, old) = g.register("shared", 0x1111, spec(50, 100), 0).expect("a");
        assert_eq!(old, None);
        let (b, old) = g.register("shared", 0x2222, spec(1, 1), 0).expect("b");
        assert_ne!(a, b, "another slice gets an entry of its own");
        assert_eq!(old, None, "and changes nobody's share");
        let (va, vb) = (view(&g, a), view(&g, b));
        assert_eq!((va.share, va.max, va.tag), (50, 100, 0x1111));
        assert_eq!((vb.share, vb.max, vb.tag), (1, 1, 0x2222));
        assert_eq!((va.name.as_str(), vb.name.as_str()), ("shared", "shared"));
        // The same slice shares its entry (the last of its processes to
        // start sets it), and leaves the other's alone.
        let (a2, old) = g
            .register("shared", 0x1111, spec(60, 80), 0)
            .expect("a again");
        assert_eq!((a2, old), (a, Some((50, 100))));
        assert_eq!((view(&g, a).share, view(&g, a).max), (60, 80));
        assert_eq!((view(&g, b).share, view(&g, b).max), (1, 1));
        // Untagged (tag 0) is a slice of its own too.
        let (c, _) = g.register("shared", 0, spec(30, 100), 0).expect("c");
        assert!(c != a && c != b);
        assert_eq!(g.tenants().len(), 3);
    }

    /// Issue 41 H3/H4: a tenant keeping the GPU segment's lock makes
    /// another's registration fail within its bound, naming the file and
    /// the holder; root's resize of an entry waits its own bound, then
    /// writes, and never makes an entry.
    #[test]
    fn a_kept_lock_bounds_registration_and_roots_update() {
        use std::os::fd::AsRawFd;
        let (_d, g) = seg("kept");
        let (a, _) = g.register("a", 7, spec(50, 100), 0).expect("a");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&g.path)
            .expect("open");
        // SAFETY: flock on the descriptor we just opened.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        let t = std::time::Instant::now();
        let e = g.register("b", 8, spec(10, 100), 0).expect_err("busy");
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        let me = std::process::id();
        assert!(
            e.0.starts_with(&format!(
                "{}: its lock is held by pid {me}",
                g.path.display()
            )),
            "{e}"
        );
        let (r, busy) = g.update_tenant("a", 7, spec(30, 60));
        assert_eq!(r, Some((a, Some((50, 100)))));
        assert_eq!(busy.and_then(|b| b.holder), Some(me));
        assert_eq!((view(&g, a).share, view(&g, a).max), (30, 60));
        drop(f);
        assert_eq!(g.update_tenant("nobody", 7, spec(30, 60)), (None, None));
        assert_eq!(g.tenants().len(), 1);
    }

    /// What a process of the previous build (which keys entries by their 64
    /// name bytes) writes for a name of up to 56 bytes is what this one
    /// writes untagged: both find the same entry in a segment they share.
    #[test]
    fn an_untagged_name_is_encoded_as_before() {
        let (_d, g) = seg("encoding");
        for (name, tag) in [
            ("team-a/trainer", 0u64),
            (&*"n".repeat(56), 0),
            ("team-a/trainer", 0x0102_0304_0506_0708),
        ] {
            let (i, _) = g.register(name, tag, spec(10, 100), 0).expect("tenant");
            let t = g.tenant(i).expect("entry");
            let bytes: Vec<u8> = name_words(t).iter().flat_map(|w| w.to_le_bytes()).collect();
            let mut want = [0u8; NAME_BYTES];
            want[..name.len()].copy_from_slice(name.as_bytes());
            want[56..].copy_from_slice(&tag.to_le_bytes());
            assert_eq!(bytes, want, "{name} {tag:#x}");
            let v = view(&g, i);
            assert_eq!((v.name.as_str(), v.tag), (name, tag));
        }
        // A name past 56 bytes (refused by the configuration) never
        // spills into the tag.
        let (i, _) = g
            .register(&"x".repeat(60), 7, spec(10, 100), 0)
            .expect("tenant");
        let v = view(&g, i);
        assert_eq!((v.name.len(), v.tag), (56, 7));
    }
}
