//! `cuslice status --json` and the exporter, against segments with known
//! contents written through cuslice-core (as the shim would).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// One GPU with tenants alpha (30 %, 1.5 s used) and beta (20 %, ceiling
/// 50 %), and one container whose live process holds 1 GiB of a 4 GiB quota.
fn fixture(name: &str) -> Fixture {
    let dir = std::env::temp_dir().join(format!("cuslice-status-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let gpu_uuid = "GPU-01010101-0101-0101-0101-010101010101".to_string();
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
    let mem = Segment::open_or_create(&dir.join("containers").join("c1").join("memory.seg"))
        .expect("mem seg");
    let d = mem.register_device(&[1; 16], 4 * GIB).expect("dev");
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

fn status_json(f: &Fixture) -> (serde_json::Value, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_cuslice"))
        .args(["status", "--json", "--gpu-dir"])
        .arg(f.dir.join("gpu"))
        .arg("--containers-root")
        .arg(f.dir.join("containers"))
        .output()
        .expect("status");
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (v, out.status.code().unwrap_or(-1))
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
    let c = &v["containers"][0];
    assert_eq!(
        c["devices"][0]["uuid"],
        "GPU-01010101-0101-0101-0101-010101010101"
    );
    assert_eq!(c["devices"][0]["limit_bytes"], 4 * GIB);
    assert_eq!(c["devices"][0]["used_bytes"], GIB);
    let p = &c["processes"][0];
    assert_eq!(
        (p["pid"].as_u64(), p["alive"].as_bool()),
        (Some(4242), Some(true))
    );
    assert_eq!(
        p["used_bytes"]["GPU-01010101-0101-0101-0101-010101010101"],
        GIB
    );
    // The process dies (its segment fd closes): status says so.
    f._mem = None;
    let (v, _) = status_json(&f);
    assert_eq!(v["containers"][0]["processes"][0]["alive"], false);
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
    let out = Command::new(env!("CARGO_BIN_EXE_cuslice"))
        .args(["status", "--gpu-dir"])
        .arg(f.dir.join("gpu"))
        .arg("--containers-root")
        .arg(f.dir.join("containers"))
        .output()
        .expect("status");
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

#[test]
fn exporter_serves_the_same_figures() {
    let f = fixture("exporter");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cuslice"))
        .args(["exporter", "--listen", "127.0.0.1:0", "--gpu-dir"])
        .arg(f.dir.join("gpu"))
        .arg("--containers-root")
        .arg(f.dir.join("containers"))
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
    let seg = f
        .dir
        .join("containers")
        .join("c1")
        .join("memory.seg")
        .display()
        .to_string();
    for want in [
        format!(
            "cuslice_memory_used_bytes{{gpu=\"GPU-01010101-0101-0101-0101-010101010101\",segment=\"{seg}\"}} 1073741824"
        ),
        format!(
            "cuslice_memory_limit_bytes{{gpu=\"GPU-01010101-0101-0101-0101-010101010101\",segment=\"{seg}\"}} 4294967296"
        ),
        format!(
            "cuslice_process_memory_used_bytes{{gpu=\"GPU-01010101-0101-0101-0101-010101010101\",segment=\"{seg}\",pid=\"4242\"}} 1073741824"
        ),
        format!(
            "cuslice_compute_used_seconds_total{{gpu=\"{}\",tenant=\"alpha\"}} 1.5",
            f.gpu_uuid
        ),
        format!(
            "cuslice_compute_share_percent{{gpu=\"{}\",tenant=\"beta\"}} 20",
            f.gpu_uuid
        ),
        format!(
            "cuslice_compute_ceiling_percent{{gpu=\"{}\",tenant=\"beta\"}} 50",
            f.gpu_uuid
        ),
    ] {
        assert!(body.contains(&want), "missing {want} in:\n{body}");
    }
    assert!(body.contains("application/openmetrics-text"), "{body}");
}

#[test]
fn top_refreshes_with_the_share_over_the_interval() {
    let f = fixture("top");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cuslice"))
        .args(["top", "--interval", "0.2", "--gpu-dir"])
        .arg(f.dir.join("gpu"))
        .arg("--containers-root")
        .arg(f.dir.join("containers"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("top");
    // Read as it comes, until two frames are whole: a frame ends where the
    // next one's clear-screen begins.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let (seen, mut stdout) = (seen.clone(), child.stdout.take().expect("stdout"));
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().expect("seen").extend_from_slice(&buf[..n]);
            }
        })
    };
    let text = || String::from_utf8_lossy(&seen.lock().expect("seen")).into_owned();
    // (The frame count is checked below, once top is stopped.)
    let _ = common::poll_until(Duration::from_secs(20), || {
        (text().matches("\x1b[2J").count() >= 3).then_some(())
    });
    let _ = child.kill();
    let _ = child.wait();
    reader.join().expect("reader");
    let out = text();
    let frames = out.matches("\x1b[2J").count();
    assert!(frames >= 2, "refreshes: {frames}\n{out}");
    // From the second frame on, each tenant shows its share over the last
    // interval (nothing ran in between here: 0.0 %).
    assert!(out.contains("   now") && out.contains("0.0%"), "{out}");
    assert!(
        out.contains("alpha") && out.contains("1.00 GiB / 4.00 GiB"),
        "{out}"
    );
}
