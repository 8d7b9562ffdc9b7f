//! A shared, file-backed mapping with a versioned header, and the OFD
//! byte-range locks that prove a slot's owner alive. Used by both segment
//! kinds: the per-container memory segment and the per-GPU scheduling
//! segment.
//!
//! A file rather than POSIX shm so that only a directory needs to be
//! bind-mounted into containers (their `/dev/shm` may be private).

use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A segment error: one line naming the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentError(pub String);

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SegmentError {}

/// How long root (`cuslice watch`, `cuslice resize`, the OCI hook) waits
/// for a segment's whole-file lock, which any tenant of the segment can
/// take and keep: the bound ("at most 2 s"). An honest holder keeps
/// it for a registration or a sweep, microseconds; 2 s covers one
/// descheduled on a loaded host many times over.
pub const ROOT_WAIT: Duration = Duration::from_secs(2);

/// How long a starting tenant waits for that lock before it fails closed
/// (cuInit refused, one line naming the file and the holder). Longer than
/// root's: a false refusal costs a job its start, and a holder may be
/// throttled by its cgroup's CPU quota or stopped for a moment (the
/// watch's freeze); a start held 5 s by a hostile tenant is bounded, and
/// said, instead of silent and for ever.
pub const TENANT_WAIT: Duration = Duration::from_secs(5);

/// A whole-file lock that another process kept past the bound: the file,
/// its holder where the kernel tells it, and how long this one waited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockBusy {
    pub path: PathBuf,
    /// The holder's pid as `/proc/locks` shows it to this process (None:
    /// not found there, or in a PID namespace this one cannot see).
    pub holder: Option<u32>,
    pub waited: Duration,
}

impl fmt::Display for LockBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match self.holder {
            Some(pid) => format!("pid {pid}"),
            None => "another process (holder unknown)".to_string(),
        };
        write!(
            f,
            "{}: its lock is held by {who}, not let go within {:.1} s",
            self.path.display(),
            self.waited.as_secs_f64()
        )
    }
}

impl std::error::Error for LockBusy {}

impl From<LockBusy> for SegmentError {
    fn from(b: LockBusy) -> SegmentError {
        SegmentError(b.to_string())
    }
}

/// The pid of the process holding a FLOCK on the file of device
/// (`major`, `minor`) and inode `ino`, from the text of `/proc/locks`
/// (lines `N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF`, device
/// numbers in hex; a waiter's line has `->` after the number and is
/// skipped). A pid of 0 is one the reader's PID namespace cannot see.
pub fn flock_holder(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    locks.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let [_, "FLOCK", _, _, pid, id, ..] = w.as_slice() else {
            return None;
        };
        let mut parts = id.split(':');
        let (Some(ma), Some(mi), Some(i), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let same = u64::from_str_radix(ma, 16).ok() == Some(major)
            && u64::from_str_radix(mi, 16).ok() == Some(minor)
            && i.parse::<u64>().ok() == Some(ino);
        same.then(|| pid.parse::<u32>().ok())
            .flatten()
            .filter(|&p| p != 0)
    })
}

/// Takes `fd`'s exclusive flock, waiting at most `wait`: polls without
/// blocking, sleeping 1 ms at first and up to 20 ms between tries (a
/// blocking flock cannot be given a deadline short of a signal). Ok(true):
/// locked; Ok(false): flock itself failed otherwise than "held" (as the
/// unbounded lock did, the caller runs on unlocked); Err: still held at
/// the deadline, and who holds it.
fn lock_within(fd: i32, path: &Path, wait: Duration) -> Result<bool, LockBusy> {
    let start = Instant::now();
    // An honest holder keeps it for microseconds (a registration, a
    // reservation): first looks come soon after, so that processes
    // starting together wait about as long as a blocking lock made them;
    // naps grow to 5 ms for a holder that keeps it.
    let mut nap = Duration::from_micros(50);
    loop {
        // SAFETY: flock on the caller's fd, not blocking.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error().raw_os_error();
        if e != Some(libc::EWOULDBLOCK) && e != Some(libc::EINTR) {
            return Ok(false);
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(LockBusy {
                path: path.to_path_buf(),
                holder: holder_of(fd),
                waited,
            });
        }
        std::thread::sleep(nap.min(wait - waited));
        nap = (nap * 2).min(Duration::from_millis(5));
    }
}

