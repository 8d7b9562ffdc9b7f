//! Opening the pool's file and reading it: the head, the entries, the
//! process slots, and the entries as observers see them.

use super::*;

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

    pub(super) fn proc_slot(&self, i: usize) -> Option<&Proc> {
        (i < MAX_PROCS).then(|| {
            // SAFETY: as in entry().
            unsafe {
                self.shm
                    .at::<Proc>(HEADER + HEAD + MAX_ENTRIES * ENTRY + i * PROC)
            }
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
