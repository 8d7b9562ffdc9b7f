//! The OCI hook's own files on the host, under its `--root`: directories
//! and files made with the modes given here, never from the umask (a hook
//! run under `umask 027` once wrote `ld.so.preload` 0640, which a
//! container's non-root user could not read: the shim never loaded), and
//! reached relative to their parent's descriptor without following a link
//! below the root.
//!
//! The root itself is the administrator's path (`/run/cuslice`): a link
//! there is followed, but what it leads to must be a directory of this
//! process's user.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::inroot;

/// An open directory of the hook's and its path (for messages and for the
/// code that still opens by path below it).
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn os_err(path: &Path, what: &str) -> String {
    format!(
        "{}: {what}: {}",
        path.display(),
        std::io::Error::last_os_error()
    )
}

fn cname(name: &str, path: &Path) -> Result<CString, String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("{}: not a plain file name", path.display()));
    }
    CString::new(name).map_err(|_| format!("{}: contains a NUL byte", path.display()))
}

/// `fchmod`, then checks the mode took (a file system that ignores modes
/// must not leave a file more open, or less, than asked).
pub fn set_mode(fd: i32, mode: u32, path: &Path) -> Result<(), String> {
    // SAFETY: fchmod on a descriptor the caller holds.
    if unsafe { libc::fchmod(fd, mode as libc::mode_t) } != 0 {
        return Err(os_err(path, &format!("cannot set mode {mode:o}")));
    }
    // SAFETY: the caller's descriptor, live for this call.
    let st = inroot::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if st.st_mode & 0o7777 != mode {
        return Err(format!(
            "{}: mode is {:o} after setting it to {mode:o}",
            path.display(),
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

/// Checks that `fd` is a directory (or a regular file) owned by this
/// process's user.
fn check_own(fd: &OwnedFd, path: &Path, dir: bool) -> Result<(), String> {
    use std::os::fd::AsFd;
    let st = inroot::fstat(fd.as_fd()).map_err(|e| format!("{}: {e}", path.display()))?;
    let want = if dir {
        inroot::Kind::Dir
    } else {
        inroot::Kind::File
    };
    if !want.matches(st.st_mode) {
        return Err(format!(
            "{} is {}, expected {}",
            path.display(),
            inroot::type_name(st.st_mode),
            want.expected()
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me {
        return Err(format!(
            "{} is owned by uid {}, not by uid {me} (this hook): refusing to use it",
            path.display(),
            st.st_uid
        ));
    }
    Ok(())
}

impl Dir {
    /// The hook's root: made where missing (its parents 0755), given
    /// `mode`, and checked to be our own directory.
    pub fn root(path: &Path, mode: u32) -> Result<Dir, String> {
        if !path.exists() {
            use std::os::unix::fs::DirBuilderExt;
            if let Some(parent) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            match std::fs::DirBuilder::new().mode(mode).create(path) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(format!("{}: {e}", path.display()));
                }
                _ => {}
            }
        }
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: contains a NUL byte", path.display()))?;
        // SAFETY: open with a NUL-terminated path that outlives the call.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(os_err(path, "cannot open"));
        }
        // SAFETY: open just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        check_own(&fd, path, true)?;
        set_mode(fd.as_raw_fd(), mode, path)?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The directory `name` in this one: made where missing, never through
    /// a link, checked to be our own, given `mode`.
    pub fn subdir(&self, name: &str, mode: u32) -> Result<Dir, String> {
        let path = self.path.join(name);
        let c = cname(name, &path)?;
        // SAFETY: mkdirat relative to our descriptor with a NUL-terminated
        // name.
        if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(os_err(&path, "cannot create directory"));
        }
        // SAFETY: openat relative to our descriptor; O_NOFOLLOW refuses a
        // link in its place.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(os_err(&path, "cannot open directory"));
        }
        // SAFETY: openat just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        check_own(&fd, &path, true)?;
        set_mode(fd.as_raw_fd(), mode, &path)?;
        Ok(Dir { fd, path })
    }

    /// Writes `name` whole with `mode`: into a new file (created
    /// exclusively, never through a link, its mode set before a byte is
    /// written), renamed into place, so that no reader sees it partial or
    /// with another mode.
    pub fn write_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), String> {
        let path = self.path.join(name);
        let c = cname(name, &path)?;
        let tmp = cname(&format!(".{name}.new"), &path)?;
        // SAFETY: unlinkat relative to our descriptor: a leftover of an
        // interrupted write (never a directory: no AT_REMOVEDIR).
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), tmp.as_ptr(), 0) };
        // SAFETY: openat relative to our descriptor, the mode as the
        // variadic argument O_CREAT reads.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(os_err(&path, "cannot create"));
        }
        // SAFETY: openat just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        set_mode(fd.as_raw_fd(), mode, &path)?;
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes)
            .map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
        drop(f);
        // SAFETY: renameat within our directory, NUL-terminated names.
        if unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                tmp.as_ptr(),
                self.fd.as_raw_fd(),
                c.as_ptr(),
            )
        } != 0
        {
            return Err(os_err(&path, "cannot rename into place"));
        }
        Ok(())
    }

    /// Whether `name` holds exactly `bytes` with `mode` (a regular file of
    /// ours, reached without following a link).
    pub fn holds(&self, name: &str, bytes: &[u8], mode: u32) -> bool {
        let path = self.path.join(name);
        let Ok(c) = cname(name, &path) else {
            return false;
        };
        // SAFETY: openat relative to our descriptor.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: openat just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if check_own(&fd, &path, false).is_err() {
            return false;
        }
        use std::os::fd::AsFd;
        if inroot::fstat(fd.as_fd()).map_or(true, |st| st.st_mode & 0o7777 != mode) {
            return false;
        }
        let mut have = Vec::new();
        let mut f = std::io::Read::take(std::fs::File::from(fd), bytes.len() as u64 + 1);
        std::io::Read::read_to_end(&mut f, &mut have).is_ok() && have == bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cuslice-hostfs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn modes_are_the_ones_given_whatever_the_umask() {
        let d = tmp("umask");
        // SAFETY: umask has no preconditions; this test's files only.
        let old = unsafe { libc::umask(0o077) };
        let r = (|| {
            let root = Dir::root(&d, 0o711)?;
            let sub = root.subdir("s", 0o755)?;
            sub.write_file("f", b"x\n", 0o444)?;
            root.subdir("t", 0o1777)?;
            Ok::<_, String>(())
        })();
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        r.expect("made");
        assert_eq!(mode(&d), 0o711);
        assert_eq!(mode(&d.join("s")), 0o755);
        assert_eq!(mode(&d.join("s/f")), 0o444);
        assert_eq!(mode(&d.join("t")), 0o1777);
        assert_eq!(std::fs::read(d.join("s/f")).expect("read"), b"x\n");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn links_below_the_root_are_refused_and_their_targets_untouched() {
        let d = tmp("links");
        let root = Dir::root(&d, 0o700).expect("root");
        let victim = tmp("links-victim");
        std::fs::create_dir_all(&victim).expect("mkdir");
        std::fs::write(victim.join("f"), "precious").expect("write");
        std::os::unix::fs::symlink(&victim, d.join("s")).expect("link");
        let e = root
            .subdir("s", 0o755)
            .err()
            .expect("a link is no directory");
        assert!(e.contains("cannot open directory"), "{e}");
        assert_eq!(mode(&victim), 0o755);
        // A file name that is a link: the link is replaced, never written
        // through.
        std::os::unix::fs::symlink(victim.join("f"), d.join("q")).expect("link");
        root.write_file("q", b"new", 0o444).expect("written");
        assert_eq!(
            std::fs::read_to_string(victim.join("f")).expect("read"),
            "precious"
        );
        assert_eq!(std::fs::read(d.join("q")).expect("read"), b"new");
        // A planted temporary name is a link too: not followed.
        std::os::unix::fs::symlink(victim.join("f"), d.join(".r.new")).expect("link");
        root.write_file("r", b"r", 0o444).expect("written");
        assert_eq!(
            std::fs::read_to_string(victim.join("f")).expect("read"),
            "precious"
        );
        assert!(root.holds("r", b"r", 0o444));
        assert!(!root.holds("r", b"r", 0o644));
        assert!(!root.holds("q", b"newer", 0o444));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&victim);
    }

    #[test]
    fn names_that_could_lead_elsewhere_are_refused() {
        let d = tmp("names");
        let root = Dir::root(&d, 0o700).expect("root");
        for n in ["", ".", "..", "a/b"] {
            assert!(root.subdir(n, 0o700).is_err(), "{n:?}");
            assert!(root.write_file(n, b"", 0o400).is_err(), "{n:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
