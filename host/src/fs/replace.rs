//! Files written whole: into a new file created exclusively, then
//! renamed over the name, so that no reader sees one partial or of
//! another mode, and a link at the name is replaced, never written
//! through.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;

use super::{Dir, Error, component};

impl Dir {
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
}
