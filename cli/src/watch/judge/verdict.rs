//! What the judge's rules conclude: a [`Verdict`], the [`Case`] a finding
//! is for the policy (`act::decide`), the [`Key`] a finding lasts under,
//! and what every rule words its findings with ([`view`], [`size`],
//! [`slice_key`]). Types and wording only: no rule here.

use std::path::PathBuf;

use cuslice_core::config::format_size;
use cuslice_core::gpu::audit::Expected;

use crate::watch::slices::SliceId;
use cuslice_host::watch_state::{FindingView, Kind};

/// The key of a finding: what, whose, which GPU, which process. A finding
/// lasts while some pass finds it again under its key.
pub type Key = (Kind, String, Option<u32>, Option<u32>);

/// What a check concluded.
// A handful per pass, each moved once: not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// A finding, and what it is about for the policy.
    Found {
        key: Key,
        view: FindingView,
        case: Case,
    },
    /// A finding that stands without being judged this pass: the compute
    /// finding of a slice serving a freeze.
    Stands(Key),
    /// A GPU segment holding values no cuslice process writes: one
    /// finding per value (`findings`, worded by
    /// `segments::gpu_segment_findings`), one repair for them all.
    GpuSegment {
        path: PathBuf,
        gpu: u32,
        expected: Vec<Expected>,
        at_ns: u64,
        findings: Vec<(Key, FindingView)>,
    },
    /// Something this pass could not see (a line of the state's errors).
    Unseen(String),
}

/// What a finding is about, for the policy (`act::decide`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Case {
    /// A process of a slice that never registered with the shim;
    /// `seen_before`: a pass before this one saw it so too.
    Unregistered {
        pid: u32,
        start: u64,
        seen_before: bool,
    },
    /// A slice over its memory quota on a GPU: the processes to kill,
    /// newest first; `certain`: the quota is the GPU's for sure (not given
    /// by an index NVML's need not match).
    Memory {
        kill: Vec<(u32, u64)>,
        certain: bool,
    },
    /// [`Case::Memory`] on a GPU whose quota the slice's last resize
    /// lowered (`judge::resize`): its grace ends at `until_ms`
    /// (CLOCK_REALTIME, ms); `over`: it has ended.
    MemoryResized {
        kill: Vec<(u32, u64)>,
        certain: bool,
        until_ms: u64,
        over: bool,
    },
    /// A slice over its share or ceiling on a GPU for `compute_sustain`
    /// passes: its processes there; `forged`: that GPU's segment was
    /// tampered with lately (the split may be forged).
    Compute {
        slice: SliceId,
        gpu: u32,
        pids: Vec<(u32, u64)>,
        certain: bool,
        forged: bool,
    },
    /// A memory segment entry whose limit (or state) differs from the
    /// quota file: what to put back; `uuid`: the GPU of this host it is
    /// (its state is put back too).
    MemorySegment {
        slice: SliceId,
        entry: usize,
        uuid: Option<[u8; 16]>,
        limit: u64,
        certain: bool,
    },
}

/// The name of a slice in finding keys.
pub fn slice_key(id: &SliceId) -> String {
    match id {
        SliceId::Container(c) => format!("container:{c}"),
        SliceId::Claim(uid) => format!("claim:{uid}"),
        SliceId::Run { pid, start } => format!("run:{pid}:{start}"),
    }
}

/// A finding as it is shown, before anything is done about it.
#[allow(clippy::too_many_arguments)]
pub fn view(
    kind: Kind,
    tenant: &str,
    slice: &str,
    gpu: Option<u32>,
    pid: Option<u32>,
    figure: String,
    limit: String,
    what: String,
) -> FindingView {
    FindingView {
        kind,
        tenant: tenant.to_string(),
        slice: slice.to_string(),
        gpu,
        pid,
        figure,
        limit,
        what,
        action: String::new(),
        since_unix: 0.0,
    }
}

/// A size for messages: `3.2 GiB`, `640 MiB`.
pub fn size(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / GIB)
    } else if b >= 1 << 20 {
        format!("{:.0} MiB", b as f64 / MIB)
    } else {
        format_size(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(640 << 20), "640 MiB");
    }
}
