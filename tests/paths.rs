//! The three ways a program reaches the driver, plus fork and threads: every
//! result passes through unchanged and the shim sees every call. Runs the
//! test programs in tests/apps/ against the fake driver in tests/fake/.

mod common;

use common::{Opts, native, run, shimmed};

const SHIM: &str = "libcuslice.so";
const DRIVER: &str = "libcuda.so.1";

/// Hook call counts of one run of tests/apps/workload.h.
fn assert_workload_counts(calls: &std::collections::BTreeMap<String, u64>, ptsz: bool) {
    let launch = if ptsz {
        "cuLaunchKernel_ptsz"
    } else {
        "cuLaunchKernel"
    };
    let alloc_async = if ptsz {
        "cuMemAllocAsync_ptsz"
    } else {
        "cuMemAllocAsync"
    };
    let free_async = if ptsz {
        "cuMemFreeAsync_ptsz"
    } else {
        "cuMemFreeAsync"
    };
    for (name, n) in [
        ("cuInit", 1),
        ("cuDevicePrimaryCtxRetain", 1),
        ("cuMemGetInfo_v2", 2),
        ("cuDeviceTotalMem_v2", 1),
        ("cuMemAlloc_v2", 9),
        ("cuMemFree_v2", 8),
        (alloc_async, 1),
        (free_async, 1),
        ("cuMemCreate", 1),
        ("cuMemRelease", 1),
        (launch, 16),
        ("cuLaunchKernelEx", 2),
    ] {
        assert_eq!(
            calls.get(name).copied(),
            Some(n),
            "calls of {name} in {calls:?}"
        );
    }
}

fn assert_same_results(prog: &str) -> (common::Run, common::Run) {
    let a = native(prog);
    a.assert_ok();
    let b = shimmed(prog);
    b.assert_ok();
    assert!(
        a.results().contains(&"R done"),
        "{prog} did not finish:\n{}",
        a.stdout
    );
    assert_eq!(
        a.results(),
        b.results(),
        "{prog}: results differ with the shim"
    );
    (a, b)
}

#[test]
fn direct_link_passes_through_and_is_seen() {
    let (native, shim) = assert_same_results("direct");
    assert_eq!(native.diag("cuMemAlloc_v2").0, DRIVER);
    assert_eq!(
        shim.diag("cuMemAlloc_v2"),
        (SHIM.into(), "cuMemAlloc_v2".into())
    );
    assert_workload_counts(&shim.calls_single(), false);
    // The out-of-memory status of an oversized allocation passes through.
    assert!(
        shim.results().contains(&"R oversize_alloc=2"),
        "{}",
        shim.stdout
    );
}

#[test]
fn dlopen_dlsym_gets_hooks_and_passes_through() {
    let (native, shim) = assert_same_results("dlopen");
    for what in [
        "handle:cuMemAlloc_v2",
        "handle:cuLaunchKernel",
        "handle:cuLaunchKernel_ptsz",
        "handle:cuGetProcAddress_v2",
        "nvml:nvmlDeviceGetMemoryInfo",
    ] {
        let (n_file, n_sym) = native.diag(what);
        let (s_file, s_sym) = shim.diag(what);
        assert_ne!(n_file, SHIM, "{what}");
        assert_eq!(s_file, SHIM, "{what}: the caller must get the hook");
        assert_eq!(
            s_sym, n_sym,
            "{what}: the hook must be the same entry point the driver gave"
        );
    }
    // The program dlopened the driver RTLD_LOCAL: natively, global lookups
    // find nothing; with the shim preloaded they find its exports.
    for what in ["default:cuMemAlloc_v2", "next:cuMemAlloc_v2"] {
        assert_eq!(native.diag(what).0, "null", "{what}");
        assert_eq!(
            shim.diag(what),
            (SHIM.into(), "cuMemAlloc_v2".into()),
            "{what}"
        );
    }
    // Functions cuslice does not hook come straight from the driver.
    assert_eq!(shim.diag("handle:cuDeviceGetName").0, DRIVER);
    assert_eq!(shim.diag("nvml:nvmlInit_v2").0, "libnvidia-ml.so.1");
    assert_eq!(shim.diag("handle:cuNoSuchFunction").0, "null");
    assert_workload_counts(&shim.calls_single(), false);
}

