//! Host facts found by discovery, the input of the pure edits layer.

use serde::{Deserialize, Serialize};

use crate::gpu::{GpuInfo, MigDevice};

/// A character device node: where it is on the host and where it goes in a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CharDevice {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub container_path: String,
    /// Path on the host; differs from `container_path` when the driver root is not `/`.
    pub host_path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// A host file (driver library or tool) that containers get as a read-only bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFile {
    /// Path on the host.
    pub host_path: String,
    /// Path inside the container.
    pub container_path: String,
}

/// A MIG device with the two capability nodes that grant access to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDeviceFacts {
    /// The MIG device as the driver reports it.
    pub device: MigDevice,
    /// `nvidia-cap<A>` for `gpu<minor>/gi<G>/access`.
    pub gi_cap: CharDevice,
    /// `nvidia-cap<B>` for `gpu<minor>/gi<G>/ci<C>/access`.
    pub ci_cap: CharDevice,
}

/// One GPU with its device node and MIG devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFacts {
    /// What the driver says about the GPU.
    pub info: GpuInfo,
    /// `/dev/nvidia<minor>`.
    pub node: CharDevice,
    /// Existing MIG devices, in MIG-index order (empty unless MIG is enabled).
    pub mig_devices: Vec<MigDeviceFacts>,
}

/// Everything discovery found on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    /// Driver version string, when known.
    pub driver_version: Option<String>,
    /// GPUs in index order.
    pub gpus: Vec<GpuFacts>,
    /// Nodes every GPU container needs: `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`.
    pub control_nodes: Vec<CharDevice>,
    /// Driver libraries and tools to bind read-only into containers.
    pub libraries: Vec<HostFile>,
}
