//! Guarantees whose maker is gone: an entry root registered (held) in a
//! GPU memory pool under the hook's root (`<root>/gpu/<uuid>.memory`: the
//! OCI hook's for a container, the DRA plugin's for a claim) stays until
//! poststop or unprepare releases it. Where those never come (a runtime
//! that died, a node whose plugin lost a claim), nothing else would: the
//! guarantee would stay reserved for nobody. The watch releases a held
//! entry that no container or claim on the host has had for
//! `orphan_grace` (60 s by default: the hook registers a container's
//! guarantee an instant before it writes the container's record).
//!
//! The entries' names and held flags are tenant-writable: a forged held
//! flag on a gone tenant's entry is released by the same rule; a forged
//! one on a live slice's entry keeps only what that slice is guaranteed
//! anyway.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use cuslice_core::pool::Pool;

/// A held entry: (pool file name, tenant name, slice tag).
pub type Held = (String, String, u64);

/// Since when each held entry without a slice has been seen so (ns).
#[derive(Debug, Default)]
pub struct Orphans {
    since: HashMap<Held, u64>,
}

/// The held entries to release now: those whose (name, tag) no live slice
/// has, seen so for at least `grace_ns` (`since` keeps when each was first
/// seen so; an entry found again, or gone, is forgotten).
pub fn due(
    held: &[Held],
    live: &HashSet<(String, u64)>,
    since: &mut HashMap<Held, u64>,
    now: u64,
    grace_ns: u64,
) -> Vec<Held> {
    let orphan = |h: &Held| !live.contains(&(h.1.clone(), h.2));
    since.retain(|k, _| held.contains(k) && orphan(k));
    let mut out = vec![];
    for h in held.iter().filter(|h| orphan(h)) {
        let t = *since.entry(h.clone()).or_insert(now);
        if now.saturating_sub(t) >= grace_ns {
            out.push(h.clone());
        }
    }
    out
}

impl Orphans {
    /// One look at the pools in `gpu_dir`: releases the held entries that
    /// no slice in `live` has had for `grace_ns`. What it did or could
    /// not do, a line each.
    pub fn tidy(
        &mut self,
        gpu_dir: &Path,
        live: &HashSet<(String, u64)>,
        now: u64,
        grace_ns: u64,
    ) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(gpu_dir) else {
            self.since.clear();
            return vec![];
        };
        let mut held = vec![];
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".memory") {
                continue;
            }
            if let Ok(p) = Pool::open_read_only(&ent.path()) {
                held.extend(
                    p.entries()
                        .into_iter()
                        .filter(|e| e.held)
                        .map(|e| (name.clone(), e.name, e.tag)),
                );
            }
        }
        let mut lines = vec![];
        for (file, tenant, tag) in due(&held, live, &mut self.since, now, grace_ns) {
            let path = gpu_dir.join(&file);
            let shown = cuslice_host::text::clean(&tenant);
            match Pool::open_existing(&path) {
                Ok(pool) => {
                    let (_, busy) = pool.release(&tenant, tag);
                    lines.push(format!(
                        "{}: released the guarantee of {shown}: no container or claim of it on the host for {} s (its maker went without poststop or unprepare){}",
                        path.display(),
                        grace_ns / 1_000_000_000,
                        busy.map_or(String::new(), |b| format!("; without the pool's lock: {b}"))
                    ));
                }
                Err(e) => lines.push(format!("cannot release the guarantee of {shown}: {e}")),
            }
            self.since.remove(&(file, tenant, tag));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_entry_without_a_slice_is_released_after_its_grace_and_a_live_ones_never() {
        let h = |n: &str| ("GPU-x.memory".to_string(), n.to_string(), 7u64);
        let held = vec![h("gone"), h("live")];
        let live: HashSet<(String, u64)> = [("live".to_string(), 7)].into();
        let mut since = HashMap::new();
        assert!(due(&held, &live, &mut since, 1_000, 60).is_empty());
        assert!(due(&held, &live, &mut since, 1_059, 60).is_empty());
        assert_eq!(due(&held, &live, &mut since, 1_060, 60), vec![h("gone")]);
        // Its slice back (a container created again): forgotten; its grace
        // starts over when it is gone again.
        let both: HashSet<(String, u64)> =
            [("live".to_string(), 7), ("gone".to_string(), 7)].into();
        assert!(due(&held, &both, &mut since, 1_100, 60).is_empty());
        assert!(due(&held, &live, &mut since, 1_101, 60).is_empty());
        assert_eq!(due(&held, &live, &mut since, 1_161, 60), vec![h("gone")]);
        // Another tag of the same name is another slice.
        let other = vec![("GPU-x.memory".to_string(), "live".to_string(), 8)];
        assert!(due(&other, &live, &mut HashMap::new(), 0, 0).len() == 1);
    }
}
