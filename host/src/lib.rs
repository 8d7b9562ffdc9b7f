//! The host side (`host/`, the crate `cuslice-host`): what runs on the
//! host, often as root, in directories other users and tenants can write,
//! opens files through this crate, and reaches the GPUs' NVML through it.
//! Shared by the `cuslice` command (`cli/`) and the DRA kubelet plugin
//! (`dra/`).
//!
//! - [`sys`]: the descriptor-level calls everything else is made of
//!   (`openat` close-on-exec, `fstat`/`fstatat` without following,
//!   `fchmod`, the effective uid, file type names, the one
//!   `/proc/self/fd/N` path maker for mount(2)).
//! - [`fs`]: the one safe-fs primitive for the host's own directories: a
//!   directory held by its descriptor, entries created, opened, read,
//!   replaced and removed in it by plain name without following links or
//!   blocking on a FIFO, modes set explicitly and checked, reads bounded,
//!   kinds and owners checked on the descriptor; segment files opened
//!   there for core to map (`Dir::open_segment`, core's `from_fd`).
//! - [`inroot`]: paths inside a container's root file system, walked as
//!   [`fs::Dir`]s from the root's descriptor without following links (the
//!   OCI hook), and the container user's access to them.
//! - [`layout`]: where the host's files are, as types: the hook's root
//!   (`/run/cuslice`) with its containers (a container's quota file in a
//!   directory of its own, the one mounted into it), claims, GPU segments,
//!   lock and preload file, the watch's directory, and the run directories of
//!   `cuslice run` sessions (their base and names).
//! - [`run_dir`]: a `cuslice run` session's directory, made exclusively
//!   under an unpredictable name and removed without following links.
//! - [`container`]: the records in a slice's directory: a container's
//!   (`container.json`, the OCI hook's) and a DRA claim's (`claim.json`,
//!   the plugin's); a slice's directory read (quota file and records), and
//!   a recorded container named, alike for `status` and the watch.
//! - [`discover`]: the slices on the host (containers, DRA claims,
//!   `cuslice run` sessions) found and their directories read, one rule
//!   per kind of slice for whose files are read: what `cuslice status` and
//!   `cuslice watch` both see.
//! - [`resize`]: the record of a live resize (`resize.json` in a slice's
//!   directory), which `cuslice resize` writes and `cuslice
//!   watch` and `cuslice status` read: what changed, when, and the grace a
//!   tenant over a lowered memory quota is given.
//! - [`guarantee`]: a slice's memory guarantee registered in each GPU's
//!   memory pool by whoever makes the slice (the OCI hook, the DRA plugin,
//!   `cuslice run`), checked against NVML's memory, released at its end.
//! - [`cdi`]: the CDI specs root writes for the container runtimes (the
//!   command's `cuslice.io/gpu=all`, the DRA plugin's per-claim ones):
//!   typed, their names checked as CDI checks them, the version the
//!   content needs declared, the `cuslice oci-hook` hooks spelled once.
//! - [`proc`]: what the host commands read of a process in `/proc` (its
//!   stat, namespace inode, cgroup).
//! - [`text`]: the one function that makes text from tenants (commands,
//!   names, images, annotations, tenant names in segments, paths from their
//!   environments) safe for a terminal or a log line.
//! - [`watch_state`]: the state `cuslice watch` publishes
//!   (`<root>/watch/state.json`) and `cuslice status` reads.
//! - [`gpu`]: the GPUs themselves: [`gpu::nvml`], NVML loaded at run time,
//!   the one loader of the command and the DRA plugin (its declarations
//!   generated from `cuda-headers/` by `build.rs`); [`gpu::health`], GPU
//!   health, one judgement per GPU that every host command and the DRA
//!   plugin share.
//!
//! No two modules import each other: `sys`, `text`, `proc` and `cdi` stand
//! alone; `fs` is on `sys`; `inroot` on `fs`, `sys` and `text`; `layout` on
//! `fs`; `run_dir` on `fs` and `layout`; `container` on `fs`, `layout`,
//! `proc` and `text`; `resize` on `fs` and `layout`; `discover` on
//! `container`, `fs`, `layout`, `resize` and `sys`; `watch_state` on `fs`,
//! `layout` and `text`; `gpu::nvml` stands alone; `gpu::health` is on
//! `gpu::nvml`, `fs`, `layout` and `text`.

pub mod cdi;
pub mod container;
pub mod discover;
pub mod fs;
pub mod gpu;
pub mod guarantee;
pub mod inroot;
pub mod layout;
pub mod proc;
pub mod resize;
pub mod run_dir;
pub mod sys;
pub mod text;
pub mod watch_state;
