//! `cuslice-dra-plugin prepare --claim FILE` / `unprepare --uid UID`: one
//! claim prepared by hand, without a kubelet or an API server, exactly as
//! NodePrepareResources would (what a GPU run of two claims uses, and what
//! an admin uses to try a claim on a node).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};

const UID: &str = "3c9b2f4e-1a7d-4b6e-8f0a-5d2c4e6a8b0d";

fn claim(consumed: serde_json::Value, pool: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "trainer", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.cuslice.io"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f"},
                                   {"apiGroup": "batch", "resource": "jobs", "name": "nightly", "uid": "6e7f8091-2b3c-4d4e-9f0a-1b2c3d4e5f60"}],
                   "allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.cuslice.io", "pool": pool, "device": "gpu-0",
                         "shareID": "9f0c6c3e-7b1a-4c55-8d7e-1f2a3b4c5d6e",
                         "consumedCapacity": consumed}],
            "config": [{"source": "FromClaim", "requests": ["gpu"],
                        "opaque": {"driver": "gpu.cuslice.io", "parameters":
                            {"apiVersion": "gpu.cuslice.io/v1alpha1", "kind": "SliceConfig", "latency": true}}}],
        }}},
    })
}

/// The plugin run by hand on `t`, its GPUs from a file (one H200).
fn plugin(t: &Path, args: &[&str]) -> Output {
    std::fs::write(
        t.join("gpus.json"),
        r#"[{"index": 0, "uuid": "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b", "memory": 151397597184, "minor": 0, "product": "NVIDIA H200"}]"#,
    )
    .expect("gpus");
    let mut c = plugin_command(t);
    c.arg("--gpus-file").arg(t.join("gpus.json"));
    c.args(args).output().expect("cuslice-dra-plugin")
}

/// The plugin's command on `t`'s directories (its GPUs from NVML unless
/// the caller adds `--gpus-file`).
fn plugin_command(t: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuslice-dra-plugin"));
    c.args(["--node-name", "node-1", "--root"])
        .arg(t.join("root"))
        .arg("--cdi-dir")
        .arg(t.join("cdi"))
        .arg("--plugin-dir")
        .arg(t.join("plugin"))
        .args(["--cuslice", "/opt/cuslice/bin/cuslice"]);
    c
}

