//! The run directory of a `cuslice run` session: where it goes, what it is
//! called, how it is made and removed. `cuslice run` makes it, `cuslice
//! watch` finds it (watch/slices/kinds.rs, `load_run`), `cuslice status` lists
//! the segments in it: all three through this one rule.
//!
//! - **Where**: `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else `/tmp` (a variable
//!   set but empty counts as unset), as the run process's environment says
//!   ([`run_base`](crate::layout::run_base)).
//! - **Its name**: `cuslice-run-<pid>-<16 hex digits>`, `<pid>` the run
//!   process's PID as it sees itself, the rest from `getrandom`: nobody can
//!   make it beforehand (the PID alone is predictable: another user of
//!   `/tmp` could plant `cuslice-run-<next pids>` with a `quota.toml` link
//!   to a file of the user's, which `run` used to write through).
//! - **How it is made** ([`RunDir::create`]): `mkdirat` in the base's
//!   descriptor, which must create it (a name taken, by anything, is tried
//!   again with another random part a few times), mode 0700 set explicitly
//!   and checked, with its owner, on a descriptor opened without following
//!   a link. Its files are created in that descriptor, exclusively, without
//!   following a link, modes set explicitly ([`fs`](crate::fs)).
//! - **Removal**: `run` holds the base's and the directory's descriptors
//!   (close-on-exec: the program does not inherit them) for its whole life,
//!   and at its end empties the directory through its descriptor (links
//!   unlinked, never followed), then removes it from the base's.
//! - **Finding it** from outside (the watch): the run process holds it
//!   open, so `/proc/<pid>/fd/` names it;
//!   [`is_run_dir_of`](crate::layout::is_run_dir_of) says whether a name
//!   there is that PID's run directory.
//!
//! Where and under what name are the layout's ([`crate::layout`]); this
//! module makes and removes the directory.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::fs::Dir;
use crate::layout::{QUOTA_FILE, SEGMENT_DIR, SliceDir, run_base_here, run_name, run_name_prefix};

/// The run directory's mode (and its segment directory's).
pub const DIR_MODE: u32 = 0o700;
/// The quota file's mode.
pub const FILE_MODE: u32 = 0o600;
/// How many random names are tried before giving up.
const TRIES: usize = 8;

/// 64 random bits from the kernel.
fn random_u64() -> Result<u64, String> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: getrandom writes at most the given length into the rest
        // of a local buffer.
        let r = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(format!("cannot get random bytes for a run directory: {e}"));
        }
        got += r as usize;
    }
    Ok(u64::from_ne_bytes(b))
}

/// This process's run directory, held open; emptied and removed on drop.
pub struct RunDir {
    base: Dir,
    dir: Dir,
    name: OsString,
}

impl RunDir {
    /// Makes this process's run directory in
    /// [`run_base_here`].
    pub fn create() -> Result<RunDir, String> {
        RunDir::create_in(&run_base_here(), std::process::id())
    }

    /// Makes the run directory of `pid` in `base`.
    pub fn create_in(base: &Path, pid: u32) -> Result<RunDir, String> {
        RunDir::create_with(base, pid, random_u64)
    }

