//! A real container started with runc, given its slice by `cuslice oci-hook`
//! from annotations: inside, the library is preloaded through
//! /etc/ld.so.preload, the quota file is read-only, and an allocation past
//! the quota fails (fake driver inside the container). After the container
//! is gone, so are its files. A bad annotation fails creation, leaving
//! nothing behind. Needs root and runc (scripts/setup.sh installs runc).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn copy_with_libs(bin: &Path, rootfs: &Path, dest: &str) {
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

struct Bundle {
    dir: PathBuf,
    root: PathBuf,
}

impl Drop for Bundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bundle(name: &str, annotations: serde_json::Value, script: &str) -> Bundle {
    bundle_in(name, annotations, script, None)
}

/// A bundle whose hooks use `root` as the host's cuslice directory
/// (default: a private one under the bundle).
fn bundle_in(
    name: &str,
    annotations: serde_json::Value,
    script: &str,
    root: Option<&Path>,
) -> Bundle {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the container test needs root"
    );
    assert!(
        Command::new("runc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "runc is not installed (scripts/setup.sh installs it)"
    );
    let e = common::env();
    let dir = std::env::temp_dir().join(format!("cuslice-ctr-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rootfs = dir.join("bundle").join("rootfs");
    for d in ["proc", "dev", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).expect("mkdir");
    }
    copy_with_libs(Path::new("/bin/sh"), &rootfs, "/bin/sh");
    copy_with_libs(Path::new("/bin/cat"), &rootfs, "/bin/cat");
    copy_with_libs(Path::new("/bin/ls"), &rootfs, "/bin/ls");
    copy_with_libs(&e.apps.join("memtest"), &rootfs, "/usr/bin/memtest");
    copy_with_libs(&e.shim, &rootfs, "/tmp/shim-deps-only.so");
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        copy_with_libs(&e.fake.join(lib), &rootfs, &format!("/usr/lib/fake/{lib}"));
    }
    let out = Command::new("runc")
        .args(["spec"])
        .current_dir(dir.join("bundle"))
        .output()
        .expect("runc spec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("bundle").join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    let root = root.map_or_else(|| dir.join("run-cuslice"), Path::to_path_buf);
    let hook = |stage: &str| {
        serde_json::json!({
            "path": env!("CARGO_BIN_EXE_cuslice"),
            "args": ["cuslice", "oci-hook", stage, "--root", root, "--lib", e.shim],
        })
    };
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    spec["process"]["env"] = serde_json::json!([
        "PATH=/usr/bin:/bin",
        "LD_LIBRARY_PATH=/usr/lib/fake",
        "FAKE_CUDA_STATE=/tmp/fake.state",
    ]);
    spec["root"]["readonly"] = false.into();
    spec["annotations"] = annotations;
    spec["hooks"] =
        serde_json::json!({"createRuntime": [hook("create")], "poststop": [hook("poststop")]});
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).expect("encode")).expect("write");
    Bundle { dir, root }
}

fn runc_run(b: &Bundle, id: &str) -> std::process::Output {
    Command::new("runc")
        .args(["run", "--bundle"])
        .arg(b.dir.join("bundle"))
        .arg(id)
        .output()
        .expect("runc run")
}

#[test]
fn an_annotated_container_gets_its_slice() {
    let script = "cat /etc/ld.so.preload; \
        if (echo x > /etc/cuslice/quota.toml) 2>/dev/null; then echo QUOTA writable; else echo QUOTA read-only; fi; \
        cat /etc/cuslice/quota.toml; \
        memtest alloc 419430400; memtest alloc 209715200; ls /run/cuslice";
    let b = bundle(
        "ok",
        serde_json::json!({"cuslice.io/memory": "1GiB"}),
        script,
    );
    let id = format!("cuslice-test-{}", std::process::id());
    let out = runc_run(&b, &id);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "runc run failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("/usr/lib/cuslice/libcuslice.so"),
        "ld.so.preload names the library:\n{stdout}"
    );
    assert!(
        stdout.contains("QUOTA read-only"),
        "the quota file must be read-only:\n{stdout}"
    );
    assert!(stdout.contains("memory = 1073741824"), "{stdout}");
    // 1 GiB quota less the 640 MiB context charge leaves 384 MiB: 400 MiB is
    // refused, 200 MiB granted.
    assert!(
        stdout.contains("R alloc=2\nR alloc=0"),
        "the quota holds inside:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("gpu") && stdout.contains("segment"),
        "{stdout}"
    );
    // runc run deletes the container at exit: the poststop hook cleaned up.
    assert!(
        !b.root.join("containers").join(&id).exists(),
        "per-container files left behind"
    );
}

