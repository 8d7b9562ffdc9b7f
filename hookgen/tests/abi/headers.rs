//! Finding NVIDIA's real `cuda.h`, `nvml.h` and `cupti.h` at test time. They
//! are never committed; in order of preference they come from:
//!
//! 1. `$CUSLICE_CUDA_INCLUDE`, a directory holding all three headers (and
//!    what `cupti.h` includes, and `cupti_profiler_target.h` beside it: a
//!    toolkit's `include/`);
//! 2. `/usr/local/cuda/include`, when it holds all three;
//! 3. the PyPI wheels `nvidia-cuda-runtime`, `nvidia-nvml-dev`,
//!    `nvidia-cuda-cupti` and `nvidia-cuda-crt` (`crt/host_defines.h`, which
//!    `cupti.h` includes), fetched with `python3 -m pip download` into a
//!    cache under the cargo target directory and unpacked with python3's
//!    `zipfile` into one tree (reused on later runs).

use std::path::{Path, PathBuf};
use std::process::Command;

pub const ENV_VAR: &str = "CUSLICE_CUDA_INCLUDE";
const SYSTEM_DIR: &str = "/usr/local/cuda/include";
const WHEELS: [&str; 4] = [
    "nvidia-cuda-runtime",
    "nvidia-nvml-dev",
    "nvidia-cuda-cupti",
    "nvidia-cuda-crt",
];
/// The headers the test needs, all in one directory.
const NEEDED: [&str; 3] = ["cuda.h", "nvml.h", "cupti.h"];

/// Where the real headers were found.
pub struct RealHeaders {
    pub cuda_h: PathBuf,
    pub nvml_h: PathBuf,
    /// Parsed with its directory on the include path (it includes `cuda.h`,
    /// `cupti_activity.h`, ...).
    pub cupti_h: PathBuf,
    /// Human-readable origin, for messages.
    pub origin: String,
}

/// Finds the headers, downloading them if need be. The error names every
/// place tried and how to provide the headers.
pub fn locate() -> Result<RealHeaders, String> {
    let mut tried = Vec::new();

    match std::env::var_os(ENV_VAR) {
        Some(dir) if !dir.is_empty() => {
            // An explicit setting is honoured or reported, never skipped.
            let dir = PathBuf::from(dir);
            return match all_in(&dir) {
                Some(h) => Ok(RealHeaders {
                    origin: format!("${ENV_VAR}={}", dir.display()),
                    ..h
                }),
                None => Err(failure(&[format!(
                    "${ENV_VAR}={}: {}",
                    dir.display(),
                    missing_in(&dir)
                )])),
            };
        }
        _ => tried.push(format!("${ENV_VAR}: not set")),
    }

    let system = Path::new(SYSTEM_DIR);
    match all_in(system) {
        Some(h) => {
            return Ok(RealHeaders {
                origin: SYSTEM_DIR.to_string(),
                ..h
            });
        }
        None => tried.push(format!("{SYSTEM_DIR}: {}", missing_in(system))),
    }

    match from_wheels() {
        Ok(h) => Ok(h),
        Err(e) => {
            tried.push(e);
            Err(failure(&tried))
        }
    }
}

fn failure(tried: &[String]) -> String {
    let mut msg = String::from(
        "ABI test: cannot find NVIDIA's cuda.h, nvml.h and cupti.h to check cuda-headers/ against.\nTried, in order:\n",
    );
    for t in tried {
        msg.push_str("  - ");
        msg.push_str(&t.replace('\n', "\n    "));
        msg.push('\n');
    }
    msg.push_str(&format!(
        "Provide the headers: set {ENV_VAR} to a directory holding cuda.h, nvml.h and cupti.h \
         (e.g. the include/ directory of a CUDA toolkit, or nvidia/cu13/include of the wheels \
         {} unpacked into one tree), or let `python3 -m pip download` reach PyPI.",
        WHEELS.join(", ")
    ));
    msg
}

fn all_in(dir: &Path) -> Option<RealHeaders> {
    NEEDED
        .iter()
        .all(|f| dir.join(f).is_file())
        .then(|| RealHeaders {
            cuda_h: dir.join("cuda.h"),
            nvml_h: dir.join("nvml.h"),
            cupti_h: dir.join("cupti.h"),
            origin: String::new(),
        })
}

