//! Segments: what the segments hold against the quota files. A slice's
//! memory segment: every device entry a process may be admitting against,
//! whatever its state word or UUID say, held to what the quota file gives
//! that GPU. A GPU segment: what core's audit found in it that no cuslice
//! process writes (`observe` audits; here each value found becomes a
//! finding, its text built from what tenants wrote, escaped). Its part of
//! the history: when each GPU's segment was last found tampered with (the
//! compute check only reports on that GPU for a while).

use std::collections::HashMap;
use std::path::Path;

use cuslice_core::config::format_uuid;
use cuslice_core::gpu::audit::Finding;
use cuslice_core::segment::{READY_STATE, UNLIMITED};

use super::verdict::{Case, Key, Verdict, size, slice_key, view};
use crate::watch::slices::SliceId;
use crate::watch::snapshot::{GpuSegReading, SliceSnap, Snapshot};
use crate::watch::tenant::{memory_certain, memory_quota};
use cuslice_host::text::{self, LINE_MAX};
use cuslice_host::watch_state::{FindingView, Kind};

/// What the segments rule leaves to the next pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// GPU index -> when (CLOCK_MONOTONIC ns) its GPU segment was last
    /// found tampered with.
    pub tampered: HashMap<u32, u64>,
}

/// `memory_segment`: every device entry of the slice's memory segment a
/// process may be admitting against, whatever its state word or UUID say
/// (a tenant that raised its limit could otherwise hide the raise by
/// writing either: the shim keeps using the entry it registered), whose
/// limit differs from what the quota file gives that GPU, or (a GPU of
/// this host) whose state word was overwritten.
pub fn memory_segment(snap: &Snapshot, id: &SliceId, slice: &SliceSnap) -> Vec<Verdict> {
    let (Some(cfg), Some(path), Some(entries)) = (&slice.quota, &slice.mem_seg, &slice.mem_entries)
    else {
        return vec![];
    };
    let mut out = vec![];
    for r in entries {
        let uuid = format_uuid(&r.uuid);
        let tampered = r.state != READY_STATE;
        let (gpu, q, certain) = match snap.devices.iter().find(|d| d.uuid == uuid) {
            Some(d) => {
                let (q, certain) = memory_quota(cfg, d.index, &r.uuid);
                (Some(d.index), q, certain)
            }
            // A UUID no GPU of this host has (a byte flipped, or a device
            // NVML does not list, such as a MIG instance): judged by what
            // the file gives that UUID, when that does not depend on an
            // index.
            None => (
                None,
                cfg.limits_for(u32::MAX, &r.uuid).memory_limit(),
                memory_certain(cfg, &r.uuid),
            ),
        };
        let (have, want) = (r.limit, q.unwrap_or(UNLIMITED));
        if have == want && !(tampered && gpu.is_some()) {
            continue;
        }
        // Sizes that differ but round alike are shown in bytes (a raise
        // of 1 MiB on 8 GiB reads "8.0 GiB" otherwise).
        let exact = size(have) == size(want);
        let shown = |l: u64| {
            if l == UNLIMITED {
                "none".to_string()
            } else if exact {
                format!("{l} bytes")
            } else {
                size(l)
            }
        };
        let entry = match gpu {
            Some(g) => format!("GPU {g}"),
            None => format!(
                "entry {} ({}, no GPU of this host)",
                r.index,
                format_uuid(&r.uuid)
            ),
        };
        let state = if tampered {
            " in an entry whose state word was overwritten"
        } else {
            ""
        };
        let what = format!(
            "{}: memory segment {} says {entry} quota {}{state}, its quota file {}",
            slice.label,
            path.display(),
            shown(have),
            shown(want)
        );
        out.push(Verdict::Found {
            key: (
                Kind::MemorySegment,
                slice_key(id),
                gpu.or(Some(1000 + r.index as u32)),
                None,
            ),
            view: view(
                Kind::MemorySegment,
                &slice.tenant,
                &slice.label,
                gpu,
                None,
                shown(have),
                shown(want),
                what,
            ),
            case: Case::MemorySegment {
                slice: id.clone(),
                entry: r.index,
                uuid: gpu.is_some().then_some(r.uuid),
                limit: want,
                certain,
            },
        });
    }
    out
}

/// `gpu_segment`: a GPU segment the audit found values in that no
/// cuslice process writes, one finding per value
/// ([`gpu_segment_findings`]); remembers when, per GPU (the compute check
/// only reports on that GPU for a while: `compute::TAMPER_QUIET_NS`). A
/// segment that could not be read is a line of the state's errors.
pub fn gpu_segment(r: &GpuSegReading, h: &mut History) -> Option<Verdict> {
    match &r.found {
        Err(e) => Some(Verdict::Unseen(e.clone())),
        Ok(found) if found.is_empty() => None,
        Ok(found) => {
            h.tampered.insert(r.gpu, r.at_ns);
            Some(Verdict::GpuSegment {
                path: r.path.clone(),
                gpu: r.gpu,
                expected: r.expected.clone(),
                at_ns: r.at_ns,
                findings: gpu_segment_findings(&r.path, r.gpu, found),
            })
        }
    }
}

