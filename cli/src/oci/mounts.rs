//! The bind mounts into the container: made from a child that enters its
//! mount namespace, every path in the container opened through `inroot`
//! without following a link, every source and target checked before
//! anything is mounted, mounted through descriptors.

use super::*;

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains NUL", p.display()))
}

/// One bind mount the hook makes into the container.
pub(super) struct Bind {
    /// On the host: the hook's own files under `--root` (the layout's), or
    /// the library.
    pub(super) src: PathBuf,
    /// Whether `src` is the library, opened by its path with a symlink
    /// there followed (an administrator may install it as a link). The
    /// hook's own files are opened through the layer instead: from
    /// `--root`, every component below it without following a link.
    pub(super) follow_src: bool,
    /// Inside the container.
    pub(super) dst: &'static str,
    pub(super) kind: Kind,
    pub(super) ro: bool,
}

pub(super) fn binds(a: &HookArgs, id: &str) -> [Bind; 5] {
    let layout = Layout::new(&a.root);
    let ctr = layout.container(id);
    [
        // The quota file's directory, not the file: a resize renames a
        // new file into it, which a mount of the file would not show.
        Bind {
            src: ctr.quota_dir(),
            follow_src: false,
            dst: config::CONTAINER_CONFIG_DIR,
            kind: Kind::Dir,
            ro: true,
        },
        Bind {
            src: match &a.claim {
                Some(uid) => layout.claim(uid).segment_dir(),
                None => ctr.segment_dir(),
            },
            follow_src: false,
            dst: config::CONTAINER_SEGMENT_DIR,
            kind: Kind::Dir,
            ro: false,
        },
        Bind {
            src: layout.gpu_dir(),
            follow_src: false,
            dst: config::CONTAINER_GPU_SEGMENT_DIR,
            kind: Kind::Dir,
            ro: false,
        },
        Bind {
            src: a.lib.clone(),
            follow_src: true,
            dst: "/usr/lib/cuslice/libcuslice.so",
            kind: Kind::File,
            ro: true,
        },
        Bind {
            src: layout.preload(),
            follow_src: false,
            dst: "/etc/ld.so.preload",
            kind: Kind::File,
            ro: true,
        },
    ]
}

/// `/proc/self/fd/N` (`host::sys::fd_path`): the path mount(2) resolves
/// to what descriptor N refers to (its mount and inode), whatever names
/// lead there.
fn fd_path(fd: BorrowedFd) -> CString {
    use std::os::unix::ffi::OsStringExt;
    // A decimal number never contains NUL.
    CString::new(cuslice_host::sys::fd_path(fd).into_os_string().into_vec()).unwrap_or_default()
}

