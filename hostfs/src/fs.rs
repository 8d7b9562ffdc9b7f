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

use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use crate::sys::Kind;
use crate::sys::{euid, fstat, lstat_at, openat, type_name};

/// How deep [`Dir::remove_contents`] goes before it gives up (a tree the
/// program made in its run directory; far deeper than any real one).
const MAX_DEPTH: usize = 64;

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

/// Opens `path`, relative to `at` (a directory descriptor) or as it is,
/// without following a link in its last component (a link there is an
/// error, wherever it points) and without blocking (a FIFO), read-only;
/// checked on the descriptor to be `kind` and owned by `owner` where given.
/// Errors say only what is wrong; the caller names the path.
pub fn open_checked(
    at: Option<BorrowedFd>,
    path: &Path,
    kind: Kind,
    owner: Option<(u32, &str)>,
) -> Result<OwnedFd, String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "a NUL in its path")?;
    let mut flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    if kind == Kind::Dir {
        flags |= libc::O_DIRECTORY;
    }
    let base = at.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: openat with a NUL-terminated path and a descriptor the
    // caller holds (or AT_FDCWD); the descriptor is owned below.
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

/// The text of the regular file `path`, opened as [`open_checked`] does
/// (owned by `owner` where given): at most `max` bytes of UTF-8 (a FIFO, a
/// link to /dev/zero or a huge file never stalls the caller). Errors say
/// only what is wrong; the caller names the path.
pub fn read_checked(path: &Path, owner: Option<(u32, &str)>, max: u64) -> Result<String, String> {
    read_checked_at(None, path, owner, max)
}

