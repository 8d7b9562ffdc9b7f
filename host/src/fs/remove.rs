//! Removal by descriptors: a link unlinked, never followed; a directory
//! emptied through a descriptor opened without following a link, then
//! removed.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;

use super::{Dir, Error, component};
use crate::sys::lstat_at;

/// How deep [`Dir::remove_contents`] goes before it gives up (a tree the
/// program made in its run directory; far deeper than any real one).
const MAX_DEPTH: usize = 64;

impl Dir {
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

    pub(super) fn unlink(&self, name: &CStr, flags: i32) -> Result<(), Error> {
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
}
