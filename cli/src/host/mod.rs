//! The host side's layout and its file-system primitive (DESIGN.md, "The
//! host side"): what runs on the host, often as root, in directories other
//! users can write.
//!
//! - [`fs`]: a directory held by its descriptor, entries created, opened
//!   and removed in it by name without following links, modes set
//!   explicitly.
//! - [`run_dir`]: where a `cuslice run` session's directory is, what it is
//!   called, how it is made and removed; used by `run`, `watch` and
//!   `status` alike.
//! - [`container`]: a container's record (`container.json`) and the hook's
//!   root: written by the OCI hook, read by `status` and `watch`.
//! - [`proc`]: what every host command reads of a process in `/proc` (its
//!   stat, namespace inode, cgroup).
//! - [`text`]: the one function that makes text from tenants (commands,
//!   names, images, annotations, tenant names in segments, paths from their
//!   environments) safe for a terminal or a log line.
//!
//! The commands (`oci`, `watch`, `status`, `run`) build on this module and
//! `cuslice-core`, never on each other: `oci` and `watch` used to import
//! each other for these.

pub mod container;
pub mod fs;
pub mod proc;
pub mod run_dir;
pub mod text;
