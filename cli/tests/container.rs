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
    let root = dir.join("run-cuslice");
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
