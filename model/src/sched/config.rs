//! The cluster configuration file: one YAML (or JSON) document in the shape
//! of HAMi's device ConfigMap, so users can bring theirs, plus HAMi's
//! `nodeconfig` list. Read by the scheduler extender and the device plugin,
//! strictly: an unknown field or a bad value is one error naming the field,
//! and the component refuses to start rather than guess.
//!
//! ```yaml
//! nvidia:
//!   resourceCountName: nvidia.com/gpu
//!   resourceMemoryName: nvidia.com/gpumem
//!   resourceMemoryPercentageName: nvidia.com/gpumem-percentage
//!   resourceCoreName: nvidia.com/gpucores
//!   defaultMemory: 0          # MiB a container gets when it names no memory; 0 = the whole GPU
//!   defaultCores: 0           # percent when it names no cores
//!   defaultGPUNum: 1          # GPUs when it names memory or cores but no count
//!   memoryFactor: 1           # a gpumem of N means N × memoryFactor MiB
//!   deviceSplitCount: 10      # most slices on one GPU
//!   deviceMemoryScaling: 1    # > 1 = oversubscription
//!   deviceCoreScaling: 1
//!   migProfileAllowlist:
//!     - models: ["A100-SXM4-40GB"]
//!       profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
//! scheduler:
//!   nodeSchedulerPolicy: binpack   # binpack | spread
//!   gpuSchedulerPolicy: spread     # binpack | spread
//! nodeconfig:
//!   - name: gpu-node-1
//!     operatingmode: mig           # hami-core | share | mig (absent: each GPU by its MIG mode)
//!     devicesplitcount: 4
//!     devicememoryscaling: 1.5
//!     devicecorescaling: 1
//!     filterdevices: {uuid: [], index: [3]}   # GPUs never handed out
//! ```
//!
//! HAMi fields Tessera does not use (`resourcePriorityName`, `overwriteEnv`,
//! `disableCoreLimit`, `gpuCorePolicy`, `runtimeClassName`, and per node
//! `migstrategy`, `preConfiguredDeviceMemory`, `libCudaLogLevel`) are accepted
//! and reported by [`ClusterConfig::ignored_fields`]; HAMi's older
//! `knownMigGeometries` is refused with a message saying to list the profile
//! names under `migProfileAllowlist`.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::request::Policy;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Resource names, defaults, scaling and the MIG allowlist.
    #[serde(default)]
    pub nvidia: NvidiaConfig,
    /// Default node- and GPU-level policies.
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// Per-node overrides.
    #[serde(default)]
    pub nodeconfig: Vec<NodeConfig>,
}

/// The `nvidia:` section (HAMi's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NvidiaConfig {
    /// Resource counting GPUs (slices), default `nvidia.com/gpu`.
    pub resource_count_name: String,
    /// Resource of memory per GPU, default `nvidia.com/gpumem`.
    pub resource_memory_name: String,
    /// Resource of memory as percent of a GPU, default `nvidia.com/gpumem-percentage`.
    pub resource_memory_percentage_name: String,
    /// Resource of SM share per GPU, default `nvidia.com/gpucores`.
    pub resource_core_name: String,
    /// MiB per GPU when a container names none; 0 = the whole GPU's memory.
    #[serde(rename = "defaultMemory")]
    pub default_memory: u64,
    /// Percent per GPU when a container names none.
    pub default_cores: u32,
    /// GPUs when a container names memory or cores but no count (0: such a
    /// container asks for no GPU).
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: u32,
    /// Unit of the memory resource in MiB (HAMi's `memoryFactor`), ≥ 1.
    pub memory_factor: u64,
    /// Most slices on one share GPU, ≥ 1.
    pub device_split_count: u32,
    /// Memory scaling of share GPUs, > 0 (> 1 oversubscribes).
    pub device_memory_scaling: f64,
    /// Core scaling of share GPUs, > 0.
    pub device_core_scaling: f64,
    /// Which MIG profiles may be created, per model.
    pub mig_profile_allowlist: Vec<MigAllowlistEntry>,
    /// Accepted from HAMi, unused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_priority_name: Option<String>,
    /// Accepted from HAMi, unused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overwrite_env: Option<bool>,
    /// Accepted from HAMi, unused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_core_limit: Option<bool>,
    /// Accepted from HAMi, unused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_core_policy: Option<String>,
    /// Accepted from HAMi, unused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// HAMi's older MIG format: refused by [`ClusterConfig::parse`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_mig_geometries: Option<serde_json::Value>,
}

/// One `migProfileAllowlist` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigAllowlistEntry {
    /// Model names, matched by [`super::gpu_type`]'s rule.
    pub models: Vec<String>,
    /// Profile names allowed on those models, e.g. `1g.5gb`.
    pub profiles: Vec<String>,
}

