//! Compiles CRI (`proto/cri-api-v1-subset.proto`, the stand-in's own) and the
//! two kubelet APIs the device plugin shares (`../../../proto/kubelet/`) into
//! tonic clients and servers.

include!("../../../proto/build_protos.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    compile_protos(
        &[
            "proto/cri-api-v1-subset.proto",
            "../../../proto/kubelet/deviceplugin-v1beta1.proto",
            "../../../proto/kubelet/podresources-v1.proto",
        ],
        &["proto", "../../../proto/kubelet"],
    )
}
