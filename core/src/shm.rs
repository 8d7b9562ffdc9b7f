//! A shared, file-backed mapping with a versioned header, and the OFD
//! byte-range locks that prove a slot's owner alive. Used by both segment
//! kinds: the per-container memory segment and the per-GPU scheduling
//! segment.
//!
//! A file rather than POSIX shm so that only a directory needs to be
//! bind-mounted into containers (their `/dev/shm` may be private).

use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A segment error: one line naming the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentError(pub String);

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SegmentError {}

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
            // Creation under an exclusive flock: two first processes cannot
            // both initialise.
            // SAFETY: flock on our fd.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
                return Err(os_err(path, "cannot lock segment"));
            }
            let r = Self::init_locked(fd, path, layout);
            // SAFETY: unlocking our fd.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
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
        let size = layout.header.total_size as usize;
        match fstat(fd, path) {
            Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => {
                // SAFETY: closing our own fd (no Shm owns it yet).
                unsafe { libc::close(fd) };
                return Err(SegmentError(format!(
                    "{}: {} is not a regular file",
                    path.display(),
                    layout.what
                )));
            }
            Ok(st) if st.st_size as u64 == size as u64 => {}
            Ok(st) => {
                // SAFETY: closing our own fd (no Shm owns it yet).
                unsafe { libc::close(fd) };
                return Err(SegmentError(format!(
                    "{}: not a cuslice {} of this version (size {}, expected {size})",
                    path.display(),
                    layout.what,
                    st.st_size
                )));
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        }
        let shm = match Self::map(fd, path, size, writable) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        // From here the Shm owns (and on error closes) the fd.
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

    /// Exclusive whole-file flock for rare registrations.
    pub fn with_flock<R>(&self, f: impl FnOnce() -> R) -> R {
        // SAFETY: flock on our fd.
        unsafe { libc::flock(self.fd, libc::LOCK_EX) };
        let r = f();
        // SAFETY: unlocking our fd.
        unsafe { libc::flock(self.fd, libc::LOCK_UN) };
        r
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
