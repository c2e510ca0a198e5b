//! Compiles the kubelet APIs the plugin speaks (device plugin v1beta1,
//! PodResources v1), the same files the kubelet stand-in compiles
//! (`../proto/kubelet/`), into tonic clients and servers.

include!("../proto/build_protos.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    compile_protos(
        &[
            "../proto/kubelet/deviceplugin-v1beta1.proto",
            "../proto/kubelet/podresources-v1.proto",
        ],
        &["../proto/kubelet"],
    )
}
