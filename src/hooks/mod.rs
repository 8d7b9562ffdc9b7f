//! Hand-written hook bodies, one module per family. The generated exports
//! (see `cuda-headers/README.md`) call `hooks::<family>::<name>` for the
//! functions annotated `pre`, `post` or `override`.

// Hook bodies are `unsafe fn`s called only by the generated exports, with
// the caller's arguments unchanged; their contract is the C function's.
#![allow(clippy::missing_safety_doc)]
// Hook bodies mirror the C signatures, however many parameters they have.
#![allow(clippy::too_many_arguments)]

pub mod context;
pub mod info;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod proc_address;
pub mod sync;
