//! Resize: a slice over a memory quota its last resize lowered (`cuslice
//! resize`, its record `resize.json` in the slice's directory) is, on the
//! GPUs whose quota that resize lowered, given the resize's grace: within
//! it the finding stands without being acted on (the shim already refuses
//! every new allocation above the quota, and the tenant may be giving
//! memory back); after it, it is acted on as any slice over its quota.
//! A record that no longer holds for the quota file (written again since)
//! gives no grace. Refines what `memory` found; nothing carried between
//! passes.

use super::verdict::{Case, Verdict};
use crate::watch::snapshot::{GpuSnap, SliceSnap};

/// `v` (what `memory` found for `slice` on `gpu`), as a finding of a
/// quota lowered by a resize where it is one: [`Case::MemoryResized`],
/// within its grace or after it at `now_unix` (CLOCK_REALTIME seconds).
pub fn grace(v: Verdict, gpu: &GpuSnap, slice: &SliceSnap, now_unix: f64) -> Verdict {
    let until = match (&slice.quota, &slice.resize, &gpu.uuid_bytes) {
        (Some(q), Some(r), Some(uuid)) => r.grace_on(q, uuid),
        _ => None,
    };
    match (v, until) {
        (
            Verdict::Found {
                key,
                view,
                case: Case::Memory { kill, certain },
            },
            Some(until),
        ) => Verdict::Found {
            key,
            view,
            case: Case::MemoryResized {
                kill,
                certain,
                until_ms: (until * 1000.0) as u64,
                over: now_unix >= until,
            },
        },
        (v, _) => v,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{History, judge};
    use crate::watch::config::Policy;
    use crate::watch::judge::Case;
    use cuslice_host::resize::{ALL, Change, ResizeRecord};

    fn resized(from: u64, to: u64) -> ResizeRecord {
        ResizeRecord {
            at_unix: 1000.0,
            grace_seconds: 30.0,
            by_uid: 0,
            changes: vec![Change {
                entry: ALL.into(),
                field: "memory".into(),
                from: Some(from),
                to,
            }],
        }
    }

    /// Slice a over its 1 GiB quota (2.6 GiB on GPU 0) at `now_unix`,
    /// resized by `r`.
    fn at(r: ResizeRecord, now_unix: f64) -> Vec<Case> {
        let mut s = memory_at(MEM_1G);
        s.now_unix = now_unix;
        for sl in s.slices.values_mut() {
            sl.resize = Some(r.clone());
        }
        let (v, _) = judge(&s, &History::default(), &policy(Policy::Kill));
        cases(&v).into_iter().cloned().collect()
    }

    #[test]
    fn a_quota_lowered_by_a_resize_is_over_within_its_grace_then_after_it() {
        assert_eq!(
            at(resized(4 * G, G), 1010.0),
            [Case::MemoryResized {
                kill: vec![(20, 200)],
                certain: true,
                until_ms: 1_030_000,
                over: false
            }]
        );
        assert!(matches!(
            at(resized(4 * G, G), 1030.0)[..],
            [Case::MemoryResized { over: true, .. }]
        ));
    }

    #[test]
    fn a_raise_or_a_record_the_file_no_longer_holds_gives_no_grace() {
        // Raised to 1 GiB from less: over it is no resize's doing.
        assert!(matches!(
            at(resized(512 << 20, G), 1010.0)[..],
            [Case::Memory { .. }]
        ));
        // The record says 2 GiB, the file 1 GiB: written again since.
        assert!(matches!(
            at(resized(4 * G, 2 * G), 1010.0)[..],
            [Case::Memory { .. }]
        ));
    }
}
