//! What the host side reads of a process in `/proc` that every host
//! command shares: the OCI hook records a container's init and namespace
//! with these, the watch maps processes to slices with them, `cuslice
//! resize` finds a `cuslice run` session's directory with them, `cuslice
//! status` tells a tenant's host processes with them.
//!
//! Paths here are the kernel's (`/proc/<pid>/...`), read by path: procfs
//! holds no link a tenant planted; the links it makes (`fd/N`, `ns/*`,
//! `exe`, `root`) are followed where what they lead to is what is asked.

use std::path::PathBuf;

/// How many of a process's descriptors (`/proc/<pid>/fd`) a host command
/// looks at: the shim opens its segments early and `cuslice run` holds a
/// handful, so a process that opens a million files costs a reading no
/// more.
pub const MAX_FDS: usize = 1024;

/// `/proc/<pid>/stat`: the parent and the start time (clock ticks after
/// boot), which with the PID names one process for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    pub start: u64,
}

/// `/proc/<pid>/stat` of process `pid` of this PID namespace, parsed; None
/// when there is no such process (or it cannot be read).
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The cgroup of process `pid` ([`cgroup_of`] its `/proc/<pid>/cgroup`);
/// None where it cannot be read or names none.
pub fn cgroup(pid: u32) -> Option<String> {
    cgroup_of(&cgroup_text(pid)?)
}

/// The text of `/proc/<pid>/cgroup` (the OCI hook parses its v2 line for
/// the driver's memory limit too); None where it cannot be read.
pub fn cgroup_text(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
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

/// Whether process `pid` holds one of `files` (device, inode) open among
/// its first [`MAX_FDS`] descriptors. Each `/proc/<pid>/fd/N` is stat'ed
/// following it, on purpose: it is the kernel's link to the open file,
/// and the file is what is compared.
pub fn holds_open(pid: u32, files: &[(u64, u64)]) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|rd| {
        rd.flatten()
            .take(MAX_FDS)
            .any(|e| std::fs::metadata(e.path()).is_ok_and(|m| files.contains(&(m.dev(), m.ino()))))
    })
}

/// The inode of a namespace file.
pub fn ns_inode(path: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The cgroup of a `/proc/<pid>/cgroup` text: the v2 line's path, else
/// the memory controller's, else the pids controller's.
pub fn cgroup_of(text: &str) -> Option<String> {
    let mut v1 = None;
    for l in text.lines() {
        let mut it = l.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            return Some(path.to_string());
        }
        let ctrls: Vec<&str> = ctrl.split(',').collect();
        if ctrls.contains(&"memory") || (v1.is_none() && ctrls.contains(&"pids")) {
            v1 = Some(path.to_string());
        }
    }
    v1
}

/// `/proc/<pid>/stat`'s parent and start time; the command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last
/// `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... starttime(22).
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// The PID process `pid` (of this PID namespace) has as it sees itself: the
/// last entry of `NSpid:` in `/proc/<pid>/status` (its container's PID for
/// a process in a container).
pub fn inner_pid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("NSpid:"))?;
    l.split_whitespace().last()?.parse().ok()
}

/// Its command line, each argument (lossily) as a string.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The file name of its executable (a binary replaced since it started
/// reads as its name, without the kernel's " (deleted)").
pub fn exe_name(pid: u32) -> Option<String> {
    let p = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let name = p.file_name()?.to_string_lossy().into_owned();
    Some(name.trim_end_matches(" (deleted)").to_string())
}

/// A variable of its initial environment.
pub fn environ(pid: u32, key: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{key}=");
    raw.split(|b| *b == 0).find_map(|kv| {
        kv.strip_prefix(prefix.as_bytes())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

/// Its real user ID (`Uid:` of `/proc/<pid>/status`).
pub fn uid(pid: u32) -> Option<u32> {
    uid_of(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The real user ID of a `/proc/<pid>/status` text.
pub fn uid_of(status: &str) -> Option<u32> {
    let l = status.lines().find(|l| l.starts_with("Uid:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

/// `path` as process `pid` sees it (through its root directory), from
/// here.
pub fn in_root(pid: u32, path: &std::path::Path) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path))
}

/// The paths of the files and directories it holds open (what
/// `/proc/<pid>/fd/*` link to; sockets, pipes and the like left out), at
/// most [`MAX_FDS`] of them.
pub fn fd_paths(pid: u32) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return vec![];
    };
    rd.flatten()
        .take(MAX_FDS)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        // `socket:[123]`, `pipe:[4]`, `anon_inode:[eventfd]`: no files.
        .filter(|p| p.is_absolute())
        .collect()
}
