//! The kubelet gRPC APIs, compiled from the workspace's `proto/kubelet/`, the
//! same files the kubelet stand-in (`tessera-kube-proto`) compiles (names and
//! field numbers are upstream's).

/// The device plugin API (`proto/kubelet/deviceplugin-v1beta1.proto`).
pub mod deviceplugin {
    /// Package `v1beta1`: services `Registration` (kubelet's) and
    /// `DevicePlugin` (ours).
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
}

/// The PodResources API (`proto/kubelet/podresources-v1.proto`).
pub mod podresources {
    /// Package `v1`: service `PodResourcesLister` (kubelet's).
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}