#[test]
fn a_bad_annotation_fails_creation_and_leaves_nothing() {
    let b = bundle(
        "bad",
        serde_json::json!({"cuslice.io/memory": "4 potatoes"}),
        "echo SHOULD NOT RUN",
    );
    let id = format!("cuslice-bad-{}", std::process::id());
    let out = runc_run(&b, &id);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}");
    assert!(!stdout.contains("SHOULD NOT RUN"));
    assert!(
        stderr.contains("annotation cuslice.io/memory=\\\"4 potatoes\\\"")
            || stderr.contains("annotation cuslice.io/memory=\"4 potatoes\""),
        "the error names the annotation:\n{stderr}"
    );
    assert!(
        !b.root.join("containers").join(&id).exists(),
        "nothing half-created"
    );
    let _ = Command::new("runc")
        .args(["delete", "--force", &id])
        .output();
}

#[test]
fn containers_cannot_reach_each_others_slice() {
    // Container B holds 300 MiB of its 1 GiB; container A, started with the
    // same host directory, sees only its own files, cannot name B's
    // segment, has its own accounting (B's usage does not count against A),
    // and cannot raise its quota from its environment.
    let shared = std::env::temp_dir().join(format!("cuslice-ctr-{}-host", std::process::id()));
    let _ = std::fs::remove_dir_all(&shared);
    let id_b = format!("cuslice-iso-b-{}", std::process::id());
    let id_a = format!("cuslice-iso-a-{}", std::process::id());
    let b = bundle_in(
        "iso-b",
        serde_json::json!({"cuslice.io/memory": "1GiB"}),
        "memtest hold 314572800",
        Some(&shared),
    );
    let mut holder = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(b.dir.join("bundle"))
        .arg(&id_b)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runc run B");
    let seg_b = shared
        .join("containers")
        .join(&id_b)
        .join("segment")
        .join("memory.seg");
    let t0 = std::time::Instant::now();
    while !seg_b.exists() && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seg_b_exists = seg_b.exists();
    let script = format!(
        "CUSLICE_MEMORY=100GiB CUSLICE_CONFIG=/tmp/none.toml memtest alloc 367001600; \
         CUSLICE_MEMORY=100GiB memtest alloc 419430400; echo --; \
         ls /run/cuslice; echo --; ls /run/cuslice/segment; echo --; \
         if [ -e /run/cuslice/containers ]; then echo HOSTROOT-VISIBLE; fi; \
         if [ -e {seg} ]; then echo B-VISIBLE; else echo B-HIDDEN; fi",
        seg = seg_b.display()
    );
    let a = bundle_in(
        "iso-a",
        serde_json::json!({"cuslice.io/memory": "1GiB"}),
        &script,
        Some(&shared),
    );
    let out = runc_run(&a, &id_a);
    let _ = Command::new("runc").args(["kill", &id_b, "KILL"]).output();
    let held = holder.wait_with_output().expect("B");
    let _ = Command::new("runc")
        .args(["delete", "--force", &id_b])
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&shared);
    assert!(
        seg_b_exists,
        "B's segment was never created:\n{}\n{}",
        String::from_utf8_lossy(&held.stdout),
        String::from_utf8_lossy(&held.stderr)
    );
    assert!(
        out.status.success(),
        "runc run A failed:\n{stdout}\n{stderr}"
    );
    let sections: Vec<&str> = stdout.split("--\n").collect();
    let listed = |i: usize| -> Vec<&str> {
        let mut v: Vec<&str> = sections[i].split_whitespace().collect();
        v.sort();
        v
    };
    assert_eq!(sections.len(), 4, "{stdout}\n{stderr}");
    assert_eq!(listed(1), ["gpu", "segment"], "{stdout}");
    assert_eq!(listed(2), ["memory.seg"], "only its own segment: {stdout}");
    assert!(!stdout.contains("HOSTROOT-VISIBLE"), "{stdout}");
    assert!(stdout.contains("B-HIDDEN"), "{stdout}");
    // 1 GiB less the 640 MiB context charge: 350 MiB fits (B's 300 MiB and
    // its context are not counted here), 400 MiB does not, whatever the
    // environment says.
    assert!(
        stdout.contains("R alloc=0\nR alloc=2"),
        "A's own quota, not B's, and not its environment's:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("CUSLICE_MEMORY") || stdout.contains("CUSLICE_MEMORY"),
        "the ignored variable is named in a warning:\n{stdout}\n{stderr}"
    );
}

