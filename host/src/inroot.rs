//! Paths inside a container's root file system, opened (and created where
//! missing) without following any symlink.
//!
//! The OCI hook runs as host root before the container has pivoted to its
//! root: a path joined under the root file system and handed to
//! `mkdir`/`open`/`mount` follows whatever symlinks the image put there
//! (`/etc -> /host/etc`, `cuslice -> ../../../../etc`), and the hook would
//! write on the host. Here the path is a walk of [`Dir`]s from the root's
//! descriptor: every component is opened relative to its parent's
//! descriptor with `openat(O_PATH|O_NOFOLLOW)` ([`Dir::open_path`]) and
//! checked with `fstat`: a symlink, wherever it points (dangling included), is refused,
//! and so is anything that is not the kind of file expected. What is
//! missing is created relative to its parent's descriptor (`mkdirat`,
//! `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`), then opened again the same way, so
//! a symlink raced in between is refused too. Nothing is ever resolved by
//! name from the host's root, and `..` is not accepted in a path: there is
//! no way up out of the root's descriptor.
//!
//! Mount points inside the root (the runtime's tmpfs on /run, /dev, ...)
//! are crossed like directories: `openat` enters them.
//!
//! openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) would do the walk in one
//! call, but would not say which component was wrong, and needs Linux 5.6;
//! the walk works on every kernel and is the only code path.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::fs::{self, Dir};
use crate::sys::openat;
pub use crate::sys::{Kind, fstat, type_name};

fn cstring(s: &[u8], what: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what}: path contains a NUL byte"))
}

/// The target of the symlink `fd` (an O_PATH|O_NOFOLLOW descriptor of it),
/// escaped so that it fits on one line whatever bytes the image put there.
fn link_target(fd: BorrowedFd) -> String {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: an empty path with an O_PATH descriptor of a symlink reads
    // that symlink (readlinkat(2), since Linux 2.6.39); `buf` is writable
    // for its full length.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return format!("unreadable: {}", io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    // The image's (the tenant's): it goes into the hook's error line.
    crate::text::clean(&String::from_utf8_lossy(&buf))
}

/// Opens a directory the caller trusts (the container's root file system as
/// the runtime set it up; symlinks in its own path are the host's) as an
/// O_PATH descriptor to walk from.
pub fn open_root(path: &Path) -> Result<OwnedFd, String> {
    let c = cstring(path.as_os_str().as_bytes(), &path.display().to_string())?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!(
            "container root {}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    // SAFETY: open just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks that what `fd` (opened O_PATH|O_NOFOLLOW) refers to is `want`;
/// the error names `shown` (a path inside the container).
fn check(fd: BorrowedFd, shown: &str, want: Kind) -> Result<(), String> {
    let st = fstat(fd).map_err(|e| format!("container path {shown}: cannot stat it: {e}"))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(format!(
            "container path {shown} is a symlink (to {}): refusing to follow it, it could lead out of the container's root",
            link_target(fd)
        ));
    }
    if !want.matches(st.st_mode) {
        return Err(format!(
            "container path {shown} is {}, expected {}",
            type_name(st.st_mode),
            want.expected()
        ));
    }
    Ok(())
}

/// Opens `path` (absolute, as seen inside the container, e.g.
/// `/etc/ld.so.preload`) beneath `root` as an O_PATH descriptor of `kind`,
/// following no symlink. With `create`, missing directories are made (mode
/// 0755) and a missing final file is created empty (0644), whatever the
/// umask.
/// Errors are one line naming the path inside the container.
pub fn open(root: BorrowedFd, path: &str, kind: Kind, create: bool) -> Result<OwnedFd, String> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if !path.starts_with('/') || comps.is_empty() || comps.iter().any(|c| *c == "." || *c == "..") {
        // Our own paths are constants; this guards the walk's premise that
        // no component leads up.
        return Err(format!(
            "container path {path:?}: expected an absolute path without . or .."
        ));
    }
    let root = walk_from(root)?;
    let mut cur: Option<Dir> = None;
    let mut shown = String::new();
    for (i, comp) in comps.iter().enumerate() {
        shown.push('/');
        shown.push_str(comp);
        let last = i + 1 == comps.len();
        let want = if last { kind } else { Kind::Dir };
        let name = cstring(comp.as_bytes(), &format!("container path {shown}"))?;
        let dir = cur.as_ref().unwrap_or(&root);
        let fd = match dir.open_path(comp) {
            Ok((fd, _)) => fd,
            Err(e) if e.not_found() && create => {
                make(dir.as_fd(), &name, want).map_err(|e| {
                    format!(
                        "container path {shown}: cannot create {}: {e}",
                        want.expected()
                    )
                })?;
                // Opened again without following: a symlink put there since
                // mkdirat/openat is caught by the check below.
                dir.open_path(comp)
                    .map(|(fd, _)| fd)
                    .map_err(|e| format!("container path {shown}: {}", os_text(&e)))?
            }
            Err(e) if e.not_found() => {
                return Err(format!("container path {shown} does not exist"));
            }
            Err(e) => {
                return Err(format!(
                    "container path {shown}: cannot open it: {}",
                    os_text(&e)
                ));
            }
        };
        check(fd.as_fd(), &shown, want)?;
        if last {
            return Ok(fd);
        }
        cur = Some(Dir::from_fd(fd, &shown).map_err(|e| format!("container path {e}"))?);
    }
    Err(format!("container path {path:?} is empty"))
}

