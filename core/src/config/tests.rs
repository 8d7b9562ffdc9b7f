//! The configuration as the shim loads it: the file, the environment, which
//! one applies, and every error message.

use super::file::MAX_FILE_BYTES;
use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

const P: &str = "/etc/cuslice/quota.toml";
const U1: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";
const U1_BYTES: [u8; 16] = [
    0x8f, 0x3c, 0x2a, 0x1e, 0x5b, 0x7d, 0x4c, 0x2e, 0x9a, 0x1b, 0x0c, 0x3d, 0x4e, 0x5f, 0x6a, 0x7b,
];
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn file(text: &str) -> Result<Config, ConfigError> {
    parse_file(Path::new(P), text)
}

fn env_of(vars: &[(&str, &str)]) -> HashMap<String, String> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A fresh temporary directory (nothing in it unless a test writes).
fn tmpdir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "cuslice-config-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// load() with a default path that does not exist, unless `default_text` is given.
fn load_env(vars: &[(&str, &str)], default_text: Option<&str>) -> Result<Config, ConfigError> {
    let map = env_of(vars);
    let dir = tmpdir();
    let default = dir.join("quota.toml");
    if let Some(t) = default_text {
        std::fs::write(&default, t).unwrap();
    }
    let r = load_with(&|k| map.get(k).cloned(), &default);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

// -- bad inputs -------------------------------------------------------

enum Bad {
    File(&'static str),
    Env(&'static [(&'static str, &'static str)]),
}

#[test]
fn context_overhead_file_and_env() {
    let p = Path::new("/q.toml");
    let c = parse_file(p, "context_overhead = \"300MiB\"\n").expect("parse");
    assert_eq!(c.context_overhead, Some(300 << 20));
    assert_eq!(
        parse_file(p, "context_overhead = 0\n")
            .expect("parse")
            .context_overhead,
        Some(0)
    );
    let e = parse_file(p, "context_overhead = \"32GiB\"\n").expect_err("too big");
    assert_eq!(
        e.0,
        "/q.toml: context_overhead: expected at most 16GiB, got 32GiB"
    );
    let e = parse_file(p, "context_overhead = true\n").expect_err("type");
    assert!(
        e.0.starts_with("/q.toml: context_overhead: expected a size like"),
        "{e}"
    );
    let env = |k: &str| match k {
        "CUSLICE_CONTEXT_OVERHEAD" => Some("1MiB".to_string()),
        "CUSLICE_MEMORY" => Some("1GiB".to_string()),
        _ => None,
    };
    let c = load_with(&env, Path::new("/nonexistent/quota.toml")).expect("env");
    assert_eq!(c.context_overhead, Some(1 << 20));
    let bad = |k: &str| (k == "CUSLICE_CONTEXT_OVERHEAD").then(|| "lots".to_string());
    let e = load_with(&bad, Path::new("/nonexistent/quota.toml")).expect_err("bad env");
    assert!(
        e.0.starts_with("CUSLICE_CONTEXT_OVERHEAD=\"lots\": expected a size like"),
        "{e}"
    );
}

#[test]
fn latency_class_file_and_env() {
    let p = Path::new("/q.toml");
    let c = parse_file(p, "latency = true\n[all]\ncompute = 40\n").expect("latency");
    assert!(c.latency);
    let c = parse_file(p, "latency = true\n[device.1]\ncompute_max = 40\n").expect("per device");
    assert!(c.latency);
    assert!(!parse_file(p, "").expect("empty").latency);
    for (text, msg) in [
        (
            "latency = \"yes\"\n[all]\ncompute = 40\n",
            "latency: expected true or false, got \"yes\"",
        ),
        (
            "latency = 1\n[all]\ncompute = 40\n",
            "latency: expected true or false, got 1",
        ),
        (
            "latency = true\n[all]\nmemory = \"1GiB\"\n",
            "latency: expected a tenant with a compute share",
        ),
        ("latncy = true\n", "latncy: expected one of the keys"),
    ] {
        let e = parse_file(p, text).expect_err(text);
        assert!(e.0.starts_with(&format!("/q.toml: {msg}")), "{text}: {e}");
    }
    let c = load_env(
        &[("CUSLICE_LATENCY", "on"), ("CUSLICE_COMPUTE", "30")],
        None,
    )
    .expect("env");
    assert!(c.latency);
    let c =
        load_env(&[("CUSLICE_LATENCY", "0"), ("CUSLICE_COMPUTE", "30")], None).expect("env off");
    assert!(!c.latency);
    let e = load_env(
        &[("CUSLICE_LATENCY", "sure"), ("CUSLICE_COMPUTE", "30")],
        None,
    )
    .expect_err("bad");
    assert_eq!(
        e.0,
        "CUSLICE_LATENCY=\"sure\": expected 1, true, yes, on or 0, false, no, off, got \"sure\""
    );
    let e = load_env(&[("CUSLICE_LATENCY", "1")], None).expect_err("no share");
    assert!(
        e.0.starts_with("CUSLICE_LATENCY=\"1\": expected a tenant with a compute share"),
        "{e}"
    );
    // A quota file is authoritative: the variable cannot make a tenant
    // latency-sensitive (it would hold the others back).
    let c = load_env(&[("CUSLICE_LATENCY", "1")], Some("[all]\ncompute = 30\n")).expect("file");
    assert!(!c.latency);
    assert!(
        c.ignored_env.contains(&"CUSLICE_LATENCY".to_string()),
        "{:?}",
        c.ignored_env
    );
}

#[test]
fn compute_slice_file_and_env() {
    let p = Path::new("/q.toml");
    assert_eq!(
        parse_file(p, "compute_slice_ms = 5\n[all]\ncompute = 30\n")
            .expect("5")
            .compute_slice_ms,
        Some(5)
    );
    assert_eq!(
        parse_file(
            p,
            "compute_slice_ms = \"1000ms\"\n[all]\ncompute_max = 30\n"
        )
        .expect("1000")
        .compute_slice_ms,
        Some(1000)
    );
    for (text, msg) in [
        (
            "compute_slice_ms = 0\n",
            "expected whole milliseconds from 1 to 1000, got 0",
        ),
        (
            "compute_slice_ms = 1001\n",
            "expected whole milliseconds from 1 to 1000, got 1001",
        ),
        (
            "compute_slice_ms = \"fast\"\n",
            "expected whole milliseconds from 1 to 1000 (like 20 or \"20ms\"), got \"fast\"",
        ),
    ] {
        let e = parse_file(p, text).expect_err(text);
        assert_eq!(e.0, format!("/q.toml: compute_slice_ms: {msg}"), "{text}");
    }
    let c = load_env(
        &[("CUSLICE_SLICE_MS", "5"), ("CUSLICE_COMPUTE", "30")],
        None,
    )
    .expect("env");
    assert_eq!(c.compute_slice_ms, Some(5));
    let e = load_env(&[("CUSLICE_SLICE_MS", "0")], None).expect_err("bad");
    assert_eq!(
        e.0,
        "CUSLICE_SLICE_MS=\"0\": expected whole milliseconds from 1 to 1000, got \"0\""
    );
    // Before, the shim read this variable whatever the quota file said.
    let c = load_env(&[("CUSLICE_SLICE_MS", "1")], Some("[all]\ncompute = 30\n")).expect("file");
    assert_eq!(c.compute_slice_ms, None);
    assert!(
        c.ignored_env.contains(&"CUSLICE_SLICE_MS".to_string()),
        "{:?}",
        c.ignored_env
    );
}

#[test]
fn compute_burst_file_and_env() {
    let p = Path::new("/q.toml");
    for (text, want) in [
        ("compute_burst_ms = 500\n", 500),
        ("compute_burst_ms = \"1000ms\"\n", 1000),
        ("compute_burst_ms = \" 20 ms \"\n", 20),
        ("compute_burst_ms = 10000\n", 10_000),
    ] {
        let text = format!("{text}[device.0]\ncompute_max = 30\n");
        let c = parse_file(p, &text).expect(&text);
        assert_eq!(c.compute_burst_ms, Some(want), "{text}");
    }
    // Without a share or ceiling it would shape nothing: refused, as the
    // slice, in the file and in the environment.
    for key in ["compute_burst_ms", "compute_slice_ms"] {
        let e = parse_file(p, &format!("{key} = 50\n[all]\nmemory = \"1GiB\"\n")).expect_err(key);
        assert_eq!(
            e.0,
            format!(
                "/q.toml: {key}: expected a tenant with a compute share (compute or compute_max for some GPU): it only shapes how a share is enforced, got none"
            )
        );
    }
    for var in ["CUSLICE_COMPUTE_BURST_MS", "CUSLICE_SLICE_MS"] {
        let e = load_env(&[(var, "50"), ("CUSLICE_MEMORY", "1GiB")], None).expect_err(var);
        assert_eq!(
            e.0,
            format!(
                "{var}=\"50\": expected a tenant with a compute share (compute or compute_max for some GPU): it only shapes how a share is enforced, got none"
            )
        );
    }
    assert_eq!(parse_file(p, "").expect("empty").compute_burst_ms, None);
    for (text, msg) in [
        (
            "compute_burst_ms = 0\n",
            "expected whole milliseconds from 1 to 10000, got 0",
        ),
        (
            "compute_burst_ms = 10001\n",
            "expected whole milliseconds from 1 to 10000, got 10001",
        ),
        (
            "compute_burst_ms = -5\n",
            "expected whole milliseconds from 1 to 10000, got -5",
        ),
        (
            "compute_burst_ms = \"0.5s\"\n",
            "expected whole milliseconds from 1 to 10000 (like 200 or \"200ms\"), got \"0.5s\"",
        ),
        (
            "compute_burst_ms = 1.5\n",
            "expected whole milliseconds from 1 to 10000, got 1.5",
        ),
    ] {
        let e = parse_file(p, text).expect_err(text);
        assert_eq!(e.0, format!("/q.toml: compute_burst_ms: {msg}"), "{text}");
    }
    let env = |k: &str| match k {
        "CUSLICE_COMPUTE_BURST_MS" => Some("50".to_string()),
        "CUSLICE_COMPUTE_MAX" => Some("30".to_string()),
        _ => None,
    };
    let c = load_with(&env, Path::new("/nonexistent/quota.toml")).expect("env");
    assert_eq!(c.compute_burst_ms, Some(50));
    let bad =
        |k: &str| (k == "CUSLICE_COMPUTE_BURST_MS").then(|| "99999999999999999999".to_string());
    let e = load_with(&bad, Path::new("/nonexistent/quota.toml")).expect_err("bad env");
    assert!(
        e.0.starts_with(
            "CUSLICE_COMPUTE_BURST_MS=\"99999999999999999999\": expected whole milliseconds"
        ),
        "{e}"
    );
    // A quota file is authoritative: the variable cannot change the burst.
    let c = load_env(
        &[("CUSLICE_COMPUTE_BURST_MS", "5")],
        Some("compute_burst_ms = 300\n[all]\ncompute = 10\n"),
    )
    .expect("file");
    assert_eq!(c.compute_burst_ms, Some(300));
    assert!(
        c.ignored_env
            .contains(&"CUSLICE_COMPUTE_BURST_MS".to_string()),
        "{:?}",
        c.ignored_env
    );
}

#[test]
fn bad_inputs_table() {
    use Bad::*;
    let size = "expected a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes";
    #[rustfmt::skip]
    let cases: Vec<(Bad, String)> = vec![
        // syntax
        (File("tenant = \"a\"\n\n[all]\nmemory = = 3\n"),
         format!("{P}: line 4: TOML syntax error: ")),
        (File("[all\nmemory = 1\n"), format!("{P}: line 1: TOML syntax error: ")),
        (File("[all]\nmemory = 1\nmemory = 2\n"), format!("{P}: line 3: TOML syntax error: ")),
        // unknown keys
        (File("tenants = \"a\"\n"),
         format!("{P}: tenants: expected one of the keys tenant, slice, segment_dir, gpu_segment_dir, context_overhead, compute_burst_ms, compute_slice_ms, latency, memory_wait, all, device, got unknown key \"tenants\" (did you mean tenant?)")),
        (File("[all]\nswap = \"1GiB\"\n"),
         format!("{P}: all.swap: expected one of the keys memory, memory_max, compute, compute_max, got unknown key \"swap\"")),
        (File("[device.0]\nmemroy = \"1GiB\"\n"),
         format!("{P}: device.0.memroy: expected one of the keys memory, memory_max, compute, compute_max, got unknown key \"memroy\" (did you mean memory?)")),
        (File("[all.extra]\n"), format!("{P}: all.extra: expected one of the keys")),
        // memory
        (File("[all]\nmemory = -5\n"), format!("{P}: all.memory: {size}, got -5")),
        (File("[all]\nmemory = 0\n"), format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got 0")),
        (File("[all]\nmemory = \"0\"\n"), format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got \"0\"")),
        (File("[device.0]\nmemory = \"4 potatoes\"\n"),
         format!("{P}: device.0.memory: {size}, got \"4 potatoes\"")),
        (File("[all]\nmemory = \"4GX\"\n"), format!("{P}: all.memory: {size}, got \"4GX\"")),
        (File("[all]\nmemory = \"2PiB\"\n"),
         format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got \"2PiB\"")),
        (File("[all]\nmemory = \"512KiB\"\n"),
         format!("{P}: all.memory: expected a size from 1MiB to 1PiB, got \"512KiB\"")),
        (File("[all]\nmemory = \"99999999999999999999\"\n"),
         format!("{P}: all.memory: expected a size below 16EiB, got \"99999999999999999999\"")),
        (File("[all]\nmemory = \"1.5\"\n"), format!("{P}: all.memory: expected a whole number of bytes")),
        (File("[all]\nmemory = true\n"), format!("{P}: all.memory: {size}, got true")),
        (File("[all]\nmemory = 4.5\n"), format!("{P}: all.memory: {size}, got 4.5")),
        (File("[all]\nmemory = [1]\n"), format!("{P}: all.memory: {size}, got an array")),
        // compute
        (File("[all]\ncompute = 0\n"), format!("{P}: all.compute: expected a percentage from 1 to 100, got 0")),
        (File("[all]\ncompute = 101\n"), format!("{P}: all.compute: expected a percentage from 1 to 100, got 101")),
        (File("[all]\ncompute = \"abc\"\n"),
         format!("{P}: all.compute: expected a percentage from 1 to 100 like 30 or \"30%\", got \"abc\"")),
        (File("[all]\ncompute = \"0%\"\n"), format!("{P}: all.compute: expected a percentage from 1 to 100, got \"0%\"")),
        (File("[all]\ncompute = 30.0\n"), format!("{P}: all.compute: expected a percentage from 1 to 100 like 30 or \"30%\", got 30.0")),
        (File("[all]\ncompute_max = 0\n"), format!("{P}: all.compute_max: expected a percentage from 1 to 100, got 0")),
        (File("[all]\ncompute = 40\ncompute_max = 30\n"),
         format!("{P}: all.compute_max: expected a ceiling of at least the guaranteed share 40 (all.compute), got 30")),
        (File("[all]\ncompute = 40\n[device.1]\ncompute_max = 30\n"),
         format!("{P}: device.1.compute_max: expected a ceiling of at least the guaranteed share 40 (all.compute), got 30")),
        (File("[all]\ncompute_max = 50\n[device.1]\ncompute = 60\n"),
         format!("{P}: device.1.compute: expected a guaranteed share of at most the ceiling 50 (all.compute_max), got 60")),
        (File("[device.0]\ncompute_max = 50\n[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\ncompute = 60\n"),
         format!("{P}: device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b.compute: expected a guaranteed share of at most the ceiling 50 (device.0.compute_max) for a GPU matched by both device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b and device.0, got 60")),
        // device keys
        (File("[device.gpu0]\nmemory = \"1GiB\"\n"),
         format!("{P}: device.gpu0: expected a device index from 0 to 63 or a GPU UUID like {U1}, got \"gpu0\"")),
        (File("[device.64]\nmemory = \"1GiB\"\n"),
         format!("{P}: device.64: expected a device index from 0 to 63, got \"64\"")),
        (File("[device.99999999999]\n"), format!("{P}: device.99999999999: expected a device index from 0 to 63, got")),
        (File("[device.01]\n"), format!("{P}: device.01: expected a device index from 0 to 63 in plain decimal, got \"01\"")),
        (File("[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7\"]\n"),
         format!("{P}: device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7: expected a GPU UUID like {U1}, got \"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7\"")),
        (File("[device.\"GPU-zf3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\n"),
         format!("{P}: device.GPU-zf3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b: expected a GPU UUID like")),
        (File("[device.\"GPU-8F3C2A1E-5B7D-4C2E-9A1B-0C3D4E5F6A7B\"]\n[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\n"),
         format!("{P}: device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b: expected each GPU once, got the same UUID as device.GPU-8F3C2A1E-5B7D-4C2E-9A1B-0C3D4E5F6A7B")),
        (File("device = 3\n"), format!("{P}: device: expected tables like [device.0]")),
        (File("[device]\n0 = 3\n"), format!("{P}: device.0: expected a table of memory, memory_max, compute, compute_max, got 3")),
        (File("all = \"4GiB\"\n"), format!("{P}: all: expected a table of memory, memory_max, compute, compute_max, got \"4GiB\"")),
        // segment_dir, tenant
        (File("segment_dir = \"run/cuslice\"\n"),
         format!("{P}: segment_dir: expected an absolute path like /run/cuslice/abc, got \"run/cuslice\"")),
        (File("segment_dir = 5\n"), format!("{P}: segment_dir: expected a string holding an absolute path, got 5")),
        (File("tenant = \"team a\"\n"),
         format!("{P}: tenant: expected 1 to 56 characters of A-Z a-z 0-9 . _ / -, got \"team a\"")),
        (File("tenant = \"\"\n"), format!("{P}: tenant: expected 1 to 56 characters")),
        (File("tenant = \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n"),
         format!("{P}: tenant: expected 1 to 56 characters")),
        (File("tenant = \"../etc\"\n"), format!("{P}: tenant: expected /-separated names without empty, \".\" or \"..\" parts, got \"../etc\"")),
        (File("tenant = 7\n"), format!("{P}: tenant: expected a string of 1 to 56 characters of A-Z a-z 0-9 . _ / -, got 7")),
        // environment
        (Env(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "lots")]),
         format!("CUDA_DEVICE_MEMORY_LIMIT_0=\"lots\": {size}, got \"lots\"")),
        (Env(&[("CUSLICE_MEMORY", "4GiB"), ("CUDA_DEVICE_MEMORY_LIMIT", "2g")]),
         "CUSLICE_MEMORY=\"4GiB\" conflicts with CUDA_DEVICE_MEMORY_LIMIT=\"2g\": expected the same limit in both (or only one set), got 4GiB and 2GiB".to_string()),
        (Env(&[("CUSLICE_MEMORY_3", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT_3", "2048m")]),
         "CUSLICE_MEMORY_3=\"1GiB\" conflicts with CUDA_DEVICE_MEMORY_LIMIT_3=\"2048m\"".to_string()),
        (Env(&[("CUSLICE_COMPUTE_MAX", "50"), ("CUDA_DEVICE_SM_LIMIT", "60")]),
         "CUSLICE_COMPUTE_MAX=\"50\" conflicts with CUDA_DEVICE_SM_LIMIT=\"60\": expected the same limit in both (or only one set), got 50% and 60%".to_string()),
        (Env(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")]),
         "CUDA_DEVICE_MEMORY_LIMIT=\"0\": expected a size from 1MiB to 1PiB, got \"0\"".to_string()),
        (Env(&[("CUDA_DEVICE_MEMORY_LIMIT", "0x100000000")]),
         format!("CUDA_DEVICE_MEMORY_LIMIT=\"0x100000000\": {size}")),
        (Env(&[("CUDA_DEVICE_SM_LIMIT", "120")]),
         "CUDA_DEVICE_SM_LIMIT=\"120\": expected a percentage from 1 to 100, got \"120\"".to_string()),
        (Env(&[("CUSLICE_COMPUTE", "abc")]),
         "CUSLICE_COMPUTE=\"abc\": expected a percentage from 1 to 100 like 30 or \"30%\", got \"abc\"".to_string()),
        (Env(&[("CUSLICE_COMPUTE", "40"), ("CUDA_DEVICE_SM_LIMIT_2", "30")]),
         "CUDA_DEVICE_SM_LIMIT_2=\"30\": expected a ceiling of at least the guaranteed share 40 (CUSLICE_COMPUTE=\"40\"), got 30".to_string()),
        (Env(&[("CUSLICE_TENANT", "a b")]),
         "CUSLICE_TENANT=\"a b\": expected 1 to 56 characters".to_string()),
        (Env(&[("CUSLICE_SEGMENT_DIR", "shm")]),
         "CUSLICE_SEGMENT_DIR=\"shm\": expected an absolute path".to_string()),
        (Env(&[("CUSLICE_CONFIG", "/nonexistent/cuslice/quota.toml")]),
         "CUSLICE_CONFIG=\"/nonexistent/cuslice/quota.toml\": expected an existing quota file, got no such file".to_string()),
    ];
    assert!(cases.len() >= 20);
    for (input, want) in &cases {
        let (what, got) = match input {
            File(t) => (format!("file {t:?}"), file(t)),
            Env(vars) => (format!("env {vars:?}"), load_env(vars, None)),
        };
        match got {
            Ok(c) => panic!("{what}: expected an error containing {want:?}, got Ok({c:?})"),
            Err(e) => {
                assert!(
                    e.0.starts_with(want.as_str()),
                    "{what}:\n  want prefix {want:?}\n  got         {:?}",
                    e.0
                );
                assert!(
                    !e.0.contains('\n') && !e.0.contains('\r'),
                    "{what}: not one line: {e}"
                );
                assert_eq!(e.to_string(), e.0);
            }
        }
    }
}

#[test]
fn syntax_error_message_is_flattened() {
    let e = file("[all]\nmemory = \"4GiB\"\ncompute = \n").unwrap_err();
    assert!(
        e.0.starts_with(&format!("{P}: line 3: TOML syntax error: ")),
        "{e}"
    );
    assert!(!e.0.contains('\n'));
}

#[test]
fn weird_paths_and_values_stay_on_one_line() {
    let e = parse_file(Path::new("/tmp/a\nb.toml"), "[all]\nmemory = \"1\\nGiB\"\n").unwrap_err();
    assert!(!e.0.contains('\n'), "{e}");
    assert!(e.0.starts_with("/tmp/a\\nb.toml: all.memory: "), "{e}");
    let long = "x".repeat(500);
    let e = file(&format!("[all]\nmemory = \"{long}\"\n")).unwrap_err();
    assert!(e.0.len() < 300, "{e}");
}

#[test]
fn unreadable_default_file_is_an_error_not_a_fallback() {
    // A directory where the file should be: it exists but cannot be read.
    let dir = tmpdir();
    let default = dir.join("quota.toml");
    std::fs::create_dir(&default).unwrap();
    let e = load_with(&|_| None, &default).unwrap_err();
    assert!(
        e.0.starts_with(&format!(
            "{}: expected a readable quota file, got ",
            default.display()
        )),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cuslice_config_unreadable_names_the_variable() {
    let dir = tmpdir();
    let d = dir.display().to_string();
    let map = env_of(&[("CUSLICE_CONFIG", &d)]);
    let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
    assert!(
        e.0.starts_with(&format!(
            "CUSLICE_CONFIG={d:?}: expected a readable quota file"
        )),
        "{e}"
    );
    // Not UTF-8.
    let f = dir.join("bin.toml");
    std::fs::write(&f, b"tenant = \"\xff\"\n").unwrap();
    let fs = f.display().to_string();
    let map = env_of(&[("CUSLICE_CONFIG", &fs)]);
    let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
    assert!(
        e.0.contains("expected UTF-8 text, got invalid UTF-8 at byte 10"),
        "{e}"
    );
    // Too large.
    let big = dir.join("big.toml");
    std::fs::write(&big, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
    let bs = big.display().to_string();
    let map = env_of(&[("CUSLICE_CONFIG", &bs)]);
    let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
    assert!(e.0.contains("expected a quota file of at most 1MiB"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cuslice_config_file_errors_name_its_path() {
    let dir = tmpdir();
    let f = dir.join("q.toml");
    std::fs::write(&f, "[all]\ncompute = 101\n").unwrap();
    let fs = f.display().to_string();
    let map = env_of(&[("CUSLICE_CONFIG", &fs)]);
    let e = load_with(&|k| map.get(k).cloned(), &dir.join("none")).unwrap_err();
    assert_eq!(
        e.0,
        format!("{fs}: all.compute: expected a percentage from 1 to 100, got 101")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// -- good inputs ------------------------------------------------------

#[test]
fn full_file_and_precedence_per_field() {
    let text = format!(
        r#"
# a comment
tenant = "team-a/trainer"
segment_dir = "/run/cuslice/abc"

[all]
memory = "4GiB"
compute = 30
compute_max = 50

[device.0]
memory = 8589934592
compute_max = "60%"

[device.1]
compute = "35"

[device."{U1}"]
memory = "2GiB"
compute = 40
"#
    );
    let c = file(&text).unwrap();
    assert_eq!(c.source, Source::File(PathBuf::from(P)));
    assert_eq!(c.tenant.as_deref(), Some("team-a/trainer"));
    assert_eq!(c.segment_dir, PathBuf::from("/run/cuslice/abc"));
    assert_eq!(
        c.all,
        Limits {
            memory: Some(4 * GIB),
            memory_max: None,
            compute: Some(30),
            compute_max: Some(50)
        }
    );
    assert!(c.has_limits());
    assert!(c.ignored_env.is_empty());
    let other = [0u8; 16];
    // Index 0, another GPU: memory and ceiling from device.0, share from [all].
    assert_eq!(
        c.limits_for(0, &other),
        Limits {
            memory: Some(8 * GIB),
            memory_max: None,
            compute: Some(30),
            compute_max: Some(60)
        }
    );
    // Index 0 with U1: memory and share from the UUID, ceiling from device.0.
    assert_eq!(
        c.limits_for(0, &U1_BYTES),
        Limits {
            memory: Some(2 * GIB),
            memory_max: None,
            compute: Some(40),
            compute_max: Some(60)
        }
    );
    // Index 1: share from device.1, the rest from [all].
    assert_eq!(
        c.limits_for(1, &other),
        Limits {
            memory: Some(4 * GIB),
            memory_max: None,
            compute: Some(35),
            compute_max: Some(50)
        }
    );
    // Index 5 with U1: UUID over [all].
    assert_eq!(
        c.limits_for(5, &U1_BYTES),
        Limits {
            memory: Some(2 * GIB),
            memory_max: None,
            compute: Some(40),
            compute_max: Some(50)
        }
    );
    // Nothing configured for index 7: [all].
    assert_eq!(c.limits_for(7, &other), c.all);
}

#[test]
fn uuid_keys_without_prefix_or_bare() {
    let c = file(&format!("[device.{}]\nmemory = \"1g\"\n", &U1[4..])).unwrap();
    assert_eq!(c.by_uuid.get(&U1_BYTES).and_then(|l| l.memory), Some(GIB));
    let c = file(&format!("[device.{U1}]\nmemory = \"1g\"\n")).unwrap();
    assert_eq!(c.limits_for(3, &U1_BYTES).memory, Some(GIB));
    assert_eq!(c.limits_for(3, &[0; 16]).memory, None);
}

#[test]
fn empty_file_means_no_limits() {
    for text in ["", "\n", "# nothing here\n", "[all]\n", "[device]\n"] {
        let c = file(text).unwrap();
        assert_eq!(c.source, Source::File(PathBuf::from(P)));
        assert!(!c.has_limits(), "{text:?}");
        assert_eq!(c.segment_dir, PathBuf::from(DEFAULT_SEGMENT_DIR));
        assert_eq!(c.tenant, None);
        assert_eq!(c.limits_for(0, &[0; 16]), Limits::default());
    }
    // An empty device table is still an entry, but sets nothing.
    let c = file("[device.2]\n").unwrap();
    assert!(!c.has_limits());
}

#[test]
fn boundaries_accepted() {
    let c = file("[all]\nmemory = \"1MiB\"\ncompute = 100\ncompute_max = 100\n").unwrap();
    assert_eq!(
        c.all,
        Limits {
            memory: Some(MIB),
            memory_max: None,
            compute: Some(100),
            compute_max: Some(100)
        }
    );
    let c = file("[device.63]\nmemory = \"1PiB\"\ncompute = 1\ncompute_max = 1\n").unwrap();
    assert_eq!(c.by_index[&63].memory, Some(1 << 50));
    let c = file("[all]\ncompute = 30\ncompute_max = 30\n").unwrap();
    assert_eq!(c.all.compute_max, Some(30));
    // A device's own ceiling may lift [all]'s only up to 100, and a
    // device's share below [all]'s ceiling is fine.
    let c = file("[all]\ncompute_max = 50\n[device.0]\ncompute = 20\ncompute_max = 90\n").unwrap();
    assert_eq!(
        c.limits_for(0, &[0; 16]),
        Limits {
            memory: None,
            memory_max: None,
            compute: Some(20),
            compute_max: Some(90)
        }
    );
    // A device that sets both overrides [all]'s inconsistent-looking pair.
    let c = file("[all]\ncompute = 60\n[device.0]\ncompute = 10\ncompute_max = 20\n").unwrap();
    assert_eq!(c.limits_for(0, &[0; 16]).compute, Some(10));
}

#[test]
fn limits_for_clamps_a_hand_built_inconsistent_config() {
    let mut c = Config::unlimited(Source::None);
    c.all.compute = Some(60);
    c.by_index.insert(
        0,
        Limits {
            compute_max: Some(40),
            ..Limits::default()
        },
    );
    assert_eq!(c.limits_for(0, &[0; 16]).compute, Some(40));
    assert!(c.has_limits());
}

#[test]
fn no_file_no_env_is_none() {
    let c = load_env(&[], None).unwrap();
    assert_eq!(c, Config::unlimited(Source::None));
    // Empty values count as unset.
    let c = load_env(&[("CUSLICE_MEMORY", ""), ("CUSLICE_CONFIG", "")], None).unwrap();
    assert_eq!(c.source, Source::None);
    // Tenant and segment dir alone are not limits.
    let c = load_env(
        &[
            ("CUSLICE_TENANT", "t1"),
            ("CUSLICE_SEGMENT_DIR", "/tmp/seg"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(c.source, Source::None);
    assert_eq!(c.tenant.as_deref(), Some("t1"));
    assert_eq!(c.segment_dir, PathBuf::from("/tmp/seg"));
}

#[test]
fn env_only_configs() {
    let c = load_env(
        &[
            ("CUSLICE_MEMORY", "4GiB"),
            ("CUSLICE_MEMORY_1", "2147483648"),
            ("CUSLICE_COMPUTE", "30%"),
            ("CUSLICE_COMPUTE_MAX", "50"),
            ("CUSLICE_COMPUTE_2", "45"),
            ("CUSLICE_COMPUTE_MAX_3", "80"),
            ("CUSLICE_TENANT", "team-b"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(c.source, Source::Env);
    assert_eq!(c.tenant.as_deref(), Some("team-b"));
    assert_eq!(
        c.all,
        Limits {
            memory: Some(4 * GIB),
            memory_max: None,
            compute: Some(30),
            compute_max: Some(50)
        }
    );
    let z = [0u8; 16];
    assert_eq!(c.limits_for(1, &z).memory, Some(2 * GIB)); // CUSLICE plain number = bytes
    assert_eq!(c.limits_for(2, &z).compute, Some(45));
    assert_eq!(c.limits_for(3, &z).compute_max, Some(80));
    assert_eq!(c.limits_for(0, &z), c.all);
    assert_eq!(
        c.by_index.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(c.ignored_env.is_empty());
}

#[test]
fn hami_semantics() {
    let z = [0u8; 16];
    // Plain numbers are bytes in HAMi-core too; m/g suffixes binary.
    let c = load_env(
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1073741824"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "2g"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(c.source, Source::Env);
    assert_eq!(c.all.memory, Some(4 * GIB));
    assert_eq!(c.limits_for(1, &z).memory, Some(GIB));
    assert_eq!(c.limits_for(2, &z).memory, Some(2 * GIB));
    // SM limit -> compute_max, a ceiling; per device too.
    let c = load_env(
        &[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_0", "60"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(
        c.all,
        Limits {
            memory: None,
            memory_max: None,
            compute: None,
            compute_max: Some(30)
        }
    );
    assert_eq!(c.limits_for(0, &z).compute_max, Some(60));
    assert_eq!(c.limits_for(1, &z).compute_max, Some(30));
    // SM limit 0 means no limit; the variable still makes the source Env.
    let c = load_env(&[("CUDA_DEVICE_SM_LIMIT", "0")], None).unwrap();
    assert_eq!(c.source, Source::Env);
    assert!(!c.has_limits());
    // So does 100: HAMi-core does not limit a tenant at 100 % (a ceiling
    // of 100 here would still give it a share of 100).
    let c = load_env(&[("CUDA_DEVICE_SM_LIMIT", "100")], None).unwrap();
    assert_eq!(c.source, Source::Env);
    assert!(!c.has_limits(), "{c:?}");
    // A leading 0 is octal to HAMi-core (010g: 8 GiB there): refused,
    // never read as the larger decimal.
    for (var, raw) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "010g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", " 0100"),
        ("CUDA_DEVICE_SM_LIMIT", "010"),
    ] {
        let e = load_env(&[(var, raw)], None).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{var}={raw:?}: expected a number without a leading 0 (HAMi reads {raw:?} as octal), got {raw:?}"
            )
        );
    }
    // A per-device 0 falls back to the all-devices value, as in HAMi-core.
    let c = load_env(
        &[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("CUDA_DEVICE_SM_LIMIT_0", "0"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(c.limits_for(0, &z).compute_max, Some(40));
    // 0 does not conflict with a CUSLICE ceiling: it is unset.
    let c = load_env(
        &[("CUSLICE_COMPUTE_MAX", "70"), ("CUDA_DEVICE_SM_LIMIT", "0")],
        None,
    )
    .unwrap();
    assert_eq!(c.all.compute_max, Some(70));
    // Both set to the same limit, written differently: fine.
    let c = load_env(
        &[
            ("CUSLICE_MEMORY", "4GiB"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
            ("CUSLICE_COMPUTE_MAX", "30%"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(
        c.all,
        Limits {
            memory: Some(4 * GIB),
            memory_max: None,
            compute: None,
            compute_max: Some(30)
        }
    );
    // Share and HAMi ceiling together.
    let c = load_env(
        &[("CUSLICE_COMPUTE", "20"), ("CUDA_DEVICE_SM_LIMIT", "50")],
        None,
    )
    .unwrap();
    assert_eq!(
        c.all,
        Limits {
            memory: None,
            memory_max: None,
            compute: Some(20),
            compute_max: Some(50)
        }
    );
}

#[test]
fn file_wins_and_env_is_listed_as_ignored() {
    let c = load_env(
        &[
            ("CUSLICE_MEMORY", "64GiB"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"),
            ("CUDA_DEVICE_SM_LIMIT", "100"),
            ("CUSLICE_TENANT", "someone-else"),
            ("CUSLICE_SEGMENT_DIR", "/tmp/elsewhere"),
            ("CUSLICE_COMPUTE", "not even valid"),
            ("CUSLICE_COMPUTE_MAX", ""),
            ("HOME", "/root"),
        ],
        Some("tenant = \"team-a\"\n[all]\nmemory = \"4GiB\"\ncompute_max = 20\n"),
    )
    .unwrap();
    assert!(matches!(c.source, Source::File(_)));
    assert_eq!(c.tenant.as_deref(), Some("team-a"));
    assert_eq!(c.segment_dir, PathBuf::from(DEFAULT_SEGMENT_DIR));
    assert_eq!(
        c.limits_for(0, &[0; 16]),
        Limits {
            memory: Some(4 * GIB),
            memory_max: None,
            compute: None,
            compute_max: Some(20)
        }
    );
    assert_eq!(
        c.ignored_env,
        vec![
            "CUSLICE_MEMORY",
            "CUSLICE_COMPUTE",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "CUDA_DEVICE_SM_LIMIT",
            "CUSLICE_TENANT",
            "CUSLICE_SEGMENT_DIR",
        ]
    );
}

#[test]
fn cuslice_config_is_used_only_without_a_mounted_file() {
    let dir = tmpdir();
    let f = dir.join("mine.toml");
    std::fs::write(&f, "[device.0]\nmemory = \"3GiB\"\n").unwrap();
    let default = dir.join("quota.toml");
    let fs = f.display().to_string();
    let map = env_of(&[("CUSLICE_CONFIG", &fs), ("CUSLICE_MEMORY_0", "9GiB")]);
    // No mounted file: CUSLICE_CONFIG names the file, env limits ignored.
    let c = load_with(&|k| map.get(k).cloned(), &default).unwrap();
    assert_eq!(c.source, Source::File(f.clone()));
    assert_eq!(c.limits_for(0, &[0; 16]).memory, Some(3 * GIB));
    assert_eq!(c.all.memory, None);
    assert_eq!(c.ignored_env, vec!["CUSLICE_MEMORY_0"]);
    // A mounted file is authoritative: CUSLICE_CONFIG cannot swap it for
    // a more generous one.
    std::fs::write(&default, "[all]\nmemory = \"1GiB\"\n").unwrap();
    let c = load_with(&|k| map.get(k).cloned(), &default).unwrap();
    assert_eq!(c.source, Source::File(default.clone()));
    assert_eq!(c.all.memory, Some(GIB));
    assert_eq!(c.limits_for(0, &[0; 16]).memory, Some(GIB));
    assert_eq!(c.ignored_env, vec!["CUSLICE_MEMORY_0", "CUSLICE_CONFIG"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn real_default_path_is_the_documented_one() {
    // The path the docs tell administrators to mount is the one the shim
    // reads.
    for (doc, text) in [
        ("README.md", include_str!("../../../README.md")),
        (
            "docs/memory-quota.md",
            include_str!("../../../docs/memory-quota.md"),
        ),
        (
            "docs/containers.md",
            include_str!("../../../docs/containers.md"),
        ),
    ] {
        assert!(
            text.contains(DEFAULT_CONFIG_PATH),
            "{doc} does not name {DEFAULT_CONFIG_PATH}"
        );
    }
    // load() itself must not panic whatever this machine holds.
    let _ = load(&|_| None);
}

#[test]
fn garbage_never_panics() {
    let samples = [
        "\0",
        "[",
        "]]",
        "a=",
        "[device.\"\"]",
        "[device.\"\\u0000\"]",
        "all = []",
        "[[all]]\nmemory=1",
        "[[device]]",
        "device = { 0 = { memory = \"1g\" } }",
        "[all]\nmemory = 9223372036854775807",
        "[all]\nmemory = -9223372036854775808",
        "[all]\ncompute = 255",
        "[all]\ncompute = 256",
        "[all]\ncompute = -1",
        "tenant = \"a/\"",
        "tenant = \"/a\"",
        "tenant = \"a//b\"",
        "tenant = \"a/./b\"",
        "segment_dir = \"/a\\u0000b\"",
        "x = 1979-05-27",
        "[device.\"GPU-\"]",
    ];
    for s in samples {
        let _ = file(s);
    }
    // Inline tables work like sections.
    let c = file("device = { 0 = { memory = \"1g\" } }").unwrap();
    assert_eq!(c.by_index[&0].memory, Some(GIB));
    for (s, ok) in [
        ("tenant = \"a/b.c_d-e\"", true),
        ("tenant = \"a/\"", false),
        ("tenant = \"a/./b\"", false),
    ] {
        assert_eq!(file(s).is_ok(), ok, "{s}");
    }
    assert!(file("segment_dir = \"/a\\u0000b\"").is_err());
}

#[test]
fn what_a_tenant_registers_with_per_gpu() {
    use super::TenantSpec;
    let p = Path::new("/q.toml");
    let uuid = [7u8; 16];
    let other = [8u8; 16];
    let text = "[all]\ncompute_max = 60\n[device.1]\ncompute = 25\n\
                [device.GPU-07070707-0707-0707-0707-070707070707]\ncompute = 40\n";
    let c = parse_file(p, text).expect("file");
    // The share defaults to the ceiling; the burst to 200 ms.
    assert_eq!(
        c.tenant_spec(0, &other),
        Some(TenantSpec {
            share: 60,
            max: 60,
            burst_ns: 200_000_000,
            latency: false
        })
    );
    assert_eq!(
        c.tenant_spec(1, &other).map(|s| (s.share, s.max)),
        Some((25, 60))
    );
    // A UUID entry wins over an index entry.
    assert_eq!(
        c.tenant_spec(1, &uuid).map(|s| (s.share, s.max)),
        Some((40, 60))
    );
    // A latency tenant's bucket holds one slice unless configured.
    let c = parse_file(
        p,
        "latency = true\ncompute_slice_ms = 5\n[all]\ncompute = 30\n",
    )
    .expect("latency");
    assert_eq!(
        c.tenant_spec(0, &uuid),
        Some(TenantSpec {
            share: 30,
            max: 100,
            burst_ns: 5_000_000,
            latency: true
        })
    );
    // Memory only: nothing to register.
    let c = parse_file(p, "[all]\nmemory = \"1GiB\"\n").expect("memory");
    assert_eq!(c.tenant_spec(0, &uuid), None);
}

#[test]
fn a_misspelt_limit_variable_is_an_error_not_a_limit_dropped() {
    for (name, want) in [
        (
            "CUSLICE_MEMORY_64",
            "CUSLICE_MEMORY_64: not a variable cuslice reads, so its limit would be dropped: expected CUSLICE_MEMORY or CUSLICE_MEMORY_<i>, <i> a device index from 0 to 63 in plain decimal",
        ),
        (
            "CUDA_DEVICE_MEMORY_LIMIT_01",
            "CUDA_DEVICE_MEMORY_LIMIT_01: not a variable cuslice reads, so its limit would be dropped: expected CUDA_DEVICE_MEMORY_LIMIT or CUDA_DEVICE_MEMORY_LIMIT_<i>, <i> a device index from 0 to 63 in plain decimal",
        ),
        (
            "CUSLICE_COMPUTE_MAX_X",
            "CUSLICE_COMPUTE_MAX_X: not a variable cuslice reads, so its limit would be dropped: expected CUSLICE_COMPUTE_MAX or CUSLICE_COMPUTE_MAX_<i>, <i> a device index from 0 to 63 in plain decimal",
        ),
        (
            "CUSLICE_MEM",
            "CUSLICE_MEM: not a variable cuslice reads, so its limit would be dropped: expected one of CUSLICE_MEMORY, CUSLICE_COMPUTE, ",
        ),
        ("CUSLICE_COMPUTEMAX", "CUSLICE_COMPUTEMAX: not a variable"),
        (
            "CUSLICE_LATENCY_CLASS",
            "CUSLICE_LATENCY_CLASS: not a variable",
        ),
    ] {
        let e = check_env_names(["HOME", "CUSLICE_MEMORY", name, "PATH"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(want) && !e.contains('\n'), "{name}: {e}");
    }
    // Every variable cuslice reads passes, and so do those of other
    // programs and cuslice's own non-limit ones.
    let known = super::env::env_var_names();
    let mut all: Vec<&str> = known.iter().map(String::as_str).collect();
    all.extend([
        "CUSLICE_LOG",
        "CUSLICE_METER",
        "CUSLICE_CUPTI",
        "CUSLICE_DISABLE",
        "CUSLICE_LIB",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    ]);
    check_env_names(all).expect("known names");
}

/// Names are read as spelt: a limit variable in another case
/// (`cuslice_memory=1GiB`) would be dropped without a word, so it is an
/// error naming it and its spelling; other programs' lower-case
/// variables, and cuslice's own non-limit ones in any case, pass.
#[test]
fn a_limit_variable_in_another_case_is_an_error_naming_its_spelling() {
    for (name, want) in [
        (
            "cuslice_memory",
            "cuslice_memory: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected CUSLICE_MEMORY",
        ),
        (
            "Cuslice_Memory",
            "Cuslice_Memory: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected CUSLICE_MEMORY",
        ),
        (
            "cuda_device_memory_limit",
            "cuda_device_memory_limit: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected CUDA_DEVICE_MEMORY_LIMIT",
        ),
        (
            "CUSLICE_MEMORY_max_2",
            "CUSLICE_MEMORY_max_2: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected CUSLICE_MEMORY_MAX_2",
        ),
        (
            "cuslice_memory_wait",
            "cuslice_memory_wait: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected CUSLICE_MEMORY_WAIT",
        ),
        (
            "cuslice_config",
            "cuslice_config: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected CUSLICE_CONFIG",
        ),
        // Upper-cased, a lookalike that is none of ours: the family's
        // spelling, as for the upper-case one.
        (
            "cuslice_memory_64",
            "cuslice_memory_64: not a variable cuslice reads, so its limit would be dropped: expected CUSLICE_MEMORY or CUSLICE_MEMORY_<i>",
        ),
        ("cuslice_mem", "cuslice_mem: not a variable cuslice reads"),
    ] {
        let e = check_env_names(["HOME", "CUSLICE_MEMORY", name, "PATH"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(want) && !e.contains('\n'), "{name}: {e}");
    }
    check_env_names([
        "cuslice_log",
        "Cuslice_Log",
        "cuslice_disable",
        "cuda_home",
        "cuda_visible_devices",
        "cudnn_memory",
        "memory",
        "slice_memory",
        "http_proxy",
    ])
    .expect("not limit variables");
}

/// `slice`: which processes may share one tenant entry of the GPU segment
/// (the hook, the DRA plugin and `cuslice run` write one per container,
/// claim and session). Its tag is FNV-1a 64 of the string; none is 0.
#[test]
fn the_slice_key_names_who_shares_a_tenant_entry() {
    let c = file("tenant = \"team-a\"\nslice = \"a\"\n[all]\ncompute = 50\n").expect("parses");
    assert_eq!(c.slice.as_deref(), Some("a"));
    assert_eq!(c.slice_tag(), 0xaf63_dc4c_8601_ec8c);
    let every = format!("slice = \"ctr-3f2a:x/y.z_w-{}\"\n", "0".repeat(111));
    let c = file(&every).expect("128 characters of every kind");
    assert_eq!(c.slice.as_deref().map(str::len), Some(128));
    assert_eq!(
        file("slice = \"ctr-3f2a\"\n").expect("parses").slice_tag(),
        0xae04_4499_4269_0b9f
    );
    // No slice: tag 0 (a process of an older hook's container, a quota
    // file written by hand, the environment).
    assert_eq!(
        file("tenant = \"team-a\"\n").expect("parses").slice_tag(),
        0
    );
    assert_eq!(Config::unlimited(Source::None).slice_tag(), 0);
    for (text, got) in [
        ("slice = \"\"\n", "\"\""),
        ("slice = \"a b\"\n", "\"a b\""),
        ("slice = \"ctr-\\n\"\n", "\"ctr-\\n\""),
        ("slice = \"é\"\n", "\"é\""),
        ("slice = 7\n", "7"),
    ] {
        let e = file(text).expect_err(text).0;
        assert_eq!(
            e,
            format!(
                "{P}: slice: expected a string of 1 to 128 characters of A-Z a-z 0-9 . _ : / -, got {got}"
            ),
            "{text}"
        );
    }
    let long = format!("slice = \"{}\"\n", "s".repeat(129));
    let e = file(&long).expect_err("129 characters").0;
    assert!(
        e.starts_with(&format!(
            "{P}: slice: expected a string of 1 to 128 characters of A-Z a-z 0-9 . _ : / -, got \"sss"
        )) && !e.contains('\n'),
        "{e}"
    );
    // Not settable from the environment: a variable by that name is not
    // one cuslice reads.
    assert!(!super::env::env_var_names().contains(&"CUSLICE_SLICE".to_string()));
    let c = load_env(&[("CUSLICE_MEMORY", "1GiB")], None).expect("env");
    assert_eq!((c.slice.as_deref(), c.slice_tag()), (None, 0));
}

/// A tenant's name and its slice's tag share the 64 bytes of a GPU
/// segment entry's name: 56 bytes are left for the name.
#[test]
fn a_tenant_name_is_at_most_56_characters() {
    let ok = format!("tenant = \"{}\"\n", "a".repeat(56));
    assert_eq!(
        file(&ok).expect("56 characters").tenant.map(|t| t.len()),
        Some(56)
    );
    let long = "a".repeat(57);
    let e = file(&format!("tenant = \"{long}\"\n"))
        .expect_err("57 characters")
        .0;
    assert_eq!(
        e,
        format!("{P}: tenant: expected 1 to 56 characters of A-Z a-z 0-9 . _ / -, got \"{long}\"")
    );
    let e = load_env(
        &[("CUSLICE_TENANT", &long), ("CUSLICE_MEMORY", "1GiB")],
        None,
    )
    .expect_err("57 characters")
    .0;
    assert_eq!(
        e,
        format!(
            "CUSLICE_TENANT=\"{long}\": expected 1 to 56 characters of A-Z a-z 0-9 . _ / -, got \"{long}\""
        )
    );
}

#[test]
fn memory_max_and_memory_wait_file_and_env() {
    let c = file(
        "memory_wait = \"30s\"\n[all]\nmemory = \"20GiB\"\nmemory_max = \"60GiB\"\n[device.1]\nmemory_max = \"30GiB\"\n",
    )
    .expect("valid");
    assert_eq!(c.memory_wait_ms, Some(30_000));
    let l0 = c.limits_for(0, &[0; 16]);
    assert_eq!((l0.memory, l0.memory_max), (Some(20 * GIB), Some(60 * GIB)));
    let l1 = c.limits_for(1, &[1; 16]);
    assert_eq!((l1.memory, l1.memory_max), (Some(20 * GIB), Some(30 * GIB)));
    for (text, wait) in [("500ms", 500), ("2m", 120_000), ("1h", 3_600_000), ("0", 0)] {
        let c = file(&format!(
            "memory_wait = \"{text}\"\n[all]\nmemory = \"1GiB\"\n"
        ))
        .expect(text);
        assert_eq!(c.memory_wait_ms, Some(wait), "{text}");
    }
    let e = load_env(
        &[
            ("CUSLICE_MEMORY", "2GiB"),
            ("CUSLICE_MEMORY_MAX", "6GiB"),
            ("CUSLICE_MEMORY_MAX_1", "3GiB"),
            ("CUSLICE_MEMORY_WAIT", "10s"),
        ],
        None,
    )
    .expect("env");
    assert_eq!(e.memory_wait_ms, Some(10_000));
    assert_eq!(e.limits_for(0, &[0; 16]).memory_max, Some(6 * GIB));
    assert_eq!(e.limits_for(1, &[1; 16]).memory_max, Some(3 * GIB));
    check_env_names([
        "CUSLICE_MEMORY_MAX",
        "CUSLICE_MEMORY_MAX_3",
        "CUSLICE_MEMORY_WAIT",
    ])
    .expect("known names");

    // Errors name the key, what was expected and what was found.
    let bad = |t: &str| file(t).expect_err(t).to_string();
    let m = bad("[all]\nmemory_max = \"4GiB\"\n");
    assert!(
        m.contains("all.memory_max: expected memory (the guarantee)"),
        "{m}"
    );
    let m = bad("[all]\nmemory = \"4GiB\"\nmemory_max = \"2GiB\"\n");
    assert!(
        m.contains(
            "all.memory_max: expected at least the guaranteed memory 4GiB (all.memory), got 2GiB"
        ),
        "{m}"
    );
    let m = bad("[all]\nmemory = \"4GiB\"\n[device.0]\nmemory_max = \"2GiB\"\n");
    assert!(m.contains("device.0.memory_max: expected at least"), "{m}");
    let m = bad("memory_wait = \"30\"\n[all]\nmemory = \"4GiB\"\n");
    assert!(m.contains("memory_wait: expected a duration like"), "{m}");
    let m = bad("memory_wait = \"2h\"\n[all]\nmemory = \"4GiB\"\n");
    assert!(m.contains("at most 1h"), "{m}");
    let m = bad("memory_wait = 30\n[all]\nmemory = \"4GiB\"\n");
    assert!(m.contains("memory_wait: expected a duration string"), "{m}");
    let m = bad("memory_wait = \"30s\"\n[all]\ncompute = 50\n");
    assert!(
        m.contains("memory_wait: expected a tenant with a memory quota"),
        "{m}"
    );
    let m = load_env(&[("CUSLICE_MEMORY_MAX", "4GiB")], None)
        .expect_err("max alone")
        .to_string();
    assert!(
        m.contains("CUSLICE_MEMORY_MAX=\"4GiB\": expected memory (the guarantee)"),
        "{m}"
    );
    let m = load_env(
        &[("CUSLICE_COMPUTE", "50"), ("CUSLICE_MEMORY_WAIT", "1s")],
        None,
    )
    .expect_err("wait alone")
    .to_string();
    assert!(
        m.contains("CUSLICE_MEMORY_WAIT=\"1s\": expected a tenant with a memory quota"),
        "{m}"
    );
}
