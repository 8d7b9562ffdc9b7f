use super::*;
use crate::claim::{AllocatedDevice, OpaqueConfig};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub(crate) fn config(t: &Path) -> Config {
    Config {
        driver: Driver {
            name: "gpu.cuslice.io".into(),
            pool: "node-1".into(),
        },
        root: t.join("run/cuslice"),
        cdi_dir: t.join("cdi"),
        state_dir: t.join("plugin"),
        cuslice: "/usr/bin/cuslice".into(),
        lib: None,
        lock_wait: LOCK_WAIT,
    }
}

fn gpus() -> Vec<Gpu> {
    vec![
        Gpu {
            index: 0,
            uuid: "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".into(),
            memory: 80 << 30,
            minor: 0,
            product: String::new(),
            compute_capability: None,
        },
        Gpu {
            index: 1,
            uuid: "GPU-00000000-5b7d-4c2e-9a1b-0c3d4e5f6a7c".into(),
            memory: 80 << 30,
            minor: 3,
            product: String::new(),
            compute_capability: None,
        },
    ]
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: "svc".into(),
        uid: uid.into(),
    }
}

fn alloc(device: &str, memory: &str, compute: &str) -> Allocation {
    Allocation {
        devices: vec![AllocatedDevice {
            request: "gpu".into(),
            driver: "gpu.cuslice.io".into(),
            pool: "node-1".into(),
            device: device.into(),
            consumed: [("memory", memory), ("compute", compute)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }],
        config: vec![OpaqueConfig {
            source: "FromClass".into(),
            requests: vec![],
            driver: "gpu.cuslice.io".into(),
            parameters: serde_json::json!({"latency": true}),
        }],
        pods: vec!["default/svc-0".into()],
    }
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

#[test]
fn a_subrequests_device_goes_by_its_main_request_and_a_uid_with_a_leading_digit_gets_a_valid_spec()
{
    // A prioritized list's result names `gpu/small`; the container
    // names `gpu`, and the kubelet matches that against request_names.
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let uid = "7e3a1111-2222-4333-8444-555555555555";
    let mut a = alloc("gpu-1", "16Gi", "20");
    a.devices[0].request = "gpu/small".into();
    a.config[0].requests = vec!["gpu/small".into()];
    let d = n.prepare(&claim(uid), &a, &gpus()).expect("prepared");
    assert_eq!(d[0].request_names, vec!["gpu".to_string()]);
    // CDI allows a device name that starts with a digit from 0.5.0 on
    // (container-device-interface's requiresV050); runtimes drop an
    // older spec with one.
    let text = fs::read_to_string(n.cdi_spec_path(uid)).expect("spec");
    let spec = cdi::Spec::parse(&text).expect("a spec CDI takes");
    let name = &spec.devices()[0].name;
    assert!(name.starts_with(|c: char| c.is_ascii_digit()));
    assert_eq!(spec.version(), "0.5.0");
    // One that starts with a letter needs no more than 0.3.0.
    let uid = "ae3a1111-2222-4333-8444-555555555555";
    n.prepare(&claim(uid), &a, &gpus()).expect("prepared");
    let text = fs::read_to_string(n.cdi_spec_path(uid)).expect("spec");
    assert_eq!(cdi::Spec::parse(&text).expect("parses").version(), "0.3.0");
    // A UID CDI would not take as a device name: refused, no files.
    let uid = "ae3a1111-2222-4333-8444-55555555555_";
    let e = n
        .prepare(&claim(uid), &a, &gpus())
        .expect_err("not a CDI name");
    assert!(e.contains("is not a CDI device name"), "{e}");
    assert!(!n.claim_dir(uid).exists() && !n.cdi_spec_path(uid).exists());
    assert!(!n.prepared().expect("checkpoint").contains_key(uid));
}

/// A claim's guarantee is in its GPU's memory pool from prepare (held,
/// before any container), and leaves at unprepare; a plugin that died
/// halfway through an unprepare (the CDI spec and the directory
/// removed, the checkpoint entry, removed last, still there) finishes
/// it at the next: the entry goes, nothing is left. Its guarantee,
/// whose quota file went with the directory, is then the watch's to
/// release (`orphan_grace`).
#[test]
fn a_claims_guarantee_is_registered_at_prepare_and_a_half_done_unprepare_is_finished() {
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let uid = "11111111-2222-4333-8444-666666666666";
    n.prepare(&claim(uid), &alloc("gpu-1", "16Gi", "20"), &gpus())
        .expect("prepared");
    let u = cuslice_core::config::parse_uuid(&gpus()[1].uuid).expect("uuid");
    let pool_path = cuslice_core::pool::path(&t.path().join("run/cuslice/gpu"), &u);
    let entries = || {
        cuslice_core::pool::Pool::open_read_only(&pool_path)
            .expect("pool")
            .entries()
    };
    let e = entries();
    assert!(
        e.len() == 1 && e[0].held && e[0].guarantee == 16 << 30 && e[0].procs == 0,
        "{e:?}"
    );
    n.unprepare(uid).expect("unprepared");
    assert!(entries().is_empty(), "{:?}", entries());
    // Prepared again, then half unprepared by a plugin that died.
    n.prepare(&claim(uid), &alloc("gpu-1", "16Gi", "20"), &gpus())
        .expect("prepared");
    fs::remove_file(t.path().join(format!("cdi/cuslice.io-claim_{uid}.json"))).expect("spec");
    fs::remove_dir_all(t.path().join("run/cuslice/claims").join(uid)).expect("dir");
    assert_eq!(n.prepared().expect("checkpoint").len(), 1);
    drop(n);
    let n = Node::open(config(t.path())).expect("reopen");
    n.unprepare(uid).expect("finished");
    assert!(n.prepared().expect("checkpoint").is_empty());
}

#[test]
fn prepare_writes_the_claims_files_and_unprepare_removes_them() {
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let uid = "11111111-2222-4333-8444-555555555555";
    let d = n
        .prepare(&claim(uid), &alloc("gpu-1", "16Gi", "20"), &gpus())
        .expect("prepared");
    assert_eq!(
        d,
        [PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-1".into(),
            device_name: "gpu-1".into(),
            cdi_device_ids: vec![format!("cuslice.io/claim={uid}")],
        }]
    );
    let dir = t.path().join("run/cuslice/claims").join(uid);
    let q = fs::read_to_string(dir.join("quota.toml")).expect("quota");
    let cfg = cuslice_core::config::parse_file(Path::new("q"), &q).expect("parses");
    let u = cuslice_core::config::parse_uuid(&gpus()[1].uuid).expect("uuid");
    assert_eq!(cfg.by_uuid[&u].memory, Some(16 << 30));
    assert_eq!(cfg.by_uuid[&u].compute, Some(20));
    assert!(cfg.latency);
    // Who it is for: its record, for `cuslice status`.
    let r: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join(CLAIM_RECORD)).expect("record"))
            .expect("json");
    assert_eq!(
        r,
        serde_json::json!({"namespace": "default", "name": "svc", "uid": uid,
            "pods": ["default/svc-0"]})
    );
    assert_eq!(mode(&dir.join(CLAIM_RECORD)), 0o444);
    assert_eq!(
        (
            mode(&t.path().join("run/cuslice")),
            mode(&dir),
            mode(&dir.join("quota.toml")),
            mode(&dir.join("segment"))
        ),
        (0o700, 0o700, 0o444, 0o755)
    );
    let spec_path = t.path().join(format!("cdi/cuslice.io-claim_{uid}.json"));
    let spec: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&spec_path).expect("spec")).expect("json");
    let root = t.path().join("run/cuslice").to_string_lossy().into_owned();
    assert_eq!(
        spec,
        serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "cuslice.io/claim",
            "devices": [{
                "name": uid,
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia3"}, {"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
                    "hooks": [
                        {"hookName": "createRuntime", "path": "/usr/bin/cuslice",
                         "args": ["cuslice", "oci-hook", "create", "--root", root, "--claim", uid]},
                        {"hookName": "poststop", "path": "/usr/bin/cuslice",
                         "args": ["cuslice", "oci-hook", "poststop", "--root", root]},
                    ],
                },
            }],
        })
    );
    assert_eq!(mode(&spec_path), 0o644);
    // Again: the same answer, the same files.
    let again = n
        .prepare(&claim(uid), &alloc("gpu-1", "16Gi", "20"), &gpus())
        .expect("again");
    assert_eq!(again, d);
    assert_eq!(
        fs::read_to_string(dir.join("quota.toml")).expect("quota"),
        q
    );
    assert_eq!(n.prepared().expect("checkpoint").len(), 1);
    // A restarted plugin knows it, and unprepares it.
    drop(n);
    let n = Node::open(config(t.path())).expect("reopen");
    assert_eq!(n.prepared().expect("checkpoint")[uid].devices, d);
    assert_eq!(n.prepared().expect("checkpoint")[uid].memory, 16 << 30);
    n.unprepare(uid).expect("unprepared");
    assert!(!dir.exists() && !spec_path.exists());
    assert!(n.prepared().expect("checkpoint").is_empty());
    n.unprepare(uid).expect("again: nothing to do");
    let n = Node::open(config(t.path())).expect("reopen");
    assert!(n.prepared().expect("checkpoint").is_empty());
    // Nothing is left but the checkpoint and the directories.
    assert_eq!(fs::read_dir(t.path().join("cdi")).expect("cdi").count(), 0);
    assert_eq!(
        fs::read_dir(t.path().join("run/cuslice/claims"))
            .expect("claims")
            .count(),
        0
    );
}

