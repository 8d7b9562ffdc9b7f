//! GPU health: one judgement per GPU, from NVML, shared by the watch,
//! `status` / `top` / the exporter, the OCI hook and the DRA plugin
//! (docs/observability.md, *GPU health*).
//!
//! - [`judge`]: the judgement itself, a pure state machine (what NVML
//!   said, with its time, in; healthy, degraded or unhealthy, the cause,
//!   the reason and since when, out), with the quiet period before a GPU
//!   returns to service and the operator's clear.
//! - [`probe`]: NVML's answers as the judge's inputs (the liveness query,
//!   the memory checks, an event), and one look at a GPU.
//! - [`file`](mod@file): what the health source publishes (`<root>/health/state.json`),
//!   its lock, and the operators' clears.
//! - [`source`]: the health source of a long-running process: a thread
//!   asleep in NVML's event wait, the GPUs asked now and then, changes
//!   reported once, the judgement published.
//! - [`view`]: what a short-lived command takes for a GPU's health: the
//!   source's judgement and its own look, whichever is worse.
//!
//! `judge` stands alone; `probe` is on `judge`; `file` on `judge`;
//! `source` on `file`, `judge` and `probe`; `view` on `file`, `judge`,
//! `probe` and `source`.

pub mod file;
pub mod judge;
pub mod probe;
pub mod source;
pub mod view;

pub use judge::{Answer, Cause, Change, Check, Failure, Health, Input, Judge, State};
