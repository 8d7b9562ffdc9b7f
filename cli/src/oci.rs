//! `cuslice oci-hook create|poststop`: the OCI runtime hook that gives a
//! container its slice.
//!
//! `create` (run it as a `createRuntime` hook, or `prestart` where only that
//! exists: podman / CRI-O hooks.d) reads the container's state on stdin,
//! turns its `cuslice.io/*` annotations into a quota file, and mounts into
//! the container, before it pivots to its root file system:
//!
//! | in the container | from the host | |
//! |---|---|---|
//! | `/etc/cuslice/quota.toml` | `<root>/containers/<id>/quota.toml` | read-only |
//! | `/run/cuslice/segment` | `<root>/containers/<id>/segment` | the container's memory segment |
//! | `/run/cuslice/gpu` | `<root>/gpu` | the host's per-GPU segments |
//! | `/usr/lib/cuslice/libcuslice.so` | the installed library | read-only |
//! | `/etc/ld.so.preload` | `<root>/ld.so.preload` (names the library) | read-only |
//!
//! The mounts are made from a child that enters the container's mount
//! namespace (`setns` on `/proc/<pid>/ns/mnt`): at this stage the
//! container's root is mounted at its bundle path and host paths are still
//! reachable. `poststop` removes `<root>/containers/<id>`.
//!
//! A container without `cuslice.io/*` annotations is left alone. A bad
//! annotation fails container creation with one line naming it, and nothing
//! is left behind.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cuslice_core::config;
use serde::Deserialize;

pub const DEFAULT_ROOT: &str = "/run/cuslice";
pub const DEFAULT_LIB: &str = "/usr/lib/cuslice/libcuslice.so";

/// The OCI state the runtime passes on stdin.
#[derive(Debug, Deserialize)]
struct State {
    id: String,
    #[serde(default)]
    pid: Option<i32>,
    bundle: PathBuf,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// The part of the bundle's config.json we need.
#[derive(Debug, Deserialize)]
struct Spec {
    root: Option<SpecRoot>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct SpecRoot {
    path: PathBuf,
}

fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        || id.starts_with('.')
    {
        return Err(format!("container id {id:?} is not a plain name"));
    }
    Ok(())
}

/// The quota file for a container's annotations; None without any
/// `cuslice.io/` annotation.
pub fn quota_from_annotations(
    id: &str,
    ann: &BTreeMap<String, String>,
) -> Result<Option<String>, String> {
    const KNOWN: [&str; 6] = [
        "cuslice.io/memory",
        "cuslice.io/compute",
        "cuslice.io/compute-max",
        "cuslice.io/compute-burst-ms",
        "cuslice.io/gpus",
        "cuslice.io/tenant",
    ];
    let ours: Vec<(&String, &String)> = ann
        .iter()
        .filter(|(k, _)| k.starts_with("cuslice.io/"))
        .collect();
    if ours.is_empty() {
        return Ok(None);
    }
    for (k, _) in &ours {
        if !KNOWN.contains(&k.as_str()) {
            return Err(format!(
                "annotation {k}: unknown (expected one of {})",
                KNOWN.join(", ")
            ));
        }
    }
    let get = |k: &str| ann.get(k).map(|v| v.trim().to_string());
    let given = crate::limits::Limits {
        memory: get("cuslice.io/memory"),
        compute: get("cuslice.io/compute"),
        compute_max: get("cuslice.io/compute-max"),
        compute_burst_ms: get("cuslice.io/compute-burst-ms"),
    };
    let (burst, limits) = crate::limits::to_toml(&given, &crate::limits::ANNOTATIONS)?;
    let tenant = match get("cuslice.io/tenant") {
        Some(t) => t,
        None => format!("ctr-{}", &id[..id.len().min(24)]),
    };
    let mut text = format!(
        "# written by `cuslice oci-hook` for container {id}\ntenant = {tenant:?}\nsegment_dir = \"/run/cuslice/segment\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\n{burst}"
    );
    match get("cuslice.io/gpus").as_deref() {
        None | Some("all") | Some("") => text.push_str(&format!("\n[all]\n{limits}")),
        Some(list) => {
            for g in list.split(',').map(str::trim) {
                let key = if g.parse::<u32>().is_ok() {
                    g.to_string()
                } else if config::parse_uuid(g).is_ok() {
                    format!("{g:?}")
                } else {
                    return Err(format!(
                        "annotation cuslice.io/gpus={list:?}: expected all, or GPU indices or UUIDs separated by commas, got {g:?}"
                    ));
                };
                text.push_str(&format!("\n[device.{key}]\n{limits}"));
            }
        }
    }
    // The same validation the shim applies: a file the hook writes must load.
    config::parse_file(Path::new("annotations"), &text).map_err(|e| format!("{e}"))?;
    Ok(Some(text))
}

fn read_state() -> Result<State, String> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
        .map_err(|e| format!("cannot read the OCI state on stdin: {e}"))?;
    serde_json::from_str(&s).map_err(|e| format!("the OCI state on stdin is not valid: {e}"))
}

