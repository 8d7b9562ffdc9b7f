//! Generates the hook table from cuda-headers/ (see hookgen/).

use std::path::PathBuf;

fn main() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let headers = [
        hookgen::Header {
            path: root.join("cuda-headers/cuslice_cuda.h"),
            lib: hookgen::Lib::Cuda,
            module: "cuda".into(),
        },
        hookgen::Header {
            path: root.join("cuda-headers/cuslice_nvml.h"),
            lib: hookgen::Lib::Nvml,
            module: "nvml".into(),
        },
    ];
    for h in &headers {
        println!("cargo:rerun-if-changed={}", h.path.display());
    }
    let generated = match hookgen::generate(&headers) {
        Ok(g) => g,
        Err(e) => {
            // One line naming the header and declaration at fault.
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    std::fs::write(out.join("sys.rs"), generated.sys).expect("write sys.rs");
    std::fs::write(out.join("hooks.rs"), generated.hooks).expect("write hooks.rs");
}
