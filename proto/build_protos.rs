// The body both build scripts that compile protos share (`sim/kube/proto` and
// `plugin/`), pulled in with `include!`: it compiles the given `.proto` files
// into tonic clients and servers. `protox` parses the protos in pure Rust, so
// the build needs no `protoc`.

/// Compiles `protos` (each found under one of `includes`) into tonic clients
/// and servers in `OUT_DIR`, and reruns the build when any of them changes
/// (a change to this file rebuilds, and so reruns, the build script itself).
fn compile_protos(protos: &[&str], includes: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, includes)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