/// Who holds `fd`'s file's flock, from `/proc/locks` (read once, at a
/// deadline, bounded).
fn holder_of(fd: i32) -> Option<u32> {
    use std::io::Read;
    // SAFETY: `stat` is a plain C struct, valid all zero.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into that struct, on the caller's descriptor.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    let mut text = String::new();
    std::fs::File::open("/proc/locks")
        .ok()?
        .take(8 << 20)
        .read_to_string(&mut text)
        .ok()?;
    let dev = st.st_dev;
    // glibc's encoding of a device number (gnu_dev_major / gnu_dev_minor).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    flock_holder(&text, major, minor, st.st_ino)
}

fn os_err(path: &Path, what: &str) -> SegmentError {
    SegmentError(format!(
        "{}: {what}: {}",
        path.display(),
        std::io::Error::last_os_error()
    ))
}

/// The first bytes of every segment. `params` are the layout's own counts
/// and entry sizes; a mismatch in any field means another layout.
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub total_size: u64,
    pub params: [u32; 8],
}

/// What a segment kind looks like.
pub struct Layout {
    /// "memory segment", "GPU segment": used in messages.
    pub what: &'static str,
    pub header: Header,
    /// Names of `header.params` entries, for messages.
    pub param_names: [&'static str; 8],
}

/// Where the header's padding starts: 8 bytes after its fields that no
/// check reads, zero in a segment this version made, free for a layout's
/// own use (the memory segment's resize marks).
pub const HEADER_SPARE: usize = std::mem::offset_of!(Header, params) + 4 * 8;
const _: () = assert!(HEADER_SPARE + 8 == std::mem::size_of::<Header>());

/// Slot locks live beyond the data, as a pure lock namespace.
const LOCK_BASE: i64 = 1 << 40;
const NO_SLOT: usize = usize::MAX;

pub struct Shm {
    /// The mapping's slot among those [`crate::sigbus`] guards (None: the
    /// guard is off in this process).
    guard: Option<usize>,
    base: *mut u8,
    size: usize,
    fd: i32,
    writable: bool,
    /// The slot this open file description holds (NO_SLOT if none). OFD
    /// locks never conflict with their own holder, so lock probes must
    /// skip it explicitly.
    own: AtomicUsize,
    /// Other slots whose locks this open file description holds now (a
    /// sweep cleaning a dead process's slot, a claim filling one). Their
    /// owners read as alive to every thread of this process: to an OFD
    /// probe they look unlocked, and a second thread that took the lock
    /// word of one for dead (or swept it again) would run beside the first
    /// in its critical section (seen in the soak: a device's usage 9.5 MiB
    /// above the sum of its slots after a lock was taken over from a
    /// sweep in progress).
    held: Mutex<Vec<usize>>,
    pub path: PathBuf,
}

// SAFETY: the mapping is shared memory accessed only through atomics (or
// written once under the init flock); fd and pointer live as long as Shm.
unsafe impl Send for Shm {}
// SAFETY: as for Send: shared use is atomic accesses to the mapping, and
// fcntl/flock on the fd, which the kernel serialises.
unsafe impl Sync for Shm {}

impl Drop for Shm {
    fn drop(&mut self) {
        if let Some(i) = self.guard {
            crate::sigbus::unregister(i);
        }
        // SAFETY: base/size is our mapping; fd is ours.
        unsafe {
            libc::munmap(self.base.cast(), self.size);
            libc::close(self.fd);
        }
    }
}

fn cpath(path: &Path) -> Result<CString, SegmentError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SegmentError(format!("{}: path contains a NUL byte", path.display())))
}

