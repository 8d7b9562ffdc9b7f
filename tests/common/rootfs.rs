//! A container's root file system for the container tests (runc, podman):
//! a shell and a few tools, `memtest`, the fake driver under
//! `/usr/lib/fake`, and the libraries they (and the shim, which the OCI
//! hook mounts in) need, copied from the host.

use std::path::Path;
use std::process::Command;

/// Copies `bin` to `dest` in `rootfs`, with every library `ldd` lists for
/// it that `rootfs` does not have yet.
pub fn copy_with_libs(bin: &Path, rootfs: &Path, dest: &str) {
    let target = rootfs.join(dest.trim_start_matches('/'));
    std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
    std::fs::copy(bin, &target).unwrap_or_else(|e| panic!("copy {}: {e}", bin.display()));
    let out = Command::new("ldd").arg(bin).output().expect("ldd");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let Some(path) = line.split_whitespace().find(|w| w.starts_with('/')) else {
            continue;
        };
        let t = rootfs.join(path.trim_start_matches('/'));
        if !t.exists() {
            std::fs::create_dir_all(t.parent().expect("parent")).expect("mkdir");
            std::fs::copy(path, &t).unwrap_or_else(|e| panic!("copy {path}: {e}"));
        }
    }
}

/// Fills `rootfs`: /bin/sh, cat, ls, /usr/bin/memtest and
/// /usr/bin/attack_noshim, the fake
/// libcuda.so.1 / libnvidia-ml.so.1 in /usr/lib/fake, the shim's library
/// dependencies, and empty /proc, /dev, /sys, /tmp (1777), /etc.
pub fn populate(rootfs: &Path) {
    let e = super::env();
    for d in ["proc", "dev", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).expect("mkdir");
    }
    // As in any image: a non-root user of the container can write /tmp
    // (the fake driver's state).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod /tmp");
    copy_with_libs(Path::new("/bin/sh"), rootfs, "/bin/sh");
    copy_with_libs(Path::new("/bin/cat"), rootfs, "/bin/cat");
    copy_with_libs(Path::new("/bin/ls"), rootfs, "/bin/ls");
    copy_with_libs(&e.apps.join("memtest"), rootfs, "/usr/bin/memtest");
    copy_with_libs(
        &e.apps.join("attack_noshim"),
        rootfs,
        "/usr/bin/attack_noshim",
    );
    copy_with_libs(&e.shim, rootfs, "/tmp/shim-deps-only.so");
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        copy_with_libs(&e.fake.join(lib), rootfs, &format!("/usr/lib/fake/{lib}"));
    }
}
