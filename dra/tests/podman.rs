//! End to end without a cluster (issue #20): the CDI spec the plugin writes
//! when it prepares a claim is what podman runs a container with (`--device
//! cuslice.io/claim=<uid>`), and the container gets that claim's slice: its
//! quota file, read-only, and its memory quota holding inside (the fake
//! driver in the image), accounted in the claim's own segment on the host;
//! with its opaque config's `memoryMax` and `memoryWait`, it bursts past
//! its guarantee up to `memoryMax` and no further; unprepared, nothing of
//! the claim is left.
//!
//! The spec's device nodes are left out here: the test host has no GPU
//! (/dev/nvidia0 does not exist); on a GPU node they are the GPU's. The
//! hooks get the fake NVML, as in cli/tests/podman.rs. Needs root and
//! podman (scripts/setup.sh installs it).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::podman::{Image, check_podman, nvml_env, private_cdi_dir, text};
use cuslice_core::segment::Segment;

const UID: &str = "7e3a9c1f-2b4d-4f6a-8c0e-1a3b5c7d9e0f";
const MIB: u64 = 1 << 20;

/// `cuslice` of this build (the hook the spec names).
fn cuslice_cli() -> PathBuf {
    let profile = std::env::current_exe()
        .expect("current_exe")
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf();
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-p", "cuslice-cli", "--bin", "cuslice"]);
    if profile.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let out = cargo.output().expect("cargo build");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile.join("cuslice")
}

/// The test's directory, removed at the end (pass or fail).
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn plugin(t: &Path, cli: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cuslice-dra-plugin"))
        .args(["--node-name", "node-1", "--gpus-file"])
        .arg(t.join("gpus.json"))
        .arg("--root")
        .arg(t.join("root"))
        .arg("--cdi-dir")
        .arg(t.join("cdi"))
        .arg("--plugin-dir")
        .arg(t.join("plugin"))
        .arg("--cuslice")
        .arg(cli)
        .arg("--lib")
        .arg(&common::env().shim)
        .args(args)
        .output()
        .expect("cuslice-dra-plugin")
}

#[test]
fn podman_runs_a_prepared_claims_cdi_device_with_the_claims_slice() {
    check_podman();
    let cli = cuslice_cli();
    let t = Dir(std::env::temp_dir().join(format!("cuslice-podman-dra-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&t.0);
    std::fs::create_dir_all(&t.0).expect("mkdir");
    let uuid = cuslice_core::config::format_uuid(&common::FAKE_UUID);
    std::fs::write(
        t.0.join("gpus.json"),
        serde_json::json!([{"index": 0, "uuid": uuid, "memory": 16u64 << 30, "minor": 0,
            "product": "cuslice Fake GPU"}])
        .to_string(),
    )
    .expect("gpus");
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "trainer", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.cuslice.io"}}]}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.cuslice.io",
            "pool": "node-1", "device": "gpu-0", "shareID": "9f0c6c3e-7b1a-4c55-8d7e-1f2a3b4c5d6e",
            "consumedCapacity": {"memory": "1Gi", "compute": "30"}}],
            "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.cuslice.io",
                "parameters": {"memoryMax": "3Gi", "memoryWait": "2s"}}}]}}},
    });
    std::fs::write(t.0.join("claim.json"), claim.to_string()).expect("claim");
    let out = plugin(
        &t.0,
        &cli,
        &[
            "prepare",
            "--claim",
            &t.0.join("claim.json").display().to_string(),
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, format!("cuslice.io/claim={UID}\n"));
    // The spec as the plugin wrote it, with the fake NVML for its hooks and
    // without device nodes (no GPU on this host).
    let spec = t.0.join("cdi").join(format!("cuslice.io-claim_{UID}.json"));
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec).expect("spec")).expect("json");
    let edits = &mut v["devices"][0]["containerEdits"];
    assert!(edits["deviceNodes"].is_array(), "{v}");
    edits.as_object_mut().expect("edits").remove("deviceNodes");
    for hook in edits["hooks"].as_array_mut().expect("hooks") {
        hook["env"] = serde_json::json!([nvml_env()]);
    }
    std::fs::write(&spec, serde_json::to_vec_pretty(&v).expect("encode")).expect("write");

    let image = Image::build("dra");
    let name = format!("cuslice-dra-{}", std::process::id());
    // 1 GiB guaranteed less the 640 MiB context charge leaves 384 MiB: 2
    // GiB is a burst (nobody else is on the fake 16 GiB GPU); 3 GiB with
    // the context is past memoryMax.
    let script = "cat /etc/cuslice/quota.toml; \
        if (echo x > /etc/cuslice/quota.toml) 2>/dev/null; then echo QUOTA writable; else echo QUOTA read-only; fi; \
        memtest alloc 2147483648; memtest alloc 3221225472";
    let mut c = Command::new("podman");
    c.args(["run", "--rm", "--name", &name]);
    c.arg("--label").arg(common::owner_label());
    c.args([
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
    ]);
    // No hooks.d: the claim's CDI spec is the only way cuslice comes in.
    c.arg("--hooks-dir").arg(t.0.join("no-hooks.d"));
    for env in [
        "PATH=/usr/bin:/bin",
        "LD_LIBRARY_PATH=/usr/lib/fake",
        "FAKE_CUDA_STATE=/tmp/fake.state",
    ] {
        c.args(["--env", env]);
    }
    c.args(["--device", &format!("cuslice.io/claim={UID}")]);
    private_cdi_dir(&mut c, &t.0.join("cdi"));
    c.args([&image.name, "/bin/sh", "-c", script]);
    let out = c.output().expect("podman run");
    let _ = Command::new("podman")
        .args(["rm", "--force", &name])
        .output();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Inside: the claim's quota file (read-only) and its quota holding.
    assert!(
        stdout.contains("tenant = \"team-a/trainer\"") && stdout.contains("memory = 1073741824"),
        "{stdout}"
    );
    assert!(
        stdout.contains("memory_max = 3221225472") && stdout.contains("memory_wait = \"2000ms\""),
        "{stdout}"
    );
    assert!(stdout.contains("QUOTA read-only"), "{stdout}");
    assert!(
        stdout.contains("R alloc=0\nR alloc=2"),
        "the claim bursts past its guarantee, and its memoryMax holds inside:\n{stdout}\n{stderr}"
    );
    // On the host: accounted in the claim's own segment.
    let seg = Segment::open_read_only(
        &t.0.join("root/claims")
            .join(UID)
            .join("segment")
            .join("memory.seg"),
    )
    .expect("the claim's memory segment");
    let u = (0..cuslice_core::segment::MAX_DEVICES)
        .find_map(|d| seg.device_usage(d))
        .expect("a device in the claim's segment");
    assert_eq!((u.guarantee, u.limit), (1 << 30, 3 << 30), "{u:?}");
    assert!(u.peak >= 2048 * MIB && u.refused >= 1, "{u:?}");
    drop(seg);
    // Unprepared: nothing of the claim is left.
    let out = plugin(&t.0, &cli, &["unprepare", "--uid", UID]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(!spec.exists());
    assert!(!t.0.join("root/claims").join(UID).exists());
}
