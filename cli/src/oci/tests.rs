#[test]
fn a_containers_cgroup_v2_directory_is_found_under_the_v2_mount() {
    let v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
    let hybrid = "25 24 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                      57 47 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    let cg = "4:memory:/x\n0::/system.slice/runc-abc.scope\n";
    assert_eq!(
        cgroup_v2_dir(cg, v2).as_deref(),
        Ok("/sys/fs/cgroup/system.slice/runc-abc.scope")
    );
    assert_eq!(
        cgroup_v2_dir(cg, hybrid).as_deref(),
        Ok("/sys/fs/cgroup/unified/system.slice/runc-abc.scope")
    );
    // No v2 mount; no v2 line; the root cgroup; a path not plain; a
    // v2 mount of a subtree (root not "/") is not the hierarchy's root.
    let v1 = "25 24 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    assert!(cgroup_v2_dir(cg, v1).unwrap_err().contains("no cgroup v2"));
    assert!(
        cgroup_v2_dir("4:memory:/x\n", v2)
            .unwrap_err()
            .contains("no cgroup v2")
    );
    assert!(
        cgroup_v2_dir("0::/\n", v2)
            .unwrap_err()
            .contains("root cgroup")
    );
    assert!(
        cgroup_v2_dir("0::/a/../b\n", v2)
            .unwrap_err()
            .contains("not a plain")
    );
    let sub = "30 23 0:26 /x /mnt/cg rw - cgroup2 cgroup2 rw\n";
    assert!(cgroup_v2_dir(cg, sub).unwrap_err().contains("no cgroup v2"));
}
use super::*;