/// A claim resized on this node (`cuslice resize claim:...`, an
/// operator's override) keeps the resize when the kubelet prepares it
/// again (another pod of it starting, a restart): the resized fields
/// as the resize left them, the rest the claim's own. A resize whose
/// file was written again since (its record stale) is not kept.
#[test]
fn prepare_again_keeps_a_resize_of_the_claim_on_this_node() {
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let uid = "11111111-2222-4333-8444-555555555555";
    let again = || {
        n.prepare(&claim(uid), &alloc("gpu-1", "16Gi", "20"), &gpus())
            .expect("prepared")
    };
    again();
    let dir = t.path().join("run/cuslice/claims").join(uid);
    let quota = dir.join("quota.toml");
    let own = fs::read_to_string(&quota).expect("quota");
    let u = cuslice_core::config::parse_uuid(&gpus()[1].uuid).expect("uuid");
    // What `cuslice resize claim:... --memory 8GiB` leaves: its record,
    // then the file with the new quota.
    let rec = ResizeRecord {
        at_unix: 1_790_000_000.0,
        grace_seconds: 30.0,
        by_uid: 0,
        changes: vec![resize::Change {
            entry: resize::device_entry(&u),
            field: "memory".into(),
            from: Some(16 << 30),
            to: 8 << 30,
        }],
    };
    fs::write(dir.join("resize.json"), rec.to_json()).expect("record");
    let resized = own.replace(
        &format!("memory = {}", 16u64 << 30),
        &format!("memory = {}", 8u64 << 30),
    );
    assert_ne!(resized, own);
    fs::write(&quota, &resized).expect("resized");
    again();
    let kept = fs::read_to_string(&quota).expect("quota");
    let cfg = cuslice_core::config::parse_file(Path::new("q"), &kept).expect("parses");
    assert_eq!(
        cfg.by_uuid[&u].memory,
        Some(8 << 30),
        "the resize undone: {kept}"
    );
    assert_eq!(cfg.by_uuid[&u].compute, Some(20));
    assert!(cfg.latency);
    assert_eq!(cfg.tenant_name(), "default/svc");
    assert!(
        rec.applies_to(&cfg),
        "the record no longer speaks for the file"
    );
    assert_eq!(mode(&quota), 0o444);
    // Written again since (by hand): the record is stale, the claim's
    // own limits are written.
    fs::write(&quota, own.replace("compute = 20", "compute = 30")).expect("by hand");
    again();
    assert_eq!(fs::read_to_string(&quota).expect("quota"), own);
}