fn read_spec(bundle: &Path) -> Result<Spec, String> {
    let p = bundle.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

pub struct HookArgs {
    pub root: PathBuf,
    pub lib: PathBuf,
}

pub fn create(a: &HookArgs) -> Result<(), String> {
    let st = read_state()?;
    check_id(&st.id)?;
    let spec = read_spec(&st.bundle)?;
    // Annotations reach hooks through the state (runtime-spec >= 1.0.2) or
    // the bundle's config.json; the state's win.
    let mut ann = spec.annotations;
    ann.extend(st.annotations);
    let Some(quota) = quota_from_annotations(&st.id, &ann)? else {
        return Ok(());
    };
    let pid = st
        .pid
        .filter(|p| *p > 0)
        .ok_or("the OCI state has no container pid")?;
    let rootfs = match spec.root {
        Some(r) if r.path.is_absolute() => r.path,
        Some(r) => st.bundle.join(r.path),
        None => st.bundle.join("rootfs"),
    };
    if !a.lib.is_file() {
        return Err(format!(
            "{}: no such library (install cuslice, or pass --lib)",
            a.lib.display()
        ));
    }
    let dir = a.root.join("containers").join(&st.id);
    let result = (|| {
        write_files(a, &dir, &quota)?;
        mount_into(pid, &rootfs, a, &dir)
    })();
    if result.is_err() {
        // Nothing half-created stays behind.
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn write_files(a: &HookArgs, dir: &Path, quota: &str) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mk = |p: &Path, mode: u32| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(p)
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    mk(&a.root.join("gpu"), 0o1777)?;
    let _ = std::fs::set_permissions(a.root.join("gpu"), std::fs::Permissions::from_mode(0o1777));
    mk(&dir.join("segment"), 0o700)?;
    let q = dir.join("quota.toml");
    std::fs::write(&q, quota).map_err(|e| format!("{}: {e}", q.display()))?;
    std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o444))
        .map_err(|e| format!("{}: {e}", q.display()))?;
    let pre = a.root.join("ld.so.preload");
    let want = format!("{}\n", "/usr/lib/cuslice/libcuslice.so");
    if std::fs::read_to_string(&pre).ok().as_deref() != Some(want.as_str()) {
        std::fs::write(&pre, want).map_err(|e| format!("{}: {e}", pre.display()))?;
    }
    Ok(())
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains NUL", p.display()))
}