#[test]
fn per_container_files_are_private_on_the_host() {
    // The hook's files: a container's directory is root-only, its quota
    // file read-only for everybody, the shared GPU directory sticky.
    use std::os::unix::fs::PermissionsExt;
    let shared = std::env::temp_dir().join(format!("cuslice-ctr-{}-perm", std::process::id()));
    let _ = std::fs::remove_dir_all(&shared);
    let id = format!("cuslice-perm-{}", std::process::id());
    let probe = shared.join("containers").join(&id);
    let b = bundle_in(
        "perm",
        serde_json::json!({"cuslice.io/memory": "1GiB"}),
        "memtest alloc 1048576",
        Some(&shared),
    );
    // Look at the files while the container runs: the poststop hook
    // removes them. Poll from a thread while runc runs.
    let watcher = {
        let probe = probe.clone();
        let gpu = shared.join("gpu");
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_secs(20) {
                let m = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o7777);
                if let (Ok(d), Ok(s), Ok(q), Ok(g)) = (
                    m(&probe),
                    m(&probe.join("segment")),
                    m(&probe.join("quota.toml")),
                    m(&gpu),
                ) {
                    return Some((d, s, q, g));
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            None
        })
    };
    let out = runc_run(&b, &id);
    let modes = watcher.join().expect("watcher");
    let _ = std::fs::remove_dir_all(&shared);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (d, s, q, g) = modes.expect("the container's files were never seen");
    assert_eq!(d, 0o700, "container directory mode {d:o}");
    assert_eq!(s, 0o700, "segment directory mode {s:o}");
    assert_eq!(q, 0o444, "quota file mode {q:o}");
    assert_eq!(g, 0o1777, "GPU segment directory mode {g:o}");
}

#[test]
fn cdi_spec_names_the_hooks() {
    let out = Command::new(env!("CARGO_BIN_EXE_cuslice"))
        .args(["cdi", "generate"])
        .output()
        .expect("cdi");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["kind"], "cuslice.io/gpu");
    assert_eq!(v["devices"][0]["name"], "all");
    let hooks = &v["devices"][0]["containerEdits"]["hooks"];
    assert_eq!(hooks[0]["hookName"], "createRuntime");
    assert_eq!(
        hooks[0]["args"],
        serde_json::json!(["cuslice", "oci-hook", "create"])
    );
    assert_eq!(hooks[1]["hookName"], "poststop");
}

#[test]
fn install_script_lays_out_a_host() {
    let e = common::env();
    let dest = std::env::temp_dir().join(format!("cuslice-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dest);
    let install = || {
        Command::new("bash")
            .arg(e.root.join("scripts/install.sh"))
            .env("DESTDIR", &dest)
            .env("LIB", &e.shim)
            .env("BIN", env!("CARGO_BIN_EXE_cuslice"))
            .output()
            .expect("install.sh")
    };
    let out = install();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "usr/bin/cuslice",
        "usr/lib/cuslice/libcuslice.so",
        "etc/cdi/cuslice.json",
        "usr/share/containers/oci/hooks.d/cuslice-create.json",
        "usr/share/containers/oci/hooks.d/cuslice-poststop.json",
    ] {
        assert!(dest.join(f).is_file(), "{f} not installed");
    }
    let hook: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dest.join("usr/share/containers/oci/hooks.d/cuslice-create.json"))
            .expect("read"),
    )
    .expect("hooks.d JSON");
    assert_eq!(hook["stages"], serde_json::json!(["prestart"]));
    assert_eq!(hook["when"]["annotations"]["^cuslice\\.io/"], ".*");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dest.join("run/cuslice/gpu"))
        .expect("gpu dir")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o7777,
        0o1777,
        "the shared GPU directory is sticky and world-writable"
    );
    // Idempotent.
    let again = install();
    assert!(again.status.success());
    let _ = std::fs::remove_dir_all(&dest);
}
