//! GPU inventory: what the driver reports about whole GPUs and MIG devices.

use serde::{Deserialize, Serialize};

use crate::mig::Placement;

/// MIG mode of one GPU: the mode in force and the one pending a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigModeState {
    /// Whether MIG is enabled now.
    pub current: bool,
    /// Whether MIG will be enabled after the next reset (equal to `current` when nothing is pending).
    pub pending: bool,
}

/// One physical GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML index (enumeration order), the `<index>` in CDI device names.
    pub index: u32,
    /// Minor number of `/dev/nvidia<minor>`; not always equal to the index.
    pub minor: u32,
    /// `GPU-…` uuid.
    pub uuid: String,
    /// Product name as NVML reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total framebuffer memory in MiB.
    pub memory_mib: u64,
    /// MIG mode; `None` when the GPU does not support MIG.
    pub mig: Option<MigModeState>,
}

impl GpuInfo {
    /// True when MIG is enabled now, so the GPU is only handed out as MIG devices.
    pub fn mig_enabled(&self) -> bool {
        self.mig.is_some_and(|m| m.current)
    }
}

/// A GPU-instance profile as the driver reports it for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstanceProfileInfo {
    /// Device profile id (19, 14, 9, 0 …): what every other MIG call takes.
    pub id: u32,
    /// NVML profile enum index (`NVML_GPU_INSTANCE_PROFILE_*`) it was queried with.
    pub enum_index: u32,
    /// Profile name, e.g. `1g.10gb` (derived when the driver does not report one).
    pub name: String,
    /// Compute slices (the `Ng` of the name).
    pub slice_count: u32,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub multiprocessor_count: u32,
    /// Most instances of this profile the GPU can hold.
    pub instance_count: u32,
}

/// A GPU instance (GI) that exists on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstance {
    /// Index of the parent GPU.
    pub gpu_index: u32,
    /// Driver-assigned GI id (not the placement start).
    pub id: u32,
    /// Device profile id of the GI.
    pub profile_id: u32,
    /// Where the GI sits on the memory-slice axis.
    pub placement: Placement,
}

/// A compute instance (CI) inside a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeInstance {
    /// Index of the parent GPU.
    pub gpu_index: u32,
    /// Id of the GI that holds this CI.
    pub gpu_instance_id: u32,
    /// Driver-assigned CI id, unique within its GI.
    pub id: u32,
    /// Compute-instance profile id.
    pub profile_id: u32,
}

/// A MIG device: one ⟨GI, CI⟩ pair that a workload can be given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    /// Index of the parent GPU.
    pub parent_index: u32,
    /// Slot index under the parent (`nvmlDeviceGetMigDeviceHandleByIndex`), the
    /// `<mig-index>` in CDI device names.
    pub mig_index: u32,
    /// GPU-instance id.
    pub gpu_instance_id: u32,
    /// Compute-instance id.
    pub compute_instance_id: u32,
    /// GI profile name, e.g. `3g.40gb` (empty when the driver could not say).
    pub profile: String,
    /// Placement of the GI.
    pub placement: Placement,
    /// `MIG-…` uuid.
    pub uuid: String,
    /// Memory of the device in MiB.
    pub memory_mib: u64,
}