/// Bind-mounts (in the container's mount namespace) `src` onto `dst` under
/// the container's root, creating the mount point; read-only when asked.
fn bind(src: &Path, rootfs: &Path, dst: &str, dir: bool, ro: bool) -> Result<(), String> {
    let target = rootfs.join(dst.trim_start_matches('/'));
    if dir {
        std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        if !target.exists() {
            std::fs::write(&target, b"").map_err(|e| format!("{}: {e}", target.display()))?;
        }
    }
    let (s, t) = (cstr(src)?, cstr(&target)?);
    // SAFETY: mount(2) with NUL-terminated paths and no data.
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!(
            "cannot mount {} on {}: {}",
            src.display(),
            dst,
            std::io::Error::last_os_error()
        ));
    }
    if ro {
        let flags =
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
        // SAFETY: as above.
        let r = unsafe {
            libc::mount(
                std::ptr::null(),
                t.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(format!(
                "cannot make {dst} read-only: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

fn mount_into(pid: i32, rootfs: &Path, a: &HookArgs, dir: &Path) -> Result<(), String> {
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
    // SAFETY: fork; the child only calls async-signal-safe-enough code
    // (setns, mount, file creation) and exits.
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
            (|| {
                bind(
                    &dir.join("quota.toml"),
                    rootfs,
                    "/etc/cuslice/quota.toml",
                    false,
                    true,
                )?;
                bind(
                    &dir.join("segment"),
                    rootfs,
                    "/run/cuslice/segment",
                    true,
                    false,
                )?;
                bind(&a.root.join("gpu"), rootfs, "/run/cuslice/gpu", true, false)?;
                bind(
                    &a.lib,
                    rootfs,
                    "/usr/lib/cuslice/libcuslice.so",
                    false,
                    true,
                )?;
                bind(
                    &a.root.join("ld.so.preload"),
                    rootfs,
                    "/etc/ld.so.preload",
                    false,
                    true,
                )
            })()
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

pub fn poststop(a: &HookArgs) -> Result<(), String> {
    let st = read_state()?;
    check_id(&st.id)?;
    let dir = a.root.join("containers").join(&st.id);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn annotations_become_a_valid_quota_file() {
        let q = quota_from_annotations(
            "abc123",
            &ann(&[
                ("cuslice.io/memory", "4GiB"),
                ("cuslice.io/compute", "30%"),
                ("other", "x"),
            ]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.all.memory, Some(4 << 30));
        assert_eq!(c.all.compute, Some(30));
        assert_eq!(c.tenant.as_deref(), Some("ctr-abc123"));
        let q = quota_from_annotations(
            "x",
            &ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", "1,3")]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.by_index.get(&3).and_then(|l| l.memory), Some(1 << 30));
        assert_eq!(c.all.memory, None);
        assert_eq!(
            quota_from_annotations("x", &ann(&[("io.kubernetes.pod", "p")])),
            Ok(None)
        );
        let q = quota_from_annotations(
            "x",
            &ann(&[
                ("cuslice.io/compute-max", "40"),
                ("cuslice.io/compute-burst-ms", "500ms"),
            ]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.compute_burst_ms, Some(500));
        assert_eq!(c.all.compute_max, Some(40));
    }

    #[test]
    fn bad_annotations_name_themselves() {
        for (kv, want) in [
            (
                ("cuslice.io/memory", "4 potatoes"),
                "annotation cuslice.io/memory=\"4 potatoes\": expected a size",
            ),
            (
                ("cuslice.io/compute", "130"),
                "annotation cuslice.io/compute=\"130\": expected a percentage",
            ),
            (
                ("cuslice.io/gpus", "zero"),
                "annotation cuslice.io/gpus=\"zero\": expected all, or GPU indices",
            ),
            (
                ("cuslice.io/memroy", "4g"),
                "annotation cuslice.io/memroy: unknown",
            ),
            (
                ("cuslice.io/compute-burst-ms", "0"),
                "annotation cuslice.io/compute-burst-ms=\"0\": expected whole milliseconds from 1 to 10000",
            ),
            (
                ("cuslice.io/compute-burst-ms", "300"),
                "annotation cuslice.io/compute-burst-ms=\"300\": only applies with cuslice.io/compute-max",
            ),
        ] {
            let e = quota_from_annotations("x", &ann(&[kv])).expect_err("must fail");
            assert!(e.starts_with(want), "{e}");
        }
        assert!(check_id("../etc").is_err());
    }
}