    /// [`RunDir::create_in`] with the random parts from `random`.
    fn create_with(
        base: &Path,
        pid: u32,
        mut random: impl FnMut() -> Result<u64, String>,
    ) -> Result<RunDir, String> {
        if !base.is_absolute() {
            // The quota file names its segment directory by an absolute
            // path, and the watch derives the same base.
            return Err(format!(
                "{}: the run directory's place ($XDG_RUNTIME_DIR, else $TMPDIR) must be an absolute path",
                base.display()
            ));
        }
        let b = Dir::open(base)?;
        for _ in 0..TRIES {
            let n = OsString::from(run_name(pid, random()?));
            match b.create_dir(&n, DIR_MODE) {
                Ok(dir) => {
                    return Ok(RunDir {
                        base: b,
                        dir,
                        name: n,
                    });
                }
                // Taken: someone made it (or guessed it); another name.
                Err(e) if e.already_exists() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(format!(
            "cannot create a run directory in {}: {TRIES} random names {}* were all taken",
            base.display(),
            run_name_prefix(pid)
        ))
    }

    /// Its path: the base as the environment gave it, joined with its name.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Creates the file `name` in it (mode 0600) holding `text`; returns
    /// its path.
    pub fn write_file(&self, name: &str, text: &str) -> Result<PathBuf, String> {
        let mut f = self.dir.create_file(OsStr::new(name), FILE_MODE)?;
        let path = self.path().join(name);
        f.write_all(text.as_bytes())
            .map_err(|e| format!("{}: cannot write it: {e}", path.display()))?;
        Ok(path)
    }

    /// Creates the directory `name` in it (mode 0700); returns its path.
    pub fn make_dir(&self, name: &str) -> Result<PathBuf, String> {
        Ok(self
            .dir
            .create_dir(OsStr::new(name), DIR_MODE)?
            .path()
            .to_path_buf())
    }

    /// Its place in the layout: where its quota file and segment
    /// directory are.
    pub fn slice_dir(&self) -> SliceDir {
        SliceDir::run(self.path())
    }

    /// Creates its quota file (`quota.toml`, mode 0600) holding `text`;
    /// returns its path.
    pub fn write_quota(&self, text: &str) -> Result<PathBuf, String> {
        self.write_file(QUOTA_FILE, text)
    }

    /// Creates its memory segment directory (`segment/`, mode 0700);
    /// returns its path.
    pub fn make_segment_dir(&self) -> Result<PathBuf, String> {
        self.make_dir(SEGMENT_DIR)
    }

    /// Empties it through its descriptor and removes it from the base's.
    fn remove(&self) -> Result<(), String> {
        self.dir.remove_contents()?;
        self.base.remove_empty_dir(&self.name)?;
        Ok(())
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("cuslice: cannot remove the run directory: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn random_parts_differ() {
        let a = random_u64().expect("random");
        let b = random_u64().expect("random");
        assert_ne!(a, b);
    }

    #[test]
    fn a_run_directory_is_made_private_and_exclusively_and_removed_without_following_links() {
        let t = std::env::temp_dir().join(format!("cuslice-run-dir-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(&t).expect("mkdir");
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let victim = t.join("victim");
        std::fs::write(&victim, "victim\n").expect("write");
        assert!(RunDir::create_in(Path::new("rel"), 1).is_err());
        let d = RunDir::create_in(&t, 4242).expect("create");
        let made = d.path().file_name().expect("name").to_owned();
        assert!(crate::layout::is_run_dir_of(&made, 4242), "{made:?}");
        assert_eq!(d.path(), t.join(&made));
        let m = std::fs::symlink_metadata(d.path()).expect("lstat");
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o7777, 0o700);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(m.uid(), unsafe { libc::geteuid() });
        let q = d.write_file("quota.toml", "x = 1\n").expect("write");
        assert_eq!(std::fs::read_to_string(&q).expect("read"), "x = 1\n");
        assert_eq!(std::fs::metadata(&q).expect("stat").mode() & 0o7777, 0o600);
        let e = d.write_file("quota.toml", "again").expect_err("exists");
        assert!(e.contains("quota.toml"), "{e}");
        let seg = d.make_dir("segment").expect("mkdir");
        assert_eq!(
            std::fs::metadata(&seg).expect("stat").mode() & 0o7777,
            0o700
        );
        // What the program leaves there, links to outside included, goes
        // with it; what the links point to stays.
        std::fs::write(seg.join("memory.seg"), "seg").expect("write");
        std::os::unix::fs::symlink(&victim, d.path().join("link")).expect("symlink");
        std::os::unix::fs::symlink(&t, seg.join("up")).expect("symlink");
        let other = RunDir::create_in(&t, 4242).expect("a second one");
        assert_ne!(other.path(), d.path());
        let path = d.path().to_path_buf();
        drop(d);
        assert!(!path.exists());
        assert!(other.path().exists());
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "victim\n");
        drop(other);
        // A name taken (by a link, say) is tried again with another random
        // part; always taken: one line.
        let taken = t.join(run_name(4242, 1));
        std::os::unix::fs::symlink(&victim, &taken).expect("symlink");
        let mut draws = [1, 1, 2].into_iter();
        let d = RunDir::create_with(&t, 4242, || Ok(draws.next().unwrap_or(3))).expect("create");
        assert_eq!(d.path(), t.join(run_name(4242, 2)));
        drop(d);
        let e = RunDir::create_with(&t, 4242, || Ok(1))
            .err()
            .expect("all taken");
        assert_eq!(
            e,
            format!(
                "cannot create a run directory in {}: 8 random names cuslice-run-4242-* were all taken",
                t.display()
            )
        );
        std::fs::remove_file(&taken).expect("rm");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "victim\n");
        let left: Vec<_> = std::fs::read_dir(&t)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![OsString::from("victim")]);
        let _ = std::fs::remove_dir_all(&t);
    }
}
