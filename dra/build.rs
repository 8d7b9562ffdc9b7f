//! Compiles the kubelet's gRPC definitions in proto/ (written for cuslice,
//! see their headers) with protox, a protobuf compiler in Rust, so that no
//! `protoc` is needed; tonic-prost-build turns them into messages, servers
//! and clients. The file descriptor set is kept too: tests/wire.rs reads the
//! field numbers and method paths from it.
//!
//! (NVML's declarations are the host file layer's: host/build.rs.)

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
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
