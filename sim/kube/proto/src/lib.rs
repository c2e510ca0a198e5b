//! The Kubernetes gRPC APIs the simulated cluster speaks, compiled from the
//! protos in `proto/` (names and field numbers are upstream's; each file says
//! which fields it keeps). Clients and servers both: the kubelet stand-in
//! serves Registration and PodResources and calls device plugins and CRI; the
//! tests serve a device plugin.

/// CRI, package `runtime.v1` (`proto/cri-api-v1-subset.proto`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}
