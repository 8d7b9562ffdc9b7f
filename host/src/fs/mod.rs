//! The host side's one safe-fs primitive: a directory held by its
//! descriptor, in which entries are created, opened and removed by a plain
//! name, relative to that descriptor, never following a symbolic link, with
//! modes set explicitly (`fchmod`, never left to the umask) and checked on
//! the open descriptor.
//!
//! A host command often runs as root in a directory other users can write
//! (`/tmp`): a path handed to `open`/`mkdir`/`remove_dir_all` there follows
//! whatever links they planted and accepts whatever directory they made
//! beforehand. Here a create must create (`O_EXCL`, `mkdirat`: an existing
//! entry, a link included, is an error the caller sees), what was created
//! is opened again without following a link and checked to be the kind of
//! file asked for, ours (the effective uid) and of exactly the mode asked
//! for, and a removal walks the tree by descriptors, unlinking links
//! rather than following them. A read never blocks (`O_NONBLOCK`: a FIFO
//! planted where a file belongs) and is bounded.
//!
//! Errors are one line naming the path.
//!
//! By concern:
//!
//! - here: [`Dir`] itself (opened at a trusted path, cloned), its errors,
//!   and the checks every opener shares ([`open_checked`], [`check_fd`]);
//! - `dir`: entries opened (files, directories, segments, `O_PATH`
//!   descriptors), walked beneath (plain names only), described, read,
//!   created, listed;
//! - `replace`: files written whole and renamed into place;
//! - `lock`: lock files, taken waiting, not waiting, or within a bound;
//! - `remove`: entries and trees removed by descriptors.

use std::ffi::{CString, OsStr};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

mod dir;
mod lock;
mod remove;
mod replace;
#[cfg(test)]
mod tests;

pub use crate::sys::Kind;
use crate::sys::{euid, fstat, type_name};

/// A failed operation: one line naming the path, and the OS error number
/// where there was one (so that a caller can tell "that name is taken").
#[derive(Debug)]
pub struct Error {
    msg: String,
    errno: Option<i32>,
}

impl Error {
    fn os(path: &Path, what: &str, e: &io::Error) -> Error {
        Error {
            msg: format!("{}: {what}: {e}", path.display()),
            errno: e.raw_os_error(),
        }
    }

    fn other(path: &Path, what: impl fmt::Display) -> Error {
        Error {
            msg: format!("{}: {what}", path.display()),
            errno: None,
        }
    }

    /// Whether a create found the name already taken (by anything: a
    /// file, a directory, a symbolic link, dangling or not).
    pub fn already_exists(&self) -> bool {
        self.errno == Some(libc::EEXIST)
    }

    /// The OS error number, where the failure was the system's.
    pub fn errno(&self) -> Option<i32> {
        self.errno
    }

    /// Whether what was opened, read or removed is not there.
    pub fn not_found(&self) -> bool {
        self.errno == Some(libc::ENOENT)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

impl From<Error> for String {
    fn from(e: Error) -> String {
        e.msg
    }
}

/// An open directory (`O_DIRECTORY|O_CLOEXEC`: a program the caller starts
/// does not inherit it), and its path for messages.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `name` as a single path component: not empty, no `/`, not `.` or `..`,
/// no NUL.
fn component(dir: &Path, name: &OsStr) -> Result<CString, Error> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(Error::other(
            &dir.join(name),
            "expected a plain name (no /, not . or ..)",
        ));
    }
    CString::new(b).map_err(|_| Error::other(dir, "a NUL in a name"))
}

/// Checks on the descriptor that `fd` is `kind` and owned by our
/// effective uid, sets its mode to exactly `mode` (never touching what is
/// not ours), and checks that it took.
fn set_mode_and_check(fd: BorrowedFd, path: &Path, kind: Kind, mode: u32) -> Result<(), Error> {
    let stat = || fstat(fd).map_err(|e| Error::os(path, "cannot stat it", &e));
    let st = stat()?;
    if !kind.matches(st.st_mode) {
        return Err(Error::other(
            path,
            format!(
                "expected {}, got {}",
                kind.expected(),
                type_name(st.st_mode)
            ),
        ));
    }
    let me = euid();
    if st.st_uid != me {
        return Err(Error::other(
            path,
            format!("owned by uid {}, expected our uid {me}", st.st_uid),
        ));
    }
    crate::sys::fchmod(fd, mode as libc::mode_t)
        .map_err(|e| Error::os(path, &format!("cannot set its mode to {mode:04o}"), &e))?;
    let got = stat()?.st_mode & 0o7777;
    if got != mode as libc::mode_t {
        return Err(Error::other(
            path,
            format!("mode {got:04o}, expected {mode:04o}"),
        ));
    }
    Ok(())
}

/// Checks on the open descriptor `fd` that it is `kind`, owned by `owner`
/// where given (`whose` says whose uid that is, for the message). Errors
/// say only what is wrong; the caller names the path.
pub fn check_fd(fd: BorrowedFd, kind: Kind, owner: Option<(u32, &str)>) -> Result<(), String> {
    let st = fstat(fd).map_err(|e| e.to_string())?;
    if !kind.matches(st.st_mode) {
        return Err(format!(
            "expected {}, got {}",
            kind.expected(),
            type_name(st.st_mode)
        ));
    }
    if let Some((u, whose)) = owner
        && st.st_uid != u
    {
        return Err(format!(
            "owned by uid {}, not by {whose} uid {u}",
            st.st_uid
        ));
    }
    Ok(())
}