/// [`read_checked`] of `path` relative to the directory `at` (as it is
/// where None).
pub fn read_checked_at(
    at: Option<BorrowedFd>,
    path: &Path,
    owner: Option<(u32, &str)>,
    max: u64,
) -> Result<String, String> {
    let fd = open_checked(at, path, Kind::File, owner)?;
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

    /// A directory of ours that the caller keeps (the OCI hook's
    /// `--root`): made where missing (its parents 0755), then opened (links
    /// on the way followed: the administrator's path), checked to be ours
    /// and given exactly `mode`.
    pub fn keep_root(path: &Path, mode: u32) -> Result<Dir, Error> {
        if let Some(parent) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| Error::os(parent, "cannot create the directory", &e))?;
        }
        match std::fs::create_dir(path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(Error::os(path, "cannot create the directory", &e));
            }
            _ => {}
        }
        let d = Dir::open(path)?;
        set_mode_and_check(d.fd.as_fd(), path, Kind::Dir, mode)?;
        Ok(d)
    }

    /// The directory `name` in this one, made where missing, kept where it
    /// is (a directory of ours, reached without following a link), given
    /// exactly `mode`.
    pub fn keep_dir(&self, name: &str, mode: u32) -> Result<Dir, Error> {
        let d = match self.create_dir(name, 0o700) {
            Ok(d) => d,
            Err(e) if e.already_exists() => self.open_dir(name)?,
            Err(e) => return Err(e),
        };
        set_mode_and_check(d.fd.as_fd(), &d.path, Kind::Dir, mode)?;
        Ok(d)
    }

    /// Writes `name` whole with exactly `mode`: into a new file (created
    /// exclusively, never through a link, its mode set before a byte is
    /// written), then renamed over `name`, so that no reader sees it
    /// partial or of another mode, and a link at `name` is replaced, never
    /// written through.
    pub fn replace_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), Error> {
        self.replace(name, bytes, mode, false)
    }

    /// [`Dir::replace_file`], durably: the new file is synced before it is
    /// renamed into place and the directory after, so that a crash leaves
    /// either the old file or the new one, whole (a plugin's checkpoint on
    /// a disk, not a tmpfs).
    pub fn replace_file_synced(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), Error> {
        self.replace(name, bytes, mode, true)
    }

    fn replace(&self, name: &str, bytes: &[u8], mode: u32, sync: bool) -> Result<(), Error> {
        use std::io::Write;
        let c = component(&self.path, OsStr::new(name))?;
        let tmp_name = format!(".{name}.new");
        let tmp = component(&self.path, OsStr::new(&tmp_name))?;
        let path = self.path.join(name);
        // A leftover of an interrupted write (a link included, unlinked).
        self.unlink(&tmp, 0)?;
        let mut f = self.create_file(&tmp_name, mode)?;
        f.write_all(bytes)
            .map_err(|e| Error::os(&path, "cannot write it", &e))?;
        if sync {
            f.sync_all()
                .map_err(|e| Error::os(&path, "cannot sync it", &e))?;
        }
        drop(f);
        // SAFETY: renameat within the directory we hold, NUL-terminated
        // names that outlive the call.
        if unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                tmp.as_ptr(),
                self.fd.as_raw_fd(),
                c.as_ptr(),
            )
        } != 0
        {
            return Err(Error::os(
                &path,
                "cannot rename it into place",
                &io::Error::last_os_error(),
            ));
        }
        if sync {
            // SAFETY: fsync on the directory descriptor we hold.
            if unsafe { libc::fsync(self.fd.as_raw_fd()) } != 0 {
                return Err(Error::os(
                    &self.path,
                    "cannot sync the directory",
                    &io::Error::last_os_error(),
                ));
            }
        }
        Ok(())
    }

    /// Whether `name` is a regular file of ours of exactly `mode` holding
    /// exactly `bytes` (reached without following a link or blocking).
    pub fn holds(&self, name: &str, bytes: &[u8], mode: u32) -> bool {
        let Ok(c) = component(&self.path, OsStr::new(name)) else {
            return false;
        };
        let Ok(fd) = openat(
            self.fd.as_fd(),
            &c,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        ) else {
            return false;
        };
        let me = euid();
        let ok = fstat(fd.as_fd()).is_ok_and(|st| {
            st.st_mode & libc::S_IFMT == libc::S_IFREG
                && st.st_uid == me
                && st.st_mode & 0o7777 == mode as libc::mode_t
        });
        let mut have = Vec::new();
        let mut f = io::Read::take(std::fs::File::from(fd), bytes.len() as u64 + 1);
        ok && io::Read::read_to_end(&mut f, &mut have).is_ok() && have == bytes
    }

    /// The text of the regular file `name` in this one, reached without
    /// following a link or blocking: a file of ours (the effective uid) of
    /// at most `max` bytes, in UTF-8.
    pub fn read_file(&self, name: &str, max: u64) -> Result<String, Error> {
        let c = component(&self.path, OsStr::new(name))?;
        let path = self.path.join(name);
        let fd = openat(
            self.fd.as_fd(),
            &c,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|e| Error::os(&path, "cannot open the file", &e))?;
        let st = fstat(fd.as_fd()).map_err(|e| Error::os(&path, "cannot stat it", &e))?;
        let me = euid();
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::other(
                &path,
                format!("expected a regular file, got {}", type_name(st.st_mode)),
            ));
        }
        if st.st_uid != me {
            return Err(Error::other(
                &path,
                format!("expected a file of uid {me}, got one of uid {}", st.st_uid),
            ));
        }
        let mut bytes = Vec::new();
        io::Read::read_to_end(
            &mut io::Read::take(std::fs::File::from(fd), max + 1),
            &mut bytes,
        )
        .map_err(|e| Error::os(&path, "cannot read it", &e))?;
        if bytes.len() as u64 > max {
            return Err(Error::other(&path, format!("larger than {max} bytes")));
        }
        String::from_utf8(bytes).map_err(|_| Error::other(&path, "not UTF-8"))
    }

    /// [`read_checked`] of the entry `name` in this one (whoever owns it
    /// unless `owner` is given): the error names its path.
    pub fn read_checked(
        &self,
        name: impl AsRef<OsStr>,
        owner: Option<(u32, &str)>,
        max: u64,
    ) -> Result<String, String> {
        let name = name.as_ref();
        let path = self.path.join(name);
        component(&self.path, name)?;
        read_checked_at(Some(self.fd.as_fd()), Path::new(name), owner, max)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Opens the directory `name` in this one without following a link (a
    /// link there is an error, wherever it points).
    pub fn open_dir(&self, name: impl AsRef<OsStr>) -> Result<Dir, Error> {
        let name = name.as_ref();
        let c = component(&self.path, name)?;
        let path = self.path.join(name);
        let fd = openat(
            self.fd.as_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(|e| match e.raw_os_error() {
            // O_NOFOLLOW|O_DIRECTORY on a link: ELOOP or ENOTDIR.
            Some(libc::ELOOP | libc::ENOTDIR) => match lstat_at(self.fd.as_fd(), &c) {
                Ok(st) => Error {
                    msg: format!(
                        "{}: expected a directory, got {}",
                        path.display(),
                        type_name(st.st_mode)
                    ),
                    errno: e.raw_os_error(),
                },
                Err(_) => Error::os(&path, "cannot open the directory", &e),
            },
            _ => Error::os(&path, "cannot open the directory", &e),
        })?;
        Ok(Dir { fd, path })
    }

    /// [`Dir::open_dir`] with the directory's owner checked on its
    /// descriptor where `owner` is given ([`open_checked`]): a directory
    /// of another user's (a run directory in a shared base). Errors say
    /// only what is wrong; the caller names the path.
    pub fn open_dir_checked(
        &self,
        name: impl AsRef<OsStr>,
        owner: Option<(u32, &str)>,
    ) -> Result<Dir, String> {
        let name = name.as_ref();
        component(&self.path, name)?;
        let fd = open_checked(Some(self.fd.as_fd()), Path::new(name), Kind::Dir, owner)?;
        Ok(Dir {
            fd,
            path: self.path.join(name),
        })
    }

    /// An `O_PATH` descriptor of the entry `name` in this one, not
    /// followed (a link there is described, not its target), with what it
    /// is: a bind mount's source, checked by the caller before anything is
    /// mounted from it.
    pub fn open_path(&self, name: impl AsRef<OsStr>) -> Result<(OwnedFd, libc::stat), Error> {
        let name = name.as_ref();
        let c = component(&self.path, name)?;
        let path = self.path.join(name);
        let fd = openat(self.fd.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .map_err(|e| Error::os(&path, "cannot open it", &e))?;
        let st = fstat(fd.as_fd()).map_err(|e| Error::os(&path, "cannot stat it", &e))?;
        Ok((fd, st))
    }

    /// [`Dir::open_path`] of `rel` below this directory (plain names, at
    /// least one): every directory on the way opened from the one above
    /// without following a link, the last entry not followed either.
    pub fn open_path_beneath(&self, rel: &Path) -> Result<(OwnedFd, libc::stat), Error> {
        let (Some(last), parent) = (rel.file_name(), rel.parent()) else {
            return Err(Error::other(
                &self.path.join(rel),
                "expected a path of plain names below the directory",
            ));
        };
        match parent.filter(|p| !p.as_os_str().is_empty()) {
            Some(p) => self.open_dir_beneath(p)?.open_path(last),
            None => self.open_path(last),
        }
    }

    /// The directory `rel` below this one (plain names; empty: this one
    /// again, a descriptor of its own), every component opened from the
    /// one above without following a link.
    pub fn open_dir_beneath(&self, rel: &Path) -> Result<Dir, Error> {
        let mut held: Option<Dir> = None;
        for c in rel.components() {
            let std::path::Component::Normal(n) = c else {
                return Err(Error::other(
                    &self.path.join(rel),
                    "expected a path of plain names below the directory",
                ));
            };
            let next = held.as_ref().unwrap_or(self).open_dir(n)?;
            held = Some(next);
        }
        match held {
            Some(d) => Ok(d),
            None => self.try_clone(),
        }
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

    /// What the entry `name` in this one is (`fstatat` without following
    /// a link: a link is described, not its target); an error for one
    /// that is not there.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> Result<libc::stat, Error> {
        let name = name.as_ref();
        let c = component(&self.path, name)?;
        lstat_at(self.fd.as_fd(), &c)
            .map_err(|e| Error::os(&self.path.join(name), "cannot stat it", &e))
    }

    /// Creates the directory `name` in this one, which must not exist (an
    /// error that [`Error::already_exists`] tells otherwise), mode exactly
    /// `mode`; opens it without following a link and checks that it is a
    /// directory of ours of that mode.
    pub fn create_dir(&self, name: impl AsRef<OsStr>, mode: u32) -> Result<Dir, Error> {
        let name = name.as_ref();
        let c = component(&self.path, name)?;
        let path = self.path.join(name);
        // The mode given here is cut by the umask: set again below.
        crate::sys::mkdirat(self.fd.as_fd(), &c, 0o700)
            .map_err(|e| Error::os(&path, "cannot create the directory", &e))?;
        let d = self.open_dir(name)?;
        set_mode_and_check(d.fd.as_fd(), &path, Kind::Dir, mode)?;
        Ok(d)
    }

    /// Creates the regular file `name` in this one for writing, which must
    /// not exist (a link there, even a dangling one, is an existing entry:
    /// `O_EXCL|O_NOFOLLOW`), mode exactly `mode`, checked on the
    /// descriptor.
    pub fn create_file(&self, name: impl AsRef<OsStr>, mode: u32) -> Result<std::fs::File, Error> {
        let name = name.as_ref();
        let c = component(&self.path, name)?;
        let path = self.path.join(name);
        let fd = openat(
            self.fd.as_fd(),
            &c,
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_NOCTTY,
            0o600,
        )
        .map_err(|e| Error::os(&path, "cannot create the file", &e))?;
        set_mode_and_check(fd.as_fd(), &path, Kind::File, mode)?;
        Ok(std::fs::File::from(fd))
    }

    /// Takes an exclusive lock (`flock`) on the regular file `name` in this
    /// one, creating it with exactly `mode` where missing (never through a
    /// link, never blocking on a FIFO; a file of ours, checked on the
    /// descriptor), waiting for whoever holds it. Held until the file
    /// returned is dropped (or the process ends: the kernel drops it).
    pub fn lock(&self, name: &str, mode: u32) -> Result<std::fs::File, Error> {
        let (f, path) = self.lock_file(name, mode)?;
        loop {
            // SAFETY: flock on a descriptor we hold.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(f);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::os(&path, "cannot lock it", &e));
            }
        }
    }

    /// [`Dir::lock`] without waiting: `Ok(Err(file))` where another holds
    /// the lock (the file opened for reading and writing, for whatever
    /// its holder wrote in it).
    pub fn try_lock(
        &self,
        name: &str,
        mode: u32,
    ) -> Result<Result<std::fs::File, std::fs::File>, Error> {
        let (f, path) = self.lock_file(name, mode)?;
        // SAFETY: flock on a descriptor we hold.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Ok(f));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(Err(f));
        }
        Err(Error::os(&path, "cannot lock it", &e))
    }

    /// [`Dir::lock`] waiting at most `wait`: `Ok(Err(file))` where another
    /// still holds the lock then (the file opened for reading and writing,
    /// for whatever its holder wrote in it). `flock` has no timeout: the
    /// lock is tried again every few milliseconds, at most every 50 ms.
    pub fn lock_within(
        &self,
        name: &str,
        mode: u32,
        wait: std::time::Duration,
    ) -> Result<Result<std::fs::File, std::fs::File>, Error> {
        let (f, path) = self.lock_file(name, mode)?;
        let deadline = std::time::Instant::now() + wait;
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            // SAFETY: flock on a descriptor we hold.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Ok(f));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => {}
                Some(libc::EINTR) => continue,
                _ => return Err(Error::os(&path, "cannot lock it", &e)),
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(Err(f));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(std::time::Duration::from_millis(50));
        }
    }

    /// The lock file `name`: opened read-write, created with `mode` where
    /// missing, never through a link nor blocking, ours and of `mode`.
    fn lock_file(&self, name: &str, mode: u32) -> Result<(std::fs::File, PathBuf), Error> {
        let c = component(&self.path, OsStr::new(name))?;
        let path = self.path.join(name);
        let fd = openat(
            self.fd.as_fd(),
            &c,
            libc::O_CREAT | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0o600,
        )
        .map_err(|e| Error::os(&path, "cannot open the lock file", &e))?;
        set_mode_and_check(fd.as_fd(), &path, Kind::File, mode)?;
        Ok((std::fs::File::from(fd), path))
    }

    /// The names of the entries in this directory (not `.` and `..`), in
    /// no particular order.
    pub fn list(&self) -> Result<Vec<std::ffi::OsString>, Error> {
        Ok(self
            .names()?
            .into_iter()
            .map(|c| OsStr::from_bytes(c.to_bytes()).to_os_string())
            .collect())
    }

    /// Removes everything in this directory (not the directory itself):
    /// files and links are unlinked (a link's target is never touched),
    /// directories emptied the same way through descriptors opened without
    /// following a link, then removed. An entry that disappears meanwhile
    /// is fine.
    pub fn remove_contents(&self) -> Result<(), Error> {
        self.remove_contents_at(0)
    }

    fn remove_contents_at(&self, depth: usize) -> Result<(), Error> {
        for name in self.names()? {
            self.remove_entry(&name, depth)?;
        }
        Ok(())
    }

    /// Removes the empty directory `name` in this one (`unlinkat` with
    /// `AT_REMOVEDIR`: a link there is not followed, and not removed).
    pub fn remove_empty_dir(&self, name: impl AsRef<OsStr>) -> Result<(), Error> {
        let c = component(&self.path, name.as_ref())?;
        self.unlink(&c, libc::AT_REMOVEDIR)
    }

    /// Removes the entry `name` in this one, whatever it is: a file or a
    /// link unlinked (its target never touched), a directory emptied as
    /// [`Dir::remove_contents`] does, then removed. Not there is fine.
    pub fn remove(&self, name: impl AsRef<OsStr>) -> Result<(), Error> {
        let c = component(&self.path, name.as_ref())?;
        self.remove_entry(&c, 0)
    }

    fn unlink(&self, name: &CStr, flags: i32) -> Result<(), Error> {
        // SAFETY: unlinkat on a descriptor we hold with a NUL-terminated
        // name that outlives the call; it follows no link.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), flags) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                let path = self.path.join(OsStr::from_bytes(name.to_bytes()));
                return Err(Error::os(&path, "cannot remove it", &e));
            }
        }
        Ok(())
    }

    fn remove_entry(&self, name: &CStr, depth: usize) -> Result<(), Error> {
        let path = self.path.join(OsStr::from_bytes(name.to_bytes()));
        let st = match lstat_at(self.fd.as_fd(), name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(Error::os(&path, "cannot stat it", &e)),
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            // A directory put in its place since is refused by unlinkat
            // (EISDIR), not followed.
            return self.unlink(name, 0);
        }
        if depth >= MAX_DEPTH {
            return Err(Error::other(
                &path,
                format!("more than {MAX_DEPTH} directories deep: not removed"),
            ));
        }
        let sub = self.open_dir(OsStr::from_bytes(name.to_bytes()))?;
        sub.remove_contents_at(depth + 1)?;
        self.unlink(name, libc::AT_REMOVEDIR)
    }

    /// The names in this directory, without `.` and `..`.
    fn names(&self) -> Result<Vec<CString>, Error> {
        // fdopendir takes the descriptor it is given: a duplicate of ours.
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we hold.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Error::os(
                &self.path,
                "cannot list it",
                &io::Error::last_os_error(),
            ));
        }
        // SAFETY: fdopendir on the duplicate, which the DIR owns from here
        // (closed by closedir below).
        let d = unsafe { libc::fdopendir(dup) };
        if d.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so the duplicate is still ours.
            unsafe { libc::close(dup) };
            return Err(Error::os(&self.path, "cannot list it", &e));
        }
        // The duplicate shares our descriptor's position: from the start.
        // SAFETY: rewinddir on the DIR just opened.
        unsafe { libc::rewinddir(d) };
        let mut names = vec![];
        let result = loop {
            // readdir returns NULL at the end and on an error, told apart
            // by errno, so it is cleared first.
            // SAFETY: __errno_location returns this thread's errno.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: readdir on the DIR we hold; the entry it returns is
            // valid until the next readdir or closedir on it.
            let ent = unsafe { libc::readdir(d) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                break match e.raw_os_error() {
                    Some(0) | None => Ok(()),
                    _ => Err(Error::os(&self.path, "cannot list it", &e)),
                };
            }
            // SAFETY: d_name is a NUL-terminated string inside the entry
            // just returned, copied out before the next readdir.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            let b = name.to_bytes();
            if b != b"." && b != b".." {
                names.push(name.to_owned());
            }
        };
        // SAFETY: closedir on the DIR we hold; it closes the duplicate.
        unsafe { libc::closedir(d) };
        result.map(|()| names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cuslice-host-fs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn os(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
    }

    #[test]
    fn kept_directories_and_replaced_files_have_their_modes_whatever_the_umask() {
        let d = tmp("keep").join("root");
        // SAFETY: umask has no preconditions; restored below.
        let old = unsafe { libc::umask(0o077) };
        let r = (|| {
            let root = Dir::keep_root(&d, 0o711)?;
            let sub = root.keep_dir("s", 0o755)?;
            sub.replace_file("f", b"x\n", 0o444)?;
            root.keep_dir("t", 0o1777)?;
            // Kept where they are: made again, the same, modes set again.
            std::fs::set_permissions(
                d.join("s"),
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            )
            .map_err(|e| Error::os(&d, "chmod", &e))?;
            Dir::keep_root(&d, 0o711)?.keep_dir("s", 0o755)?;
            Ok::<_, Error>(())
        })();
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        r.expect("made");
        assert_eq!(mode(&d), 0o711);
        assert_eq!(mode(&d.join("s")), 0o755);
        assert_eq!(mode(&d.join("s/f")), 0o444);
        assert_eq!(mode(&d.join("t")), 0o1777);
        assert_eq!(std::fs::read(d.join("s/f")).expect("read"), b"x\n");
        let _ = std::fs::remove_dir_all(d.parent().expect("parent"));
    }

    #[test]
    fn links_below_a_kept_root_are_refused_or_replaced_never_followed() {
        let t = tmp("keep-links");
        let d = t.join("root");
        let root = Dir::keep_root(&d, 0o700).expect("root");
        let victim = t.join("victim");
        std::fs::create_dir_all(&victim).expect("mkdir");
        std::fs::write(victim.join("f"), "precious").expect("write");
        // Its mode set here: another test of this binary changes the
        // process's umask while it runs (a flake: 0700 once).
        std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o750))
            .expect("chmod");
        std::os::unix::fs::symlink(&victim, d.join("s")).expect("link");
        let e = root
            .keep_dir("s", 0o755)
            .expect_err("a link is no directory");
        assert!(
            e.to_string()
                .contains("expected a directory, got a symlink"),
            "{e}"
        );
        assert_eq!(mode(&victim), 0o750, "the link's target is untouched");
        // A file name that is a link: replaced, never written through.
        std::os::unix::fs::symlink(victim.join("f"), d.join("q")).expect("link");
        root.replace_file("q", b"new", 0o444).expect("written");
        assert_eq!(
            std::fs::read_to_string(victim.join("f")).expect("read"),
            "precious"
        );
        assert_eq!(std::fs::read(d.join("q")).expect("read"), b"new");
        // A planted temporary name is a link too: removed, not followed.
        std::os::unix::fs::symlink(victim.join("f"), d.join(".r.new")).expect("link");
        root.replace_file("r", b"r", 0o444).expect("written");
        assert_eq!(
            std::fs::read_to_string(victim.join("f")).expect("read"),
            "precious"
        );
        assert!(root.holds("r", b"r", 0o444));
        assert!(!root.holds("r", b"r", 0o644));
        assert!(!root.holds("q", b"newer", 0o444));
        for n in ["", ".", "..", "a/b"] {
            assert!(root.keep_dir(n, 0o700).is_err(), "{n:?}");
            assert!(root.replace_file(n, b"", 0o400).is_err(), "{n:?}");
        }
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn files_are_read_only_when_regular_ours_and_small() {
        let t = tmp("read");
        let d = Dir::open(&t).expect("open");
        std::fs::write(t.join("f"), "quota\n").expect("write");
        assert_eq!(d.read_file("f", 6).expect("read"), "quota\n");
        let e = d.read_file("f", 5).expect_err("too large");
        assert!(e.to_string().ends_with("/f: larger than 5 bytes"), "{e}");
        std::os::unix::fs::symlink(t.join("f"), t.join("l")).expect("link");
        let e = d.read_file("l", 100).expect_err("a link");
        assert!(e.to_string().contains("/l: cannot open the file"), "{e}");
        std::fs::create_dir(t.join("dir")).expect("mkdir");
        let e = d.read_file("dir", 100).expect_err("a directory");
        assert!(
            e.to_string()
                .ends_with("/dir: expected a regular file, got a directory"),
            "{e}"
        );
        assert!(d.read_file("../f", 100).is_err());
        assert!(d.read_file("missing", 100).is_err());
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn creates_refuse_an_existing_entry_and_never_follow_a_link() {
        let t = tmp("refuse");
        let victim = t.join("victim");
        std::fs::write(&victim, "victim\n").expect("write");
        std::fs::create_dir(t.join("victim-dir")).expect("mkdir");
        let d = Dir::open(&t).expect("open");
        std::os::unix::fs::symlink(&victim, t.join("link")).expect("symlink");
        std::os::unix::fs::symlink(t.join("nowhere"), t.join("dangling")).expect("symlink");
        std::os::unix::fs::symlink(t.join("victim-dir"), t.join("dirlink")).expect("symlink");
        std::fs::create_dir(t.join("there")).expect("mkdir");
        std::fs::write(t.join("file"), "x").expect("write");
        for name in ["link", "dangling", "dirlink", "there", "file"] {
            let e = d.create_file(os(name), 0o600).expect_err(name);
            assert!(e.already_exists(), "{name}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("{}: ", t.join(name).display()))
            );
            let e = d.create_dir(os(name), 0o700).expect_err(name);
            assert!(e.already_exists(), "{name}: {e}");
        }
        // Nothing was created through the links.
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "victim\n");
        assert!(!t.join("nowhere").exists());
        assert_eq!(
            std::fs::read_dir(t.join("victim-dir")).expect("ls").count(),
            0
        );
        // A link where a directory is opened: refused, wherever it points.
        let e = d.open_dir(os("dirlink")).expect_err("a link");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: expected a directory, got a symlink",
                t.join("dirlink").display()
            )
        );
        let e = d.open_dir(os("file")).expect_err("a file");
        assert!(
            e.to_string()
                .ends_with("expected a directory, got a regular file"),
            "{e}"
        );
        // Only plain names.
        for bad in ["", ".", "..", "a/b", "../x"] {
            let e = d.create_file(os(bad), 0o600).expect_err(bad);
            assert!(
                !e.already_exists() && e.to_string().contains("plain name"),
                "{e}"
            );
        }
        let _ = std::fs::remove_dir_all(&t);
    }

    /// Modes are set, not left to the umask (the umask is the process's,
    /// shared by every test thread: cli/tests/run.rs runs `cuslice run`
    /// under umask 000 and 077).
    #[test]
    fn modes_are_exactly_those_asked_for() {
        let t = tmp("modes");
        let d = Dir::open(&t).expect("open");
        let sub = d.create_dir(os("sub"), 0o710).expect("dir");
        let mut f = d.create_file(os("f"), 0o640).expect("file");
        d.create_file(os("g"), 0o604).expect("file");
        f.write_all(b"x").expect("write");
        let mode = |p: &Path| std::fs::symlink_metadata(p).expect("lstat").mode() & 0o7777;
        assert_eq!(mode(&t.join("sub")), 0o710);
        assert_eq!(mode(&t.join("f")), 0o640);
        assert_eq!(mode(&t.join("g")), 0o604);
        assert_eq!(sub.path(), t.join("sub"));
        assert_eq!(std::fs::read(t.join("f")).expect("read"), b"x");
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn paths_below_a_directory_are_walked_without_following_a_link() {
        let t = tmp("beneath");
        std::fs::create_dir_all(t.join("a/b")).expect("mkdir");
        std::fs::write(t.join("a/b/f"), "x").expect("write");
        std::fs::create_dir_all(t.join("elsewhere/b")).expect("mkdir");
        std::os::unix::fs::symlink(t.join("elsewhere"), t.join("l")).expect("link");
        std::os::unix::fs::symlink(t.join("a/b/f"), t.join("a/b/fl")).expect("link");
        let d = Dir::open(&t).expect("open");
        let (_, st) = d.open_path_beneath(Path::new("a/b/f")).expect("a file");
        assert!(Kind::File.matches(st.st_mode));
        // The last component is described, not followed.
        let (_, st) = d.open_path_beneath(Path::new("a/b/fl")).expect("a link");
        assert_eq!(type_name(st.st_mode), "a symlink");
        let e = d
            .open_path_beneath(Path::new("l/b"))
            .expect_err("a link on the way");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: expected a directory, got a symlink",
                t.join("l").display()
            )
        );
        for bad in ["", "../a", "a/../a/b", "/a"] {
            assert!(d.open_path_beneath(Path::new(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(
            d.open_dir_beneath(Path::new("a/b")).expect("dir").path(),
            t.join("a/b")
        );
        assert_eq!(d.open_dir_beneath(Path::new("")).expect("itself").path(), t);
        assert!(d.open_dir_beneath(Path::new("l")).is_err());
        // What an entry is, not followed; missing is told.
        assert_eq!(type_name(d.stat("l").expect("stat").st_mode), "a symlink");
        assert!(d.stat("missing").expect_err("missing").not_found());
        // Read by a plain name only, not through a link, whoever owns it.
        let e = d.read_checked("a/b/f", None, 9).expect_err("not a name");
        assert!(e.contains("plain name"), "{e}");
        let b = d.open_dir_beneath(Path::new("a/b")).expect("dir");
        assert_eq!(b.read_checked("f", None, 1).expect("read"), "x");
        let e = b.read_checked("fl", None, 1).expect_err("a link");
        assert_eq!(
            e,
            format!(
                "{}: expected a regular file, got a symbolic link",
                t.join("a/b/fl").display()
            )
        );
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn an_entry_is_removed_whatever_it_is_and_a_link_never_followed() {
        let t = tmp("remove-entry");
        std::fs::create_dir_all(t.join("outside")).expect("mkdir");
        std::fs::write(t.join("outside/keep"), "keep").expect("write");
        std::fs::create_dir_all(t.join("d/sub")).expect("mkdir");
        std::os::unix::fs::symlink(t.join("outside"), t.join("d/sub/out")).expect("link");
        std::os::unix::fs::symlink(t.join("outside"), t.join("l")).expect("link");
        std::fs::write(t.join("f"), "x").expect("write");
        let d = Dir::open(&t).expect("open");
        for name in ["d", "l", "f", "missing"] {
            d.remove(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(std::fs::symlink_metadata(t.join(name)).is_err(), "{name}");
        }
        assert_eq!(
            std::fs::read_to_string(t.join("outside/keep")).expect("kept"),
            "keep"
        );
        assert!(d.remove("..").is_err());
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn a_synced_replace_is_a_replace_and_a_lock_is_tried_without_waiting() {
        let t = tmp("synced");
        let d = Dir::open(&t).expect("open");
        d.replace_file_synced("c", b"one", 0o600).expect("written");
        d.replace_file_synced("c", b"two", 0o600).expect("again");
        assert!(d.holds("c", b"two", 0o600));
        assert_eq!(d.list().expect("ls"), vec![std::ffi::OsString::from("c")]);
        let held = d.try_lock("lock", 0o644).expect("lock").expect("free");
        assert_eq!(mode(&t.join("lock")), 0o644);
        let other = d.try_lock("lock", 0o644).expect("lock");
        assert!(other.is_err(), "held by the first");
        drop(held);
        assert!(d.try_lock("lock", 0o644).expect("lock").is_ok());
        std::os::unix::fs::symlink(t.join("c"), t.join("linked")).expect("link");
        assert!(d.try_lock("linked", 0o644).is_err());
        assert!(d.holds("c", b"two", 0o600), "not written through the link");
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn a_lock_is_waited_for_within_a_bound() {
        use std::time::{Duration, Instant};
        let t = tmp("lock-within");
        let d = Dir::open(&t).expect("open");
        // Free: taken at once, 0600.
        let held = d
            .lock_within("lock", 0o600, Duration::from_secs(5))
            .expect("lock")
            .expect("free");
        assert_eq!(mode(&t.join("lock")), 0o600);
        // Held by another open file description: not taken within the
        // bound, the file handed back for what its holder wrote.
        let start = Instant::now();
        let other = d
            .lock_within("lock", 0o600, Duration::from_millis(200))
            .expect("lock");
        assert!(other.is_err(), "held by the first");
        assert!(start.elapsed() >= Duration::from_millis(200));
        // (A bound a loaded machine meets.)
        assert!(start.elapsed() < Duration::from_secs(10));
        // Released while waiting: taken then. (The start taken before the
        // releasing thread sleeps: a loaded machine may run this thread
        // late, not the release early.)
        let start = Instant::now();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let got = d
            .lock_within("lock", 0o600, Duration::from_secs(10))
            .expect("lock");
        assert!(got.is_ok(), "released");
        assert!(start.elapsed() >= Duration::from_millis(250));
        release.join().expect("joined");
        // Never through a link.
        std::os::unix::fs::symlink(t.join("lock"), t.join("linked")).expect("link");
        assert!(
            d.lock_within("linked", 0o600, Duration::from_millis(10))
                .is_err()
        );
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn a_tree_is_removed_without_following_its_links() {
        let t = tmp("remove");
        let outside = t.join("outside");
        std::fs::create_dir_all(outside.join("deep")).expect("mkdir");
        std::fs::write(outside.join("deep/keep"), "keep").expect("write");
        let tree = t.join("tree");
        std::fs::create_dir_all(tree.join("a/b/c")).expect("mkdir");
        std::fs::write(tree.join("a/b/c/f"), "x").expect("write");
        std::fs::write(tree.join("top"), "x").expect("write");
        std::os::unix::fs::symlink(&outside, tree.join("a/out")).expect("symlink");
        std::os::unix::fs::symlink(outside.join("deep/keep"), tree.join("a/b/keep"))
            .expect("symlink");
        let d = Dir::open(&t).expect("open");
        let inner = d.open_dir(os("tree")).expect("tree");
        inner.remove_contents().expect("emptied");
        assert_eq!(std::fs::read_dir(&tree).expect("ls").count(), 0);
        d.remove_empty_dir(os("tree")).expect("removed");
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("deep/keep")).expect("kept"),
            "keep"
        );
        // A link is never removed as a directory.
        std::os::unix::fs::symlink(&outside, t.join("t4")).expect("symlink");
        assert!(d.remove_empty_dir(os("t4")).is_err());
        assert!(outside.join("deep/keep").exists());
        let _ = std::fs::remove_dir_all(&t);
    }
}