pub(super) fn mount(
    src: Option<&CString>,
    target: &CString,
    flags: libc::c_ulong,
) -> std::io::Result<()> {
    // SAFETY: mount(2) with NUL-terminated paths that outlive the call (or a
    // null source, which MS_REMOUNT ignores), no file system type and no
    // data.
    let r = unsafe {
        libc::mount(
            src.map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A host source, opened O_PATH and checked to be the kind its target
/// is: the library by its path (a link there followed: the
/// administrator's), the hook's own files through the layer, from `root`
/// (`--root`, the administrator's path) with no link followed below it,
/// the last component included. Opened in the container's mount namespace
/// (a bind mount's source must be of the caller's).
pub(super) fn open_source(b: &Bind, root: &Path) -> Result<(OwnedFd, libc::stat), String> {
    let (fd, st) = if b.follow_src {
        let c = cstr(&b.src)?;
        // SAFETY: `c` is NUL-terminated and outlives the call.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "host path {}: {}",
                b.src.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: open just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st =
            inroot::fstat(fd.as_fd()).map_err(|e| format!("host path {}: {e}", b.src.display()))?;
        (fd, st)
    } else {
        let rel = b.src.strip_prefix(root).map_err(|_| {
            format!(
                "host path {}: not under the hook's root {}",
                b.src.display(),
                root.display()
            )
        })?;
        Dir::open(root)
            .and_then(|r| r.open_path_beneath(rel))
            .map_err(|e| format!("host path {e}"))?
    };
    if !b.kind.matches(st.st_mode) {
        return Err(format!(
            "host path {} is {}, expected {}",
            b.src.display(),
            inroot::type_name(st.st_mode),
            b.kind.expected()
        ));
    }
    Ok((fd, st))
}

/// Makes the mounts, in the container's mount namespace (run in the child
/// after setns). Every path in the container is opened (and created where
/// missing) through `inroot`, following no symlink, and every source and
/// target is checked before anything is mounted: an image the hook refuses
/// gets no mount at all, and nothing is created outside its root.
fn mount_all(
    rootfs: &Path,
    host_root: &Path,
    binds: &[Bind],
    user: &inroot::User,
) -> Result<(), String> {
    let root = inroot::open_root(rootfs)?;
    let mut opened = Vec::with_capacity(binds.len());
    for b in binds {
        let (src, src_st) = open_source(b, host_root)?;
        let dst = inroot::open(root.as_fd(), b.dst, b.kind, true)?;
        opened.push((b, src, src_st, dst));
    }
    // The container's user must reach each of them, or the shim would not
    // load (ld.so skips an unreadable /etc/ld.so.preload without a word) or
    // not find its files: refused here, before anything is mounted.
    for (b, _, src_st, _) in &opened {
        inroot::check_search(root.as_fd(), b.dst, user)?;
        let want = match b.kind {
            Kind::File => inroot::R,
            Kind::Dir => inroot::X,
        };
        if !user.may(src_st, want) {
            return Err(inroot::denied(user, b.dst, src_st, want));
        }
    }
    for (b, src, src_st, dst) in &opened {
        // Mounted through the descriptors: the target is the inode the walk
        // checked, not whatever the name leads to by now.
        mount(
            Some(&fd_path(src.as_fd())),
            &fd_path(dst.as_fd()),
            libc::MS_BIND,
        )
        .map_err(|e| {
            format!(
                "cannot mount {} on container path {}: {e}",
                b.src.display(),
                b.dst
            )
        })?;
        if b.ro {
            remount_read_only(root.as_fd(), b, src_st)?;
        }
    }
    Ok(())
}

/// Makes the bind mount just made at `b.dst` read-only. The target's
/// descriptor still refers to the covered inode, on the mount below (the
/// container's root file system, say): a remount through it would act on
/// that mount, not the new one. The path is walked again (no symlink
/// followed) to the new mount's top, which must be the source's inode.
fn remount_read_only(root: BorrowedFd, b: &Bind, src_st: &libc::stat) -> Result<(), String> {
    let top = inroot::open(root, b.dst, b.kind, false)?;
    let st = inroot::fstat(top.as_fd())
        .map_err(|e| format!("container path {}: cannot stat it: {e}", b.dst))?;
    if (st.st_dev, st.st_ino) != (src_st.st_dev, src_st.st_ino) {
        return Err(format!(
            "container path {} is not {} after mounting it there: refusing to remount it read-only",
            b.dst,
            b.src.display()
        ));
    }
    let flags =
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(None, &fd_path(top.as_fd()), flags)
        .map_err(|e| format!("cannot make container path {} read-only: {e}", b.dst))?;
    // What the container will see through that name must now be read-only.
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct;
    // fstatvfs only writes into it.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `top` is a live descriptor, `vfs` a writable statvfs.
    let r = unsafe { libc::fstatvfs(top.as_raw_fd(), &mut vfs) };
    if r != 0 || vfs.f_flag & libc::ST_RDONLY == 0 {
        return Err(format!(
            "container path {} is still writable after remounting it read-only",
            b.dst
        ));
    }
    Ok(())
}

pub(super) fn mount_into(
    pid: i32,
    rootfs: &Path,
    a: &HookArgs,
    id: &str,
    user: &inroot::User,
) -> Result<(), String> {
    let binds = binds(a, id);
    let ns = format!("/proc/{pid}/ns/mnt");
    let nsc = CString::new(ns.clone()).map_err(|_| "bad pid".to_string())?;
    // SAFETY: open a namespace file.
    let fd = unsafe { libc::open(nsc.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("{ns}: {}", std::io::Error::last_os_error()));
    }
    let (rd, wr) = {
        let mut p = [0i32; 2];
        // SAFETY: pipe into a 2-element array.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        (p[0], p[1])
    };
    // setns(CLONE_NEWNS) needs a single-threaded process: do it in a child.
    // SAFETY: fork; the hook has no other thread, so the child may
    // allocate; it only opens, creates and mounts (mount_all), reports on
    // the pipe and _exits, never returning into the caller.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: setns on the namespace fd.
        let r = if unsafe { libc::setns(fd, libc::CLONE_NEWNS) } != 0 {
            Err(format!(
                "cannot enter the container's mount namespace: {}",
                std::io::Error::last_os_error()
            ))
        } else {
            mount_all(rootfs, &a.root, &binds, user)
        };
        let msg = r.err().unwrap_or_default();
        // SAFETY: write to the pipe, then leave without running destructors.
        unsafe {
            libc::write(wr, msg.as_ptr().cast(), msg.len());
            libc::_exit(if msg.is_empty() { 0 } else { 1 });
        }
    }
    // SAFETY: closing our copies of fds we own.
    unsafe {
        libc::close(wr);
        libc::close(fd);
    }
    let mut msg = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        // SAFETY: read into a local buffer.
        let n = unsafe { libc::read(rd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        msg.extend_from_slice(&buf[..n as usize]);
    }
    let mut status = 0;
    // SAFETY: reaping our child; closing our fd.
    unsafe {
        libc::waitpid(child, &mut status, 0);
        libc::close(rd);
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else if !msg.is_empty() {
        Err(String::from_utf8_lossy(&msg).into_owned())
    } else {
        Err(format!(
            "mounting into the container failed (status {status})"
        ))
    }
}
