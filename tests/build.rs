//! Compiles the CRI API subset (`proto/cri-api-v1-subset.proto`) into a tonic
//! client for the containerd end-to-end tests. `protox` parses the proto in
//! pure Rust, so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/cri-api-v1-subset.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