fn missing_in(dir: &Path) -> String {
    if !dir.is_dir() {
        return "no such directory".to_string();
    }
    let missing: Vec<&str> = NEEDED
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    format!("no {} there", missing.join(" and no "))
}

/// `<target>/cuda-headers-cache`.
fn cache_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is `<target>/tmp`, given to integration tests.
    if let Some(target) = option_env!("CARGO_TARGET_TMPDIR").and_then(|tmp| Path::new(tmp).parent())
    {
        return target.join("cuda-headers-cache");
    }
    // Fallback: the test executable is `<target>/<profile>/deps/abi-<hash>`.
    let exe = std::env::current_exe().expect("path of the test executable");
    let target = exe.ancestors().nth(3).unwrap_or(Path::new("."));
    target.join("cuda-headers-cache")
}

fn from_wheels() -> Result<RealHeaders, String> {
    let cache = cache_dir();
    let unpacked = cache.join("unpacked");
    let wheels = cache.join("wheels");
    let what = format!(
        "PyPI wheels {} cached in {}",
        WHEELS.join(", "),
        cache.display()
    );

    if let Some(h) = find_all(&unpacked) {
        return Ok(RealHeaders {
            origin: format!("{what} (cached)"),
            ..h
        });
    }

    std::fs::create_dir_all(&wheels)
        .map_err(|e| format!("{what}: cannot create {}: {e}", wheels.display()))?;
    let have = |prefix: &str| {
        wheel_files(&wheels)
            .iter()
            .any(|w| file_name(w).starts_with(prefix))
    };
    // "nvidia-cuda-cupti" is the wheel file nvidia_cuda_cupti-<version>-...
    if !WHEELS
        .iter()
        .all(|w| have(&format!("{}-", w.replace('-', "_"))))
    {
        let mut args: Vec<String> = [
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(wheels.display().to_string());
        args.extend(WHEELS.iter().map(|s| s.to_string()));
        let shown = format!("python3 {}", args.join(" "));
        let out = Command::new("python3")
            .args(&args)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .output()
            .map_err(|e| format!("{what}: cannot run `{shown}`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{what}: `{shown}` failed ({}):\n{}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr), 12)
            ));
        }
    }

    // Unpack into a private directory, then move it into place, so that an
    // interrupted run never leaves a half-unpacked cache behind.
    let staging = cache.join(format!("unpacked.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let script = "import sys, zipfile\nfor w in sys.argv[2:]:\n    zipfile.ZipFile(w).extractall(sys.argv[1])\n";
    let whl = wheel_files(&wheels);
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&staging)
        .args(&whl)
        .output()
        .map_err(|e| format!("{what}: cannot run python3 to unpack the wheels: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: unpacking {} with python3 zipfile failed:\n{}",
            whl.iter()
                .map(|w| file_name(w))
                .collect::<Vec<_>>()
                .join(", "),
            tail(&String::from_utf8_lossy(&out.stderr), 12)
        ));
    }
    if find_all(&staging).is_none() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "{what}: the unpacked wheels do not hold all of {}",
            NEEDED.join(", ")
        ));
    }
    let _ = std::fs::remove_dir_all(&unpacked);
    if std::fs::rename(&staging, &unpacked).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    find_all(&unpacked)
        .map(|h| RealHeaders {
            origin: format!("{what} (downloaded)"),
            ..h
        })
        .ok_or_else(|| {
            format!(
                "{what}: cannot move the unpacked wheels to {}",
                unpacked.display()
            )
        })
}

fn wheel_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    v.sort();
    v
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn find_all(root: &Path) -> Option<RealHeaders> {
    let cuda_h = find_file(root, "cuda.h")?;
    let nvml_h = find_file(root, "nvml.h")?;
    let cupti_h = find_file(root, "cupti.h")?;
    Some(RealHeaders {
        cuda_h,
        nvml_h,
        cupti_h,
        origin: String::new(),
    })
}

/// Finds `name` under `root` (today: `nvidia/cu13/include/<name>`),
/// preferring a copy in a directory called `include`.
fn find_file(root: &Path, name: &str) -> Option<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() && entry.file_name() == name {
                found.push(p);
            }
        }
    }
    found.sort_by_key(|p| {
        (
            p.parent()
                .and_then(|d| d.file_name())
                .is_none_or(|d| d != "include"),
            p.clone(),
        )
    });
    found.into_iter().next()
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.trim_end().lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}
