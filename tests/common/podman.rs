//! podman for the end-to-end tests (cli/tests/podman.rs, dra/tests/podman.rs):
//! root and podman checked, an image of our own root file system, a private
//! CDI directory, output helpers.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

pub fn check_podman() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "the podman tests need root"
    );
    assert!(
        Command::new("podman")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "podman is not installed (scripts/setup.sh installs it)"
    );
}

/// What the hooks are run with: the fake NVML (where the hook lists the
/// GPUs whose segments it makes).
pub fn nvml_env() -> String {
    format!(
        "CUSLICE_REAL_NVML={}",
        super::env().fake.join("libnvidia-ml.so.1").display()
    )
}

/// An image built from a root file system of our own, removed when
/// dropped.
pub struct Image {
    pub name: String,
}

impl Image {
    pub fn build(tag: &str) -> Image {
        let name = format!("localhost/cuslice-test:{tag}-{}", std::process::id());
        let rootfs = std::env::temp_dir().join(format!(
            "cuslice-podman-{tag}-{}-rootfs",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&rootfs);
        super::rootfs::populate(&rootfs);
        // Content of its own: images of identical content share their
        // layer, and one test's `rmi --force` while another imports made
        // podman fail the import ("layer not known"), a CI flake.
        std::fs::write(rootfs.join("cuslice-test-image"), &name).expect("write the image's name");
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .expect("tar");
        let out = Command::new("podman")
            .args(["import", "--quiet"])
            .arg("--change")
            .arg(format!("LABEL {}", super::owner_label()))
            .args(["-", &name])
            .stdin(tar.stdout.take().expect("tar stdout"))
            .output()
            .expect("podman import");
        let tarred = tar.wait().expect("tar");
        assert!(tarred.success(), "tar -C {}: {tarred}", rootfs.display());
        let _ = std::fs::remove_dir_all(&rootfs);
        assert!(
            out.status.success(),
            "podman import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Image { name }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rmi", "--force", &self.name])
            .output();
    }
}

/// Runs `c` in a mount namespace of its own where `dir` is mounted on
/// /run/cdi (created, empty, where missing: /var/run/cdi is one of the
/// directories podman reads CDI specs from).
pub fn private_cdi_dir(c: &mut Command, dir: &Path) {
    let run_cdi = Path::new("/run/cdi");
    if !run_cdi.exists() {
        std::fs::create_dir_all(run_cdi).expect("mkdir /run/cdi");
    }
    let src = CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    let dst = CString::new("/run/cdi").expect("path");
    let root = CString::new("/").expect("path");
    // SAFETY: the closure runs in the forked child before exec and only
    // makes system calls (unshare, mount) on strings made before the fork.
    unsafe {
        c.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Waits for `child`, reading its output (for a command that was spawned).
pub fn finish(mut child: Child) -> Output {
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait().expect("wait");
    Output {
        status,
        stdout: stdout.into_bytes(),
        stderr: stderr.into_bytes(),
    }
}
