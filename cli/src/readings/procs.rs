//! What the host's `/proc` says of a process now: the command line of one
//! of this PID namespace that holds a tenant's segment open
//! ([`host_cmdline`]), whether it holds one open ([`holds_open`]), whether
//! it is exiting ([`exiting`]). The kernel's files (procfs), not a
//! tenant's; what a process put in its command line is escaped.

use crate::host::container::command_line;
use crate::host::text::clean;

use super::file_id;

/// The command line of process `pid` of this PID namespace, if it is one
/// of the tenant's: it must hold one of `files` (a segment of the tenant)
/// open. A PID from another namespace (a container's) names another
/// process here, or none, and is not taken for it.
pub fn host_cmdline(pid: u32, files: &[(u64, u64)]) -> Option<String> {
    if !holds_open(pid, files) {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!args.is_empty()).then(|| clean(&command_line(&args)))
}

/// Whether process `pid` of this PID namespace holds one of `files` open
/// among its first `MAX_FDS` descriptors (the shim opens its segments
/// early; a process that opens a million files costs a reading no more).
pub fn holds_open(pid: u32, files: &[(u64, u64)]) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|rd| {
        rd.flatten()
            .take(crate::host::proc::MAX_FDS)
            .any(|e| file_id(&e.path()).is_some_and(|f| files.contains(&f)))
    })
}

/// Whether process `pid` is exiting (`PF_EXITING` in the flags of
/// `/proc/<pid>/stat`): it gave its registration back and the driver has
/// not torn its context down yet.
pub fn exiting(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.get(s.rfind(')')? + 2..)?;
            // After the name: state ppid pgrp session tty_nr tpgid flags.
            rest.split(' ').nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|f| f & PF_EXITING != 0)
}