#[test]
fn prepare_and_unprepare_wait_for_the_node_lock_within_its_bound() {
    use std::time::{Duration, Instant};
    let t = tempfile::tempdir().expect("tmp");
    let mut cfg = config(t.path());
    cfg.lock_wait = Duration::from_millis(300);
    let n = Node::open(cfg.clone()).expect("open");
    // Another plugin on the node holds it (another open file
    // description of the lock file: flock tells them apart within one
    // process as between two).
    let other = Node::open(cfg.clone()).expect("another");
    let held = other.lock().expect("free");
    let lock = t.path().join("plugin").join(LOCK_FILE);
    assert_eq!(mode(&lock), 0o600);
    let uid = "55555555-2222-4333-8444-555555555555";
    let start = Instant::now();
    let e = n
        .prepare(&claim(uid), &alloc("gpu-0", "1Gi", "1"), &gpus())
        .expect_err("held");
    assert!(start.elapsed() >= Duration::from_millis(300));
    let who = format!("cuslice-dra-plugin pid {}", std::process::id());
    assert!(
        e.starts_with(&format!(
            "cannot take the node lock {}: {who}",
            lock.display()
        )) && e.ends_with(" still holds it after 300ms")
            && !e.contains('\n'),
        "{e}"
    );
    assert!(!n.claim_dir(uid).exists() && !n.cdi_spec_path(uid).exists());
    assert!(n.prepared().expect("checkpoint").is_empty());
    let e = n.unprepare(uid).expect_err("held");
    assert!(e.ends_with(" still holds it after 300ms"), "{e}");
    // Released while a prepare waits: it goes on then.
    cfg.lock_wait = Duration::from_secs(10);
    let n = Node::open(cfg).expect("open");
    // (The start taken before the releasing thread sleeps: a loaded
    // machine may run this thread late, not the release early.)
    let start = Instant::now();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
    });
    n.prepare(&claim(uid), &alloc("gpu-0", "1Gi", "1"), &gpus())
        .expect("prepared once released");
    assert!(start.elapsed() >= Duration::from_millis(250));
    release.join().expect("joined");
    assert!(n.cdi_spec_path(uid).exists());
    // Let go, the lock names nobody; held by a process that wrote
    // nothing in it, the line says so.
    assert_eq!(fs::read_to_string(&lock).expect("lock"), "");
    let raw = Dir::open(&t.path().join("plugin"))
        .expect("dir")
        .lock(LOCK_FILE, 0o600)
        .expect("held");
    let n = Node::open(Config {
        lock_wait: Duration::from_millis(50),
        ..config(t.path())
    })
    .expect("open");
    let e = n.unprepare(uid).expect_err("held");
    assert_eq!(
        e,
        format!(
            "cannot take the node lock {}: another process still holds it after 50ms",
            lock.display()
        )
    );
    drop(raw);
    n.unprepare(uid).expect("unprepared");
    assert!(!n.cdi_spec_path(uid).exists());
}

