//! The watch's log: one line on standard error per call, whatever it
//! holds. Every step of a pass logs through it (the slices' notes, the
//! findings, the freezes let go), so it is below them all.

use cuslice_host::text::{self, LINE_MAX};

/// One line of the log. The values from tenants in it were escaped where
/// they entered the watch (slice labels, segment tenant names, findings);
/// the whole line is escaped again (idempotent) and bounded, for the paths
/// from a session's environment and whatever a later message adds: one
/// call, one line, whatever it holds.
pub fn log(line: &str) {
    eprintln!("cuslice watch: {}", text::clean_to(line, LINE_MAX));
}
