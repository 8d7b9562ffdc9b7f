//! What the watch reads about a process, behind a trait so that the
//! PID-to-slice mapping can be tested on synthetic data. The real source
//! reads `/proc`: only for the PIDs NVML lists, their ancestors when a PID
//! is first seen, and the slices' own processes.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

pub use cuslice_host::proc::{Stat, ns_inode};

pub trait ProcSource {
    fn stat(&self, pid: u32) -> Option<Stat>;
    /// The inodes of the PID namespaces the process is in, its own first,
    /// then each parent up to the one this process (the watch) is in.
    fn pid_namespaces(&self, pid: u32) -> Vec<u64>;
    /// Its cgroup (v2 path, else the memory or pids controller's).
    fn cgroup(&self, pid: u32) -> Option<String>;
    /// Its PID as it sees itself (the last `NSpid` entry).
    fn inner_pid(&self, pid: u32) -> Option<u32>;
    fn cmdline(&self, pid: u32) -> Vec<String>;
    /// The file name of its executable.
    fn exe_name(&self, pid: u32) -> Option<String>;
    /// A variable of its initial environment.
    fn environ(&self, pid: u32, key: &str) -> Option<String>;
    /// Its real user ID (`Uid:` of `/proc/<pid>/status`, as this process
    /// sees it).
    fn uid(&self, pid: u32) -> Option<u32>;
    /// A path as the process sees it (its root directory), from here.
    fn in_root(&self, pid: u32, path: &std::path::Path) -> PathBuf;
    /// The paths of the files and directories it holds open (what
    /// `/proc/<pid>/fd/*` link to; sockets, pipes and the like left out),
    /// at most [`MAX_FDS`](cuslice_host::proc::MAX_FDS) of them: how a `cuslice run` session's
    /// directory, whose name is unpredictable, is found.
    fn fd_paths(&self, pid: u32) -> Vec<PathBuf>;
}

pub struct Procfs;

const NS_GET_PARENT: libc::c_ulong = 0xb702; // _IO(0xb7, 0x2)

impl ProcSource for Procfs {
    fn stat(&self, pid: u32) -> Option<Stat> {
        cuslice_host::proc::stat(pid)
    }

