//! Registration: a process of a slice on a GPU that never registered with
//! the shim (it went around it), where the shim would have registered it
//! (`tenant::registers`; registered: `tenant::is_registered`). Its part of
//! the history: when each such process was first seen, so that one is
//! acted on only from the second pass in a row that sees it.

use std::collections::HashMap;

use super::verdict::{Case, Verdict, size, slice_key, view};
use crate::watch::slices::SliceId;
use crate::watch::snapshot::{GpuSnap, ProcSnap, SliceSnap, Snapshot};
use crate::watch::tenant::{is_registered, registered_pids, registers};
use cuslice_host::watch_state::Kind;

/// What registration leaves to the next pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// (pid, start) -> the pass that first saw it unregistered.
    pub first_unregistered: HashMap<(u32, u64), u64>,
}

impl History {
    /// Every 16th pass, forgets the processes NVML no longer lists.
    pub fn forget_gone(&mut self, snap: &Snapshot) {
        if snap.pass.is_multiple_of(16) {
            self.first_unregistered
                .retain(|(pid, _), _| snap.nvml_pids.contains(pid));
        }
    }
}

/// `unregistered`: each process of the slice on this GPU that is not
/// registered, where the shim would have registered it. Reported at once;
/// `seen_before` (what `kill` needs) only from the second pass in a row
/// that sees it: a process that exits normally gives its slot back before
/// the driver has torn its context down, and NVML lists it until then. A
/// process the kernel marks exiting is skipped (and forgotten).
pub fn unregistered(
    pass: u64,
    gpu: &GpuSnap,
    id: &SliceId,
    slice: &SliceSnap,
    procs: &[&ProcSnap],
    h: &mut History,
) -> Vec<Verdict> {
    let (Some(cfg), Some(uuid)) = (&slice.quota, &gpu.uuid_bytes) else {
        return vec![];
    };
    if !registers(cfg, gpu.index, uuid) {
        return vec![];
    }
    let first_seen = &mut h.first_unregistered;
    let reg = registered_pids(&slice.slots);
    let mut out = vec![];
    for p in procs {
        let Some(r) = &p.registration else { continue };
        if is_registered(&reg, r) || r.exiting == Some(true) {
            first_seen.remove(&(p.pid, p.start));
            continue;
        }
        let first = *first_seen.entry((p.pid, p.start)).or_insert(pass);
        let what = format!(
            "{} pid {}: uses GPU {} ({}) but never registered with the shim",
            slice.label,
            p.pid,
            gpu.index,
            p.used.map_or_else(|| "memory unknown".to_string(), size)
        );
        out.push(Verdict::Found {
            key: (
                Kind::Unregistered,
                slice_key(id),
                Some(gpu.index),
                Some(p.pid),
            ),
            view: view(
                Kind::Unregistered,
                &slice.tenant,
                &slice.label,
                Some(gpu.index),
                Some(p.pid),
                p.used.map_or_else(|| "-".into(), size),
                "registered".into(),
                what,
            ),
            case: Case::Unregistered {
                pid: p.pid,
                start: p.start,
                seen_before: first < pass,
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{History, judge};
    use super::*;
    use crate::watch::config::Policy;
    use crate::watch::slices::Owner;
    use crate::watch::snapshot::{Registration, SlotReading};
    use cuslice_core::config::format_uuid;

    #[test]
    fn an_unregistered_process_is_found_at_once_and_seen_before_only_from_the_second_pass_in_a_row()
    {
        let cfg = policy(Policy::Kill);
        let at = unregistered_at;
        let (v, h) = judge(&at(1, false), &History::default(), &cfg);
        assert_eq!(
            cases(&v),
            [&Case::Unregistered {
                pid: 7,
                start: 70,
                seen_before: false
            }]
        );
        let Verdict::Found { key, view, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(
            key,
            &(
                Kind::Unregistered,
                "container:aaa".to_string(),
                Some(0),
                Some(7)
            )
        );
        assert_eq!(
            view.what,
            "container a pid 7: uses GPU 0 (512 MiB) but never registered with the shim"
        );
        // Seen again in the next pass: seen before (what `kill` needs).
        let (v, h) = judge(&at(2, false), &h, &cfg);
        assert_eq!(
            cases(&v),
            [&Case::Unregistered {
                pid: 7,
                start: 70,
                seen_before: true
            }]
        );
        // Registered in between: the next sighting is a first one again.
        let (v, h) = judge(&at(3, true), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        assert!(h.registration.first_unregistered.is_empty());
        let (v, _) = judge(&at(4, false), &h, &cfg);
        assert_eq!(
            cases(&v),
            [&Case::Unregistered {
                pid: 7,
                start: 70,
                seen_before: false
            }]
        );
    }

    #[test]
    fn a_process_the_kernel_marks_exiting_is_skipped() {
        // It gave its slot back on its way out; NVML lists it until the
        // driver lets go of its context.
        let cfg = policy(Policy::Kill);
        let at = |pass, exiting| {
            let mut p = process(7, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 7,
                maps_segment: None,
                exiting: Some(exiting),
            });
            snapshot(
                pass,
                vec![gpu(0, GPU0, vec![p])],
                vec![(a(), slice("a", MEM_1G))],
            )
        };
        let (v, h) = judge(&at(1, false), &History::default(), &cfg);
        assert_eq!(cases(&v).len(), 1);
        let (v, h) = judge(&at(2, true), &h, &cfg);
        assert!(v.is_empty(), "{v:?}");
        // Forgotten, too: not "seen before" if it shows up again.
        assert!(h.registration.first_unregistered.is_empty());
    }

    #[test]
    fn a_dead_slots_pid_does_not_count_as_registered() {
        let cfg = policy(Policy::Report);
        let at = |alive| {
            let mut s = slice("a", MEM_1G);
            // A slot not swept yet, of a process that died; the PID is
            // this one's (PIDs are reused, and namespaces repeat them).
            s.slots.push(SlotReading { pid: 7, alive });
            let mut p = process(7, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 7,
                maps_segment: Some(true),
                exiting: Some(false),
            });
            snapshot(1, vec![gpu(0, GPU0, vec![p])], vec![(a(), s)])
        };
        assert!(judge(&at(true), &History::default(), &cfg).0.is_empty());
        let (v, _) = judge(&at(false), &History::default(), &cfg);
        assert!(
            matches!(cases(&v)[..], [Case::Unregistered { pid: 7, .. }]),
            "{v:?}"
        );
    }

    #[test]
    fn a_pid_in_a_live_slot_is_registered_only_if_the_process_maps_its_slices_segments() {
        // `unshare -Urpf`: the process sees itself as 1, as a registered
        // sibling in another namespace does.
        let cfg = policy(Policy::Report);
        let at = |maps| {
            let mut s = slice("a", MEM_1G);
            s.slots.push(SlotReading {
                pid: 1,
                alive: true,
            });
            let mut p = process(4242, 70, G / 2, Owner::Slice(a()));
            p.registration = Some(Registration {
                inner_pid: 1,
                maps_segment: Some(maps),
                exiting: Some(false),
            });
            snapshot(1, vec![gpu(0, GPU0, vec![p])], vec![(a(), s)])
        };
        assert!(judge(&at(true), &History::default(), &cfg).0.is_empty());
        let (v, _) = judge(&at(false), &History::default(), &cfg);
        assert!(
            matches!(cases(&v)[..], [Case::Unregistered { pid: 4242, .. }]),
            "{v:?}"
        );
    }

    #[test]
    fn registration_is_judged_only_where_the_shim_registers() {
        // No memory quota anywhere, a share on GPU 1 only: a process on
        // GPU 0 has nothing to register in.
        let cfg = policy(Policy::Kill);
        let q = format!("[device.\"{}\"]\ncompute = 30\n", format_uuid(&GPU1));
        let at = |g: u32, uuid| {
            let p = process(7, 70, G / 2, Owner::Slice(a()));
            snapshot(1, vec![gpu(g, uuid, vec![p])], vec![(a(), slice("a", &q))])
        };
        assert!(judge(&at(0, GPU0), &History::default(), &cfg).0.is_empty());
        let (v, _) = judge(&at(1, GPU1), &History::default(), &cfg);
        assert!(
            matches!(cases(&v)[..], [Case::Unregistered { pid: 7, .. }]),
            "{v:?}"
        );
        // What the snapshot looked at follows the same rule.
        assert!(!registers(&quota(&q), 0, &GPU0));
        assert!(registers(&quota(&q), 1, &GPU1));
        assert!(registers(&quota(MEM_1G), 0, &GPU0));
    }
}
