//! Golden tests of the generator: the generated hook table is committed, so
//! every change to the declarations or to hookgen shows up as a reviewable
//! diff. Regenerate with `UPDATE_GOLDEN=1 cargo test -p hookgen --test golden`.

use std::path::{Path, PathBuf};

use hookgen::{Header, Kind, Lib, generate};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check_golden(actual: &str, golden: &Path) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(golden, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(golden).unwrap_or_default();
    if expected != actual {
        let diff_at = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} is out of date (first difference at line {}: expected {:?}, generated {:?}).\n\
             Review the change, then run: UPDATE_GOLDEN=1 cargo test -p hookgen --test golden",
            golden.display(),
            diff_at + 1,
            expected.lines().nth(diff_at),
            actual.lines().nth(diff_at)
        );
    }
}

#[test]
fn project_hook_table_matches_golden() {
    let repo = root().join("..");
    let g = generate(&[
        Header {
            path: repo.join("cuda-headers/cuslice_cuda.h"),
            lib: Lib::Cuda,
            module: "cuda".into(),
        },
        Header {
            path: repo.join("cuda-headers/cuslice_nvml.h"),
            lib: Lib::Nvml,
            module: "nvml".into(),
        },
    ])
    .expect("generate");
    check_golden(&g.hooks, &root().join("golden/hooks.rs"));
    // What the rest of the project relies on.
    let names: Vec<&str> = g.funcs.iter().map(|f| f.name.as_str()).collect();
    for must in [
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuMemAlloc_v2",
        "cuLaunchKernel_ptsz",
        "nvmlDeviceGetMemoryInfo_v2",
    ] {
        assert!(names.contains(&must), "{must} missing from the table");
    }
    let cuda = g.funcs.iter().filter(|f| f.lib == Lib::Cuda).count();
    let nvml = g.funcs.iter().filter(|f| f.lib == Lib::Nvml).count();
    assert!(cuda > 40 && nvml >= 2, "cuda {cuda}, nvml {nvml}");
}

#[test]
fn every_kind_generates_as_documented() {
    let g = generate(&[Header {
        path: root().join("tests/fixtures/kinds.h"),
        lib: Lib::Cuda,
        module: "fx".into(),
    }])
    .expect("generate");
    check_golden(&g.hooks, &root().join("tests/fixtures/kinds.golden.rs"));
    let kind = |n: &str| {
        g.funcs
            .iter()
            .find(|f| f.name == n)
            .map(|f| (f.kind, f.family.clone()))
    };
    assert_eq!(kind("passFn"), Some((Kind::Pass, None)));
    assert_eq!(kind("preFn"), Some((Kind::Pre, Some("memory".into()))));
    assert_eq!(kind("postFn"), Some((Kind::Post, Some("info".into()))));
    assert_eq!(
        kind("overrideFn"),
        Some((Kind::Override, Some("launch".into())))
    );
    assert_eq!(kind("realFn"), Some((Kind::Real, None)));
    let h = &g.hooks;
    // pass: straight to the real function, counted.
    assert!(h.contains("crate::ffi::pass(id::passFn)"));
    // pre: hook first (unguarded), real only on Ok.
    assert!(h.contains("crate::ffi::pre(\n            id::preFn,\n            || unsafe { crate::hooks::memory::preFn(out, size) },"));
    // post: real first, hook gets its status.
    assert!(h.contains("crate::hooks::info::postFn(__status, free, total)"));
    // override: the hook alone.
    assert!(h.contains("crate::hooks::launch::overrideFn(t, params)"));
    // real: resolvable, never exported.
    assert!(h.contains("pub unsafe fn realFn("));
    assert!(!h.contains("extern \"C\" fn realFn("));
    // The types stay in sys.rs, without the function declarations.
    assert!(g.sys.contains("pub struct status_enum"));
    assert!(!g.sys.contains("pub fn passFn"));
}

fn gen_err(body: &str) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("hookgen-{}-{n}.h", std::process::id()));
    std::fs::write(&path, format!("typedef int status;\n{body}\n")).expect("write");
    let r = generate(&[Header {
        path: path.clone(),
        lib: Lib::Cuda,
        module: "m".into(),
    }]);
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(_) => panic!("expected an error for:\n{body}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_annotations_are_refused_with_the_function_named() {
    let cases = [
        ("status f(int a);", "f has no @hook annotation"),
        (
            "/** @hook sideways */\nstatus f(int a);",
            "f: unknown hook kind `sideways`",
        ),
        (
            "/** @hook pre */\nstatus f(int a);",
            "f: @hook pre needs a family",
        ),
        (
            "/** @hook pass memory */\nstatus f(int a);",
            "f: @hook pass takes no family",
        ),
        (
            "/** @hook override Memory */\nstatus f(int a);",
            "family `Memory` must be a lowercase module name",
        ),
        (
            "/** @hook pass\n @hook pass */\nstatus f(int a);",
            "f has more than one @hook annotation",
        ),
        ("/** @hook pass */\nvoid f(int a);", "f returns void"),
        ("/** @hook pass */\nstatus f(int a, ...);", "f is variadic"),
    ];
    for (body, want) in cases {
        let e = gen_err(body);
        assert!(e.contains(want), "for {body:?}: got {e:?}, want {want:?}");
        assert!(e.starts_with("hookgen-"), "the error names the header: {e}");
    }
}
