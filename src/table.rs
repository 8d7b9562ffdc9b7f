//! A fixed-capacity, lock-free map from a 64-bit key (a device pointer, a
//! VMM handle, an array handle) to what the quota needs to credit it back
//! (size and device). Used on the allocation and free paths, so: no lock, no
//! allocation after creation, no syscall.
//!
//! Open addressing with linear probing. Keys are unique while live (the
//! driver never hands out a live pointer twice), so an insert never races a
//! remove of the same key; a removed entry becomes a tombstone that later
//! inserts reuse. The backing memory is an anonymous `MAP_NORESERVE`
//! mapping: pages are only touched (and only cost memory) where entries land.

use std::sync::atomic::{AtomicU64, Ordering};

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;

#[repr(C)]
struct Entry {
    key: AtomicU64,
    size: AtomicU64,
    meta: AtomicU64,
}

pub struct Table {
    entries: *mut Entry,
    cap: usize,
}

// SAFETY: entries are only accessed through atomics; the mapping lives as
// long as the table.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}

impl Table {
    /// A table of `cap` entries (a power of two). None if the mapping fails.
    pub fn new(cap: usize) -> Option<Table> {
        debug_assert!(cap.is_power_of_two());
        let bytes = cap * std::mem::size_of::<Entry>();
        // SAFETY: anonymous private mapping; zero-filled, i.e. all EMPTY.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Table {
            entries: p.cast(),
            cap,
        })
    }

    fn entry(&self, i: usize) -> &Entry {
        // SAFETY: i < cap, within the mapping.
        unsafe { &*self.entries.add(i & (self.cap - 1)) }
    }

    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing; device pointers are aligned, so mix high bits in.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize
    }

    /// Records `key`. Returns false when the table is full (the caller must
    /// then refuse the allocation rather than lose track of it).
    pub fn insert(&self, key: u64, size: u64, meta: u64) -> bool {
        if key == EMPTY || key == TOMBSTONE {
            return false;
        }
        let h = self.home(key);
        for i in 0..self.cap {
            let e = self.entry(h + i);
            let k = e.key.load(Ordering::Acquire);
            if (k == EMPTY || k == TOMBSTONE)
                && e.key
                    .compare_exchange(k, key, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                e.size.store(size, Ordering::Release);
                e.meta.store(meta, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Looks `key` up without removing it.
    pub fn get(&self, key: u64) -> Option<(u64, u64)> {
        self.find(key).map(|e| {
            (
                e.size.load(Ordering::Acquire),
                e.meta.load(Ordering::Acquire),
            )
        })
    }

    fn find(&self, key: u64) -> Option<&Entry> {
        if key == EMPTY || key == TOMBSTONE {
            return None;
        }
        let h = self.home(key);
        for i in 0..self.cap {
            let e = self.entry(h + i);
            match e.key.load(Ordering::Acquire) {
                EMPTY => return None,
                k if k == key => return Some(e),
                _ => {}
            }
        }
        None
    }

    /// Removes `key`, returning its (size, meta).
    pub fn remove(&self, key: u64) -> Option<(u64, u64)> {
        let e = self.find(key)?;
        let v = (
            e.size.load(Ordering::Acquire),
            e.meta.load(Ordering::Acquire),
        );
        // Only the owner of a live key removes it; a failed exchange means a
        // double free raced another, and only one may credit.
        e.key
            .compare_exchange(key, TOMBSTONE, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(v)
    }

    /// Replaces the (size, meta) of a live key. Returns false if absent.
    pub fn update(&self, key: u64, size: u64, meta: u64) -> bool {
        match self.find(key) {
            Some(e) => {
                e.size.store(size, Ordering::Release);
                e.meta.store(meta, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Visits every live entry (key, size, meta). Not atomic as a whole.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64, u64)) {
        for i in 0..self.cap {
            let e = self.entry(i);
            let k = e.key.load(Ordering::Acquire);
            if k != EMPTY && k != TOMBSTONE {
                f(
                    k,
                    e.size.load(Ordering::Acquire),
                    e.meta.load(Ordering::Acquire),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_and_reuse() {
        let t = Table::new(16).expect("table");
        for k in 1..=12u64 {
            assert!(t.insert(k << 21, k, k + 100));
        }
        assert_eq!(t.get(5 << 21), Some((5, 105)));
        assert_eq!(t.remove(5 << 21), Some((5, 105)));
        assert_eq!(t.remove(5 << 21), None, "second free must not credit again");
        assert_eq!(t.get(5 << 21), None);
        // Tombstones are reused; the table fills up to its capacity exactly.
        for k in 13..=17u64 {
            assert!(t.insert(k << 21, k, 0), "{k}");
        }
        assert!(!t.insert(99 << 21, 1, 0), "a full table says so");
        let mut n = 0;
        t.for_each(|_, _, _| n += 1);
        assert_eq!(n, 16);
    }

    #[test]
    fn concurrent_inserts_and_removes_keep_every_key() {
        let t = std::sync::Arc::new(Table::new(1 << 14).expect("table"));
        let hs: Vec<_> = (0..8u64)
            .map(|th| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..2000u64 {
                        let k = ((th << 32) | round) << 9 | 0x100;
                        assert!(t.insert(k, round, th));
                        if round % 2 == 0 {
                            assert_eq!(t.remove(k), Some((round, th)));
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("thread");
        }
        let mut n = 0;
        t.for_each(|_, size, _| {
            assert_eq!(size % 2, 1);
            n += 1
        });
        assert_eq!(n, 8 * 1000);
    }
}
