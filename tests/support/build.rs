//! With the `containerd` feature, compiles the CRI API subset
//! (`proto/cri-api-v1-subset.proto`) into a tonic client for the containerd
//! runner. `protox` parses the proto in pure Rust, so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "containerd")]
    {
        let proto = "proto/cri-api-v1-subset.proto";
        println!("cargo:rerun-if-changed={proto}");
        let descriptors = protox::compile([proto], ["proto"])?;
        tonic_prost_build::configure()
            .build_server(false)
            .build_transport(false)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
