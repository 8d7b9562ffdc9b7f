//! NVML's answers turned into the judge's inputs: the liveness query, the
//! memory checks and an event; and one look at every GPU for the
//! commands that do not run a health source (`status`, the OCI hook):
//! fresh judges fed what NVML says now.

use super::judge::{Answer, Check, Failure, Input, Judge};
use crate::gpu::nvml::{DeviceHandle, EVENT_DOUBLE_BIT_ECC, EVENT_XID, Event, Nvml, NvmlError};

fn failed(check: Check, e: NvmlError) -> Input {
    Input::Failed(
        check,
        Failure {
            code: e.code,
            text: e.text,
        },
    )
}

/// The liveness query: the GPU's memory information.
pub fn alive(nvml: &Nvml, d: &DeviceHandle) -> Input {
    match nvml.alive(d) {
        Ok(()) => Input::Answered(Answer::Alive),
        Err(e) => failed(Check::Alive, e),
    }
}

/// The memory checks: retired pages pending, remapped rows, the
/// uncorrectable ECC count.
pub fn checks(nvml: &Nvml, d: &DeviceHandle) -> Vec<Input> {
    vec![
        match nvml.retired_pages_pending(d) {
            Ok(pending) => Input::Answered(Answer::RetiredPages { pending }),
            Err(e) => failed(Check::RetiredPages, e),
        },
        match nvml.remapped_rows(d) {
            Ok((pending, failure)) => Input::Answered(Answer::RemappedRows { pending, failure }),
            Err(e) => failed(Check::RemappedRows, e),
        },
        match nvml.ecc_uncorrected(d) {
            Ok(uncorrected) => Input::Answered(Answer::Ecc { uncorrected }),
            Err(e) => failed(Check::Ecc, e),
        },
    ]
}

/// What registering for its events says of a GPU.
pub fn registered(r: Result<u64, NvmlError>) -> Input {
    match r {
        Ok(_) => Input::Answered(Answer::Events),
        Err(e) => failed(Check::Events, e),
    }
}

/// An event as the judge takes it (None: a type the judge does not
/// know, which the source never registers for).
pub fn event(e: &Event) -> Option<Input> {
    if e.kind & EVENT_XID != 0 {
        Some(Input::Xid(e.data))
    } else if e.kind & EVENT_DOUBLE_BIT_ECC != 0 {
        Some(Input::DoubleBitEcc)
    } else {
        None
    }
}

/// One look at GPU `d` at `now`: a fresh judge (quiet period `quiet`)
/// fed the liveness query and the memory checks. No history: a check
/// that fails now counts as one that never answered, and a rising ECC
/// count cannot be seen; XID events are not seen at all.
pub fn look(nvml: &Nvml, d: &DeviceHandle, now: f64, quiet: f64) -> Judge {
    let mut j = Judge::new(now, quiet);
    j.observe(&alive(nvml, d), now);
    for i in checks(nvml, d) {
        j.observe(&i, now);
    }
    j
}
