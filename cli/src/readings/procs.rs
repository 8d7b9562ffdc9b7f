//! What the host's `/proc` says of a process now: the command line of one
//! of this PID namespace that holds a tenant's segment open
//! ([`host_cmdline`]), whether it holds one open ([`holds_open`]), whether
//! it is exiting ([`exiting`]): read by `host::proc`. The kernel's files
//! (procfs), not a tenant's; what a process put in its command line is
//! escaped.

use cuslice_host::container::command_line;
use cuslice_host::proc;
use cuslice_host::text::clean;

/// The command line of process `pid` of this PID namespace, if it is one
/// of the tenant's: it must hold one of `files` (a segment of the tenant)
/// open. A PID from another namespace (a container's) names another
/// process here, or none, and is not taken for it.
pub fn host_cmdline(pid: u32, files: &[(u64, u64)]) -> Option<String> {
    if !holds_open(pid, files) {
        return None;
    }
    let args = proc::cmdline(pid);
    (!args.is_empty()).then(|| clean(&command_line(&args)))
}

pub use proc::{exiting, holds_open};
