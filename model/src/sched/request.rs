//! What a pod asks for: per container the number of GPUs, memory and cores,
//! from its resource limits (requests where a limit is absent), and per pod
//! the mode, type and uuid filters and policies from its annotations.
//!
//! Input is plain data (names and quantity strings), so this stays pure; the
//! extender copies it out of the Kubernetes Pod.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::config::NvidiaConfig;

/// binpack or spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Fill the most used first (fewer, fuller nodes or GPUs).
    #[default]
    Binpack,
    /// Fill the least used first.
    Spread,
}

/// The pod's `nvidia.com/vgpu-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ModeRequest {
    /// No annotation: the unified pool, a share slice or a MIG instance.
    #[default]
    Any,
    /// `share` (or `hami-core`): vGPU slices of whole GPUs only.
    Share,
    /// `mig`: MIG instances only.
    Mig,
}

/// Memory per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryRequest {
    /// MiB (already multiplied by `memoryFactor`).
    Mib(u64),
    /// Percent of the GPU's memory, 1..=100.
    Percent(u32),
    /// The whole GPU's memory (`defaultMemory: 0` and nothing named).
    Whole,
}

/// One container's ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRequest {
    /// Position in `initContainers ++ containers` (the allocation's index).
    pub index: u32,
    /// Container name.
    pub name: String,
    /// An init container (runs alone, before the regular containers).
    pub init: bool,
    /// Number of devices (GPUs or MIG instances), ≥ 1.
    pub count: u32,
    /// Memory per device.
    pub memory: MemoryRequest,
    /// SM share per device, percent 0..=100 (100 = a whole GPU to itself).
    pub cores: u32,
}

/// The whole pod's ask; only containers that want a GPU are listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRequest {
    /// Containers asking for GPUs, init containers first.
    pub containers: Vec<ContainerRequest>,
    /// Share, MIG or either.
    pub mode: ModeRequest,
    /// `nvidia.com/use-gputype`: only GPUs whose model matches one of these.
    pub use_types: Vec<String>,
    /// `nvidia.com/nouse-gputype`: never GPUs whose model matches one of these.
    pub nouse_types: Vec<String>,
    /// `nvidia.com/use-gpuuuid`: only these GPUs.
    pub use_uuids: Vec<String>,
    /// `nvidia.com/nouse-gpuuuid`: never these GPUs.
    pub nouse_uuids: Vec<String>,
    /// `tessera.io/gpu-policy`, else the config's default.
    pub gpu_policy: Option<Policy>,
    /// `tessera.io/node-policy`, else the config's default.
    pub node_policy: Option<Policy>,
}

/// One container's resources as written in the pod (quantity strings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// Container name.
    pub name: String,
    /// `resources.limits`.
    pub limits: BTreeMap<String, String>,
    /// `resources.requests`.
    pub requests: BTreeMap<String, String>,
}

/// Why a pod's ask could not be read. Each names the container and field or
/// the annotation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// A resource quantity that is not a whole non-negative number, or out of range.
    #[error("container {container:?}: {resource}: {problem}")]
    Resource {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// What is wrong.
        problem: String,
    },
    /// An annotation with a value outside its set.
    #[error("annotation {key}: {problem}")]
    Annotation {
        /// Annotation key.
        key: String,
        /// What is wrong.
        problem: String,
    },
}

impl PodRequest {
    /// Reads a pod's ask; `Ok(None)` when no container wants a GPU.
    ///
    /// Per container: the count resource; memory from the memory resource ×
    /// `memoryFactor`, else the percentage resource, else `defaultMemory`
    /// (0 = [`MemoryRequest::Whole`]); cores from the core resource, else
    /// `defaultCores`; a container naming memory or cores but no count gets
    /// `defaultGPUNum` (0: it asks for none). Limits win over requests.
    /// Quantities are Kubernetes quantities that must be whole numbers
    /// (`8000`, `8k`, `1Ki`; `0.5` or `-1` refused); count ≤ 64, cores ≤ 100,
    /// percentage 1..=100. Annotations: `nvidia.com/vgpu-mode` share | mig |
    /// hami-core (= share), the type and uuid lists comma-separated (blanks
    /// trimmed, empty items dropped), policies binpack | spread.
    pub fn from_pod(
        init_containers: &[ContainerResources],
        containers: &[ContainerResources],
        annotations: &BTreeMap<String, String>,
        config: &NvidiaConfig,
    ) -> Result<Option<PodRequest>, RequestError> {
        let _ = (init_containers, containers, annotations, config);
        todo!()
    }
}
