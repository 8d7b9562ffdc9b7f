//! Lock files: an exclusive `flock` on a file of ours, taken waiting, not
//! waiting, or waiting at most a bound (root never waits without bound on
//! a lock a tenant can take).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use super::{Dir, Error, Kind, component, set_mode_and_check};
use crate::sys::openat;

impl Dir {
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
}