#[test]
fn a_claim_from_a_file_is_prepared_and_unprepared_by_hand() {
    let t = tempfile::tempdir().expect("tmp");
    let f = t.path().join("claim.json");
    let c = claim(
        serde_json::json!({"memory": "40Gi", "compute": "30"}),
        "node-1",
    );
    std::fs::write(&f, c.to_string()).expect("claim");
    let out = plugin(
        t.path(),
        &["prepare", "--claim", f.to_str().expect("utf-8")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, format!("cuslice.io/claim={UID}\n"));
    let quota = std::fs::read_to_string(t.path().join("root/claims").join(UID).join("quota.toml"))
        .expect("quota file");
    let q = cuslice_core::config::parse_file(Path::new("quota.toml"), &quota).expect("parses");
    assert_eq!(q.tenant_name(), "team-a/trainer");
    assert!(quota.contains("memory = 42949672960\n"), "{quota}");
    assert!(quota.contains("compute = 30"), "{quota}");
    assert!(quota.contains("latency = true"), "{quota}");
    let spec = t
        .path()
        .join("cdi")
        .join(format!("cuslice.io-claim_{UID}.json"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec).expect("CDI spec")).expect("json");
    assert_eq!(v["kind"], "cuslice.io/claim");
    assert_eq!(v["devices"][0]["name"], UID);
    // Who it is for (the pods of status.reservedFor), for `cuslice status`.
    let r: serde_json::Value = serde_json::from_slice(
        &std::fs::read(t.path().join("root/claims").join(UID).join("claim.json")).expect("record"),
    )
    .expect("json");
    assert_eq!(r["pods"], serde_json::json!(["team-a/trainer-0"]), "{r}");
    // The plugin's checkpoint knows it: a plugin started later unprepares it.
    let cp = std::fs::read_to_string(t.path().join("plugin/checkpoint.json")).expect("checkpoint");
    assert!(cp.contains(UID), "{cp}");
    // Marked as prepared by hand: the served plugin's cleanup leaves it
    // alone (its claim need not be the API server's).
    let v: serde_json::Value = serde_json::from_str(&cp).expect("json");
    assert_eq!(v["claims"][UID]["by_hand"], true, "{cp}");
    // The spec is one CDI takes (the UID starts with a digit: 0.5.0).
    let s = cuslice_host::cdi::Spec::parse(&std::fs::read_to_string(&spec).expect("spec"))
        .expect("a CDI spec");
    assert_eq!(s.version(), "0.5.0");

    let out = plugin(t.path(), &["unprepare", "--uid", UID]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!spec.exists());
    assert!(!t.path().join("root/claims").join(UID).exists());
}

#[test]
fn a_bad_claim_by_hand_is_one_line_naming_what_is_wrong_and_leaves_nothing() {
    let t = tempfile::tempdir().expect("tmp");
    let f = t.path().join("claim.json");
    // Allocated in another node's pool.
    let c = claim(
        serde_json::json!({"memory": "40Gi", "compute": "30"}),
        "node-2",
    );
    std::fs::write(&f, c.to_string()).expect("claim");
    let out = plugin(
        t.path(),
        &["prepare", "--claim", f.to_str().expect("utf-8")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains(" GPU(s): "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("cuslice-dra-plugin: ") && errors[0].contains("node-2"),
        "{stderr}"
    );
    assert!(!t.path().join("root/claims").join(UID).exists());
    assert!(std::fs::read_dir(t.path().join("cdi")).map_or(true, |mut d| d.next().is_none()));
    // Not JSON of a ResourceClaim.
    std::fs::write(&f, "{\"kind\": 3}").expect("claim");
    let out = plugin(
        t.path(),
        &["prepare", "--claim", f.to_str().expect("utf-8")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("claim.json: not a ResourceClaim: "),
        "{stderr}"
    );
}

#[test]
fn without_a_gpus_file_the_gpus_come_from_nvml() {
    // The plugin's NVML path (what a node runs): the fake NVML's GPUs, their
    // UUIDs, device nodes and compute capability, into the claim's quota
    // file and CDI spec.
    let t = tempfile::tempdir().expect("tmp");
    let f = t.path().join("claim.json");
    let c = claim(
        serde_json::json!({"memory": "4Gi", "compute": "30"}),
        "node-1",
    );
    std::fs::write(&f, c.to_string()).expect("claim");
    let out = plugin_command(t.path())
        .env(
            "CUSLICE_REAL_NVML",
            common::env().fake.join("libnvidia-ml.so.1"),
        )
        .env("FAKE_CUDA_STATE", t.path().join("fake.state"))
        .args(["prepare", "--claim"])
        .arg(&f)
        .output()
        .expect("cuslice-dra-plugin");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let uuid = cuslice_core::config::format_uuid(&common::FAKE_UUID);
    assert!(
        stderr.contains(&format!("GPU(s): gpu-0 {uuid}")),
        "{stderr}"
    );
    let quota = std::fs::read_to_string(t.path().join("root/claims").join(UID).join("quota.toml"))
        .expect("quota file");
    assert!(
        quota.contains(&format!("[device.{uuid}]")) && quota.contains("memory = 4294967296"),
        "{quota}"
    );
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            t.path()
                .join("cdi")
                .join(format!("cuslice.io-claim_{UID}.json")),
        )
        .expect("CDI spec"),
    )
    .expect("json");
    let nodes = &spec["devices"][0]["containerEdits"]["deviceNodes"];
    assert_eq!(nodes[0]["path"], "/dev/nvidia0", "{spec}");
}
