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

use super::gpu_type;
use super::request::Policy;
use crate::contract::resources;
use crate::mig::catalogue;

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

impl FilterDevices {
    /// Whether the GPU with `index` and `uuid` is filtered out. A `uuid`
    /// entry is compared without surrounding blanks, and one that is a bare
    /// number names an index (HAMi's lists mix the two); the extender and the
    /// device plugin both ask here, so they never disagree on a GPU.
    pub fn excludes(&self, index: u32, uuid: &str) -> bool {
        self.index.contains(&index)
            || self
                .uuid
                .iter()
                .map(|f| f.trim())
                .any(|f| f == uuid || f.parse::<u32>().is_ok_and(|i| i == index))
    }
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
    /// HAMi's defaults: the contract's resource names, `defaultMemory` 0 (the
    /// whole GPU), `defaultCores` 0, `defaultGPUNum` 1, `memoryFactor` 1,
    /// `deviceSplitCount` 10, scaling 1, and [`default_mig_allowlist`].
    fn default() -> Self {
        NvidiaConfig {
            resource_count_name: resources::GPU.to_owned(),
            resource_memory_name: resources::GPU_MEMORY.to_owned(),
            resource_memory_percentage_name: resources::GPU_MEMORY_PERCENTAGE.to_owned(),
            resource_core_name: resources::GPU_CORES.to_owned(),
            default_memory: 0,
            default_cores: 0,
            default_gpu_num: 1,
            memory_factor: 1,
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            mig_profile_allowlist: default_mig_allowlist(),
            resource_priority_name: None,
            overwrite_env: None,
            disable_core_limit: None,
            gpu_core_policy: None,
            runtime_class_name: None,
            known_mig_geometries: None,
        }
    }
}

/// The allowlist in force when the file names none: for every MIG-capable
/// model of the catalogue, one entry naming the model by its product name
/// without `NVIDIA ` and listing its plain profiles. Variants whose name has
/// a `+` or `-` suffix (`+me`, `+me.all`, `+gfx`, `-me`) are left out: they
/// hold engines a GPU has one of (media engines, graphics) or drop them,
/// which only workloads that know they need them should ask for, and an
/// operator lists them explicitly.
pub fn default_mig_allowlist() -> Vec<MigAllowlistEntry> {
    catalogue::models()
        .iter()
        .filter_map(|model| {
            let mig = model.mig?;
            let name = model
                .product_name
                .strip_prefix("NVIDIA ")
                .unwrap_or(model.product_name);
            Some(MigAllowlistEntry {
                models: vec![name.to_owned()],
                profiles: mig
                    .profiles
                    .iter()
                    .filter(|p| !p.name.contains(['+', '-']))
                    .map(|p| p.name.to_owned())
                    .collect(),
            })
        })
        .collect()
}

/// A complete cluster configuration file, commented, that a user can copy;
/// every field appears with its default or an example value.
pub const EXAMPLE: &str = r#"# Tessera cluster configuration (/etc/tessera/cluster.yaml).
# The shape of HAMi's device ConfigMap: a HAMi user's `nvidia:` section works as is.
nvidia:
  # Extended resource names pods ask for.
  resourceCountName: nvidia.com/gpu                           # devices (GPU slices or MIG instances)
  resourceMemoryName: nvidia.com/gpumem                       # memory per device, in units of memoryFactor MiB
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage  # memory per device, percent of the GPU
  resourceCoreName: nvidia.com/gpucores                       # SM share per device, percent (100 = exclusive)
  defaultMemory: 0          # MiB when a container names no memory; 0 = the whole GPU
  defaultCores: 0           # percent when a container names no cores (0..100)
  defaultGPUNum: 1          # devices when a container names memory or cores but no count
  memoryFactor: 1           # a gpumem of N means N x memoryFactor MiB
  deviceSplitCount: 10      # most slices on one share GPU
  deviceMemoryScaling: 1    # > 1 oversubscribes memory of share GPUs
  deviceCoreScaling: 1      # > 1 oversubscribes cores of share GPUs
  # MIG profiles that may be created, per GPU model. Model names match NVML's
  # product names token by token ("A100" matches "NVIDIA A100-SXM4-40GB");
  # the most specific matching entry wins. A model no entry matches gets no
  # MIG instances. Leaving the list out allows the plain profiles of every
  # model Tessera knows.
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB", "A100-PCIE-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    - models: ["H100"]
      profiles: ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]
    - models: ["A30"]
      profiles: ["1g.6gb", "2g.12gb", "4g.24gb"]
