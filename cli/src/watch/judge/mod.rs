//! The watch's judgements: pure functions from what a pass saw (a
//! [`Snapshot`]), what earlier passes left (a [`History`]) and the host's
//! policy ([`WatchConfig`]) to [`Verdict`]s. No I/O here: every rule is
//! tested on snapshots written by hand. What is done about a verdict is
//! `act`'s.
//!
//! One rule per module, each with its part of the history and the text
//! of its findings:
//!
//! - [`registration`]: processes that went around the shim (first
//!   sightings);
//! - [`memory`]: a slice over its memory quota on a GPU (or, for one that
//!   may burst, past the burst the watch granted it from NVML's figures,
//!   or the one it publishes), and which of its processes to kill; its
//!   history: the bursts granted, where each slice's guarantee counts;
//! - [`resize`]: a memory finding on a GPU whose quota the slice's last
//!   resize lowered: within the resize's grace, or after it;
//! - [`compute`]: a slice over its share or its ceiling on a GPU (the
//!   throttled time between passes, whether a demand is current, the
//!   ceiling's window, the passes in a row, the slices serving a freeze,
//!   whether its GPU's segment was tampered with lately);
//! - [`segments`]: a memory segment's entries against the quota file, a
//!   GPU segment's values no cuslice process writes (when each GPU's was
//!   last found tampered with).
//!
//! [`verdict`] holds what they conclude and how a finding is worded;
//! what the steps share about a tenant (whether the shim registers it,
//! whether a limit is certain) is `tenant`'s. [`judge`] composes the
//! rules, in the order their findings are logged: per GPU, the memory
//! grants for the GPU as a whole (`memory::grants`, no finding), then per
//! slice with processes on it, `unregistered` then `memory` (through
//! `resize`), then `compute` for the GPU; then `memory_segment` per slice; then `gpu_segment` per GPU
//! segment file. No rule imports another: what one needs of another's
//! history is an argument.

pub mod compute;
pub mod memory;
pub mod registration;
pub mod resize;
pub mod segments;
pub mod verdict;

#[cfg(test)]
pub mod fixtures;

use std::collections::BTreeMap;

pub use verdict::{Case, Key, Verdict, slice_key};

use crate::watch::config::WatchConfig;
use crate::watch::slices::SliceId;
use crate::watch::snapshot::{GpuSnap, ProcSnap, Snapshot};

/// What earlier passes leave to the next one: each rule's part.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub registration: registration::History,
    pub memory: memory::History,
    pub compute: compute::History,
    pub segments: segments::History,
}

/// Judges a pass: every rule, in order (see the module comment), from
/// `prev`; returns the verdicts and what this pass leaves to the next.
pub fn judge(snap: &Snapshot, prev: &History, cfg: &WatchConfig) -> (Vec<Verdict>, History) {
    let mut next = prev.clone();
    let mut out = vec![];
    next.registration.forget_gone(snap);
    next.memory.forget_gone(snap);
    for gpu in &snap.gpus {
        let groups = groups(gpu);
        // What each slice that may burst may hold here: decided for the
        // GPU as a whole (every slice's guarantee, every process's use).
        let held = memory::grants(snap, gpu, &groups, &prev.memory, &mut next.memory, cfg);
        for (id, procs) in &groups {
            let Some(slice) = snap.slices.get(*id) else {
                continue;
            };
            // Registration first: that a process went around the shim is
            // worth its own finding, whatever the memory check does to it.
            out.extend(registration::unregistered(
                snap.pass,
                gpu,
                id,
                slice,
                procs,
                &mut next.registration,
            ));
            out.extend(
                memory::memory(gpu, id, slice, procs, held.get(*id), cfg)
                    .map(|v| resize::grace(v, gpu, slice, snap.now_unix)),
            );
        }
        out.extend(compute::compute(
            snap,
            gpu,
            &groups,
            &prev.compute,
            &mut next.compute,
            prev.segments.tampered.get(&gpu.index).copied(),
            cfg,
        ));
    }
    for (id, slice) in &snap.slices {
        out.extend(segments::memory_segment(snap, id, slice));
    }
    for r in &snap.gpu_segments {
        out.extend(segments::gpu_segment(r, &mut next.segments));
    }
    (out, next)
}

/// A GPU's processes by slice (in slice order, each in NVML's order): a
/// process outside any slice, or claimed by several alike, is no one's
/// and never judged.
pub fn groups(gpu: &GpuSnap) -> BTreeMap<&SliceId, Vec<&ProcSnap>> {
    let mut g: BTreeMap<&SliceId, Vec<&ProcSnap>> = BTreeMap::new();
    for p in &gpu.procs {
        if let Some(id) = p.owner.slice() {
            g.entry(id).or_default().push(p);
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::watch::config::Policy;
    use crate::watch::slices::Owner;

    #[test]
    fn a_process_claimed_by_several_slices_alike_or_by_none_is_never_judged() {
        // Containers a and b share a PID namespace (and nothing tells
        // which a process is): once every such process went to the first
        // record, and the watch killed a well-behaved process of b.
        let cfg = policy(Policy::Kill);
        let mut ambiguous = process(7, 70, 3 * G, Owner::Ambiguous(vec![a(), b()]));
        ambiguous.registration = None;
        let mut outside = process(8, 80, 3 * G, Owner::Nobody);
        outside.registration = None;
        let s = snapshot(
            2,
            vec![gpu(0, GPU0, vec![ambiguous, outside])],
            vec![(a(), slice("a", MEM_1G)), (b(), slice("b", MEM_1G))],
        );
        let mut h = History::default();
        h.registration.first_unregistered.insert((7, 70), 1);
        let (v, _) = judge(&s, &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert!(groups(&s.gpus[0]).is_empty());
    }
}
