//! The fake driver's own self-test (tests/fake/selftest.c): the memory
//! accounting, timeline, events, pools, VMM, graphs and cuGetProcAddress
//! mapping that every other test relies on, checked against the fake alone.

mod common;

use std::process::Command;

#[test]
fn fake_driver_selftest_passes() {
    let e = common::env();
    let exe = e.apps.join("fake-selftest");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()))
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-o"])
        .arg(&exe)
        .arg(format!("-I{}", e.root.join("cuda-headers").display()))
        .arg(format!("-I{}", e.root.join("tests/fake").display()))
        .arg(e.root.join("tests/fake/selftest.c"))
        .arg(format!("-L{}", e.fake.display()))
        .args(["-lcuda", "-lnvidia-ml", "-ldl", "-pthread"])
        .output()
        .expect("gcc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe)
        .env_clear()
        .env("LD_LIBRARY_PATH", &e.fake)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("selftest");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}