#[test]
fn get_proc_address_keeps_driver_version_choice() {
    let (native, shim) = assert_same_results("procaddr");
    let lines: Vec<&str> = native
        .stdout
        .lines()
        .filter(|l| l.starts_with("D gpa"))
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect();
    assert!(lines.len() >= 14, "{}", native.stdout);
    for what in lines {
        let (n_file, n_sym) = native.diag(what);
        let (s_file, s_sym) = shim.diag(what);
        assert_eq!(n_file, DRIVER, "{what}");
        assert_eq!(
            s_sym, n_sym,
            "{what}: the driver's choice of version/_ptsz must survive"
        );
        if what == "gpa:cuDeviceGetName" {
            assert_eq!(s_file, DRIVER, "{what}: not hooked, must pass through");
        } else {
            assert_eq!(s_file, SHIM, "{what}: must be the hook");
        }
    }
    // The choices the fake driver makes, as the real one does.
    assert_eq!(
        shim.diag("gpa:cuLaunchKernel/ptds").1,
        "cuLaunchKernel_ptsz"
    );
    assert_eq!(shim.diag("gpa:cuLaunchKernel/default").1, "cuLaunchKernel");
    assert_eq!(shim.diag("gpa:cuCtxCreate/13000").1, "cuCtxCreate_v4");
    assert_eq!(shim.diag("gpa:cuCtxCreate/11040").1, "cuCtxCreate_v3");
    assert_eq!(shim.diag("gpa:cuCtxCreate/3020").1, "cuCtxCreate_v2");
    assert_eq!(shim.diag("gpa:cuCtxCreate/3000").1, "cuCtxCreate");
    assert_eq!(shim.diag("gpa:cuMemAlloc/3000").1, "cuMemAlloc");
    assert_eq!(shim.diag("gpa:cuGetProcAddress").1, "cuGetProcAddress_v2");
    assert_eq!(shim.diag("gpa1:cuMemAlloc").1, "cuMemAlloc_v2");
    let calls = shim.calls_single();
    assert_workload_counts(&calls, true);
    // 26 successful lookups + 1 unknown symbol, through the hooked v2 entry.
    assert_eq!(calls.get("cuGetProcAddress_v2"), Some(&27), "{calls:?}");
    assert_eq!(calls.get("cuGetProcAddress"), Some(&1), "{calls:?}");
}

#[test]
fn forked_child_is_intercepted() {
    let native = native("forked");
    native.assert_ok();
    let shim = shimmed("forked");
    shim.assert_ok();
    assert_eq!(native.results(), shim.results());
    assert!(shim.results().contains(&"R child status=0"));
    let per_pid = shim.calls();
    assert_eq!(
        per_pid.len(),
        2,
        "parent and child each report: {per_pid:?}\n{}",
        shim.stderr
    );
    let mut allocs: Vec<u64> = per_pid
        .values()
        .map(|m| m.get("cuMemAlloc_v2").copied().unwrap_or(0))
        .collect();
    allocs.sort();
    // The child counts only its own 10 calls; the parent its 3 + 5.
    assert_eq!(allocs, vec![8, 10], "{per_pid:?}");
}

#[test]
fn thirty_two_threads_every_call_seen() {
    let native = native("threads");
    native.assert_ok();
    let shim = shimmed("threads");
    shim.assert_ok();
    assert_eq!(native.results(), vec!["R failures=0 leaked=0"]);
    assert_eq!(shim.results(), native.results());
    let calls = shim.calls_single();
    assert_eq!(calls.get("cuMemAlloc_v2"), Some(&6400), "{calls:?}");
    assert_eq!(calls.get("cuMemFree_v2"), Some(&6400), "{calls:?}");
    assert_eq!(calls.get("cuLaunchKernel"), Some(&6400), "{calls:?}");
    // Each intercepted symbol is announced once, not once per thread.
    let announced = shim
        .stderr
        .lines()
        .filter(|l| l.ends_with("debug: intercepted cuMemAlloc_v2"))
        .count();
    assert_eq!(announced, 1, "{}", shim.stderr);
}

#[test]
fn rtld_next_of_another_interposer_is_unchanged() {
    let e = common::env();
    let r = run(
        "rtldnext",
        Opts {
            preload_extra: vec![e.apps.join("libnext.so")],
            ..Opts::default()
        },
    );
    r.assert_ok();
    // libnext's cuslice_test_fn chains to libbase's (42) and adds 1.
    assert_eq!(r.results(), vec!["R value=43"]);
}