/// The findings of a GPU segment at `path` (GPU `gpu`), from what its
/// audit (or its repair, which stands for the audit: `act`) found: one per
/// tenant entry (or the scheduler words, `-`) and kind of value, which
/// starts, is restored, and ends when the segment is found right again.
/// Tenant names are whatever a tenant wrote into the segment: escaped
/// here, and each value found one line.
pub fn gpu_segment_findings(path: &Path, gpu: u32, found: &[Finding]) -> Vec<(Key, FindingView)> {
    let label = format!("GPU segment {}", path.display());
    found
        .iter()
        .map(|f| {
            let tenant = f.tenant.as_deref().map_or_else(|| "-".into(), text::clean);
            let what = text::clean_to(&format!("{} ({})", f, f.kind), LINE_MAX);
            // The kind as the line ends with it (its closing parenthesis
            // included).
            let kind = what.rsplit_once(" (").map_or("", |(_, k)| k);
            (
                (
                    Kind::GpuSegment,
                    format!("{}:{tenant}:{kind}", path.display()),
                    Some(gpu),
                    None,
                ),
                view(
                    Kind::GpuSegment,
                    &tenant,
                    &label,
                    Some(gpu),
                    None,
                    what.clone(),
                    "-".into(),
                    format!("{label}: {what}"),
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{History, judge};
    use super::*;
    use crate::watch::config::Policy;
    use cuslice_core::segment::RawDevice;
    use std::path::PathBuf;

    #[test]
    fn a_memory_segments_entries_are_held_to_the_quota_file_whatever_their_state_or_uuid() {
        let cfg = policy(Policy::Report);
        let at = |q: &str, e: RawDevice| judge(&memory_entry_at(q, e), &History::default(), &cfg).0;
        // As the file says: nothing.
        assert!(at(MEM_1G, entry(0, GPU0, READY_STATE, G)).is_empty());
        // Raised: put back, with its UUID and state.
        let v = at(MEM_1G, entry(0, GPU0, READY_STATE, 2 * G));
        assert_eq!(
            cases(&v),
            [&Case::MemorySegment {
                slice: a(),
                entry: 0,
                uuid: Some(GPU0),
                limit: G,
                certain: true
            }]
        );
        let Verdict::Found { key, view, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(key.2, Some(0));
        assert_eq!(
            view.what,
            "container a: memory segment /run/cuslice/containers/a/segment/memory.seg says GPU 0 quota 2.0 GiB, its quota file 1.0 GiB"
        );
        // The right limit, its state word overwritten (the shim keeps
        // admitting against it): found too.
        let v = at(MEM_1G, entry(0, GPU0, READY_STATE + 7, G));
        let Verdict::Found { view, .. } = &v[0] else {
            panic!("{v:?}")
        };
        assert!(
            view.what.ends_with(
                "says GPU 0 quota 1073741824 bytes in an entry whose state word was overwritten, its quota file 1073741824 bytes"
            ),
            "{}",
            view.what
        );
        // A UUID byte flipped: no GPU of this host; held to what the file
        // gives every GPU, its UUID left as it is.
        let mut flipped = GPU0;
        flipped[15] ^= 1;
        let v = at(MEM_1G, entry(3, flipped, READY_STATE, 100 * G));
        assert_eq!(
            cases(&v),
            [&Case::MemorySegment {
                slice: a(),
                entry: 3,
                uuid: None,
                limit: G,
                certain: true
            }]
        );
        let Verdict::Found { key, .. } = &v[0] else {
            unreachable!()
        };
        assert_eq!(key.2, Some(1003));
        // A quota given by index: found, not certain (never restored).
        let v = at(
            "[device.0]\nmemory = \"1GiB\"\n",
            entry(0, GPU0, READY_STATE, 2 * G),
        );
        assert!(
            matches!(cases(&v)[..], [Case::MemorySegment { certain: false, .. }]),
            "{v:?}"
        );
    }

    #[test]
    fn a_tampered_gpu_segment_is_a_finding_per_value_and_marks_its_gpu() {
        let cfg = policy(Policy::Report);
        let path = PathBuf::from(GPU_SEGMENT);
        let what = "tenant a: share 90, its quota file 30 (tenant-config)".to_string();
        let s = gpu_segments_read(forged_share());
        let (v, h) = judge(&s, &History::default(), &cfg);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[1], Verdict::Unseen("cannot open".into()));
        assert_eq!(h.segments.tampered, HashMap::from([(1, NOW)]));
        let f = gpu_segment_findings(&path, 1, &[forged_share()]);
        // The verdict carries them, worded alike.
        assert!(
            matches!(&v[0], Verdict::GpuSegment { gpu: 1, findings, .. } if *findings == f),
            "{v:?}"
        );
        assert_eq!(
            f[0].0,
            (
                Kind::GpuSegment,
                "/run/cuslice/gpu/GPU-x.seg:a:tenant-config)".to_string(),
                Some(1),
                None
            )
        );
        assert_eq!(
            f[0].1.what,
            format!("GPU segment {}: {what}", path.display())
        );
    }
}