fn fstat(fd: i32, path: &Path) -> Result<libc::stat, SegmentError> {
    // SAFETY: `stat` is a plain C struct, valid all zero.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into that struct, on the caller's descriptor.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err(path, "cannot stat segment"));
    }
    Ok(st)
}

impl Shm {
    /// Opens the segment at `path`, creating it (and its directory, mode
    /// `dir_mode`) if absent and writing `layout`'s header. Refuses a file
    /// that is not ours: owned by another user than this process's or root,
    /// not a regular file, another size, magic, version or layout.
    pub fn open_or_create(
        path: &Path,
        layout: &Layout,
        dir_mode: u32,
    ) -> Result<Shm, SegmentError> {
        if let Some(dir) = path.parent()
            && !dir.exists()
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(dir_mode)
                .create(dir)
                .map_err(|e| {
                    SegmentError(format!("{}: cannot create directory: {e}", dir.display()))
                })?;
        }
        let c = cpath(path)?;
        // SAFETY: open with a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os_err(path, &format!("cannot open {}", layout.what)));
        }
        // Until a Shm owns the fd, every error path closes it here.
        let mapped = Self::check_owner(fd, path, layout).and_then(|()| {
            // A file already whole (its size and header this layout's) is
            // mapped without the lock: initialisation wrote the magic last,
            // and never again, so there is nothing to wait for, and a
            // tenant that keeps the lock cannot stall the others' open.
            if Self::initialised(fd, path, layout)? {
                return Self::map(fd, path, layout.header.total_size as usize, true);
            }
            // Creation under an exclusive flock: two first processes cannot
            // both initialise. Bounded (root's bound for everyone: an
            // honest initialiser sizes the file and writes a header, well
            // under it).
            let locked = lock_within(fd, path, ROOT_WAIT)?;
            let r = Self::init_locked(fd, path, layout);
            if locked {
                // SAFETY: unlocking our fd.
                unsafe { libc::flock(fd, libc::LOCK_UN) };
            }
            r
        });
        let shm = match mapped {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: closing our own fd; no Shm owns it.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        // From here the Shm owns (and on error closes) the fd.
        shm.validate(layout)?;
        Ok(shm)
    }

    fn check_owner(fd: i32, path: &Path, layout: &Layout) -> Result<(), SegmentError> {
        let st = fstat(fd, path)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        // Root's files are the host's: the OCI hook makes a container's
        // segments (root-owned, for whatever user the container runs as);
        // a file of any other user could have been planted.
        if st.st_uid != me && st.st_uid != 0 {
            return Err(SegmentError(format!(
                "{}: {} is owned by uid {}, neither this process's uid {me} nor root; refusing to use it",
                path.display(),
                layout.what,
                st.st_uid
            )));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(SegmentError(format!(
                "{}: {} is not a regular file",
                path.display(),
                layout.what
            )));
        }
        Ok(())
    }

    /// Whether the file is already of `layout`'s size and starts with its
    /// header, magic included (then nobody initialises it any more).
    fn initialised(fd: i32, path: &Path, layout: &Layout) -> Result<bool, SegmentError> {
        if fstat(fd, path)?.st_size as u64 != layout.header.total_size {
            return Ok(false);
        }
        let mut h = std::mem::MaybeUninit::<Header>::zeroed();
        let n = std::mem::size_of::<Header>();
        // SAFETY: reading at most `n` bytes into a buffer of `n` bytes.
        let got = unsafe { libc::pread(fd, h.as_mut_ptr().cast(), n, 0) };
        if got != n as isize {
            return Ok(false);
        }
        // SAFETY: zero-initialised and then filled: a Header is plain
        // integers, valid for any bytes.
        let h = unsafe { h.assume_init() };
        Ok(h == layout.header)
    }

    /// Sizes and maps the file, writing the header if it is new. Does not
    /// validate (the caller does, once a Shm owns the fd).
    fn init_locked(fd: i32, path: &Path, layout: &Layout) -> Result<Shm, SegmentError> {
        let size = layout.header.total_size as usize;
        let have = fstat(fd, path)?.st_size as u64;
        let fresh = have == 0;
        if fresh {
            // SAFETY: ftruncate on our fd.
            if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
                return Err(os_err(path, "cannot size segment"));
            }
        } else if have != size as u64 {
            return Err(SegmentError(format!(
                "{}: {} is {have} bytes, expected {size}: written by another version of cuslice, or not a cuslice segment; remove it when no process uses it",
                path.display(),
                layout.what
            )));
        }
        let shm = Self::map(fd, path, size, true)?;
        if fresh {
            let h = shm.base.cast::<Header>();
            let mut hdr = layout.header;
            let magic = hdr.magic;
            hdr.magic = [0; 8];
            // SAFETY: fresh zero-filled mapping; nobody reads it before we
            // drop the flock. The magic goes last: a reader seeing it sees
            // the rest.
            unsafe {
                h.write(hdr);
                // The padding a struct copy leaves undefined: zero, as
                // layouts that use it expect of a fresh segment.
                std::ptr::write_bytes(shm.base.add(HEADER_SPARE), 0, 8);
                std::sync::atomic::fence(Ordering::Release);
                (*h).magic = magic;
            }
        }
        Ok(shm)
    }

    fn map(fd: i32, path: &Path, size: usize, writable: bool) -> Result<Shm, SegmentError> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: mapping `size` bytes of a file at least that long.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(os_err(path, "cannot map segment"));
        }
        // A mapping holds a reference to the open file description, and an
        // OFD lock lives as long as the description: a fork child that
        // inherited the mapping would keep its parent's slot "alive" after
        // the parent died (closing the inherited fd is not enough). Fork
        // children drop the inherited state anyway (pthread_atfork in the
        // shim), so they get no copy of the mapping.
        // SAFETY: advice on the mapping we just made.
        unsafe { libc::madvise(p, size, libc::MADV_DONTFORK) };
        let guard = match crate::sigbus::register(p as usize, size) {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: the mapping we just made, owned by nobody yet.
                unsafe { libc::munmap(p, size) };
                return Err(SegmentError(format!("{}: {e}", path.display())));
            }
        };
        Ok(Shm {
            guard,
            base: p.cast(),
            size,
            fd,
            writable,
            own: NO_SLOT.into(),
            held: Mutex::new(Vec::new()),
            path: path.to_path_buf(),
        })
    }

    /// Opens an existing segment read-only (for `cuslice status`).
    pub fn open_read_only(path: &Path, layout: &Layout) -> Result<Shm, SegmentError> {
        Self::open_existing(path, layout, false)
    }

    /// Opens an existing segment, never creating it and whoever owns it
    /// (the host watchdog, as root, reads and repairs tenants' segments):
    /// read-write if `writable`. The file must be a regular file of the
    /// layout's size and header.
    pub fn open_existing(
        path: &Path,
        layout: &Layout,
        writable: bool,
    ) -> Result<Shm, SegmentError> {
        let c = cpath(path)?;
        let mode = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        // SAFETY: open with a NUL-terminated path.
        // O_NONBLOCK: a fifo planted at the path must not block the opener.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                mode | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(os_err(path, &format!("cannot open {}", layout.what)));
        }
        // SAFETY: open just returned this descriptor; nothing else owns it.
        Self::from_fd(unsafe { OwnedFd::from_raw_fd(fd) }, path, layout)
    }

    /// An existing segment from `fd`, a descriptor of it the caller opened
    /// (the host's file layer: by a plain name from its directory's
    /// descriptor, without following a link or blocking on a FIFO), never
    /// creating it and whoever owns it: mapped read-write where `fd` was
    /// opened for reading and writing, else read-only. The file must be a
    /// regular file of the layout's size and header; `path` names it in
    /// messages.
    pub fn from_fd(fd: OwnedFd, path: &Path, layout: &Layout) -> Result<Shm, SegmentError> {
        // SAFETY: F_GETFL on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(os_err(path, &format!("cannot use {}", layout.what)));
        }
        let writable = flags & libc::O_ACCMODE == libc::O_RDWR;
        let size = layout.header.total_size as usize;
        // Until a Shm owns it, `fd` closes itself on every error path.
        match fstat(fd.as_raw_fd(), path)? {
            st if st.st_mode & libc::S_IFMT != libc::S_IFREG => {
                return Err(SegmentError(format!(
                    "{}: {} is not a regular file",
                    path.display(),
                    layout.what
                )));
            }
            st if st.st_size as u64 == size as u64 => {}
            st => {
                return Err(SegmentError(format!(
                    "{}: not a cuslice {} of this version (size {}, expected {size})",
                    path.display(),
                    layout.what,
                    st.st_size
                )));
            }
        }
        let shm = Self::map(fd.as_raw_fd(), path, size, writable)?;
        // The Shm owns (and on error closes) the descriptor from here.
        let _ = fd.into_raw_fd();
        shm.validate(layout)?;
        Ok(shm)
    }

    fn validate(&self, layout: &Layout) -> Result<(), SegmentError> {
        // SAFETY: the mapping starts with a Header.
        let h = unsafe { *self.base.cast::<Header>() };
        let want = &layout.header;
        let p = self.path.display();
        if h.magic != want.magic {
            return Err(SegmentError(format!(
                "{p}: not a cuslice {} (bad magic)",
                layout.what
            )));
        }
        if h.version != want.version {
            return Err(SegmentError(format!(
                "{p}: {} layout version {} is not the version {} this cuslice uses",
                layout.what, h.version, want.version
            )));
        }
        if h.header_size != want.header_size || h.total_size != want.total_size {
            return Err(SegmentError(format!(
                "{p}: {} header says {} header bytes / {} bytes in all, expected {} / {}: corrupt or foreign",
                layout.what, h.header_size, h.total_size, want.header_size, want.total_size
            )));
        }
        for (i, name) in layout.param_names.iter().enumerate() {
            if h.params[i] != want.params[i] {
                return Err(SegmentError(format!(
                    "{p}: {} {name} is {}, expected {}: corrupt or foreign",
                    layout.what, h.params[i], want.params[i]
                )));
            }
        }
        Ok(())
    }

    /// A `T` at `offset` (caller guarantees layout, bounds and alignment).
    ///
    /// # Safety
    /// `offset + size_of::<T>() <= size`, `offset` aligned for `T`, and `T`
    /// made only of atomics / plain data valid for any bit pattern.
    pub unsafe fn at<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.size);
        // SAFETY: per the caller's guarantee.
        unsafe { &*self.base.add(offset).cast::<T>() }
    }

    fn lock_cmd(&self, cmd: i32, typ: i32, slot: usize) -> bool {
        // SAFETY: zeroed flock is a valid initial value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = typ as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = LOCK_BASE + slot as i64;
        fl.l_len = 1;
        // SAFETY: fcntl with a valid flock struct on our fd.
        let r = unsafe { libc::fcntl(self.fd, cmd, &mut fl) };
        if cmd == libc::F_OFD_GETLK {
            // Alive unless the query succeeded and found no other holder
            // (never reclaim what we cannot prove dead).
            return r != 0 || fl.l_type != libc::F_UNLCK as libc::c_short;
        }
        r == 0
    }

    /// Whether the owner of `slot` is alive (another open file description
    /// holds its lock). Our own slot reads as alive.
    pub fn slot_alive(&self, slot: usize) -> bool {
        slot == self.own()
            || self.lock_cmd(libc::F_OFD_GETLK, libc::F_WRLCK, slot)
            || self.held().contains(&slot)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `slot`'s lock (non-blocking); false if another process holds
    /// it, or another thread of ours (`held`).
    pub fn try_lock_slot(&self, slot: usize) -> bool {
        let mut held = self.held();
        if slot == self.own() || held.contains(&slot) {
            return false;
        }
        let ok = self.lock_cmd(libc::F_OFD_SETLK, libc::F_WRLCK, slot);
        if ok {
            held.push(slot);
        }
        ok
    }

    pub fn unlock_slot(&self, slot: usize) {
        let mut held = self.held();
        self.lock_cmd(libc::F_OFD_SETLK, libc::F_UNLCK, slot);
        held.retain(|&s| s != slot);
    }

    pub fn own(&self) -> usize {
        self.own.load(Ordering::Relaxed)
    }

    pub fn set_own(&self, slot: Option<usize>) {
        self.own.store(slot.unwrap_or(NO_SLOT), Ordering::Relaxed);
    }

    /// Registers this process: takes the first of `n` slots whose lock is
    /// free (never used, or its owner died), runs `take(slot)` with the lock
    /// held (to clean what a dead owner left and fill the slot), and records
    /// the slot as ours.
    pub fn claim_first(
        &self,
        n: usize,
        what: &str,
        take: impl Fn(usize),
    ) -> Result<usize, SegmentError> {
        if !self.writable {
            return Err(SegmentError(format!(
                "{}: opened read-only",
                self.path.display()
            )));
        }
        if self.own() != NO_SLOT {
            return Err(SegmentError(format!(
                "{}: this process already holds a {what}",
                self.path.display()
            )));
        }
        for i in 0..n {
            if self.try_lock_slot(i) {
                take(i);
                self.set_own(Some(i));
                self.held().retain(|&s| s != i);
                return Ok(i);
            }
        }
        Err(SegmentError(format!(
            "{}: all {n} {what}s are in use by live processes",
            self.path.display()
        )))
    }

    /// For each of `n` slots that is `in_use` but whose owner is dead (its
    /// lock can be taken), runs `clean(slot)` under the lock: taking it
    /// proves the owner gone and keeps a new process from claiming the slot
    /// meanwhile. Returns how many were cleaned.
    pub fn sweep_dead(
        &self,
        n: usize,
        in_use: impl Fn(usize) -> bool,
        clean: impl Fn(usize),
    ) -> usize {
        let mut cleaned = 0;
        for i in 0..n {
            if i == self.own() || !in_use(i) {
                continue;
            }
            if self.try_lock_slot(i) {
                clean(i);
                self.unlock_slot(i);
                cleaned += 1;
            }
        }
        cleaned
    }

    /// Gives our slot back: `clean(slot)` under its lock, then the lock.
    pub fn release_own(&self, slot: usize, clean: impl FnOnce(usize)) {
        clean(slot);
        self.unlock_slot(slot);
        if self.own() == slot {
            self.set_own(None);
        }
    }

    /// Exclusive whole-file flock, waiting for it as long as it takes.
    /// Every process of the segment can take and keep this lock: use it
    /// nowhere a tenant may hold it against another tenant or root (only
    /// the memory pool's calls are left, until they are converted); see
    /// [`Shm::with_flock_bounded`].
    pub fn with_flock<R>(&self, f: impl FnOnce() -> R) -> R {
        // SAFETY: flock on our fd.
        unsafe { libc::flock(self.fd, libc::LOCK_EX) };
        let r = f();
        // SAFETY: unlocking our fd.
        unsafe { libc::flock(self.fd, libc::LOCK_UN) };
        r
    }

    /// `f` under the exclusive whole-file flock, waiting for it at most
    /// `wait` ([`ROOT_WAIT`], [`TENANT_WAIT`]); Err, and `f` not run, where
    /// another process keeps it that long: which file, its holder, how long.
    pub fn with_flock_bounded<R>(
        &self,
        wait: Duration,
        f: impl FnOnce() -> R,
    ) -> Result<R, LockBusy> {
        let locked = lock_within(self.fd, &self.path, wait)?;
        let r = f();
        if locked {
            // SAFETY: unlocking our fd.
            unsafe { libc::flock(self.fd, libc::LOCK_UN) };
        }
        Ok(r)
    }

    /// Root's writes of a few atomic stores: `f` under the flock where it
    /// comes within `wait`, else `f` all the same, and the holder that kept
    /// it. Sound without the lock: it only orders these stores after an
    /// honest registration, which holds it for microseconds; a process
    /// that keeps it past the bound is not registering, and could write
    /// the same words of the mapping without any lock whatever the lock
    /// said (the watch audits them every pass).
    pub fn with_flock_or_without<R>(
        &self,
        wait: Duration,
        f: impl FnOnce() -> R,
    ) -> (R, Option<LockBusy>) {
        match lock_within(self.fd, &self.path, wait) {
            Ok(locked) => {
                let r = f();
                if locked {
                    // SAFETY: unlocking our fd.
                    unsafe { libc::flock(self.fd, libc::LOCK_UN) };
                }
                (r, None)
            }
            Err(busy) => (f(), Some(busy)),
        }
    }

    /// As [`Shm::with_flock`], but only where nobody holds the lock now:
    /// None, and `f` not run, where another does (never waits for it).
    pub fn try_with_flock<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        // SAFETY: flock on our fd, not blocking.
        if unsafe { libc::flock(self.fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return None;
        }
        let r = f();
        // SAFETY: unlocking our fd.
        unsafe { libc::flock(self.fd, libc::LOCK_UN) };
        Some(r)
    }

    /// True once the file was truncated under this mapping and the
    /// mapping was swapped for zero pages ([`crate::sigbus`], on in the
    /// host's commands only): what was read from it since is void.
    pub fn truncated(&self) -> bool {
        self.guard.is_some_and(crate::sigbus::hit)
    }

    /// The fd, for a fork child that must not keep its parent's locks alive.
    pub fn raw_fd(&self) -> i32 {
        self.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testdir::TestDir as Dir;

    fn layout() -> Layout {
        Layout {
            what: "test segment",
            header: Header {
                magic: *b"CUSLTST\0",
                version: 1,
                header_size: std::mem::size_of::<Header>() as u32,
                total_size: 4096,
                params: [0; 8],
            },
            param_names: ["-"; 8],
        }
    }

    /// Another open file description of `path` holding its flock, as a
    /// tenant that took it and keeps it.
    fn held(path: &Path) -> std::fs::File {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .expect("open");
        // SAFETY: flock on the descriptor we just opened.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        f
    }

    #[test]
    fn a_held_lock_is_given_up_on_within_the_bound_naming_the_file_and_our_pid() {
        let d = Dir::new("shm-test", "busy");
        let p = d.path().join("x.seg");
        let s = Shm::open_or_create(&p, &layout(), 0o700).expect("open");
        let h = held(&p);
        let t = Instant::now();
        let ran = std::cell::Cell::new(false);
        let e = s
            .with_flock_bounded(Duration::from_millis(200), || ran.set(true))
            .expect_err("busy");
        let took = t.elapsed();
        assert!(!ran.get(), "f ran without the lock");
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert_eq!(e.path, p);
        assert_eq!(e.holder, Some(std::process::id()), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: its lock is held by pid {}, not let go within {:.1} s",
                p.display(),
                std::process::id(),
                e.waited.as_secs_f64()
            )
        );
        // Root's write runs all the same, and says who held the lock.
        let (r, busy) = s.with_flock_or_without(Duration::from_millis(50), || 7);
        assert_eq!(r, 7);
        assert_eq!(busy.map(|b| b.holder), Some(Some(std::process::id())));
        // Let go: taken at once, and given back.
        drop(h);
        assert_eq!(s.with_flock_bounded(Duration::ZERO, || 1), Ok(1));
        assert_eq!(s.with_flock_or_without(Duration::ZERO, || 2), (2, None));
        assert_eq!(s.try_with_flock(|| 3), Some(3));
    }

    #[test]
    fn a_lock_let_go_while_waiting_is_taken() {
        let d = Dir::new("shm-test", "later");
        let p = d.path().join("x.seg");
        let s = Shm::open_or_create(&p, &layout(), 0o700).expect("open");
        let h = held(&p);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(h);
        });
        assert_eq!(s.with_flock_bounded(Duration::from_secs(30), || 5), Ok(5));
        t.join().expect("join");
    }

    #[test]
    fn an_initialised_segment_opens_while_another_holds_its_lock_and_a_fresh_one_does_not() {
        let d = Dir::new("shm-test", "open");
        let p = d.path().join("x.seg");
        drop(Shm::open_or_create(&p, &layout(), 0o700).expect("create"));
        let h = held(&p);
        Shm::open_or_create(&p, &layout(), 0o700).expect("opens without the lock");
        drop(h);
        // A file not yet initialised (empty) whose lock another keeps: the
        // open waits at most root's bound, then fails naming the holder.
        let q = d.path().join("fresh.seg");
        let h = held(&q);
        let t = Instant::now();
        let e = Shm::open_or_create(&q, &layout(), 0o700)
            .err()
            .expect("busy");
        assert!(t.elapsed() < Duration::from_secs(20));
        assert!(
            e.0.starts_with(&format!(
                "{}: its lock is held by pid {}",
                q.display(),
                std::process::id()
            )),
            "{e}"
        );
        drop(h);
        Shm::open_or_create(&q, &layout(), 0o700).expect("then initialised");
    }

    #[test]
    fn a_segment_is_opened_from_a_descriptor_writable_as_the_descriptor_was_opened() {
        use std::os::fd::OwnedFd;
        let d = Dir::new("shm-test", "from-fd");
        let p = d.path().join("x.seg");
        drop(Shm::open_or_create(&p, &layout(), 0o700).expect("create"));
        let open = |write: bool| -> OwnedFd {
            std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(&p)
                .expect("open")
                .into()
        };
        let shown = Path::new("/shown/x.seg");
        let rw = Shm::from_fd(open(true), shown, &layout()).expect("read-write");
        assert!(rw.writable);
        assert_eq!(rw.path, shown);
        let ro = Shm::from_fd(open(false), shown, &layout()).expect("read-only");
        assert!(!ro.writable);
        assert!(
            ro.claim_first(1, "slot", |_| ()).is_err(),
            "opened read-only"
        );
        // What is not a segment of this layout is refused, named as given.
        let q = d.path().join("short.seg");
        std::fs::write(&q, b"x").expect("write");
        let f: OwnedFd = std::fs::File::open(&q).expect("open").into();
        let e = Shm::from_fd(f, shown, &layout()).err().expect("refused");
        assert_eq!(
            e.0,
            "/shown/x.seg: not a cuslice test segment of this version (size 1, expected 4096)"
        );
        let dir: OwnedFd = std::fs::File::open(d.path()).expect("open").into();
        let e = Shm::from_fd(dir, shown, &layout()).err().expect("refused");
        assert_eq!(e.0, "/shown/x.seg: test segment is not a regular file");
    }

    #[test]
    fn the_flock_holder_is_read_from_proc_locks() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 08:01:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4321 fd:02:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 77 fd:02:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 0 08:01:5 0 EOF\n";
        assert_eq!(flock_holder(locks, 0xfd, 2, 1234), Some(4321));
        // A POSIX lock is not a flock; another inode or device is not ours.
        assert_eq!(flock_holder(locks, 8, 1, 99), None);
        assert_eq!(flock_holder(locks, 0xfd, 2, 1235), None);
        assert_eq!(flock_holder(locks, 0xfd, 3, 1234), None);
        // A holder in a PID namespace the reader cannot see reads 0.
        assert_eq!(flock_holder(locks, 8, 1, 5), None);
        assert_eq!(flock_holder("garbage\n\n1: FLOCK", 0, 0, 0), None);
    }
}