/// The container's root (`root`, the caller's descriptor) as a [`Dir`] to
/// walk from: a descriptor of its own, named `/` in messages.
fn walk_from(root: BorrowedFd) -> Result<Dir, String> {
    let fd = root
        .try_clone_to_owned()
        .map_err(|e| format!("container root: cannot duplicate its descriptor: {e}"))?;
    Dir::from_fd(fd, "/").map_err(|e| format!("container root {e}"))
}

/// The system's words for what failed in `e` (the component itself is
/// named by the caller, as inside the container).
fn os_text(e: &fs::Error) -> String {
    match e.errno() {
        Some(n) => io::Error::from_raw_os_error(n).to_string(),
        None => e.to_string(),
    }
}

/// Creates `name` in `dir`: a directory (mode 0755), or an empty regular
/// file (0644), modes set explicitly, never from the umask (under `umask
/// 027` a mount point made 0750 kept a non-root user of the container from
/// the file mounted there). Already there (made by someone else since we
/// looked) is fine: the caller opens it again and checks what it is.
fn make(dir: BorrowedFd, name: &CString, kind: Kind) -> io::Result<()> {
    let fchmod = |fd: OwnedFd, mode: libc::mode_t| crate::sys::fchmod(fd.as_fd(), mode);
    let r = match kind {
        Kind::Dir => {
            crate::sys::mkdirat(dir, name, 0o700).and_then(|()| {
                // Opened without following: what we just made, or refused.
                openat(
                    dir,
                    name,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    0,
                )
                .and_then(|fd| fchmod(fd, 0o755))
            })
        }
        // O_EXCL|O_NOFOLLOW: never opens through a symlink (not even a
        // dangling one, which O_CREAT alone would create the target of).
        Kind::File => openat(
            dir,
            name,
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY,
            0o600,
        )
        .and_then(|fd| fchmod(fd, 0o644)),
    };
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

/// The user a container's process runs as (`process.user` of its
/// config.json), whose access to what the hook mounts is checked before
/// the container starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Read, write, search: the bits of a mode's "other" triple.
pub const R: u32 = 4;
pub const W: u32 = 2;
pub const X: u32 = 1;

impl User {
    /// Whether this user may do `want` (R, W, X bits) on a file of `st`'s
    /// owner and mode, as the kernel's permission bits say (uid 0 may do
    /// anything but execute a file nobody may; ACLs are not consulted).
    pub fn may(&self, st: &libc::stat, want: u32) -> bool {
        let mode = st.st_mode;
        if self.uid == 0 {
            return want & X == 0 || mode & 0o111 != 0 || mode & libc::S_IFMT == libc::S_IFDIR;
        }
        let bits = if st.st_uid == self.uid {
            (mode >> 6) & 7
        } else if st.st_gid == self.gid || self.groups.contains(&st.st_gid) {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        bits & want == want
    }

    pub fn describe(&self) -> String {
        format!("uid {} gid {}", self.uid, self.gid)
    }
}

/// What `want` is called in a message.
pub fn access_name(want: u32) -> &'static str {
    match want {
        X => "search",
        R => "read",
        w if w == R | W => "read and write",
        _ => "use",
    }
}

/// The first directory on `path` (inside the container, below `root`,
/// following no link; the path must exist) that `user` may not search,
/// as a one-line error.
pub fn check_search(root: BorrowedFd, path: &str, user: &User) -> Result<(), String> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let st = fstat(root).map_err(|e| format!("container root: cannot stat it: {e}"))?;
    if !user.may(&st, X) {
        return Err(denied(user, "/", &st, X));
    }
    let root = walk_from(root)?;
    let mut cur: Option<Dir> = None;
    let mut shown = String::new();
    for comp in comps.iter().take(comps.len().saturating_sub(1)) {
        shown.push('/');
        shown.push_str(comp);
        cstring(comp.as_bytes(), &format!("container path {shown}"))?;
        let dir = cur.as_ref().unwrap_or(&root);
        let (fd, _) = dir
            .open_path(comp)
            .map_err(|e| format!("container path {shown}: cannot open it: {}", os_text(&e)))?;
        check(fd.as_fd(), &shown, Kind::Dir)?;
        let st = fstat(fd.as_fd()).map_err(|e| format!("container path {shown}: {e}"))?;
        if !user.may(&st, X) {
            return Err(denied(user, &shown, &st, X));
        }
        cur = Some(Dir::from_fd(fd, &shown).map_err(|e| format!("container path {e}"))?);
    }
    Ok(())
}

