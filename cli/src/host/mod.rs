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

pub mod fs;
pub mod run_dir;