#[test]
fn kill_switch_passes_everything_through() {
    let r = run(
        "dlopen",
        Opts {
            env: vec![
                ("CUSLICE_LOG", "debug".into()),
                ("CUSLICE_DISABLE", "1".into()),
            ],
            ..Opts::default()
        },
    );
    r.assert_ok();
    assert_eq!(r.results(), native("dlopen").results());
    assert_eq!(r.diag("handle:cuMemAlloc_v2").0, DRIVER);
    assert_eq!(r.diag("handle:cuLaunchKernel").0, DRIVER);
    assert!(r.calls().is_empty(), "no hook may run: {}", r.stderr);
}

#[test]
fn unknown_kill_switch_value_keeps_the_shim_and_says_so() {
    let r = run(
        "direct",
        Opts {
            env: vec![
                ("CUSLICE_LOG", "debug".into()),
                ("CUSLICE_DISABLE", "perhaps".into()),
            ],
            ..Opts::default()
        },
    );
    r.assert_ok();
    assert!(
        r.stderr.contains("CUSLICE_DISABLE=perhaps is not 1/0"),
        "{}",
        r.stderr
    );
    assert_eq!(r.calls_single().get("cuMemAlloc_v2"), Some(&9));
}

#[test]
fn missing_real_symbol_gives_not_found() {
    let e = common::env();
    let r = run(
        "missing",
        Opts {
            env: vec![(
                "CUSLICE_REAL_LIBCUDA",
                e.apps.join("libpartialcuda.so").display().to_string(),
            )],
            ..Opts::default()
        },
    );
    r.assert_ok();
    assert_eq!(r.results(), vec!["R init=0", "R alloc=500", "R launch=500"]);
}

#[test]
fn missing_driver_gives_one_clear_error() {
    let r = run(
        "missing",
        Opts {
            env: vec![("CUSLICE_REAL_LIBCUDA", "/nonexistent/libcuda.so.1".into())],
            ..Opts::default()
        },
    );
    r.assert_ok();
    assert_eq!(
        r.results(),
        vec!["R init=500", "R alloc=500", "R launch=500"]
    );
    let errors: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains(": error: "))
        .collect();
    assert_eq!(errors.len(), 1, "exactly one error line: {}", r.stderr);
    assert!(
        errors[0].contains("/nonexistent/libcuda.so.1")
            && errors[0].contains("CUSLICE_REAL_LIBCUDA"),
        "{}",
        errors[0]
    );
}

#[test]
fn shim_posing_as_the_driver_is_refused() {
    let e = common::env();
    let r = run(
        "missing",
        Opts {
            env: vec![("CUSLICE_REAL_LIBCUDA", e.shim.display().to_string())],
            ..Opts::default()
        },
    );
    r.assert_ok();
    assert_eq!(
        r.results(),
        vec!["R init=500", "R alloc=500", "R launch=500"]
    );
    assert!(
        r.stderr.contains("is cuslice itself, not the real driver"),
        "{}",
        r.stderr
    );
}

#[test]
fn every_annotated_hook_is_exported() {
    let e = common::env();
    let mut wanted = Vec::new();
    for h in ["cuslice_cuda.h", "cuslice_nvml.h"] {
        let text = std::fs::read_to_string(e.root.join("cuda-headers").join(h)).expect("header");
        let mut kind: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix("/** @hook ") {
                kind = rest.split_whitespace().next().map(str::to_string);
            } else if let Some(k) = kind.take() {
                let name = line
                    .split('(')
                    .next()
                    .and_then(|s| s.split_whitespace().last())
                    .expect("decl");
                if k != "real" {
                    wanted.push(name.to_string());
                }
            }
        }
    }
    assert!(wanted.len() > 40, "{wanted:?}");
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&e.shim)
        .output()
        .expect("nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    let exported: std::collections::BTreeSet<&str> = syms
        .lines()
        .filter(|l| l.contains(" T "))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    for w in &wanted {
        assert!(
            exported.contains(w.as_str()),
            "{w} is annotated but not exported"
        );
    }
    assert!(exported.contains("dlsym"));
    // CUPTI's registration: the GPU time meter steps aside for a profiler;
    // its subscription and profiler initialisation: the meter stops
    // detaching CUPTI from under the program.
    let cupti = [
        "cuptiActivityRegisterCallbacks",
        "cuptiSubscribe",
        "cuptiProfilerInitialize",
        "cuptiSubscribe_v2",
    ];
    for c in cupti {
        assert!(exported.contains(c), "{c} is not exported");
    }
    // Nothing else: no stray Rust symbols, no unhooked driver names.
    assert_eq!(
        exported.len(),
        wanted.len() + 1 + cupti.len(),
        "unexpected exports: {exported:?}"
    );
}