/// The `scheduler:` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SchedulerConfig {
    /// Node-level policy when a pod names none (default binpack).
    pub node_scheduler_policy: Policy,
    /// GPU-level policy when a pod names none (default spread).
    pub gpu_scheduler_policy: GpuPolicyDefault,
}

/// GPU-level default policy; a newtype so its default is `spread`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuPolicyDefault(pub Policy);

impl Default for GpuPolicyDefault {
    fn default() -> Self {
        GpuPolicyDefault(Policy::Spread)
    }
}

/// How a node's GPUs may be handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperatingMode {
    /// Only vGPU slices (share GPUs); MIG GPUs of the node are not used.
    #[serde(alias = "hami-core")]
    Share,
    /// Only MIG instances; share GPUs of the node are not used.
    Mig,
}

/// One `nodeconfig` entry (HAMi's lower-case keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Node name, exactly as `kubectl get node` shows it.
    pub name: String,
    /// Restrict the node to one mode; absent: each GPU by its MIG mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operatingmode: Option<OperatingMode>,
    /// Overrides `deviceSplitCount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devicesplitcount: Option<u32>,
    /// Overrides `deviceMemoryScaling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devicememoryscaling: Option<f64>,
    /// Overrides `deviceCoreScaling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devicecorescaling: Option<f64>,
    /// GPUs of the node never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filterdevices: Option<FilterDevices>,
    /// Accepted from HAMi, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migstrategy: Option<String>,
    /// Accepted from HAMi, unused.
    #[serde(
        default,
        rename = "preConfiguredDeviceMemory",
        alias = "preconfigureddevicememory",
        skip_serializing_if = "Option::is_none"
    )]
    pub preconfigured_device_memory: Option<i64>,
    /// Accepted from HAMi, unused.
    #[serde(
        default,
        rename = "libCudaLogLevel",
        alias = "libcudaloglevel",
        skip_serializing_if = "Option::is_none"
    )]
    pub lib_cuda_log_level: Option<serde_json::Value>,
}

/// GPUs excluded on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FilterDevices {
    /// By uuid.
    pub uuid: Vec<String>,
    /// By NVML index.
    pub index: Vec<u32>,
}

/// The settings in force on one node: the `nvidia:` values with its
/// `nodeconfig` entry applied.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// Restriction of the node's mode, if any.
    pub operating_mode: Option<OperatingMode>,
    /// Most slices on one share GPU.
    pub split_count: u32,
    /// Memory scaling of share GPUs.
    pub memory_scaling: f64,
    /// Core scaling of share GPUs.
    pub core_scaling: f64,
    /// Excluded GPUs.
    pub filter: FilterDevices,
}

/// Why a configuration file was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// Not YAML/JSON of this shape (the parser's message names the field and line).
    #[error("cluster config: {0}")]
    Malformed(String),
    /// A field holds a value the rules forbid.
    #[error("cluster config: {field}: {problem}")]
    Invalid {
        /// Path of the field, e.g. `nvidia.deviceMemoryScaling` or `nodeconfig[2].name`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl Default for NvidiaConfig {
    fn default() -> Self {
        todo!(
            "HAMi's defaults: the contract's resource names, defaultMemory 0, defaultCores 0, defaultGPUNum 1, memoryFactor 1, deviceSplitCount 10, scaling 1.0, allowlist: every catalogue MIG model with all its profiles"
        )
    }
}

impl ClusterConfig {
    /// Parses and validates a YAML or JSON document.
    pub fn parse(text: &str) -> Result<ClusterConfig, ConfigError> {
        let _ = text;
        todo!()
    }

    /// Checks the rules serde cannot: scaling > 0 and finite, split count ≥ 1,
    /// memoryFactor ≥ 1, cores ≤ 100, distinct resource names, node names
    /// unique and non-empty, allowlist entries with models and profiles, no
    /// `knownMigGeometries`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        todo!()
    }

    /// The dotted paths of HAMi fields that were given but have no effect here.
    pub fn ignored_fields(&self) -> Vec<String> {
        todo!()
    }

    /// The settings in force on `node`.
    pub fn node_settings(&self, node: &str) -> NodeSettings {
        let _ = node;
        todo!()
    }

    /// The profile names allowed on a GPU whose product name is `model`: the
    /// most specific matching allowlist entry's (see [`super::gpu_type`]), or
    /// `None` when no entry matches (no MIG profile may be created on it).
    pub fn allowed_profiles(&self, model: &str) -> Option<&[String]> {
        let _ = model;
        todo!()
    }
}
