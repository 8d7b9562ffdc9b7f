//! The host side's file layer, which the command shares with the DRA
//! plugin: the crate `cuslice-host` (`hostfs/`), under the name the
//! commands have always used for it. See that crate for what each module
//! owns: [`fs`] (the one safe-fs primitive), [`layout`] (where the host's
//! files are), [`run_dir`], [`container`] (the records), [`discover`] (the slices found, for `status`
//! and `watch` alike), [`inroot`] (a
//! container's root file system), [`sys`] (the descriptor-level calls),
//! [`cdi`] (the CDI specs), [`proc`], [`text`], [`resize`] (the record of
//! a live resize, which `resize` writes and `watch` and `status` read),
//! [`watch_state`] (the state file `watch` writes and `status` reads),
//! [`nvml`] (NVML, loaded at run time, as the DRA plugin loads it) and
//! [`health`] (GPU health: the judgement, the source, what is published).
//!
//! The commands (`oci`, `watch`, `status`, `run`, `resize`) build on it and
//! `cuslice-core`, never on each other.

pub use cuslice_host::{
    cdi, container, discover, fs, guarantee, health, inroot, layout, nvml, proc, resize, run_dir,
    sys, text, watch_state,
};
