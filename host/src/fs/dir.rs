//! A directory's entries opened, read, described and created: every one
//! by a plain name from the directory's descriptor, never following a
//! link or blocking on a FIFO; what is created is checked on its
//! descriptor (kind, owner, mode).

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{Dir, Error, Kind, component, set_mode_and_check};
use crate::sys::{euid, fstat, lstat_at, openat, type_name};

impl Dir {
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

    /// [`super::read_checked_at`] of the entry `name` in this one (whoever owns it
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
        super::read_checked_at(self.fd.as_fd(), Path::new(name), owner, max)
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
    /// descriptor where `owner` is given ([`super::open_checked`]): a directory
    /// of another user's (a run directory in a shared base). Errors say
    /// only what is wrong; the caller names the path.
    pub fn open_dir_checked(
        &self,
        name: impl AsRef<OsStr>,
        owner: Option<(u32, &str)>,
    ) -> Result<Dir, String> {
        let name = name.as_ref();
        component(&self.path, name)?;
        let fd = super::open_checked(self.fd.as_fd(), Path::new(name), Kind::Dir, owner)?;
        Ok(Dir {
            fd,
            path: self.path.join(name),
        })
    }

    /// Opens the segment file `name` in this one (a memory segment, a GPU
    /// segment, a GPU's memory pool) for core to map (`Segment::from_fd`,
    /// `Pool::from_fd`): by a plain name from this directory's descriptor,
    /// not following a link (a link there is an error, wherever it points)
    /// nor blocking on a FIFO, read-write where `writable`, else read-only.
    /// Whoever owns it: what it is, its size and its header are core's to
    /// check, on the descriptor.
    pub fn open_segment(&self, name: impl AsRef<OsStr>, writable: bool) -> Result<OwnedFd, Error> {
        let name = name.as_ref();
        let c = component(&self.path, name)?;
        let access = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        openat(
            self.fd.as_fd(),
            &c,
            access | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|e| Error::os(&self.path.join(name), "cannot open the segment", &e))
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

    /// The names of the entries in this directory (not `.` and `..`), in
    /// no particular order.
    pub fn list(&self) -> Result<Vec<std::ffi::OsString>, Error> {
        Ok(self
            .names()?
            .into_iter()
            .map(|c| OsStr::from_bytes(c.to_bytes()).to_os_string())
            .collect())
    }

    /// The names in this directory, without `.` and `..`.
    pub(super) fn names(&self) -> Result<Vec<CString>, Error> {
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