/// Opens `path` relative to `at` (a directory descriptor), without
/// following a link in its last component (a link there is an error,
/// wherever it points) and without blocking (a FIFO), read-only; checked on
/// the descriptor to be `kind` and owned by `owner` where given. Errors say
/// only what is wrong; the caller names the path.
pub fn open_checked(
    at: BorrowedFd,
    path: &Path,
    kind: Kind,
    owner: Option<(u32, &str)>,
) -> Result<OwnedFd, String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "a NUL in its path")?;
    let mut flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    if kind == Kind::Dir {
        flags |= libc::O_DIRECTORY;
    }
    let base = at.as_raw_fd();
    // SAFETY: openat with a NUL-terminated path and a descriptor the
    // caller holds; the descriptor is owned below.
    let fd = unsafe { libc::openat(base, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        let got_link = || format!("expected {}, got a symbolic link", kind.expected());
        return Err(match e.raw_os_error() {
            Some(libc::ELOOP) => got_link(),
            // O_DIRECTORY|O_NOFOLLOW on a link, or on another kind of file:
            // said as what is there.
            Some(libc::ENOTDIR) if kind == Kind::Dir => {
                // SAFETY: an all-zero `stat` is a valid value of this plain
                // C struct; fstatat only writes into it.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: fstatat with the same base and NUL-terminated
                // path, into a local, following no link.
                let r =
                    unsafe { libc::fstatat(base, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
                match st.st_mode & libc::S_IFMT {
                    _ if r != 0 => e.to_string(),
                    libc::S_IFLNK => got_link(),
                    _ => format!("expected a directory, got {}", type_name(st.st_mode)),
                }
            }
            _ => e.to_string(),
        });
    }
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    check_fd(fd.as_fd(), kind, owner)?;
    Ok(fd)
}

/// The text of the regular file `name` in the directory `dir`, opened as
/// [`open_checked`] does (owned by `owner` where given): at most `max`
/// bytes of UTF-8 (a FIFO, a link to /dev/zero or a huge file never stalls
/// the caller). Errors say only what is wrong; the caller names the path.
pub fn read_checked_at(
    dir: BorrowedFd,
    name: &Path,
    owner: Option<(u32, &str)>,
    max: u64,
) -> Result<String, String> {
    let fd = open_checked(dir, name, Kind::File, owner)?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(
        &mut io::Read::take(std::fs::File::from(fd), max + 1),
        &mut bytes,
    )
    .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "expected at most {}, got a larger file",
            cuslice_core::config::format_size(max)
        ));
    }
    String::from_utf8(bytes).map_err(|_| "expected UTF-8 text".to_string())
}

/// Gives the file behind `fd` (one the caller made: a segment) exactly
/// `mode`, checked on the descriptor; it must be a regular file of ours.
pub fn set_file_mode(fd: BorrowedFd, path: &Path, mode: u32) -> Result<(), Error> {
    set_mode_and_check(fd, path, Kind::File, mode)
}

impl Dir {
    /// Opens the directory at `path`, a place the caller trusts (the
    /// user's `$XDG_RUNTIME_DIR`, `/tmp`, the hook's root): links on the
    /// way to it are followed, as the user or the administrator set them
    /// up; nothing is followed below it.
    pub fn open(path: &Path) -> Result<Dir, Error> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::other(path, "a NUL in the path"))?;
        // SAFETY: open with a NUL-terminated path that outlives the call.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(Error::os(
                path,
                "cannot open the directory",
                &io::Error::last_os_error(),
            ));
        }
        Ok(Dir {
            // SAFETY: open just returned this descriptor; nothing else owns
            // it.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// Its path, for messages and for handing to others.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path` joined with `name`, for messages and for code that still
    /// opens by path below a directory of root's.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// The directory `fd` refers to (checked on the descriptor to be one),
    /// named `path` in messages: a descriptor opened from another `Dir`
    /// (an `O_PATH` one from [`Dir::open_path`] included: entries are
    /// opened from it, it cannot be listed or read), or one the caller
    /// trusts (a container's root as its runtime set it up).
    pub fn from_fd(fd: OwnedFd, path: impl Into<PathBuf>) -> Result<Dir, Error> {
        let path = path.into();
        let st = fstat(fd.as_fd()).map_err(|e| Error::os(&path, "cannot stat it", &e))?;
        if !Kind::Dir.matches(st.st_mode) {
            return Err(Error::other(
                &path,
                format!("expected a directory, got {}", type_name(st.st_mode)),
            ));
        }
        Ok(Dir { fd, path })
    }

    /// This directory again, through a descriptor of its own.
    pub fn try_clone(&self) -> Result<Dir, Error> {
        Ok(Dir {
            fd: self
                .fd
                .try_clone()
                .map_err(|e| Error::os(&self.path, "cannot duplicate its descriptor", &e))?,
            path: self.path.clone(),
        })
    }
}