/// The error for a container's user who may not `want` `shown`.
pub fn denied(user: &User, shown: &str, st: &libc::stat, want: u32) -> String {
    format!(
        "the container's user ({}) may not {} {shown} (mode {:o}, uid {}, gid {}): the shim could not load or keep its slice; fix the image's permissions or run the container as another user",
        user.describe(),
        access_name(want),
        st.st_mode & 0o7777,
        st.st_uid,
        st.st_gid
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;

    /// A fresh directory holding `root/` (the container's root) and
    /// `outside/` (stands for the host), removed on drop.
    struct Tree {
        dir: PathBuf,
    }

    impl Tree {
        fn new(name: &str) -> Tree {
            let dir =
                std::env::temp_dir().join(format!("cuslice-inroot-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("root")).expect("mkdir root");
            std::fs::create_dir_all(dir.join("outside")).expect("mkdir outside");
            Tree { dir }
        }
        fn root(&self) -> PathBuf {
            self.dir.join("root")
        }
        fn outside(&self) -> PathBuf {
            self.dir.join("outside")
        }
        fn open(&self, path: &str, kind: Kind, create: bool) -> Result<OwnedFd, String> {
            let root = open_root(&self.root()).expect("open root");
            open(root.as_fd(), path, kind, create)
        }
        /// Everything under outside/, to show it was not touched.
        fn outside_listing(&self) -> Vec<String> {
            fn walk(p: &Path, base: &Path, out: &mut Vec<String>) {
                let mut v: Vec<_> = std::fs::read_dir(p).expect("read_dir").flatten().collect();
                v.sort_by_key(|e| e.path());
                for e in v {
                    let m = std::fs::symlink_metadata(e.path()).expect("lstat");
                    out.push(format!(
                        "{} {:o}",
                        e.path().strip_prefix(base).expect("under").display(),
                        m.mode()
                    ));
                    if m.is_dir() {
                        walk(&e.path(), base, out);
                    }
                }
            }
            let mut out = Vec::new();
            walk(&self.outside(), &self.outside(), &mut out);
            out
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn same_file(fd: &OwnedFd, p: &Path) -> bool {
        let st = fstat(fd.as_fd()).expect("fstat");
        let m = std::fs::symlink_metadata(p).expect("lstat");
        st.st_dev == m.dev() && st.st_ino == m.ino()
    }

    #[test]
    fn a_normal_tree_is_created_and_reopened() {
        let t = Tree::new("normal");
        let f = t
            .open("/etc/cuslice/quota.toml", Kind::File, true)
            .expect("create");
        let q = t.root().join("etc/cuslice/quota.toml");
        assert!(q.is_file());
        assert!(same_file(&f, &q), "the descriptor is the file created");
        assert_eq!(std::fs::read(&q).expect("read"), b"", "created empty");
        // umask applies; nothing beyond 0755 / 0644.
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&t.root().join("etc/cuslice")) & !0o755, 0);
        assert_eq!(mode(&q) & !0o644, 0);
        let d = t
            .open("/run/cuslice/segment", Kind::Dir, true)
            .expect("mkdirs");
        assert!(same_file(&d, &t.root().join("run/cuslice/segment")));
        // Existing ones are opened, not recreated; content is kept.
        std::fs::write(&q, b"kept").expect("write");
        let f2 = t
            .open("/etc/cuslice/quota.toml", Kind::File, false)
            .expect("reopen");
        assert!(same_file(&f2, &q));
        assert_eq!(std::fs::read(&q).expect("read"), b"kept");
        assert!(t.open("//etc///cuslice/", Kind::Dir, false).is_ok());
        assert_eq!(t.outside_listing(), Vec::<String>::new());
    }

    #[test]
    fn missing_paths_are_not_created_unless_asked() {
        let t = Tree::new("missing");
        let e = t
            .open("/etc/ld.so.preload", Kind::File, false)
            .expect_err("missing");
        assert_eq!(e, "container path /etc does not exist");
        assert!(!t.root().join("etc").exists());
    }

    #[test]
    fn an_absolute_symlink_component_is_refused() {
        let t = Tree::new("abs");
        std::os::unix::fs::symlink(t.outside(), t.root().join("etc")).expect("symlink");
        let e = t
            .open("/etc/cuslice/quota.toml", Kind::File, true)
            .expect_err("refused");
        assert_eq!(
            e,
            format!(
                "container path /etc is a symlink (to {}): refusing to follow it, it could lead out of the container's root",
                t.outside().display()
            )
        );
        assert_eq!(t.outside_listing(), Vec::<String>::new());
    }

    #[test]
    fn a_relative_symlink_climbing_out_is_refused() {
        let t = Tree::new("rel");
        std::fs::create_dir_all(t.root().join("usr/lib")).expect("mkdir");
        // root/usr/lib/cuslice -> ../../../outside
        std::os::unix::fs::symlink("../../../outside", t.root().join("usr/lib/cuslice"))
            .expect("symlink");
        assert!(
            t.root().join("usr/lib/cuslice").is_dir(),
            "the link does lead out"
        );
        let e = t
            .open("/usr/lib/cuslice/libcuslice.so", Kind::File, true)
            .expect_err("refused");
        assert!(
            e.starts_with(
                "container path /usr/lib/cuslice is a symlink (to ../../../outside): refusing"
            ),
            "{e}"
        );
        assert_eq!(t.outside_listing(), Vec::<String>::new());
    }

    #[test]
    fn a_dangling_symlink_is_refused_and_its_target_not_created() {
        let t = Tree::new("dangling");
        std::fs::create_dir_all(t.root().join("etc")).expect("mkdir");
        let target = t.outside().join("ld.so.preload");
        std::os::unix::fs::symlink(&target, t.root().join("etc/ld.so.preload")).expect("symlink");
        for create in [true, false] {
            let e = t
                .open("/etc/ld.so.preload", Kind::File, create)
                .expect_err("refused");
            assert!(
                e.starts_with("container path /etc/ld.so.preload is a symlink (to "),
                "{e}"
            );
        }
        // Also as an intermediate directory.
        std::os::unix::fs::symlink(t.outside().join("nowhere"), t.root().join("run"))
            .expect("symlink");
        let e = t
            .open("/run/cuslice/gpu", Kind::Dir, true)
            .expect_err("refused");
        assert!(e.starts_with("container path /run is a symlink"), "{e}");
        assert!(!target.exists());
        assert_eq!(t.outside_listing(), Vec::<String>::new());
    }

    #[test]
    fn a_symlink_target_with_odd_bytes_stays_on_one_line() {
        let t = Tree::new("odd");
        std::os::unix::fs::symlink("/x\ny", t.root().join("etc")).expect("symlink");
        let e = t.open("/etc/x", Kind::File, true).expect_err("refused");
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains("(to /x\\ny)"), "{e}");
    }

    #[test]
    fn the_wrong_kind_of_file_is_refused() {
        let t = Tree::new("kinds");
        std::fs::create_dir_all(t.root().join("etc/ld.so.preload")).expect("mkdir");
        let e = t
            .open("/etc/ld.so.preload", Kind::File, true)
            .expect_err("dir for file");
        assert_eq!(
            e,
            "container path /etc/ld.so.preload is a directory, expected a regular file"
        );
        std::fs::write(t.root().join("run"), b"").expect("write");
        let e = t
            .open("/run/cuslice/segment", Kind::Dir, true)
            .expect_err("file for dir");
        assert_eq!(
            e,
            "container path /run is a regular file, expected a directory"
        );
        std::fs::create_dir_all(t.root().join("usr/lib/cuslice")).expect("mkdir");
        std::fs::write(t.root().join("usr/lib/cuslice/gpu"), b"").expect("write");
        let e = t
            .open("/usr/lib/cuslice/gpu", Kind::Dir, true)
            .expect_err("file for final dir");
        assert_eq!(
            e,
            "container path /usr/lib/cuslice/gpu is a regular file, expected a directory"
        );

        let fifo = t.root().join("usr/lib/cuslice/libcuslice.so");
        let c = CString::new(fifo.as_os_str().as_bytes()).expect("cstr");
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // Opening a fifo for reading would block; O_PATH does not.
        let e = t
            .open("/usr/lib/cuslice/libcuslice.so", Kind::File, true)
            .expect_err("fifo");
        assert_eq!(
            e,
            "container path /usr/lib/cuslice/libcuslice.so is a fifo, expected a regular file"
        );

        std::fs::create_dir_all(t.root().join("etc/cuslice")).expect("mkdir");
        let _sock = std::os::unix::net::UnixListener::bind(t.root().join("etc/cuslice/quota.toml"))
            .expect("bind");
        let e = t
            .open("/etc/cuslice/quota.toml", Kind::File, true)
            .expect_err("socket");
        assert_eq!(
            e,
            "container path /etc/cuslice/quota.toml is a socket, expected a regular file"
        );

        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::create_dir_all(t.root().join("dev")).expect("mkdir");
            let c = CString::new(t.root().join("dev/null").as_os_str().as_bytes()).expect("cstr");
            // SAFETY: mknod with a NUL-terminated path (1:3 is /dev/null).
            let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
            let e = t.open("/dev/null", Kind::File, true).expect_err("device");
            assert_eq!(
                e,
                "container path /dev/null is a character device, expected a regular file"
            );
        }
        assert_eq!(t.outside_listing(), Vec::<String>::new());
    }

    #[test]
    fn paths_that_could_lead_up_are_refused() {
        let t = Tree::new("dots");
        for p in ["etc", "/etc/../x", "/./etc", "/", ""] {
            assert!(t.open(p, Kind::Dir, true).is_err(), "{p}");
        }
        assert_eq!(std::fs::read_dir(t.root()).expect("ls").count(), 0);
    }
}