#[test]
fn a_bad_claim_leaves_nothing_and_a_bad_uid_is_no_path() {
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let uid = "22222222-2222-4333-8444-555555555555";
    let e = n
        .prepare(&claim(uid), &alloc("gpu-7", "16Gi", "20"), &gpus())
        .expect_err("vanished");
    assert!(e.starts_with("device gpu-7 is not on this node"), "{e}");
    assert!(n.prepared().expect("checkpoint").is_empty());
    assert!(!t.path().join("run").exists() && !t.path().join("cdi").exists());
    for bad in ["../../etc", "", ".x", "a/b", "-rf"] {
        let e = n
            .prepare(&claim(bad), &alloc("gpu-0", "1Gi", "1"), &gpus())
            .expect_err("bad uid");
        assert!(e.ends_with("is not a plain name"), "{e}");
        assert!(n.unprepare(bad).is_err());
    }
}

#[test]
fn links_where_the_claims_files_belong_are_replaced_and_below_it_refused() {
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let uid = "44444444-2222-4333-8444-555555555555";
    let dir = t.path().join("run/cuslice/claims").join(uid);
    fs::create_dir_all(&dir).expect("mkdir");
    let victim = t.path().join("victim");
    fs::write(&victim, "precious").expect("write");
    // A link where the quota file goes, and one where its temporary
    // file goes: replaced and removed, never written through.
    std::os::unix::fs::symlink(&victim, dir.join("quota.toml")).expect("link");
    std::os::unix::fs::symlink(&victim, dir.join(".claim.json.new")).expect("link");
    n.prepare(&claim(uid), &alloc("gpu-0", "1Gi", "1"), &gpus())
        .expect("prepared");
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious");
    assert!(
        fs::symlink_metadata(dir.join("quota.toml"))
            .expect("stat")
            .is_file()
    );
    assert_eq!(mode(&dir.join("quota.toml")), 0o444);
    assert!(fs::symlink_metadata(dir.join(".claim.json.new")).is_err());
    // A link where the segment directory goes: refused.
    fs::remove_dir(dir.join("segment")).expect("rmdir");
    let elsewhere = t.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).expect("mkdir");
    std::os::unix::fs::symlink(&elsewhere, dir.join("segment")).expect("link");
    let e = n
        .prepare(&claim(uid), &alloc("gpu-0", "2Gi", "1"), &gpus())
        .expect_err("a link");
    assert!(
        e.ends_with("segment: expected a directory, got a symlink"),
        "{e}"
    );
    // Unprepare removes the claim's directory, the link in it unlinked.
    fs::write(elsewhere.join("keep"), "keep").expect("write");
    n.unprepare(uid).expect("unprepared");
    assert!(!dir.exists());
    assert_eq!(
        fs::read_to_string(elsewhere.join("keep")).expect("kept"),
        "keep"
    );
}

#[test]
fn links_where_the_plugins_directories_belong_are_refused() {
    let t = tempfile::tempdir().expect("tmp");
    let n = Node::open(config(t.path())).expect("open");
    let victim = t.path().join("victim");
    fs::create_dir_all(&victim).expect("mkdir");
    fs::create_dir_all(t.path().join("run/cuslice/claims")).expect("mkdir");
    let uid = "33333333-2222-4333-8444-555555555555";
    std::os::unix::fs::symlink(&victim, t.path().join("run/cuslice/claims").join(uid))
        .expect("link");
    let e = n
        .prepare(&claim(uid), &alloc("gpu-0", "1Gi", "1"), &gpus())
        .expect_err("a link");
    assert!(
        e.ends_with(&format!(
            "claims/{uid}: expected a directory, got a symlink"
        )),
        "{e}"
    );
    assert_eq!(fs::read_dir(&victim).expect("victim").count(), 0);
    // Unprepare removes the link, not what it points to.
    n.unprepare(uid).expect("unprepared");
    assert!(victim.exists());
    assert!(fs::symlink_metadata(t.path().join("run/cuslice/claims").join(uid)).is_err());
}
