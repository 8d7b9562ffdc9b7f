//! Compiles the kubelet's gRPC definitions in proto/ (written for cuslice,
//! see their headers) with protox, a protobuf compiler in Rust, so that no
//! `protoc` is needed; tonic-prost-build turns them into messages, servers
//! and clients. The file descriptor set is kept too: tests/wire.rs reads the
//! field numbers and method paths from it.
//!
//! Also generates NVML's declarations for src/gpus.rs from cuda-headers/
//! (cuslice_nvml_host.h and the shim's cuslice_nvml.h, ABI-checked against
//! NVIDIA's nvml.h by hookgen/tests/abi.rs), as cli/build.rs does for the
//! command: each function a function-pointer type of its own name.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let headers =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../cuda-headers");
    for h in ["cuslice_nvml.h", "cuslice_nvml_host.h"] {
        println!("cargo:rerun-if-changed={}", headers.join(h).display());
    }
    let nvml = hookgen::loader_bindings(&headers.join("cuslice_nvml_host.h"))
        .map_err(|e| format!("NVML declarations: {e}"))?;
    std::fs::write(out.join("nvml_sys.rs"), nvml)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
