//! Compiles the kubelet APIs in `proto/` (device plugin v1beta1, PodResources
//! v1) into tonic clients and servers. `protox`
//! parses the protos in pure Rust, so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto");
    let mut protos: Vec<String> = std::fs::read_dir("proto")?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .map(|p| p.display().to_string())
        .collect();
    protos.sort();
    let descriptors = protox::compile(&protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