scheduler:
  nodeSchedulerPolicy: binpack   # among nodes: binpack | spread (pod annotation tessera.io/node-policy)
  gpuSchedulerPolicy: spread     # among a node's GPUs: binpack | spread (pod annotation tessera.io/gpu-policy)
nodeconfig:
  - name: gpu-node-1
    operatingmode: mig           # share (or hami-core) | mig; absent: each GPU by its MIG mode
    devicesplitcount: 4          # overrides deviceSplitCount on this node
    devicememoryscaling: 1.5     # overrides deviceMemoryScaling
    devicecorescaling: 1         # overrides deviceCoreScaling
    filterdevices:               # GPUs of this node never handed out
      uuid: ["GPU-00000000-0000-0000-0000-000000000003"]
      index: [3]
"#;

impl ClusterConfig {
    /// Parses and validates a YAML or JSON document. An empty document (or
    /// one of comments only) is the defaults.
    pub fn parse(text: &str) -> Result<ClusterConfig, ConfigError> {
        let blank = text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        let config = if blank {
            ClusterConfig::default()
        } else {
            serde_yaml::from_str::<ClusterConfig>(text)
                .map_err(|e| ConfigError::Malformed(one_line(&e.to_string())))?
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules serde cannot: scaling > 0 and finite, split count ≥ 1,
    /// memoryFactor ≥ 1, cores ≤ 100, distinct resource names, node names
    /// unique and non-empty, allowlist entries with models and profiles, no
    /// `knownMigGeometries`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: String, problem: String| ConfigError::Invalid { field, problem };
        let n = &self.nvidia;
        if n.known_mig_geometries.is_some() {
            return Err(invalid(
                "nvidia.knownMigGeometries".into(),
                "HAMi's older MIG format is not read; list the profile names per model under nvidia.migProfileAllowlist instead".into(),
            ));
        }
        let names = [
            ("nvidia.resourceCountName", &n.resource_count_name),
            ("nvidia.resourceMemoryName", &n.resource_memory_name),
            (
                "nvidia.resourceMemoryPercentageName",
                &n.resource_memory_percentage_name,
            ),
            ("nvidia.resourceCoreName", &n.resource_core_name),
        ];
        for (i, (field, name)) in names.iter().enumerate() {
            if name.trim().is_empty() || name.contains(char::is_whitespace) {
                return Err(invalid(
                    (*field).into(),
                    format!("{name:?} is not a resource name"),
                ));
            }
            if let Some((other, _)) = names[..i].iter().find(|(_, o)| o == name) {
                return Err(invalid(
                    (*field).into(),
                    format!("{name:?} is also {other}"),
                ));
            }
        }
        if n.default_cores > 100 {
            return Err(invalid(
                "nvidia.defaultCores".into(),
                format!("{} is over 100", n.default_cores),
            ));
        }
        if n.default_gpu_num > super::request::MAX_COUNT {
            return Err(invalid(
                "nvidia.defaultGPUNum".into(),
                format!(
                    "{} is over {}",
                    n.default_gpu_num,
                    super::request::MAX_COUNT
                ),
            ));
        }
        if n.memory_factor == 0 {
            return Err(invalid("nvidia.memoryFactor".into(), "0 is not ≥ 1".into()));
        }
        check_split("nvidia.deviceSplitCount", n.device_split_count)?;
        check_scaling("nvidia.deviceMemoryScaling", n.device_memory_scaling)?;
        check_scaling("nvidia.deviceCoreScaling", n.device_core_scaling)?;
        for (i, entry) in n.mig_profile_allowlist.iter().enumerate() {
            let at = |f: &str| format!("nvidia.migProfileAllowlist[{i}].{f}");
            if entry.models.is_empty() {
                return Err(invalid(at("models"), "empty".into()));
            }
            if entry.profiles.is_empty() {
                return Err(invalid(at("profiles"), "empty".into()));
            }
            for (k, model) in entry.models.iter().enumerate() {
                let meaningful = model
                    .split([' ', '-', '_', '\t'])
                    .any(|t| !t.is_empty() && !t.eq_ignore_ascii_case("NVIDIA"));
                if !meaningful {
                    return Err(invalid(
                        at(&format!("models[{k}]")),
                        format!("{model:?} names no GPU model"),
                    ));
                }
            }
            for (k, profile) in entry.profiles.iter().enumerate() {
                if profile.trim().is_empty() {
                    return Err(invalid(at(&format!("profiles[{k}]")), "empty".into()));
                }
            }
        }
        for (i, node) in self.nodeconfig.iter().enumerate() {
            let at = |f: &str| format!("nodeconfig[{i}].{f}");
            if node.name.trim().is_empty() {
                return Err(invalid(at("name"), "empty".into()));
            }
            if self.nodeconfig[..i].iter().any(|o| o.name == node.name) {
                return Err(invalid(
                    at("name"),
                    format!("{:?} appears twice", node.name),
                ));
            }
            if let Some(split) = node.devicesplitcount {
                check_split(&at("devicesplitcount"), split)?;
            }
            if let Some(scaling) = node.devicememoryscaling {
                check_scaling(&at("devicememoryscaling"), scaling)?;
            }
            if let Some(scaling) = node.devicecorescaling {
                check_scaling(&at("devicecorescaling"), scaling)?;
            }
        }
        Ok(())
    }

    /// The dotted paths of HAMi fields that were given but have no effect here.
    pub fn ignored_fields(&self) -> Vec<String> {
        let n = &self.nvidia;
        let mut ignored = Vec::new();
        let top = [
            ("resourcePriorityName", n.resource_priority_name.is_some()),
            ("overwriteEnv", n.overwrite_env.is_some()),
            ("disableCoreLimit", n.disable_core_limit.is_some()),
            ("gpuCorePolicy", n.gpu_core_policy.is_some()),
            ("runtimeClassName", n.runtime_class_name.is_some()),
        ];
        ignored.extend(
            top.iter()
                .filter(|(_, given)| *given)
                .map(|(name, _)| format!("nvidia.{name}")),
        );
        for (i, node) in self.nodeconfig.iter().enumerate() {
            let fields = [
                ("migstrategy", node.migstrategy.is_some()),
                (
                    "preConfiguredDeviceMemory",
                    node.preconfigured_device_memory.is_some(),
                ),
                ("libCudaLogLevel", node.lib_cuda_log_level.is_some()),
            ];
            ignored.extend(
                fields
                    .iter()
                    .filter(|(_, given)| *given)
                    .map(|(name, _)| format!("nodeconfig[{i}].{name}")),
            );
        }
        ignored
    }

    /// The settings in force on `node`.
    pub fn node_settings(&self, node: &str) -> NodeSettings {
        let n = &self.nvidia;
        let entry = self.nodeconfig.iter().find(|c| c.name == node);
        NodeSettings {
            operating_mode: entry.and_then(|c| c.operatingmode),
            split_count: entry
                .and_then(|c| c.devicesplitcount)
                .unwrap_or(n.device_split_count),
            memory_scaling: entry
                .and_then(|c| c.devicememoryscaling)
                .unwrap_or(n.device_memory_scaling),
            core_scaling: entry
                .and_then(|c| c.devicecorescaling)
                .unwrap_or(n.device_core_scaling),
            filter: entry
                .and_then(|c| c.filterdevices.clone())
                .unwrap_or_default(),
        }
    }

    /// The profile names allowed on a GPU whose product name is `model`: the
    /// most specific matching allowlist entry's (see [`super::gpu_type`]), or
    /// `None` when no entry matches (no MIG profile may be created on it).
    /// Between equally specific entries the first wins.
    pub fn allowed_profiles(&self, model: &str) -> Option<&[String]> {
        allowed_profiles(&self.nvidia.mig_profile_allowlist, model)
    }
}

/// The profile names `allowlist` allows on a GPU whose product name is
/// `model`: the most specific matching entry's (see [`super::gpu_type`]), or
/// `None` when no entry matches (no MIG profile may be created on it).
/// Between equally specific entries the first wins. The one reading of
/// `migProfileAllowlist`, the extender's and the device plugin's.
pub fn allowed_profiles<'a>(
    allowlist: &'a [MigAllowlistEntry],
    model: &str,
) -> Option<&'a [String]> {
    let mut best: Option<(usize, &MigAllowlistEntry)> = None;
    for entry in allowlist {
        let score = entry
            .models
            .iter()
            .filter_map(|written| gpu_type::specificity(written, model))
            .max();
        if let Some(score) = score
            && best.is_none_or(|(b, _)| score > b)
        {
            best = Some((score, entry));
        }
    }
    best.map(|(_, entry)| entry.profiles.as_slice())
}

