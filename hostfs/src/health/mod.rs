//! GPU health: one judgement per GPU, from NVML, shared by the watch,
//! `status` / `top` / the exporter, the OCI hook and the DRA plugin
//! (docs/observability.md, *GPU health*).
//!
//! - [`judge`]: the judgement itself, a pure state machine (what NVML
//!   said, with its time, in; healthy, degraded or unhealthy, the cause,
//!   the reason and since when, out), with the quiet period before a GPU
//!   returns to service and the operator's clear.

pub mod judge;

pub use judge::{Answer, Cause, Change, Check, Failure, Health, Input, Judge, State};
