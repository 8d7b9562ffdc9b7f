//! What involves the GPU's memory pool beyond admission: waiting for
//! memory to be freed (`memory_wait`), and the headroom reported to the
//! info hooks (guarantee, burst and the pool's room).

use std::sync::atomic::Ordering;

use super::{Dev, Quota, Short};

std::thread_local! {
    /// Set while a stream-ordered allocation is admitted: it never waits
    /// (it may be captured into a graph, and waiting would stall the
    /// capture).
    static NO_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with waiting for memory off on this thread.
pub fn without_waiting<R>(f: impl FnOnce() -> R) -> R {
    NO_WAIT.with(|w| {
        let old = w.replace(true);
        let r = f();
        w.set(old);
        r
    })
}
impl Quota {
    /// With `memory_wait`, retries `again` each time memory is freed on the
    /// GPU (by this container or another tenant), until it succeeds or the
    /// deadline passes. Never waits where nobody else could free memory
    /// (the calling process would wait for itself), nor on a thread
    /// admitting a stream-ordered allocation. One log line per process.
    pub fn wait(
        &self,
        ordinal: usize,
        bytes: u64,
        why: Short,
        mut again: impl FnMut() -> Result<(), Short>,
    ) -> Result<(), Short> {
        let Some(dev) = self.devs.get(ordinal) else {
            return Err(why);
        };
        let Some((pool, _)) = dev.pool else {
            return Err(why);
        };
        if self.wait_ms == 0 || NO_WAIT.with(|w| w.get()) || !self.others_may_free(dev, &why) {
            return Err(why);
        }
        let start = std::time::Instant::now();
        let deadline = start + std::time::Duration::from_millis(self.wait_ms);
        let mut why = why;
        // Counted among the waiters before the first look (see Pool::freed).
        // None only once at_exit gave the pool slot back (another thread is
        // ending the process): the allocation fails as without memory_wait.
        let Some(waiting) = pool.waiting() else {
            return Err(why);
        };
        let outcome = loop {
            let seen = waiting.generation();
            match again() {
                Ok(()) => break Ok(()),
                Err(w) => why = w,
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                break Err(why);
            }
            // Woken by a free; at most a second between looks at processes
            // that died without freeing (their usage is reclaimed here).
            waiting.sleep(
                seen,
                (deadline - now).min(std::time::Duration::from_secs(1)),
            );
            self.seg.reclaim_dead();
        };
        drop(waiting);
        if !self.wait_logged.swap(true, Ordering::Relaxed) {
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let what = why.what();
            match &outcome {
                Ok(()) => crate::info!(
                    "GPU {ordinal}: an allocation of {bytes} bytes waited {ms:.1} ms {what} and was granted (memory_wait {} ms; further waits are not logged)",
                    self.wait_ms
                ),
                Err(_) => crate::warn!(
                    "GPU {ordinal}: an allocation of {bytes} bytes waited {ms:.1} ms {what}, the whole memory_wait, and was refused (further waits are not logged)"
                ),
            }
        }
        outcome
    }

    /// Whether someone other than this process holds memory that a free
    /// could give to it: other processes of the container (a refusal under
    /// the quota), or other processes on the GPU's pool.
    fn others_may_free(&self, dev: &Dev, why: &Short) -> bool {
        let mine = self
            .seg
            .slot(self.slot)
            .map_or(0, |s| s.used[dev.seg].load(Ordering::Relaxed));
        let container = self.seg.device_usage(dev.seg).map_or(0, |u| u.used);
        let in_container = container > mine;
        match why {
            Short::Quota { .. } => in_container,
            Short::Pool { .. } | Short::Lent { .. } | Short::Driver => {
                in_container || dev.pool.is_some_and(|(p, _)| p.others_live())
            }
        }
    }

    /// What this container can still get on device `ordinal` beyond its
    /// use, where it has a guarantee below its limit: its guarantee, its
    /// burst and the pool's room, less its use. For `cuMemGetInfo` and
    /// NVML's memory info, never the allocation path: it may sweep the
    /// pool ([`GpuPool::tidy`](cuslice_core::pool::Pool::tidy)).
    pub fn headroom(&self, ordinal: usize) -> Option<u64> {
        let dev = self.devs.get(ordinal)?;
        let u = self.seg.device_usage(dev.seg)?;
        if u.guarantee == 0 || u.guarantee >= u.limit {
            return None;
        }
        let link = self.seg.pool_link(dev.seg)?;
        // A look at the room: dead processes' bursts and guarantees whose
        // linger is over are swept first (at most ten times a second per
        // process, never waiting for the lock), or a framework sizing its
        // caches by the free memory would be told less than it can get.
        link.pool.tidy();
        let burst = link
            .pool
            .entry(link.entry)
            .map_or(0, |e| e.burst.load(Ordering::Acquire));
        Some(
            u.guarantee
                .saturating_add(burst)
                .saturating_add(link.pool.room())
                .saturating_sub(u.used),
        )
    }
}