fn check_split(field: &str, split: u32) -> Result<(), ConfigError> {
    if split == 0 {
        return Err(ConfigError::Invalid {
            field: field.to_owned(),
            problem: "0 is not ≥ 1".into(),
        });
    }
    Ok(())
}

fn check_scaling(field: &str, scaling: f64) -> Result<(), ConfigError> {
    if !scaling.is_finite() || scaling <= 0.0 {
        return Err(ConfigError::Invalid {
            field: field.to_owned(),
            problem: format!("{scaling} is not > 0"),
        });
    }
    Ok(())
}

/// The parser's message on one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(text: &str) -> String {
        ClusterConfig::parse(text).expect_err(text).to_string()
    }

    #[test]
    fn defaults_are_hamis() {
        let n = NvidiaConfig::default();
        assert_eq!(n.resource_count_name, "nvidia.com/gpu");
        assert_eq!(n.resource_memory_name, "nvidia.com/gpumem");
        assert_eq!(
            n.resource_memory_percentage_name,
            "nvidia.com/gpumem-percentage"
        );
        assert_eq!(n.resource_core_name, "nvidia.com/gpucores");
        assert_eq!(
            (
                n.default_memory,
                n.default_cores,
                n.default_gpu_num,
                n.memory_factor
            ),
            (0, 0, 1, 1)
        );
        assert_eq!(n.device_split_count, 10);
        assert_eq!((n.device_memory_scaling, n.device_core_scaling), (1.0, 1.0));
        let config = ClusterConfig::default();
        assert_eq!(config.scheduler.node_scheduler_policy, Policy::Binpack);
        assert_eq!(config.scheduler.gpu_scheduler_policy.0, Policy::Spread);
        assert_eq!(ClusterConfig::parse("").expect("empty"), config);
        assert_eq!(
            ClusterConfig::parse("# only a comment\n").expect("comment"),
            config
        );
        assert_eq!(ClusterConfig::parse("{}").expect("empty map"), config);
        assert!(config.ignored_fields().is_empty());
    }

    #[test]
    fn the_default_allowlist_has_the_plain_profiles_of_every_mig_model() {
        let config = ClusterConfig::default();
        let allowed = |model: &str| config.allowed_profiles(model).map(<[String]>::to_vec);
        assert_eq!(
            allowed("NVIDIA A100-SXM4-40GB"),
            Some(
                [
                    "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!(
            allowed("NVIDIA A30"),
            Some(["1g.6gb", "2g.12gb", "4g.24gb"].map(String::from).to_vec())
        );
        assert_eq!(
            allowed("NVIDIA RTX PRO 6000 Blackwell Server Edition"),
            Some(["1g.24gb", "2g.48gb", "4g.96gb"].map(String::from).to_vec())
        );
        assert_eq!(allowed("NVIDIA H100 80GB HBM3").map(|p| p.len()), Some(6));
        // "H200" is the catalogue's name and matches the NVL board too.
        assert_eq!(
            allowed("NVIDIA H200 NVL").and_then(|p| p.last().cloned()),
            Some("7g.141gb".into())
        );
        assert_eq!(allowed("Tesla V100-SXM2-16GB"), None);
        assert_eq!(config.nvidia.mig_profile_allowlist.len(), 8);
    }

    #[test]
    fn the_most_specific_allowlist_entry_wins() {
        let config = ClusterConfig::parse(
            r#"
nvidia:
  migProfileAllowlist:
    - models: ["A100"]
      profiles: ["1g.5gb"]
    - models: ["H100", "A100-SXM4-80GB"]
      profiles: ["2g.20gb"]
    - models: ["A100 80GB"]
      profiles: ["3g.40gb"]
"#,
        )
        .expect("valid");
        let allowed = |model: &str| config.allowed_profiles(model).map(<[String]>::to_vec);
        assert_eq!(
            allowed("NVIDIA A100-SXM4-40GB"),
            Some(vec!["1g.5gb".into()])
        );
        assert_eq!(
            allowed("NVIDIA A100-SXM4-80GB"),
            Some(vec!["2g.20gb".into()])
        );
        assert_eq!(
            allowed("NVIDIA A100 80GB PCIe"),
            Some(vec!["3g.40gb".into()])
        );
        assert_eq!(allowed("NVIDIA H100 NVL"), Some(vec!["2g.20gb".into()]));
        assert_eq!(allowed("NVIDIA A30"), None);
    }

    #[test]
    fn the_example_parses_and_means_what_its_comments_say() {
        let config = ClusterConfig::parse(EXAMPLE).expect("EXAMPLE parses");
        assert!(config.ignored_fields().is_empty());
        assert_eq!(config.nvidia.mig_profile_allowlist.len(), 3);
        assert_eq!(config.scheduler.gpu_scheduler_policy.0, Policy::Spread);
        let node = config.node_settings("gpu-node-1");
        assert_eq!(
            node,
            NodeSettings {
                operating_mode: Some(OperatingMode::Mig),
                split_count: 4,
                memory_scaling: 1.5,
                core_scaling: 1.0,
                filter: FilterDevices {
                    uuid: vec!["GPU-00000000-0000-0000-0000-000000000003".into()],
                    index: vec![3],
                },
            }
        );
        let other = config.node_settings("gpu-node-2");
        assert_eq!(other.operating_mode, None);
        assert_eq!(other.split_count, 10);
        assert_eq!(other.filter, FilterDevices::default());
        // JSON is YAML: the same configuration written as JSON reads the same.
        let json = serde_json::to_string(&config).expect("serializes");
        assert_eq!(ClusterConfig::parse(&json).expect("json"), config);
    }

    #[test]
    fn a_hami_nvidia_section_parses_with_its_unused_fields_reported() {
        let text = r#"
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
  disableCoreLimit: false
  gpuCorePolicy: default
  runtimeClassName: ""
nodeconfig:
  - name: node-a
    operatingmode: hami-core
    devicememoryscaling: 1.8
    devicesplitcount: 10
    migstrategy: none
    filterdevices:
      uuid: []
      index: []
    libCudaLogLevel: 1
"#;
        let config = ClusterConfig::parse(text).expect("HAMi config");
        assert_eq!(
            config.ignored_fields(),
            [
                "nvidia.resourcePriorityName",
                "nvidia.overwriteEnv",
                "nvidia.disableCoreLimit",
                "nvidia.gpuCorePolicy",
                "nvidia.runtimeClassName",
                "nodeconfig[0].migstrategy",
                "nodeconfig[0].libCudaLogLevel",
            ]
        );
        let node = config.node_settings("node-a");
        assert_eq!(node.operating_mode, Some(OperatingMode::Share));
        assert_eq!(node.memory_scaling, 1.8);
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (
                "nvidia: {deviceMemoryScaling: -1}",
                "cluster config: nvidia.deviceMemoryScaling: -1 is not > 0",
            ),
            (
                "nvidia: {deviceCoreScaling: 0}",
                "cluster config: nvidia.deviceCoreScaling: 0 is not > 0",
            ),
            (
                "nvidia: {deviceCoreScaling: .nan}",
                "cluster config: nvidia.deviceCoreScaling: NaN is not > 0",
            ),
            (
                "nvidia: {deviceSplitCount: 0}",
                "cluster config: nvidia.deviceSplitCount: 0 is not ≥ 1",
            ),
            (
                "nvidia: {memoryFactor: 0}",
                "cluster config: nvidia.memoryFactor: 0 is not ≥ 1",
            ),
            (
                "nvidia: {defaultCores: 101}",
                "cluster config: nvidia.defaultCores: 101 is over 100",
            ),
            (
                "nvidia: {resourceCoreName: nvidia.com/gpu}",
                "cluster config: nvidia.resourceCoreName: \"nvidia.com/gpu\" is also nvidia.resourceCountName",
            ),
            (
                "nodeconfig: [{name: n1}, {name: n1}]",
                "cluster config: nodeconfig[1].name: \"n1\" appears twice",
            ),
            (
                "nodeconfig: [{name: \"\"}]",
                "cluster config: nodeconfig[0].name: empty",
            ),
            (
                "nodeconfig: [{name: n1, devicememoryscaling: 0}]",
                "cluster config: nodeconfig[0].devicememoryscaling: 0 is not > 0",
            ),
            (
                "nvidia: {migProfileAllowlist: [{models: [], profiles: [1g.5gb]}]}",
                "cluster config: nvidia.migProfileAllowlist[0].models: empty",
            ),
            (
                "nvidia: {migProfileAllowlist: [{models: [A100], profiles: []}]}",
                "cluster config: nvidia.migProfileAllowlist[0].profiles: empty",
            ),
            (
                "nvidia: {migProfileAllowlist: [{models: [NVIDIA], profiles: [1g.5gb]}]}",
                "cluster config: nvidia.migProfileAllowlist[0].models[0]: \"NVIDIA\" names no GPU model",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(invalid(text), expected, "{text}");
        }
    }

    #[test]
    fn known_mig_geometries_is_refused_pointing_at_the_allowlist() {
        let err = invalid(
            "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n      allowedGeometries: []\n",
        );
        assert!(
            err.starts_with("cluster config: nvidia.knownMigGeometries:"),
            "{err}"
        );
        assert!(err.contains("migProfileAllowlist"), "{err}");
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_named() {
        for (text, needle) in [
            ("nvidia: {deviceSplitCont: 3}", "deviceSplitCont"),
            ("nvidias: {}", "nvidias"),
            ("nodeconfig: [{name: n, operatingmode: time}]", "time"),
            (
                "nodeconfig: [{name: n, filterdevices: {uuids: []}}]",
                "uuids",
            ),
            ("nvidia: {deviceSplitCount: ten}", "deviceSplitCount"),
            ("scheduler: {nodeSchedulerPolicy: pack}", "pack"),
            ("[1, 2]", "cluster config"),
        ] {
            let err = invalid(text);
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }
}
