//! The descriptor-level calls the rest of this crate is made of, in one
//! place: `openat` (always close-on-exec), `fstat` and `fstatat` without
//! following a link, `fchmod`, the effective uid, what a file type is
//! called in a message, and a descriptor's `/proc/self/fd` path
//! ([`fd_path`]). [`fs`](crate::fs) (the host's own directories) and
//! [`inroot`](crate::inroot) (a container's root file system) both build
//! on this module and on nothing of each other.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// What a path or an entry is expected to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

impl Kind {
    /// How it is named in a message: "a directory", "a regular file".
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Dir => "a directory",
            Kind::File => "a regular file",
        }
    }

    /// Whether a file of `mode` (its `st_mode`) is of this kind.
    pub fn matches(self, mode: libc::mode_t) -> bool {
        mode & libc::S_IFMT == self.ifmt()
    }

    /// The `S_IF*` type bits of this kind.
    pub fn ifmt(self) -> libc::mode_t {
        match self {
            Kind::Dir => libc::S_IFDIR,
            Kind::File => libc::S_IFREG,
        }
    }
}

/// What a file type is called in an error.
pub fn type_name(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFREG => "a regular file",
        libc::S_IFLNK => "a symlink",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFIFO => "a fifo",
        libc::S_IFSOCK => "a socket",
        _ => "a file of unknown type",
    }
}

/// `fstat` of a descriptor.
pub fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct;
    // fstat only writes into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a live descriptor (borrowed) and `st` is a writable
    // `stat` that outlives the call.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: a link is described, not its
/// target.
pub fn lstat_at(dir: BorrowedFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: libc::stat is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat on a descriptor the caller holds, a NUL-terminated
    // name that outlives the call, into a local.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)` as an owned descriptor (a
/// program the caller starts never inherits it).
pub fn openat(dir: BorrowedFd, name: &CStr, flags: i32, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is a live descriptor, `name` a NUL-terminated string
    // that outlives the call; the mode is the variadic argument openat reads
    // with O_CREAT (an unsigned int, as C promotes it).
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fchmod` of a descriptor.
pub fn fchmod(fd: BorrowedFd, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: fchmod on a descriptor the caller holds.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `mkdirat(dir, name, mode)` (the mode is cut by the umask: callers set
/// it again with [`fchmod`]).
pub fn mkdirat(dir: BorrowedFd, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: mkdirat on a descriptor the caller holds with a
    // NUL-terminated name that outlives the call.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `/proc/self/fd/N`, the path by which the kernel reaches what descriptor
/// N of this process refers to (its mount and inode), whatever names lead
/// there now: for what takes only a path (mount(2) of a bind mount's
/// source and target, the OCI hook's). The one place such a path is
/// made; a file below a held directory is opened from the directory's
/// descriptor ([`crate::fs::Dir`]), never through this.
pub fn fd_path(fd: BorrowedFd) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The effective uid: whose the files this process makes are.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