fn ann(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_containers_gpus_are_those_its_quota_names_else_its_device_nodes_else_all() {
    let u = |i: u8| format!("GPU-c511ce00-fa4e-4000-8000-0000000000{i:02x}");
    let host: Vec<HostGpu> = (0..3)
        .map(|i| (u32::from(i), u(i), Some(u32::from(i))))
        .collect();
    let idx = |v: Vec<&HostGpu>| v.iter().map(|g| g.0).collect::<Vec<_>>();
    let named = [config::parse_uuid(&u(2)).expect("uuid")];
    assert_eq!(idx(container_gpus(&named, &[0], &host)), [2]);
    assert_eq!(idx(container_gpus(&[], &[0, 1], &host)), [0, 1]);
    assert_eq!(idx(container_gpus(&[], &[], &host)), [0, 1, 2]);
    // A minor NVML does not tell: not matched by its device node.
    let unknown: Vec<HostGpu> = vec![(0, u(0), None)];
    assert!(container_gpus(&[], &[0], &unknown).is_empty());
    let devices: Vec<SpecDevice> = [
        "/dev/nvidia3",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia12",
        "/dev/nvidia",
    ]
    .iter()
    .map(|p| SpecDevice {
        path: p.to_string(),
    })
    .collect();
    assert_eq!(gpu_minors(&devices), [3, 12]);
}

#[test]
fn an_unhealthy_gpu_is_refused_in_one_line_unless_allowed_a_degraded_one_warned() {
    use cuslice_host::gpu::health::view::GpuView;
    use cuslice_host::gpu::health::{Cause, Health, State};
    let gpu = |state: State, reason: &str| GpuView {
        index: 1,
        uuid: "GPU-x".into(),
        health: Health {
            state,
            cause: Some(Cause::Xid(79)),
            reason: Some(reason.into()),
            since_unix: 0.0,
            lost: false,
        },
        judged_by: "source",
        events: Some(true),
        ignored_xid: None,
    };
    let sick = gpu(State::Unhealthy, "XID 79: the GPU has fallen off the bus");
    let meh = gpu(State::Degraded, "XID 92: high single-bit ECC error rate");
    let ok = GpuView {
        health: Health::healthy(0.0),
        ..gpu(State::Healthy, "")
    };
    assert_eq!(
            health_verdict(&[&ok, &sick], false),
            Err("GPU 1 (GPU-x) is unhealthy since 1970-01-01T00:00:00Z: XID 79: the GPU has fallen off the bus: refusing to start the container on it (annotation cuslice.io/allow-unhealthy-gpu: \"true\" starts it anyway)".into())
        );
    assert_eq!(
            health_verdict(&[&sick], true),
            Ok(vec!["GPU 1 (GPU-x) is unhealthy since 1970-01-01T00:00:00Z: XID 79: the GPU has fallen off the bus; the container starts on it as its annotation cuslice.io/allow-unhealthy-gpu allows".into()])
        );
    assert_eq!(
            health_verdict(&[&meh, &ok], false),
            Ok(vec!["GPU 1 (GPU-x) is degraded since 1970-01-01T00:00:00Z: XID 92: high single-bit ECC error rate; the container starts on it".into()])
        );
    assert_eq!(health_verdict(&[&ok], false), Ok(vec![]));
    let ann = |v: &str| BTreeMap::from([(ALLOW_UNHEALTHY_ANNOTATION.to_string(), v.to_string())]);
    assert_eq!(allow_unhealthy(&BTreeMap::new()), Ok(false));
    assert_eq!(allow_unhealthy(&ann("true")), Ok(true));
    assert_eq!(allow_unhealthy(&ann(" false ")), Ok(false));
    assert!(
        allow_unhealthy(&ann("sure"))
            .expect_err("bad")
            .starts_with("annotation cuslice.io/allow-unhealthy-gpu=\"sure\": ")
    );
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
    // Its own slice: the container's, whatever tenant it is given.
    assert_eq!(c.slice.as_deref(), Some("ctr-abc123"));
    // Host GPUs 1 and 3 (as `--gpus device=1,3` gives them, CUDA's
    // 0 and 1 inside): the file names them by UUID.
    let q = quota_from_annotations_with(
        "x",
        &ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", "1,3")]),
        &host_gpus,
    )
    .expect("ok")
    .expect("some");
    let c = config::parse_file(Path::new("q"), &q).expect("parses");
    assert!(c.by_index.is_empty(), "{q}");
    for i in [1, 3] {
        let u = config::parse_uuid(&host_uuid(i)).expect("uuid");
        assert_eq!(c.by_uuid.get(&u).and_then(|l| l.memory), Some(1 << 30));
    }
    assert_eq!(c.by_uuid.len(), 2);
    assert_eq!(c.all.memory, None);
    // An index the host lacks, or no NVML to map it, refuses the
    // container; UUIDs need no NVML.
    let gpus = |list: &str| ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", list)]);
    assert_eq!(
            quota_from_annotations_with("x", &gpus("0,7"), &host_gpus),
            Err("annotation cuslice.io/gpus=\"0,7\": expected GPUs of this host, got \"7\" (5 GPUs listed by NVML)".to_string())
        );
    let other = "GPU-99999999-1111-2222-3333-444444444444";
    assert_eq!(
        quota_from_annotations_with("x", &gpus(other), &host_gpus),
        Err(format!(
            "annotation cuslice.io/gpus={other:?}: expected GPUs of this host, got {other:?} (5 GPUs listed by NVML)"
        ))
    );
    // Annotations that set no limit would give the container the
    // whole GPU: refused.
    for a in [
        ann(&[("cuslice.io/tenant", "team-a")]),
        ann(&[("cuslice.io/gpus", "0")]),
        ann(&[("cuslice.io/latency", "false")]),
    ] {
        assert!(
            quota_from_annotations_with("x", &a, &host_gpus)
                .expect_err("no limit")
                .starts_with("annotations: no limit among them"),
            "{a:?}"
        );
    }
    let no_nvml = || Err("libnvidia-ml.so.1: not found".to_string());
    assert_eq!(
            quota_from_annotations_with("x", &gpus("1"), &no_nvml),
            Err("annotation cuslice.io/gpus=\"1\": cannot find the UUID of host GPU 1 through NVML (libnvidia-ml.so.1: not found); give UUIDs instead".to_string())
        );
    assert!(quota_from_annotations_with("x", &gpus(&host_uuid(2)), &no_nvml).is_ok());
    // The same GPU by index and by UUID is the same GPU twice.
    let both = format!("2,{}", host_uuid(2).to_uppercase().replace("GPU-", "gpu-"));
    assert!(
        quota_from_annotations_with("x", &gpus(&both), &host_gpus)
            .expect_err("twice")
            .ends_with("twice"),
    );
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
    for (v, want) in [
        ("true", true),
        ("1", true),
        ("false", false),
        ("off", false),
    ] {
        let q = quota_from_annotations(
            "x",
            &ann(&[("cuslice.io/compute", "50"), ("cuslice.io/latency", v)]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.latency, want, "{v}");
    }
}

/// `memory-max` (what a container may burst to past its guarantee)
/// and `memory-wait` (how long a refused allocation waits for a free)
/// reach the quota file as the shim reads them; a value out of range
/// is refused in one line naming the annotation.
#[test]
fn memory_max_and_memory_wait_annotations_reach_the_quota_file() {
    let q = quota_from_annotations(
        "x",
        &ann(&[
            ("cuslice.io/memory", "1GiB"),
            ("cuslice.io/memory-max", "3GiB"),
            ("cuslice.io/memory-wait", "30s"),
        ]),
    )
    .expect("ok")
    .expect("some");
    let c = config::parse_file(Path::new("q"), &q).expect("parses");
    assert_eq!(
        (c.all.memory, c.all.memory_max),
        (Some(1 << 30), Some(3 << 30))
    );
    assert_eq!(c.memory_wait_ms, Some(30_000));
    // Per GPU, as the other limits: the burst with the guarantee.
    let q = quota_from_annotations_with(
        "x",
        &ann(&[
            ("cuslice.io/memory", "2g"),
            ("cuslice.io/memory-max", "2g"),
            ("cuslice.io/memory-wait", "0"),
            ("cuslice.io/gpus", "1"),
        ]),
        &host_gpus,
    )
    .expect("ok")
    .expect("some");
    let c = config::parse_file(Path::new("q"), &q).expect("parses");
    let host1 = config::parse_uuid(&host_uuid(1)).expect("uuid");
    let l = c.by_uuid.get(&host1).expect("gpu 1");
    assert_eq!((l.memory, l.memory_max), (Some(2 << 30), Some(2 << 30)));
    assert_eq!(c.memory_wait_ms, Some(0));
    for (kv, want) in [
        (
            [
                ("cuslice.io/memory", "2GiB"),
                ("cuslice.io/memory-max", "1GiB"),
            ],
            "annotation cuslice.io/memory-max=\"1GiB\": expected from cuslice.io/memory (the guarantee) to 1PiB",
        ),
        (
            [
                ("cuslice.io/memory", "2GiB"),
                ("cuslice.io/memory-max", "2PiB"),
            ],
            "annotation cuslice.io/memory-max=\"2PiB\": expected from cuslice.io/memory (the guarantee) to 1PiB",
        ),
        (
            [
                ("cuslice.io/memory", "2GiB"),
                ("cuslice.io/memory-max", "lots"),
            ],
            "annotation cuslice.io/memory-max=\"lots\": expected a size",
        ),
        (
            [
                ("cuslice.io/memory", "2GiB"),
                ("cuslice.io/memory-wait", "2h"),
            ],
            "annotation cuslice.io/memory-wait=\"2h\": expected a duration like \"30s\", \"500ms\" or \"2m\" (whole numbers, at most 1h)",
        ),
        (
            [
                ("cuslice.io/memory", "2GiB"),
                ("cuslice.io/memory-wait", "1.5s"),
            ],
            "annotation cuslice.io/memory-wait=\"1.5s\": expected a duration",
        ),
        (
            [
                ("cuslice.io/memory", "2GiB"),
                ("cuslice.io/memory-wiat", "1s"),
            ],
            "annotation cuslice.io/memory-wiat: unknown",
        ),
    ] {
        let e = quota_from_annotations("x", &ann(&kv)).expect_err("must fail");
        assert!(e.starts_with(want) && !e.contains('\n'), "{e}");
    }
}

/// A host's GPUs as NVML lists them: indices 0-3.
fn host_uuid(i: u32) -> String {
    format!("GPU-0000000{i}-1111-2222-3333-444444444444")
}

fn host_gpus() -> Result<Vec<(u32, String)>, String> {
    let mut l: Vec<(u32, String)> = (0..4).map(|i| (i, host_uuid(i))).collect();
    l.push((4, "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".to_string()));
    Ok(l)
}

#[test]
fn the_quota_file_is_toml_whatever_the_values() {
    let q = quota_from_annotations_with(
        "abc",
        &ann(&[
            ("cuslice.io/memory", "2g"),
            ("cuslice.io/compute-max", "60"),
            ("cuslice.io/compute-burst-ms", "50"),
            ("cuslice.io/latency", "on"),
            (
                "cuslice.io/gpus",
                "0, GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b",
            ),
            ("cuslice.io/tenant", "team-a/svc"),
        ]),
        &host_gpus,
    )
    .expect("ok")
    .expect("some");
    assert!(q.starts_with("# written by `cuslice oci-hook` for container abc\n"));
    let c = config::parse_file(Path::new("q"), &q).expect("parses");
    assert_eq!(c.tenant.as_deref(), Some("team-a/svc"));
    assert_eq!(c.segment_dir, Path::new("/run/cuslice/segment"));
    assert_eq!(c.gpu_segment_dir, Path::new("/run/cuslice/gpu"));
    assert_eq!((c.compute_burst_ms, c.latency), (Some(50), true));
    let l = config::Limits {
        memory: Some(2 << 30),
        memory_max: None,
        compute: None,
        compute_max: Some(60),
    };
    let host0 = config::parse_uuid(&host_uuid(0)).expect("uuid");
    assert_eq!(c.by_uuid.get(&host0), Some(&l));
    let uuid = config::parse_uuid("GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b").expect("uuid");
    assert_eq!(c.by_uuid.get(&uuid), Some(&l));
    assert!(c.all.is_empty());
    // A tenant name reaches the shim's validation as it was written
    // (quotes and escapes included), and is refused there.
    for t in ["a\"b", "a\\b", "a\u{1b}b"] {
        let e = quota_from_annotations("x", &ann(&[("cuslice.io/tenant", t)]))
            .expect_err("not a tenant name");
        assert!(
            e.starts_with(&format!(
                "annotations: tenant: expected 1 to 56 characters of A-Z a-z 0-9 . _ / -, got {t:?}"
            )),
            "{e}"
        );
    }
    let e = quota_from_annotations_with(
        "x",
        &ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", "1, 2,1")]),
        &host_gpus,
    )
    .expect_err("twice");
    assert_eq!(
        e,
        "annotation cuslice.io/gpus=\"1, 2,1\": expected each GPU once, got \"1\" twice"
    );
}

/// Every container has a slice of its own, ids of any length
/// included.
#[test]
fn a_containers_slice_is_its_id() {
    let ann = ann(&[("cuslice.io/compute", "10"), ("cuslice.io/tenant", "t")]);
    let slice_of = |id: &str| {
        let q = quota_from_annotations(id, &ann).expect("ok").expect("some");
        config::parse_file(Path::new("q"), &q)
            .expect("parses")
            .slice
            .expect("a slice")
    };
    let hex = "3f2a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a";
    assert_eq!(slice_of(hex), format!("ctr-{hex}"));
    let long = |c: char| format!("{}{c}", "x".repeat(127));
    let (a, b) = (slice_of(&long('a')), slice_of(&long('b')));
    assert!(a.len() <= 128 && b.len() <= 128 && a != b, "{a} {b}");
    assert!(a.starts_with("ctr-xxxx"), "{a}");
}

/// The tenant name a container asks for is taken by a live container
/// (its recorded init runs) or a DRA claim; not by a record whose init
/// is gone, by a container of a claim (the claim holds it), nor by the
/// container itself.
#[test]
fn a_tenant_name_is_held_by_live_containers_and_claims() {
    let t = std::env::temp_dir().join(format!("cuslice-oci-tenant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&t);
    let record = |id: &str, tenant: &str, init: u32, claim: Option<&str>| {
        let d = t.join("containers").join(id);
        std::fs::create_dir_all(d.join("etc")).expect("mkdir");
        std::fs::write(
            d.join("etc/quota.toml"),
            format!("tenant = \"{tenant}\"\n[all]\ncompute = 10\n"),
        )
        .expect("quota");
        let m = ContainerMeta {
            id: id.into(),
            init_pid: Some(init),
            init_start: Some(1),
            claim: claim.map(str::to_string),
            ..ContainerMeta::default()
        };
        std::fs::write(
            d.join(CONTAINER_RECORD),
            serde_json::to_string(&m).expect("json"),
        )
        .expect("record");
    };
    // Init 1 runs, init 2 is gone.
    let alive = |init: Option<(u32, u64)>| init.is_none_or(|(pid, _)| pid == 1);
    let holder = |own: &str, tenant: &str| tenant_holder(&t, own, tenant, &alive);
    assert_eq!(holder("new", "team-a"), None, "no root yet");
    record("live", "team-a", 1, None);
    record("gone", "team-b", 2, None);
    record("member", "team-c", 1, Some("uid-1"));
    assert_eq!(holder("new", "team-a").as_deref(), Some("container live"));
    assert_eq!(holder("live", "team-a"), None, "its own record");
    assert_eq!(holder("new", "team-b"), None, "a record left behind");
    assert_eq!(holder("new", "team-c"), None, "a claim's container");
    let claim = t.join("claims/uid-1");
    std::fs::create_dir_all(&claim).expect("mkdir");
    std::fs::write(
        claim.join("quota.toml"),
        "tenant = \"team-c\"\n[all]\ncompute = 10\n",
    )
    .expect("quota");
    assert_eq!(holder("new", "team-c").as_deref(), Some("DRA claim uid-1"));
    std::fs::write(
        claim.join("claim.json"),
        r#"{"namespace": "ns", "name": "train\u001b[2J", "uid": "uid-1"}"#,
    )
    .expect("record");
    assert_eq!(
        holder("new", "team-c").as_deref(),
        Some("DRA claim ns/train\\x1b[2J (uid-1)")
    );
    // A record without an init (an older hook's) is taken as live; its
    // quota file is where that hook put it.
    let d = t.join("containers/old");
    std::fs::create_dir_all(&d).expect("mkdir");
    std::fs::write(
        d.join("quota.toml"),
        "tenant = \"team-d\"\n[all]\ncompute = 10\n",
    )
    .expect("quota");
    std::fs::write(d.join(CONTAINER_RECORD), r#"{"id": "old"}"#).expect("record");
    assert_eq!(holder("new", "team-d").as_deref(), Some("container old"));
    // The lock: made root's, 0600, in the root; held until dropped.
    let l = lock_root(&t).expect("lock");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(t.join(LOCK_FILE))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
    let other = std::fs::File::open(t.join(LOCK_FILE)).expect("open");
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we hold.
    let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, -1, "a second lock while the first is held");
    drop(l);
    // SAFETY: as above.
    let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "free once dropped");
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_claim_gives_its_quota_file_and_segment_directory() {
    let t = std::env::temp_dir().join(format!("cuslice-oci-claim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&t);
    let claim = t.join("claims").join("uid-1");
    std::fs::create_dir_all(claim.join("segment")).expect("mkdir");
    let q = "tenant = \"team-a/train\"\n[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\nmemory = 1073741824\ncompute = 30\n";
    std::fs::write(claim.join("quota.toml"), q).expect("write");
    let (text, path) = claim_quota(&t, "uid-1").expect("read");
    assert_eq!((text.as_str(), path), (q, claim.join("quota.toml")));
    let a = HookArgs {
        root: t.clone(),
        lib: PathBuf::from(DEFAULT_LIB),
        claim: Some("uid-1".into()),
    };
    let b = binds(&a, "ctr");
    // The container's copy, in its quota directory (mounted whole).
    assert_eq!(
        (b[0].src.as_path(), b[0].dst, b[0].kind, b[0].ro),
        (
            t.join("containers/ctr/etc").as_path(),
            "/etc/cuslice",
            Kind::Dir,
            true
        )
    );
    assert_eq!(
        (b[1].src.as_path(), b[1].dst),
        (claim.join("segment").as_path(), "/run/cuslice/segment")
    );
    // Not a plain name, missing, a link, no limit, invalid: refused.
    for bad in ["../x", "", ".x", "a/b"] {
        let e = claim_quota(&t, bad).expect_err("not a name");
        assert!(
            e.starts_with("claim ") && e.ends_with("is not a plain name"),
            "{e}"
        );
    }
    let e = claim_quota(&t, "uid-2").expect_err("missing");
    assert!(e.contains("claims/uid-2: cannot open the directory"), "{e}");
    std::fs::create_dir_all(t.join("claims/uid-3")).expect("mkdir");
    std::os::unix::fs::symlink(claim.join("quota.toml"), t.join("claims/uid-3/quota.toml"))
        .expect("link");
    let e = claim_quota(&t, "uid-3").expect_err("a link");
    assert!(e.contains("uid-3/quota.toml: cannot open the file"), "{e}");
    std::fs::create_dir_all(t.join("claims/uid-4")).expect("mkdir");
    std::fs::write(t.join("claims/uid-4/quota.toml"), "tenant = \"x\"\n").expect("write");
    let e = claim_quota(&t, "uid-4").expect_err("unlimited");
    assert!(
        e.ends_with("no limit in it: refusing to give the claim's container an unlimited GPU"),
        "{e}"
    );
    std::fs::write(t.join("claims/uid-4/quota.toml"), "[all]\ncompute = 130\n").expect("write");
    let e = claim_quota(&t, "uid-4").expect_err("invalid");
    assert!(e.contains("uid-4/quota.toml: all.compute: "), "{e}");
    let _ = std::fs::remove_dir_all(&t);
}

/// The bind mounts' sources under `--root` are opened from the root
/// through the host file layer: a link anywhere below the root (not
/// only as the last component) is refused, never followed; and a
/// container's directory is removed without following what its tenant
/// left in its segment directory.
#[test]
fn mount_sources_below_the_root_are_opened_without_following_a_link() {
    let t = std::env::temp_dir().join(format!("cuslice-oci-sources-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&t);
    let root = t.join("root");
    std::fs::create_dir_all(root.join("containers/ctr/segment")).expect("mkdir");
    std::fs::create_dir_all(root.join("containers/ctr/etc")).expect("mkdir");
    std::fs::create_dir_all(root.join("gpu")).expect("mkdir");
    std::fs::write(root.join("containers/ctr/etc/quota.toml"), "x").expect("write");
    std::fs::write(root.join("ld.so.preload"), "x").expect("write");
    let a = HookArgs {
        root: root.clone(),
        lib: PathBuf::from(DEFAULT_LIB),
        claim: None,
    };
    let b = binds(&a, "ctr");
    for i in [0, 1, 2, 4] {
        open_source(&b[i], &root).unwrap_or_else(|e| panic!("{}: {e}", b[i].dst));
    }
    // `containers` a link to a tree of the same shape elsewhere.
    let elsewhere = t.join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("ctr/segment")).expect("mkdir");
    std::fs::create_dir_all(elsewhere.join("ctr/etc")).expect("mkdir");
    std::fs::write(elsewhere.join("ctr/etc/quota.toml"), "y").expect("write");
    std::fs::rename(root.join("containers"), t.join("moved")).expect("mv");
    std::os::unix::fs::symlink(&elsewhere, root.join("containers")).expect("link");
    let e = open_source(&b[0], &root).expect_err("a link on the way");
    assert_eq!(
        e,
        format!(
            "host path {}: expected a directory, got a symlink",
            root.join("containers").display()
        )
    );
    assert!(open_source(&b[1], &root).is_err());
    std::fs::remove_file(root.join("containers")).expect("rm");
    std::fs::rename(t.join("moved"), root.join("containers")).expect("mv");
    // The last component a link: described, refused.
    std::fs::remove_dir(root.join("gpu")).expect("rmdir");
    std::os::unix::fs::symlink(&elsewhere, root.join("gpu")).expect("link");
    let e = open_source(&b[2], &root).expect_err("a link");
    assert_eq!(
        e,
        format!(
            "host path {} is a symlink, expected a directory",
            root.join("gpu").display()
        )
    );
    // What the container left in its segment directory goes with it;
    // what its links point to stays.
    std::os::unix::fs::symlink(&elsewhere, root.join("containers/ctr/segment/out")).expect("link");
    remove_container(&Layout::new(&root), "ctr").expect("removed");
    assert!(!root.join("containers/ctr").exists());
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("ctr/etc/quota.toml")).expect("kept"),
        "y"
    );
    remove_container(&Layout::new(&root), "ctr").expect("again: nothing to do");
    remove_container(&Layout::new(t.join("nowhere")), "ctr").expect("no root");
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn containers_that_would_not_be_host_root_are_refused() {
    let linux =
        |v: serde_json::Value| -> SpecLinux { serde_json::from_value(v).expect("linux section") };
    let plain = linux(serde_json::json!({"namespaces": [{"type": "pid"}, {"type": "mount"}]}));
    assert_eq!(check_user_namespaces(None, &plain), Ok(()));
    assert_eq!(check_user_namespaces(None, &SpecLinux::default()), Ok(()));
    let e = check_user_namespaces(Some("1001".into()), &plain).expect_err("rootless");
    assert!(
            e.starts_with("the runtime is rootless (this hook runs in a user namespace, as host uid 1001): cuslice needs a rootful runtime"),
            "{e}"
        );
    let userns = linux(serde_json::json!({
        "namespaces": [{"type": "user"}],
        "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
    }));
    let e = check_user_namespaces(None, &userns).expect_err("userns");
    assert!(
        e.starts_with("the container has its own user namespace (its uid 0 is host uid 100000): "),
        "{e}"
    );
    assert!(!e.contains('\n'));
    // This process runs outside any user namespace (the tests run as
    // the host's root or a plain user, not in a container's).
    if std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
    {
        assert_eq!(own_user_namespace(), None);
    }
}

#[test]
fn the_container_record_takes_what_runtimes_annotate() {
    let args = vec!["python3".to_string(), "train.py".to_string()];
    let m = container_meta("abc", &ann(&[("cuslice.io/memory", "1g")]), &args);
    assert_eq!(
        m,
        ContainerMeta {
            id: "abc".into(),
            command: args.clone(),
            ..ContainerMeta::default()
        }
    );
    let m = container_meta(
        "abc",
        &ann(&[
            ("io.kubernetes.cri.container-name", "trainer"),
            ("io.kubernetes.cri.sandbox-namespace", "team-a"),
            ("io.kubernetes.cri.sandbox-name", "train-0"),
            (
                "io.kubernetes.cri.image-name",
                "docker.io/pytorch/pytorch:2.3",
            ),
        ]),
        &args,
    );
    assert_eq!(m.name.as_deref(), Some("trainer"));
    assert_eq!(m.pod.as_deref(), Some("team-a/train-0"));
    assert_eq!(m.image.as_deref(), Some("docker.io/pytorch/pytorch:2.3"));
    // CRI-O's names.
    let m = container_meta(
        "abc",
        &ann(&[
            ("io.kubernetes.container.name", "svc"),
            ("io.kubernetes.pod.namespace", "default"),
            ("io.kubernetes.pod.name", "svc-7"),
            ("io.kubernetes.cri-o.ImageName", "vllm/vllm-openai:latest"),
        ]),
        &[],
    );
    assert_eq!(
        (m.name.as_deref(), m.pod.as_deref(), m.image.as_deref()),
        (
            Some("svc"),
            Some("default/svc-7"),
            Some("vllm/vllm-openai:latest")
        )
    );
    // What is absent is left out of the file.
    let text = serde_json::to_string(&container_meta("x", &ann(&[]), &[])).expect("json");
    assert_eq!(text, r#"{"id":"x"}"#);
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
            ("cuslice.io/latency", "maybe"),
            "annotation cuslice.io/latency=\"maybe\": expected 1, true, yes, on or 0, false, no, off",
        ),
        (
            ("cuslice.io/latency", "true"),
            "annotation cuslice.io/latency: only applies with cuslice.io/compute or cuslice.io/compute-max",
        ),
        (
            ("cuslice.io/compute-burst-ms", "300"),
            "annotation cuslice.io/compute-burst-ms=\"300\": only applies with cuslice.io/compute-max",
        ),
        (
            ("cuslice.io/memory-max", "3GiB"),
            "annotation cuslice.io/memory-max=\"3GiB\": only applies with cuslice.io/memory",
        ),
        (
            ("cuslice.io/memory-wait", "30s"),
            "annotation cuslice.io/memory-wait=\"30s\": only applies with cuslice.io/memory",
        ),
    ] {
        let e = quota_from_annotations("x", &ann(&[kv])).expect_err("must fail");
        assert!(e.starts_with(want), "{e}");
    }
    assert!(check_id("../etc").is_err());
}