    fn pid_namespaces(&self, pid: u32) -> Vec<u64> {
        let mine = ns_inode("/proc/self/ns/pid");
        let Ok(c) = CString::new(format!("/proc/{pid}/ns/pid")) else {
            return vec![];
        };
        // SAFETY: open with a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return vec![];
        }
        // SAFETY: open just returned this descriptor; nothing else owns it.
        let mut cur = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut out = vec![];
        // A process may nest PID namespaces (32 levels at most).
        for _ in 0..33 {
            let Ok(st) = cuslice_host::sys::fstat(cur.as_fd()) else {
                break;
            };
            out.push(st.st_ino);
            if Some(st.st_ino) == mine {
                break;
            }
            // SAFETY: NS_GET_PARENT on a namespace descriptor we own; it
            // returns a new descriptor or -1.
            let p = unsafe { libc::ioctl(cur.as_raw_fd(), NS_GET_PARENT) };
            if p < 0 {
                break;
            }
            // SAFETY: the ioctl just returned this descriptor.
            cur = unsafe { OwnedFd::from_raw_fd(p) };
        }
        out
    }

    fn cgroup(&self, pid: u32) -> Option<String> {
        cuslice_host::proc::cgroup(pid)
    }

    fn inner_pid(&self, pid: u32) -> Option<u32> {
        cuslice_host::proc::inner_pid(pid)
    }

    fn cmdline(&self, pid: u32) -> Vec<String> {
        cuslice_host::proc::cmdline(pid)
    }

    fn exe_name(&self, pid: u32) -> Option<String> {
        cuslice_host::proc::exe_name(pid)
    }

    fn environ(&self, pid: u32, key: &str) -> Option<String> {
        cuslice_host::proc::environ(pid, key)
    }

    fn uid(&self, pid: u32) -> Option<u32> {
        cuslice_host::proc::uid(pid)
    }

    fn in_root(&self, pid: u32, path: &std::path::Path) -> PathBuf {
        cuslice_host::proc::in_root(pid, path)
    }

    fn fd_paths(&self, pid: u32) -> Vec<PathBuf> {
        cuslice_host::proc::fd_paths(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuslice_host::proc::{cgroup_of, parse_stat, uid_of};

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let s =
            "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(
            parse_stat(s),
            Some(Stat {
                ppid: 17,
                start: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_cgroup_is_the_v2_path_else_memory() {
        assert_eq!(
            cgroup_of("0::/system.slice/runc-abc.scope\n").as_deref(),
            Some("/system.slice/runc-abc.scope")
        );
        assert_eq!(
            cgroup_of("12:pids:/docker/x\n4:cpu,cpuacct:/docker/y\n3:memory:/docker/z\n1:name=systemd:/s\n")
                .as_deref(),
            Some("/docker/z")
        );
        assert_eq!(cgroup_of(""), None);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = std::process::id();
        let st = Procfs.stat(me).expect("stat");
        assert_eq!(st.ppid, std::os::unix::process::parent_id());
        assert_eq!(Procfs.inner_pid(me), Some(me));
        let ns = Procfs.pid_namespaces(me);
        assert_eq!(ns, vec![ns_inode("/proc/self/ns/pid").expect("ns")]);
        assert!(!Procfs.cmdline(me).is_empty());
        let dir = std::env::temp_dir();
        let held = std::fs::File::open(&dir).expect("open");
        let fds = Procfs.fd_paths(me);
        assert!(
            fds.contains(&dir.canonicalize().expect("canonical")),
            "{fds:?}"
        );
        assert!(fds.iter().all(|p| p.is_absolute()), "{fds:?}");
        drop(held);
        // SAFETY: getuid has no preconditions.
        assert_eq!(Procfs.uid(me), Some(unsafe { libc::getuid() }));
        assert_eq!(
            uid_of("Name:\tx\nUid:\t1000\t1001\t1002\t1003\n"),
            Some(1000)
        );
    }
}

/// Whether a `/proc/<pid>/maps` text maps one of the files `ids` (device
/// and inode, as `fstat` gives them): the fields after the offset are
/// `major:minor` in hex and the inode in decimal.
pub fn maps_any_of(maps: &str, ids: &[(u64, u64)]) -> bool {
    maps.lines().any(|l| {
        let mut f = l.split_ascii_whitespace().skip(3);
        let (Some(dev), Some(ino)) = (f.next(), f.next()) else {
            return false;
        };
        let Some((maj, min)) = dev.split_once(':') else {
            return false;
        };
        let (Ok(maj), Ok(min), Ok(ino)) = (
            u32::from_str_radix(maj, 16),
            u32::from_str_radix(min, 16),
            ino.parse::<u64>(),
        ) else {
            return false;
        };
        ino != 0 && ids.contains(&(libc::makedev(maj, min), ino))
    })
}

/// Whether host process `pid` maps one of the files `ids` (its
/// `/proc/<pid>/maps`, read by the host's /proc).
pub fn maps_any(pid: u32, ids: &[(u64, u64)]) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| maps_any_of(&m, ids))
}

#[cfg(test)]
mod maps_tests {
    use super::*;

    #[test]
    fn a_mapped_file_is_found_by_device_and_inode() {
        let maps = "7f00-7f10 rw-s 00000000 00:1a 4242 /run/cuslice/segment/memory.seg\n\
                    7f20-7f30 r-xp 00001000 fd:01 77 /usr/lib/libc.so.6\n\
                    7f40-7f50 rw-p 00000000 00:00 0 \n";
        let seg = (libc::makedev(0, 0x1a), 4242);
        assert!(maps_any_of(maps, &[seg]));
        assert!(maps_any_of(maps, &[(libc::makedev(0xfd, 1), 77)]));
        // Same inode on another device, another inode, anonymous memory.
        assert!(!maps_any_of(maps, &[(libc::makedev(0, 0x1b), 4242)]));
        assert!(!maps_any_of(maps, &[(libc::makedev(0, 0x1a), 4243)]));
        assert!(!maps_any_of(maps, &[(libc::makedev(0, 0), 0)]));
        assert!(!maps_any_of("garbage\n1 2 3 x:y z\n", &[seg]));
    }
}
