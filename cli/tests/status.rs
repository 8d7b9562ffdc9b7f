//! `cuslice status --json`, the exporter and `top`, against segments with
//! known contents written through cuslice-core (as the shim would), and the
//! fake NVML (tests/fake) for the GPU header.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuslice_core::config::format_uuid;
use cuslice_core::gpu::{Acquire, GpuSegment};
use cuslice_core::segment::{Admit, Segment};

const SLICE: u64 = 20_000_000;
const GIB: u64 = 1 << 30;

struct Fixture {
    dir: PathBuf,
    gpu_uuid: String,
    _gpu: GpuSegment,
    _mem: Option<Segment>,
}

/// The fake's GPU 0 with tenants alpha (30 %, 1.5 s used) and beta (20 %,
/// ceiling 50 %, no process), and container c1 of tenant alpha, whose live
/// process holds 1 GiB of a 4 GiB quota.
fn fixture(name: &str) -> Fixture {
    let dir = std::env::temp_dir().join(format!("cuslice-status-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let gpu_uuid = format_uuid(&common::FAKE_UUID);
    let gpu = GpuSegment::open_or_create(&dir.join("gpu").join(format!("{gpu_uuid}.seg")))
        .expect("gpu seg");
    let now = cuslice_core::gpu::monotonic_ns();
    let (a, _) = gpu
        .register_tenant("alpha", 30, 100, 0, now)
        .expect("alpha");
    gpu.register_tenant("beta", 20, 50, 0, now).expect("beta");
    let p = gpu.claim_proc(a, 4242).expect("proc");
    gpu.begin_wait(p, a, now);
    assert!(matches!(
        gpu.try_acquire(p, a, now, SLICE),
        Acquire::Granted { .. }
    ));
    gpu.end_wait(p, a);
    gpu.release(p, a, now + 1_500_000_000);
    // Container c1, as the OCI hook lays it out: its quota file names
    // tenant alpha, container.json what it runs, segment/ its memory.
    let c1 = dir.join("containers").join("c1");
    std::fs::create_dir_all(&c1).expect("mkdir");
    std::fs::write(c1.join("quota.toml"), "tenant = \"alpha\"\n").expect("quota");
    std::fs::write(
        c1.join("container.json"),
        r#"{"id":"c1","name":"trainer","image":"pytorch/pytorch:2.3","command":["python3","train.py"]}"#,
    )
    .expect("container.json");
    let mem = Segment::open_or_create(&c1.join("segment").join("memory.seg")).expect("mem seg");
    let d = mem
        .register_device(&common::FAKE_UUID, 4 * GIB)
        .expect("dev")
        .0;
    let slot = mem.claim_slot(4242).expect("slot");
    assert_eq!(mem.admit(d, slot, GIB), Admit::Granted);
    Fixture {
        dir,
        gpu_uuid,
        _gpu: gpu,
        _mem: Some(mem),
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cuslice ARGS --gpu-dir ... --containers-root ...` on the fixture, with
/// the fake NVML (its GPU 0 is the fixture's GPU).
fn cuslice(f: &Fixture, args: &[&str]) -> Command {
    let e = common::env();
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuslice"));
    c.args(args)
        .arg("--gpu-dir")
        .arg(f.dir.join("gpu"))
        .arg("--containers-root")
        .arg(f.dir.join("containers"))
        .env("CUSLICE_REAL_NVML", e.fake.join("libnvidia-ml.so.1"))
        .env("FAKE_CUDA_STATE", f.dir.join("fake.state"))
        // Hermetic: the host's own segments (a `cuslice run` session's in
        // its runtime directory, /dev/shm/cuslice) are not this test's.
        .env("XDG_RUNTIME_DIR", f.dir.join("xdg"))
        .env("CUSLICE_SEGMENT_DIR", f.dir.join("local"));
    c
}

fn status_json(f: &Fixture) -> (serde_json::Value, i32) {
    let out = cuslice(f, &["status", "--json", "--interval", "0.1"])
        .output()
        .expect("status");
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (v, out.status.code().unwrap_or(-1))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string()
}

#[test]
fn status_json_reports_what_the_segments_hold() {
    let mut f = fixture("json");
    let (v, code) = status_json(&f);
    assert_eq!(code, 0, "{v}");
    let g = &v["gpus"][0];
    assert_eq!(g["uuid"], f.gpu_uuid.as_str());
    let t = &g["tenants"];
    assert_eq!(t[0]["name"], "alpha");
    assert_eq!(t[0]["share_percent"], 30);
    assert!(t[0]["ceiling_percent"].is_null());
    assert_eq!(t[0]["gpu_time_seconds"], 1.5);
    assert_eq!(t[0]["processes"], 1);
    assert_eq!(t[1]["name"], "beta");
    assert_eq!(t[1]["ceiling_percent"], 50);
    assert_eq!(t[1]["gpu_time_seconds"], 0.0);
    // What NVML says of the GPU, and what the container is.
    assert_eq!(g["index"], 0);
    assert_eq!(g["name"], "cuslice Fake GPU");
    assert_eq!(g["memory_total_bytes"], 16 * GIB);
    assert!(g["utilization_percent"].is_u64(), "{g}");
    assert!(v["nvml_error"].is_null(), "{v}");
    assert!(
        v["interval_seconds"].as_f64().is_some_and(|s| s >= 0.1),
        "{v}"
    );
    assert_eq!(t[0]["live"], true);
    assert_eq!(t[0]["pids"], serde_json::json!([4242]));
    assert_eq!(t[0]["memory_used_bytes"], GIB);
    assert_eq!(t[0]["memory_limit_bytes"], 4 * GIB);
    assert_eq!(t[0]["runs"], "trainer pytorch/pytorch:2.3");
    assert_eq!(
        t[0]["container"]["command"],
        serde_json::json!(["python3", "train.py"])
    );
    assert_eq!(t[0]["class"], "standard");
    assert_eq!(t[0]["gpu_percent"], 0.0);
    assert_eq!(t[0]["throttled_percent"], 0.0);
    assert!(t[0]["ended_seconds_ago"].is_null());
    // beta never had a process: listed as ended, for its linger time.
    assert_eq!(t[1]["live"], false);
    assert_eq!(t[1]["processes"], 0);
    assert!(
        t[1]["ended_seconds_ago"].as_f64().is_some_and(|s| s < 60.0),
        "{t}"
    );
    let c = &v["containers"][0];
    assert_eq!(c["tenant"], "alpha");
    assert_eq!(c["devices"][0]["uuid"], f.gpu_uuid.as_str());
    assert_eq!(c["devices"][0]["limit_bytes"], 4 * GIB);
    assert_eq!(c["devices"][0]["used_bytes"], GIB);
    let p = &c["processes"][0];
    assert_eq!(
        (p["pid"].as_u64(), p["alive"].as_bool()),
        (Some(4242), Some(true))
    );
    assert_eq!(p["used_bytes"][f.gpu_uuid.as_str()], GIB);
    // The process dies (its segment fd closes): status says so.
    f._mem = None;
    let (v, _) = status_json(&f);
    assert_eq!(v["containers"][0]["processes"][0]["alive"], false);
}

/// Two containers given one tenant name (quota files written by hand: the
/// hook refuses the second) are two slices: two entries of the GPU
/// segment, each shown as a row of its own with its own share and its own
/// container's memory, never merged by name.
#[test]
fn one_tenant_name_in_two_slices_is_two_rows() {
    let dir = std::env::temp_dir().join(format!("cuslice-status-{}-slices", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let gpu_uuid = format_uuid(&common::FAKE_UUID);
    let gpu = GpuSegment::open_or_create(&dir.join("gpu").join(format!("{gpu_uuid}.seg")))
        .expect("gpu seg");
    let now = cuslice_core::gpu::monotonic_ns();
    let mut mems = vec![];
    for (id, share, quota) in [("c-a", 30, 4 * GIB), ("c-b", 20, 2 * GIB)] {
        let d = dir.join("containers").join(id);
        std::fs::create_dir_all(&d).expect("mkdir");
        let text = format!("tenant = \"same\"\nslice = \"ctr-{id}\"\n[all]\ncompute = {share}\n");
        std::fs::write(d.join("quota.toml"), &text).expect("quota");
        std::fs::write(
            d.join("container.json"),
            format!(r#"{{"id":"{id}","name":"{id}"}}"#),
        )
        .expect("container.json");
        let tag = cuslice_core::config::parse_file(&d.join("quota.toml"), &text)
            .expect("quota")
            .slice_tag();
        let spec = cuslice_core::gpu::TenantSpec {
            share,
            max: 100,
            burst_ns: 0,
            latency: false,
        };
        gpu.register("same", tag, spec, now).expect("tenant");
        let mem = Segment::open_or_create(&d.join("segment").join("memory.seg")).expect("mem");
        mem.register_device(&common::FAKE_UUID, quota).expect("dev");
        mems.push(mem);
    }
    let f = Fixture {
        dir,
        gpu_uuid,
        _gpu: gpu,
        _mem: None,
    };
    let (v, code) = status_json(&f);
    assert_eq!(code, 0, "{v}");
    let rows: Vec<(String, u64, u64, String)> = v["gpus"][0]["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or_default().to_string(),
                t["share_percent"].as_u64().unwrap_or(0),
                t["memory_limit_bytes"].as_u64().unwrap_or(0),
                t["container"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let mut rows = rows;
    rows.sort();
    assert_eq!(
        rows,
        [
            ("same".to_string(), 20, 2 * GIB, "c-b".to_string()),
            ("same".to_string(), 30, 4 * GIB, "c-a".to_string()),
        ],
        "{v}"
    );
}

#[test]
fn a_fifo_beside_a_planted_segment_does_not_hang_status() {
    // Any user can make a run directory in /tmp, or /dev/shm/cuslice, with
    // a valid segment and a FIFO where status looks for its quota file and
    // container record: status reads them without blocking.
    let f = fixture("fifo");
    let run = f.dir.join("xdg").join("cuslice-run-1-0123456789abcdef");
    drop(Segment::open_or_create(&run.join("segment").join("memory.seg")).expect("run seg"));
    drop(Segment::open_or_create(&f.dir.join("local").join("memory.seg")).expect("local seg"));
    for fifo in [
        run.join("quota.toml"),
        run.join("container.json"),
        f.dir.join("quota.toml"),
    ] {
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "{fifo:?}");
    }
    let mut child = cuslice(&f, &["status", "--json", "--interval", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("status");
    let t = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("status hung on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let segments: Vec<&str> = v["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["segment"].as_str())
        .collect();
    assert!(
        segments
            .iter()
            .any(|s| s.contains("cuslice-run-1-0123456789abcdef")),
        "{v}"
    );
}

/// A slice's directory as a user could plant one: a valid memory segment
/// (one device, a 1 GiB quota) and a quota file naming `tenant`, in `dir`.
fn planted_slice(dir: &std::path::Path, tenant: &str) {
    let mem = Segment::open_or_create(&dir.join("segment").join("memory.seg")).expect("seg");
    mem.register_device(&common::FAKE_UUID, GIB).expect("dev");
    std::fs::write(dir.join("quota.toml"), format!("tenant = \"{tenant}\"\n")).expect("quota");
}

/// Every memory segment status shows (its path) and every tenant its
/// quota files name, and its errors, from `status --json`.
fn segments_and_tenants(f: &Fixture) -> (Vec<String>, Vec<String>, serde_json::Value, i32) {
    let (v, code) = status_json(f);
    let rows = v["containers"].as_array().cloned().unwrap_or_default();
    let seg = rows
        .iter()
        .filter_map(|c| c["segment"].as_str().map(str::to_string))
        .collect();
    let tenants = rows
        .iter()
        .filter_map(|c| c["tenant"].as_str().map(str::to_string))
        .collect();
    (seg, tenants, v, code)
}

#[test]
fn a_link_planted_as_a_run_directory_is_not_followed_by_status() {
    // Any user of /tmp can make `cuslice-run-<pid>-<random>` a link to a
    // directory of someone else's (root's own, holding a segment and a
    // quota file): status, as root, lists the run directories but follows
    // no link below their base, as `cuslice watch` follows none.
    let f = fixture("run-link");
    let elsewhere = f.dir.join("elsewhere");
    planted_slice(&elsewhere, "not-a-session");
    std::fs::create_dir_all(f.dir.join("xdg")).expect("mkdir");
    std::os::unix::fs::symlink(
        &elsewhere,
        f.dir.join("xdg").join("cuslice-run-7-0123456789abcdef"),
    )
    .expect("link");
    let (seg, tenants, v, code) = segments_and_tenants(&f);
    assert_eq!(code, 0, "{v}");
    assert!(
        !seg.iter().any(|s| s.contains("cuslice-run-7")),
        "followed a run directory that is a link: {v}"
    );
    assert!(!tenants.iter().any(|t| t == "not-a-session"), "{v}");
    // The fixture's own container is still there.
    assert!(tenants.iter().any(|t| t == "alpha"), "{v}");
}

#[test]
fn links_planted_below_the_places_status_lists_are_not_followed() {
    // Below each place status lists (the containers root, the claims
    // directory beside it, the run directories' base), a directory or
    // segment that is a link is not followed: not read, not listed, no
    // error. Before the host file layer, status followed each of them
    // (and reported a segment that is a link as an error).
    let f = fixture("links");
    let uid = "0b5f3c1e-7a2d-4e9f-8c6b-2d4e6f8a0b1c";
    // A claim's directory that is a link.
    planted_slice(&f.dir.join("elsewhere-claim"), "linked-claim");
    std::fs::create_dir_all(f.dir.join("claims")).expect("mkdir");
    std::os::unix::fs::symlink(
        f.dir.join("elsewhere-claim"),
        f.dir.join("claims").join(uid),
    )
    .expect("link");
    // A container's directory that is a link.
    planted_slice(&f.dir.join("elsewhere-ctr"), "linked-container");
    std::os::unix::fs::symlink(
        f.dir.join("elsewhere-ctr"),
        f.dir.join("containers").join("c2"),
    )
    .expect("link");
    // A run directory whose segment directory is a link.
    planted_slice(&f.dir.join("elsewhere-seg"), "linked-segment-dir");
    let run = f.dir.join("xdg").join("cuslice-run-8-0123456789abcdef");
    std::fs::create_dir_all(&run).expect("mkdir");
    std::fs::write(run.join("quota.toml"), "tenant = \"run-8\"\n").expect("quota");
    std::os::unix::fs::symlink(
        f.dir.join("elsewhere-seg").join("segment"),
        run.join("segment"),
    )
    .expect("link");
    // A run directory whose segment is a link to a valid segment.
    let run9 = f.dir.join("xdg").join("cuslice-run-9-0123456789abcdef");
    std::fs::create_dir_all(run9.join("segment")).expect("mkdir");
    std::os::unix::fs::symlink(
        f.dir
            .join("elsewhere-seg")
            .join("segment")
            .join("memory.seg"),
        run9.join("segment").join("memory.seg"),
    )
    .expect("link");
    let (seg, tenants, v, code) = segments_and_tenants(&f);
    assert_eq!(code, 0, "{v}");
    for planted in [uid, "containers/c2", "cuslice-run-8", "cuslice-run-9"] {
        assert!(
            !seg.iter().any(|s| s.contains(planted)),
            "followed {planted}: {v}"
        );
    }
    for t in ["linked-claim", "linked-container", "linked-segment-dir"] {
        assert!(!tenants.iter().any(|x| x == t), "read {t}: {v}");
    }
    assert!(tenants.iter().any(|t| t == "alpha"), "{v}");
    assert!(
        v["errors"].as_array().is_some_and(Vec::is_empty),
        "a link is no error: {v}"
    );
}

#[test]
fn a_quota_file_or_record_linked_elsewhere_or_to_dev_zero_is_not_read_by_status() {
    // Beside a segment in a run directory (any user's), a quota file that
    // is a link to a root-only file and a container record that is a link
    // to /dev/zero; in a claim's directory, a record that is a FIFO and a
    // quota file linked to /dev/zero: status reads none of them, never
    // blocks and never reads without end; the segment is still shown, by
    // the name the shim derives from its directory.
    let f = fixture("linked-files");
    let secret = f.dir.join("secret.toml");
    std::fs::write(&secret, "tenant = \"secret\"\n").expect("write");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let run = f.dir.join("xdg").join("cuslice-run-5-0123456789abcdef");
    planted_slice(&run, "unused");
    std::fs::remove_file(run.join("quota.toml")).expect("rm");
    std::os::unix::fs::symlink(&secret, run.join("quota.toml")).expect("link");
    std::os::unix::fs::symlink("/dev/zero", run.join("container.json")).expect("link");
    let uid = "1c6a4d2f-8b3e-4f0a-9d7c-3e5f7a9b1c2d";
    let claim = f.dir.join("claims").join(uid);
    planted_slice(&claim, "unused");
    std::fs::remove_file(claim.join("quota.toml")).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", claim.join("quota.toml")).expect("link");
    let fifo = std::ffi::CString::new(claim.join("claim.json").as_os_str().as_encoded_bytes())
        .expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let mut child = cuslice(&f, &["status", "--json", "--interval", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("status");
    let t = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("status hung on a FIFO or /dev/zero");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = v["containers"].as_array().expect("containers");
    let row = |name: &str| {
        rows.iter()
            .find(|c| c["segment"].as_str().is_some_and(|s| s.contains(name)))
            .unwrap_or_else(|| panic!("no row for {name}: {v}"))
    };
    for (name, dir) in [("cuslice-run-5", &run), (uid, &claim)] {
        let r = row(name);
        // The shim's name for a segment without a quota file: from its
        // directory.
        assert_eq!(
            r["tenant"].as_str(),
            Some(cuslice_core::config::default_tenant(&dir.join("segment")).as_str()),
            "{v}"
        );
        assert!(r["container"].is_null(), "{v}");
    }
    assert!(
        !rows.iter().any(|c| c["tenant"] == "secret"),
        "read through a link: {v}"
    );
}

#[test]
fn a_corrupt_segment_is_reported_and_the_rest_still_shown() {
    let f = fixture("corrupt");
    std::fs::write(f.dir.join("gpu").join("GPU-bad.seg"), b"not a segment").expect("write");
    let (v, code) = status_json(&f);
    assert_eq!(code, 1);
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(1));
    let err = v["errors"][0].as_str().unwrap_or_default();
    assert!(
        err.contains("GPU-bad.seg") && err.contains("not a cuslice GPU segment"),
        "{err}"
    );
    // The human table too.
    let out = cuslice(&f, &["status"]).output().expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("alpha") && text.contains("1.00 GiB / 4.00 GiB"),
        "{text}"
    );
    assert!(
        text.contains("error: ") && text.contains("GPU-bad.seg"),
        "{text}"
    );
}

/// The exporter's answer to one scrape of /metrics.
fn scrape(f: &Fixture) -> String {
    let mut child = cuslice(f, &["exporter", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("exporter");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("line");
    let addr = first
        .trim()
        .trim_start_matches("cuslice exporter listening on http://")
        .trim_end_matches("/metrics");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    let _ = child.kill();
    let _ = child.wait();
    body
}

#[test]
fn exporter_serves_the_same_figures() {
    let f = fixture("exporter");
    let body = scrape(&f);
    // DCGM's labels: NVML's index, the UUID, the model and the host.
    let gpu = format!(
        "gpu=\"0\",UUID=\"{}\",modelName=\"cuslice Fake GPU\",Hostname=\"{}\"",
        f.gpu_uuid,
        hostname()
    );
    for want in [
        format!("cuslice_memory_used_bytes{{{gpu},tenant=\"alpha\"}} 1073741824"),
        format!("cuslice_memory_limit_bytes{{{gpu},tenant=\"alpha\"}} 4294967296"),
        format!(
            "cuslice_process_memory_used_bytes{{{gpu},tenant=\"alpha\",pid=\"4242\"}} 1073741824"
        ),
        format!("cuslice_compute_used_seconds_total{{{gpu},tenant=\"alpha\"}} 1.5"),
        // Nothing of it was an upper bound: what its kernels ran is what
        // it was charged.
        format!("cuslice_compute_gpu_seconds_total{{{gpu},tenant=\"alpha\"}} 1.5"),
        format!("cuslice_compute_share_percent{{{gpu},tenant=\"beta\"}} 20"),
        format!("cuslice_compute_ceiling_percent{{{gpu},tenant=\"beta\"}} 50"),
        format!("cuslice_tenant_live{{{gpu},tenant=\"alpha\"}} 1"),
        format!("cuslice_tenant_live{{{gpu},tenant=\"beta\"}} 0"),
        format!(
            "cuslice_tenant_info{{{gpu},tenant=\"alpha\",runs=\"trainer pytorch/pytorch:2.3\",container=\"trainer\",pod=\"\",namespace=\"\",image=\"pytorch/pytorch:2.3\"}} 1"
        ),
        format!("cuslice_gpu_memory_total_bytes{{{gpu}}} 17179869184"),
        format!("cuslice_gpu_lease_handovers_total{{{gpu}}} 1"),
    ] {
        assert!(body.contains(&want), "missing {want} in:\n{body}");
    }
    assert!(body.contains("cuslice_gpu_utilization_percent{"), "{body}");
    assert!(body.contains("application/openmetrics-text"), "{body}");
}

#[test]
fn a_dra_claim_is_shown_and_exported_by_its_namespace_and_name() {
    // The DRA plugin's layout: <root>/claims/<uid>/quota.toml (tenant =
    // "<namespace>/<name>") and the claim's memory segment in segment/,
    // beside the hook's containers/ (issue #20: claims in status and the
    // exporter).
    let f = fixture("claim");
    let uid = "0b5f3c1e-7a2d-4e9f-8c6b-2d4e6f8a0b1c";
    let claim = f.dir.join("claims").join(uid);
    std::fs::create_dir_all(&claim).expect("mkdir");
    std::fs::write(claim.join("quota.toml"), "tenant = \"team-a/trainer\"\n").expect("quota");
    // The plugin's record: the pods the claim is reserved for.
    std::fs::write(
        claim.join("claim.json"),
        format!(
            r#"{{"namespace":"team-a","name":"trainer","uid":"{uid}","pods":["team-a/trainer-0"]}}"#
        ),
    )
    .expect("record");
    let mem = Segment::open_or_create(&claim.join("segment").join("memory.seg")).expect("mem");
    let d = mem
        .register_device(&common::FAKE_UUID, 8 * GIB)
        .expect("dev")
        .0;
    let slot = mem.claim_slot(5151).expect("slot");
    assert_eq!(mem.admit(d, slot, 2 * GIB), Admit::Granted);
    let (v, code) = status_json(&f);
    assert_eq!(code, 0, "{v}");
    let tenants = v["gpus"][0]["tenants"].as_array().expect("tenants");
    let t = tenants
        .iter()
        .find(|t| t["name"] == "team-a/trainer")
        .unwrap_or_else(|| panic!("no row for the claim: {v}"));
    assert_eq!(t["runs"], "pod team-a/trainer-0 (DRA claim 0b5f3c1e-7a2)");
    assert_eq!(t["memory_used_bytes"], 2 * GIB);
    assert_eq!(t["memory_limit_bytes"], 8 * GIB);
    assert_eq!(t["pids"], serde_json::json!([5151]));
    let body = scrape(&f);
    let want = format!(
        "cuslice_memory_limit_bytes{{gpu=\"0\",UUID=\"{}\",modelName=\"cuslice Fake GPU\",Hostname=\"{}\",tenant=\"team-a/trainer\"}} 8589934592",
        f.gpu_uuid,
        hostname()
    );
    assert!(body.contains(&want), "missing {want} in:\n{body}");
    drop(mem);
}

/// Every metric name a PromQL expression mentions: the `cuslice_...` words.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = expr;
    while let Some(i) = rest.find("cuslice_") {
        let tail = &rest[i..];
        let n = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..n].to_string());
        rest = &tail[n..];
    }
    out
}

/// Every string value under the key `key`, anywhere in `v`.
fn strings_at(v: &serde_json::Value, key: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match x {
                    serde_json::Value::String(s) if k == key => out.push(s.clone()),
                    _ => strings_at(x, key, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings_at(x, key, out)),
        _ => {}
    }
}

#[test]
fn the_grafana_dashboard_asks_for_metrics_the_exporter_serves() {
    let path = common::env().root.join("docs/grafana-cuslice.json");
    let dash: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read the dashboard"))
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    let mut exprs = vec![];
    strings_at(&dash["panels"], "expr", &mut exprs);
    // The template variables' queries too (label_values(...)).
    let mut queries = vec![];
    strings_at(&dash["templating"], "query", &mut queries);
    let names: BTreeSet<String> = exprs
        .iter()
        .chain(&queries)
        .flat_map(|e| metric_names(e))
        .collect();
    // The names the exporter serves: every sample's name.
    let f = fixture("grafana");
    let body = scrape(&f);
    let served: BTreeSet<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && l.starts_with("cuslice_"))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for n in &names {
        assert!(
            served.contains(n.as_str()),
            "the dashboard asks for {n}, which the exporter does not serve; it serves {served:?}"
        );
    }
    // The panels the dashboard is for.
    for want in [
        "cuslice_compute_used_seconds_total",
        "cuslice_compute_gpu_seconds_total",
        "cuslice_compute_throttled_seconds_total",
        "cuslice_memory_used_bytes",
        "cuslice_memory_limit_bytes",
        "cuslice_compute_latency_class",
        "cuslice_compute_lease_mode",
        "cuslice_gpu_health",
    ] {
        assert!(names.contains(want), "no panel asks for {want}: {names:?}");
    }
    let panels = dash["panels"].as_array().map_or(0, Vec::len);
    assert!(panels >= 4, "{panels} panels");
}

/// Reads `child`'s stdout as it comes, into a shared buffer.
fn collect(child: &mut std::process::Child) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s, mut stdout) = (seen.clone(), child.stdout.take().expect("stdout"));
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            s.lock().expect("seen").extend_from_slice(&buf[..n]);
        }
    });
    (seen, reader)
}

#[test]
fn top_refreshes_with_the_share_over_the_interval() {
    let f = fixture("top");
    let mut child = cuslice(&f, &["top", "--interval", "0.2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("top");
    // Read as it comes, until two frames are whole: a frame ends where the
    // next one's clear-screen begins.
    let (seen, reader) = collect(&mut child);
    let text = || String::from_utf8_lossy(&seen.lock().expect("seen")).into_owned();
    // (The frame count is checked below, once top is stopped.)
    let _ = common::poll_until(Duration::from_secs(20), || {
        (text().matches("\x1b[2J").count() >= 3).then_some(())
    });
    let _ = child.kill();
    let _ = child.wait();
    reader.join().expect("reader");
    let out = text();
    let frames: Vec<&str> = out.split("\x1b[2J").filter(|f| !f.is_empty()).collect();
    assert!(frames.len() >= 2, "refreshes: {}\n{out}", frames.len());
    // From the second frame on, each tenant shows its share over the last
    // interval (nothing ran in between here: 0.0 %).
    fn alpha(frame: &str) -> Vec<&str> {
        frame
            .lines()
            .find(|l| l.trim_start().starts_with("alpha "))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no alpha row in:\n{frame}"))
    }
    // TENANT RUNS(2 words) MEMORY SHARE MAX CLASS MODE GPU% THR% PROCS
    let first = alpha(frames[0]);
    let second = alpha(frames[1]);
    assert_eq!(
        first[4..],
        ["30%", "-", "std", "lease", "-", "-", "1"],
        "{out}"
    );
    assert_eq!(
        second[4..],
        ["30%", "-", "std", "lease", "0.0", "0.0", "1"],
        "{out}"
    );
    assert_eq!(second[3], "1.0G/4.0G", "{out}");
    assert!(
        frames[1].contains("GPU%") && frames[1].contains("over 0.2s"),
        "{out}"
    );
}

#[test]
fn top_once_prints_one_frame_within_80_columns() {
    let f = fixture("once");
    let out = cuslice(&f, &["top", "--once", "--interval", "0.1"])
        .env("COLUMNS", "80")
        .output()
        .expect("top --once");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains('\x1b'),
        "no escape codes off a terminal:\n{text}"
    );
    assert_eq!(text.matches("cuslice top").count(), 1, "{text}");
    for l in text.lines() {
        assert!(l.chars().count() <= 80, "wider than 80 columns: {l:?}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("GPU 0  healthy  cuslice Fake GPU  mem 0B/16G  util ")),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("alpha "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("trainer pytorch") && row.contains("1.0G/4.0G"),
        "{row}"
    );
    let beta = text
        .lines()
        .find(|l| l.trim_start().starts_with("beta "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(beta.ends_with("ended"), "{beta}");
}

// Terminal and log injection (issue 18, hole 7): what a tenant writes
// (its container's command and annotations, the tenant name in the shared
// GPU segment) reaches `status`, `top` and the exporter escaped.

/// Window title (OSC 0 ... BEL), clear screen (CSI 2J), and a newline
/// followed by what looks like a row of the table.
const TITLE: &str = "\x1b]0;pwned\x07";
const CLEAR: &str = "\x1b[2J";

/// The fixture, with container c1's name and image and a second container
/// c2's command (tenant gamma, shown by its command: no name) written by a
/// hostile tenant, and a tenant entry of the GPU segment named by one.
/// Returns c2's memory segment, with a live process (4343) in it.
fn hostile(f: &Fixture) -> Segment {
    let meta = serde_json::json!({
        "id": "c1",
        "name": format!("trainer{TITLE}{CLEAR}\n  forged-name-row  x  80G/80G  100%  1"),
        "image": "img\"quoted\\back\u{202e}slash",
        "command": ["python3", "train.py"],
    });
    std::fs::write(f.dir.join("containers/c1/container.json"), meta.to_string())
        .expect("container.json");
    let c2 = f.dir.join("containers").join("c2");
    std::fs::create_dir_all(&c2).expect("mkdir");
    std::fs::write(c2.join("quota.toml"), "tenant = \"gamma\"\n").expect("quota");
    let meta = serde_json::json!({
        "id": "c2",
        "command": ["/bin/sh", format!("-c{TITLE}"), format!("{CLEAR}\r\n  forged-cmd-row  y")],
    });
    std::fs::write(c2.join("container.json"), meta.to_string()).expect("container.json");
    let mem = Segment::open_or_create(&c2.join("segment").join("memory.seg")).expect("mem seg");
    mem.register_device(&common::FAKE_UUID, GIB).expect("dev");
    mem.claim_slot(4343).expect("slot");
    let now = cuslice_core::gpu::monotonic_ns();
    f._gpu
        .register_tenant("evil\x1b[2J\n  forged-tenant-row", 10, 100, 0, now)
        .expect("hostile tenant");
    mem
}

/// `text` carries no terminal control (ESC, BEL, CR, C1, bidi), and no
/// line of it is one the tenant forged.
fn assert_no_injection(text: &str) {
    for bad in ['\x1b', '\x07', '\r', '\u{9b}', '\u{202e}'] {
        assert!(!text.contains(bad), "{bad:?} reached the output:\n{text}");
    }
    for l in text.lines() {
        assert!(
            !l.trim_start().starts_with("forged-"),
            "a forged line: {l:?} in:\n{text}"
        );
    }
}

#[test]
fn status_shows_what_tenants_wrote_escaped_on_one_line() {
    let f = fixture("inject");
    let _c2 = hostile(&f);
    let out = cuslice(&f, &["status"]).output().expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_no_injection(&text);
    // The escapes are there to see, each on the line of its tenant.
    let row = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{text}"))
    };
    assert!(
        row("trainer\\x1b]0;pwned\\x07\\x1b[2J\\n  forged-name-row").starts_with("  alpha "),
        "{text}"
    );
    assert!(
        row("sh -c\\x1b]0;pwned\\x07 \\x1b[2J\\r\\n  forged-cmd-row  y").starts_with("  gamma "),
        "{text}"
    );
    assert!(
        row("evil\\x1b[2J\\n  forged-tenant-row").starts_with("  evil"),
        "{text}"
    );
    assert!(text.contains("img\"quoted\\back\\u{202e}slash"), "{text}");
    // The details' line of each container too.
    assert!(
        row("(tenant alpha, container trainer\\x1b]0;pwned").starts_with("container segment "),
        "{text}"
    );
}

#[test]
fn status_json_carries_the_escaped_strings() {
    let f = fixture("inject-json");
    let _c2 = hostile(&f);
    let out = cuslice(&f, &["status", "--json"]).output().expect("status");
    let raw = String::from_utf8_lossy(&out.stdout);
    // serde escapes control characters in JSON, not bidi overrides; and
    // `jq -r` would print the strings raw: they are escaped before.
    assert!(!raw.contains('\u{202e}'), "{raw}");
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{e}: {raw}"));
    let tenants = v["gpus"][0]["tenants"].as_array().expect("tenants");
    let t = |name: &str| {
        tenants
            .iter()
            .find(|t| t["name"].as_str().is_some_and(|n| n.starts_with(name)))
            .unwrap_or_else(|| panic!("no tenant {name}: {v}"))
    };
    let name = "trainer\\x1b]0;pwned\\x07\\x1b[2J\\n  forged-name-row  x  80G/80G  100%  1";
    assert_eq!(t("alpha")["container"]["name"], name);
    assert_eq!(
        t("alpha")["runs"],
        format!("{name} img\"quoted\\back\\u{{202e}}slash")
    );
    assert_eq!(
        t("gamma")["container"]["command"],
        serde_json::json!([
            "/bin/sh",
            "-c\\x1b]0;pwned\\x07",
            "\\x1b[2J\\r\\n  forged-cmd-row  y"
        ])
    );
    assert_eq!(t("evil")["name"], "evil\\x1b[2J\\n  forged-tenant-row");
    let mut all = vec![];
    strings_in(&v, &mut all);
    for s in &all {
        assert!(
            !s.chars().any(char::is_control),
            "a control character in {s:?}"
        );
    }
}

/// Every string anywhere in `v`.
fn strings_in(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Object(m) => m.values().for_each(|x| strings_in(x, out)),
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings_in(x, out)),
        _ => {}
    }
}

#[test]
fn top_shows_what_tenants_wrote_escaped_on_one_line() {
    let f = fixture("inject-top");
    let _c2 = hostile(&f);
    let out = cuslice(&f, &["top", "--once", "--interval", "0.1"])
        .env("COLUMNS", "200")
        .output()
        .expect("top --once");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_no_injection(&text);
    assert!(
        text.lines()
            .any(|l| l.starts_with("  alpha ") && l.contains("trainer\\x1b]0;pwned\\x07")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("  evil\\x1b[2J\\n  forged-tenant-row")),
        "{text}"
    );
}

/// The label values of a sample line of the text exposition format, the
/// escapes undone (`\\`, `\"`, `\n`), in order; None if the line does not
/// parse as `name{label="value",...} number`.
fn labels(line: &str) -> Option<Vec<(String, String)>> {
    let (_, mut rest) = line.split_once('{')?;
    let mut out = vec![];
    loop {
        let (key, r) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    _ => return None,
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        rest = &r[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else {
            let value = rest.strip_prefix("} ")?;
            value.parse::<f64>().ok()?;
            return Some(out);
        }
    }
}

#[test]
fn exporter_label_values_are_escaped_and_forge_no_line() {
    let f = fixture("inject-exporter");
    let _c2 = hostile(&f);
    let body = scrape(&f);
    let (_, metrics) = body.split_once("\r\n\r\n").expect("an HTTP answer");
    for bad in ['\x1b', '\x07', '\r', '\u{202e}'] {
        assert!(!metrics.contains(bad), "{bad:?} in:\n{metrics}");
    }
    // Every line is a comment or a whole sample.
    for l in metrics.lines() {
        assert!(
            l.starts_with('#') || labels(l).is_some() && l.starts_with("cuslice_"),
            "not a sample: {l:?} in:\n{metrics}"
        );
    }
    let info = metrics
        .lines()
        .find(|l| l.starts_with("cuslice_tenant_info{") && l.contains("tenant=\"alpha\""))
        .unwrap_or_else(|| panic!("{metrics}"));
    let l = labels(info).unwrap_or_else(|| panic!("{info}"));
    let get = |k: &str| {
        l.iter()
            .find(|(x, _)| x == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {k} in {info}"))
    };
    // The value is the escaped text; `"` and `\` per the format.
    assert_eq!(get("image"), "img\"quoted\\back\\u{202e}slash");
    assert_eq!(
        get("container"),
        "trainer\\x1b]0;pwned\\x07\\x1b[2J\\n  forged-name-row  x  80G/80G  100%  1"
    );
    assert!(
        info.contains(r#"image="img\"quoted\\back\\u{202e}slash""#),
        "{info}"
    );
    assert!(
        metrics.contains(r#"tenant="evil\\x1b[2J\\n  forged-tenant-row""#),
        "{metrics}"
    );
}

/// `cuslice status --json` (or the table, `json` false) on `h`'s fake GPU
/// over `interval` seconds, the tenant's memory segment `mem` given, NVML
/// being `nvml` (the fake's, or a file that is not there).
fn status_on(
    h: &common::Host,
    mem: &std::path::Path,
    nvml: &std::path::Path,
    json: bool,
) -> String {
    status_over(h, mem, nvml, json, "1.5", &[])
}

/// `status_on` over `interval` seconds, with `env` added.
fn status_over(
    h: &common::Host,
    mem: &std::path::Path,
    nvml: &std::path::Path,
    json: bool,
    interval: &str,
    env: &[(&str, &str)],
) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuslice"));
    c.arg("status");
    if json {
        c.arg("--json");
    }
    c.envs(env.iter().copied());
    let out = c
        .args(["--interval", interval, "--gpu-dir"])
        .arg(h.gpu_dir())
        .arg("--memory-segment")
        .arg(mem)
        .env("CUSLICE_REAL_NVML", nvml)
        .env("FAKE_CUDA_STATE", h.fake_state())
        .env("XDG_RUNTIME_DIR", h.dir.join("xdg"))
        .env("CUSLICE_SEGMENT_DIR", h.dir.join("local"))
        .output()
        .expect("status");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The fake's launch-bound decode loop alone on `h`'s GPU for `seconds`
/// (tenant `decode`, `compute = 50` and a memory quota, so that it has a
/// memory segment), `env` added, once it registered and ran a moment.
fn decode_alone(
    h: &common::Host,
    seconds: &str,
    env: &[(&'static str, &str)],
) -> std::process::Child {
    let q = h.quota("decode", "", "compute = 50\nmemory = \"1GiB\"");
    let decode = h.spawn(
        "decode",
        Some(&q),
        &[seconds, "10000", "12", "4", "20000", "100000"],
        env,
    );
    common::wait_for(
        || "the decode loop never registered on the GPU".into(),
        Duration::from_secs(20),
        || (h.gpu_seg().exists() && h.mem_seg("decode").exists()).then_some(()),
    );
    std::thread::sleep(Duration::from_millis(500));
    decode
}

/// Tenant `name` of the first GPU of `status --json`'s output.
fn tenant_in(text: &str, name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["gpus"][0]["tenants"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no tenant {name}: {v}"))
}

/// Alone on a GPU, nothing measures what a process's kernels run, and a
/// launch-bound loop is charged its wall time in flight: the fake's decode
/// loop (48 kernels of 20 us per request, one every 10 ms: 9.6 % of the
/// time) is in flight ~40 % of it. Status showed that charge as its GPU %
/// (a decode server alone read 25-33 % for ~4 % of kernel time on an H100);
/// it now shows NVML's per-process time for that part, and where NVML is
/// not there, says the figure is an upper bound.
#[test]
fn status_shows_a_launch_bound_loop_alone_its_kernels_time_not_its_time_in_flight() {
    let e = common::env();
    let h = common::Host::new("status", "decode-alone");
    let mut decode = decode_alone(&h, "60", &[]);
    let fake_nvml = e.fake.join("libnvidia-ml.so.1");
    let no_nvml = h.dir.join("no-such-libnvidia-ml.so.1");
    let with = status_on(&h, &h.mem_seg("decode"), &fake_nvml, true);
    let without = status_on(&h, &h.mem_seg("decode"), &no_nvml, true);
    let table = status_on(&h, &h.mem_seg("decode"), &no_nvml, false);
    let _ = decode.kill();
    let _ = decode.wait();
    let f =
        |t: &serde_json::Value, k: &str| t[k].as_f64().unwrap_or_else(|| panic!("no {k} in {t}"));
    let t = tenant_in(&with, "decode");
    // Charged its time in flight, all of it an upper bound...
    assert!(f(&t, "charged_percent") >= 20.0, "{t}");
    assert!(
        f(&t, "unmeasured_percent") >= f(&t, "charged_percent") - 1.0,
        "{t}"
    );
    // ...shown as what its kernels ran, checked against NVML.
    assert!(
        (2.0..=9.6 + 5.0).contains(&f(&t, "gpu_percent")),
        "GPU % {} for kernels 9.6 % of the time: {t}",
        f(&t, "gpu_percent")
    );
    assert_eq!(f(&t, "unverified_percent"), 0.0, "{t}");
    // The counter whose rate is GPU % left the difference out.
    let interval =
        serde_json::from_str::<serde_json::Value>(&with).expect("json")["interval_seconds"]
            .as_f64()
            .expect("interval");
    let left_out = 100.0 * (f(&t, "gpu_time_seconds") - f(&t, "gpu_seconds")) / interval;
    let want = f(&t, "charged_percent") - f(&t, "gpu_percent");
    assert!(
        (left_out - want).abs() < 0.5,
        "left out {left_out:.2} %, want {want:.2} %: {t}"
    );
    // Without NVML: the charge, said to be an upper bound.
    let t = tenant_in(&without, "decode");
    assert!(f(&t, "gpu_percent") >= 20.0, "{t}");
    assert!(
        f(&t, "unverified_percent") >= f(&t, "gpu_percent") - 1.0,
        "{t}"
    );
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("decode "))
        .unwrap_or_else(|| panic!("no row of decode:\n{table}"));
    assert!(
        row.contains(" <"),
        "the upper bound is not marked:\n{table}"
    );
    assert!(
        table.contains("<: at most: wall time in flight that nothing measured"),
        "no legend:\n{table}"
    );
}

/// NVML keeps a bounded buffer of per-process samples (the fake: 32
/// periods): over a long interval (an exporter scraped every 30 s) its
/// start is gone, and counted as idle it would show a busy process a
/// fraction of what it ran. Where the oldest sample is seconds after the
/// previous reading, status scales what is there instead.
#[test]
fn status_over_an_interval_longer_than_nvmls_buffer_does_not_take_lost_samples_for_idle() {
    let e = common::env();
    let h = common::Host::new("status", "decode-long");
    // 50 ms periods: the fake keeps 1.6 s of samples.
    let sample = [("FAKE_NVML_SAMPLE_MS", "50")];
    let mut decode = decode_alone(&h, "60", &sample);
    let fake_nvml = e.fake.join("libnvidia-ml.so.1");
    let out = status_over(&h, &h.mem_seg("decode"), &fake_nvml, true, "7", &sample);
    // The same over 1.5 s, within the buffer, right after: what the loop
    // ran meanwhile (9.6 % of the time on an idle machine; a CPU-starved
    // loop falls behind its schedule and runs less).
    let short = status_over(&h, &h.mem_seg("decode"), &fake_nvml, true, "1.5", &sample);
    let _ = decode.kill();
    let _ = decode.wait();
    let t = tenant_in(&out, "decode");
    let gpu = t["gpu_percent"].as_f64().unwrap_or_else(|| panic!("{t}"));
    let s = tenant_in(&short, "decode");
    let within = s["gpu_percent"].as_f64().unwrap_or_else(|| panic!("{s}"));
    eprintln!("GPU % over 7 s: {gpu:.2}, over 1.5 s within the buffer: {within:.2}");
    // Lost periods taken for idle: 1.6 s of 7 counted, ~2 % (a quarter of
    // what the loop ran). Scaled: about what it ran, as over a short
    // interval.
    assert!(
        gpu <= 9.6 + 5.0 && (gpu >= 9.6 - 5.0 || gpu >= 0.6 * within),
        "GPU % {gpu} over 7 s, {within} over 1.5 s within NVML's buffer, for kernels 9.6 % of the time (idle machine): {t}\n{s}"
    );
}
