//! `cuslice run`: limits applied through a private quota file, exit status
//! and signals passed through, bad flags refused with one line.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

fn cuslice() -> Command {
    let e = common::env();
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuslice"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(
            "LD_LIBRARY_PATH",
            format!("{}:{}", e.fake.display(), e.apps.display()),
        )
        .env("CUSLICE_LIB", &e.shim)
        .env("FAKE_CUDA_CTX_OVERHEAD", "1MiB")
        .env("CUSLICE_CONTEXT_OVERHEAD", "1MiB");
    c
}

#[test]
fn memory_flag_limits_the_program() {
    let e = common::env();
    // 1 GiB quota; the context is charged the default 640 MiB
    // (CUSLICE_CONTEXT_OVERHEAD is ignored: the private quota file written
    // by `run` is authoritative), leaving exactly 384 MiB.
    let out = cuslice()
        .args(["run", "--memory", "1GiB", "--"])
        .arg(e.apps.join("memtest"))
        .args(["boundary", "alloc", &(384u64 << 20).to_string()])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "R alloc fill=0 over=2 free=0 refill=0 plain=0"
    );
    // The private quota file and segment live in $XDG_RUNTIME_DIR and are
    // gone when the program ends.
    let rundir = std::env::temp_dir().join(format!("cuslice-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&rundir).expect("mkdir");
    let out = cuslice()
        .env("XDG_RUNTIME_DIR", &rundir)
        .args(["run", "--memory", "1GiB", "--"])
        .arg(e.apps.join("memtest"))
        .args(["alloc", &(2u64 << 30).to_string()])
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "R alloc=2");
    let leftovers = std::fs::read_dir(&rundir).expect("rundir").count();
    let _ = std::fs::remove_dir_all(&rundir);
    assert_eq!(leftovers, 0, "cuslice run left its directory behind");
}

#[test]
fn exit_status_and_signals_pass_through() {
    let s = cuslice()
        .args(["run", "--memory", "1GiB", "--", "sh", "-c", "exit 7"])
        .status()
        .expect("run");
    assert_eq!(s.code(), Some(7));
    let s = cuslice()
        .args(["run", "--", "sh", "-c", "exit 3"])
        .status()
        .expect("run");
    assert_eq!(s.code(), Some(3));
    let s = cuslice()
        .args(["run", "--memory", "1GiB", "--", "sh", "-c", "kill -TERM $$"])
        .status()
        .expect("run");
    assert_eq!(s.signal(), Some(15), "{s:?}");
}

#[test]
fn bad_flags_are_refused_with_one_line() {
    for (args, want) in [
        (
            vec!["run", "--memory", "4 potatoes", "--", "true"],
            "cuslice: --memory \"4 potatoes\": expected a size like",
        ),
        (
            vec!["run", "--memory", "0", "--", "true"],
            "cuslice: --memory \"0\": expected from 1MiB to 1PiB",
        ),
        (
            vec!["run", "--gpu", "zero", "--", "true"],
            "cuslice: --gpu \"zero\": expected GPU indices or UUIDs",
        ),
        (
            vec![
                "run",
                "--compute-max",
                "30",
                "--compute-burst-ms",
                "0",
                "--",
                "true",
            ],
            "cuslice: --compute-burst-ms \"0\": expected whole milliseconds from 1 to 10000",
        ),
        (
            vec![
                "run",
                "--compute",
                "30",
                "--compute-burst-ms",
                "100",
                "--",
                "true",
            ],
            "cuslice: --compute-burst-ms \"100\": only applies with --compute-max",
        ),
        (
            vec!["run", "--memory", "1GiB", "--latency", "--", "true"],
            "cuslice: --latency: only applies with --compute or --compute-max",
        ),
        (
            vec!["run", "--lib", "/nonexistent.so", "--", "true"],
            "cuslice: --lib /nonexistent.so: no such file",
        ),
    ] {
        let out = cuslice().args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(
            err.starts_with(want) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

#[test]
fn compute_ceiling_flag_limits_the_program() {
    let e = common::env();
    let h = common::Host::new("cli", "compute");
    let spin = |limit: &[&str]| {
        let out = cuslice()
            .env("FAKE_CUDA_STATE", h.fake_state())
            .env("CUSLICE_GPU_SEGMENT_DIR", h.gpu_dir())
            .arg("run")
            .args(limit)
            .arg("--")
            .arg(e.apps.join("spin"))
            .args(["1.5", "1000000", "4"])
            .output()
            .expect("run");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = stdout
            .lines()
            .find(|l| l.starts_with("R "))
            .expect("result")
            .to_string();
        let num = |k: &str| -> f64 {
            r.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .expect("value")
        };
        num("busy_ms=") / num("wall_ms=")
    };
    let native = spin(&["--memory", "1GiB"]);
    // A short burst: many on/off periods in 1.5 s.
    let capped = spin(&[
        "--memory",
        "1GiB",
        "--compute-max",
        "25%",
        "--compute-burst-ms",
        "20",
    ]);
    let pct = 100.0 * capped / native;
    assert!(
        (pct - 25.0).abs() <= 3.0,
        "--compute-max 25%: {pct:.1} % of uncapped"
    );
}

#[test]
fn status_shows_a_running_program_live() {
    let e = common::env();
    let h = common::Host::new("cli", "live");
    let dir = &h.dir;
    std::fs::create_dir_all(dir.join("run")).expect("mkdir");
    let mut child = cuslice()
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env("FAKE_CUDA_STATE", h.fake_state())
        .env("CUSLICE_GPU_SEGMENT_DIR", h.gpu_dir())
        .args([
            "run",
            "--memory",
            "1GiB",
            "--compute",
            "30%",
            "--latency",
            "--",
        ])
        .arg(e.apps.join("spin"))
        .args(["2", "1000000", "4"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run");
    let status = || -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_cuslice"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env("CUSLICE_GPU_SEGMENT_DIR", h.gpu_dir())
            .args(["status", "--json", "--containers-root"])
            .arg(dir.join("none"))
            .output()
            .expect("status");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    // Until the program shows up with some GPU time (the checks below), or
    // has ended (then they fail on what status said last).
    let last = std::cell::RefCell::new(serde_json::Value::Null);
    let v = common::wait_for(
        || format!("cuslice status never showed the program: {}", last.borrow()),
        std::time::Duration::from_secs(20),
        || {
            let v = status();
            *last.borrow_mut() = v.clone();
            let t = &v["gpus"][0]["tenants"][0];
            let shown = t["processes"] == 1
                && t["gpu_time_seconds"].as_f64().is_some_and(|t| t > 0.1)
                && v["containers"][0]["processes"][0]["alive"] == true;
            (shown || child.try_wait().ok().flatten().is_some()).then_some(v)
        },
    );
    let _ = child.wait();
    let tenant = &v["gpus"][0]["tenants"][0];
    assert!(
        tenant["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("run-")),
        "{v}"
    );
    assert_eq!(tenant["share_percent"], 30, "{v}");
    assert_eq!(tenant["class"], "latency", "{v}");
    assert_eq!(tenant["processes"], 1, "{v}");
    assert!(
        tenant["gpu_time_seconds"].as_f64().is_some_and(|t| t > 0.1),
        "{v}"
    );
    let c = &v["containers"][0];
    assert_eq!(c["devices"][0]["limit_bytes"], 1u64 << 30, "{v}");
    assert_eq!(c["processes"][0]["alive"], true, "{v}");
}
