//! The host side's NVML declarations, generated from cuda-headers/ (the
//! shim's cuslice_nvml.h and cuslice_nvml_host.h, both ABI-checked against
//! NVIDIA's nvml.h by hookgen/tests/abi.rs): types, and each function as a
//! function-pointer type for what `dlsym` finds (src/nvml.rs, the NVML
//! loader the command and the DRA plugin share).

use std::path::PathBuf;

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = manifest.join("../cuda-headers");
    let dir = dir.canonicalize().unwrap_or(dir);
    for h in ["cuslice_nvml.h", "cuslice_nvml_host.h"] {
        println!("cargo:rerun-if-changed={}", dir.join(h).display());
    }
    match hookgen::loader_bindings(&dir.join("cuslice_nvml_host.h")) {
        Ok(rs) => std::fs::write(out.join("nvml_sys.rs"), rs).expect("write nvml_sys.rs"),
        Err(e) => {
            // One line naming the header and declaration at fault.
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
