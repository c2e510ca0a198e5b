//! CDI spec types, strict on read: an unknown field is an error, as in the reference loader.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A CDI spec file: one `vendor/class` and its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// Spec format version; the minimum the content needs.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec-level annotations (cdiVersion ≥ 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices; at least one.
    pub devices: Vec<Device>,
    /// Edits applied once when any device of the spec is used.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One named device of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Device name, unique within the spec.
    pub name: String,
    /// Device annotations (cdiVersion ≥ 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the device adds to a container; must not be empty.
    pub container_edits: ContainerEdits,
}

/// Changes to an OCI container spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Intel RDT class (cdiVersion ≥ 0.7.0; `schemata` and `enableMonitoring` ≥ 1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// Extra supplementary group ids (cdiVersion ≥ 0.7.0; the spec spells it `additionalGids`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "additionalGids"
    )]
    pub additional_gids: Vec<u32>,
    /// Network devices to move into the container (cdiVersion ≥ 1.1.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
}

impl ContainerEdits {
    /// True when the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.additional_gids.is_empty()
            && self.net_devices.is_empty()
    }
}

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host when it differs from `path` (cdiVersion ≥ 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub node_type: Option<String>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup access, a subset of `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner uid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Owner gid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// A character device at `path` with its numbers, everything else left to
    /// the runtime (host path = `path`, the host node's mode and owner, `rwm`).
    /// Type and numbers let a runtime create the node where the host has none.
    pub fn char(path: impl Into<String>, major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            node_type: Some("c".to_owned()),
            major: Some(i64::from(major)),
            minor: Some(i64::from(minor)),
            ..DeviceNode::default()
        }
    }
}

/// A mount to add to the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options (`ro`, `bind`, `nosuid`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Filesystem type (cdiVersion ≥ 0.4.0).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub mount_type: Option<String>,
}

/// An OCI hook entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// `prestart`, `createRuntime`, `createContainer`, `startContainer`, `poststart` or `poststop`.
    pub hook_name: String,
    /// Absolute path of the executable on the host.
    pub path: String,
    /// argv, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The hook's whole environment; Tessera always sets it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Intel RDT (resource director technology) settings for the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntelRdt {
    /// The class of service; a file name under the resctrl root, or `/` for the root class.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "closID")]
    pub clos_id: Option<String>,
    /// L3 cache allocation schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l3_cache_schema: Option<String>,
    /// Memory bandwidth allocation schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bw_schema: Option<String>,
    /// Raw schemata lines (cdiVersion ≥ 1.1.0, even when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// Turn on resctrl monitoring (cdiVersion ≥ 1.1.0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_monitoring: bool,
}

/// A host network interface to move into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetDevice {
    /// The interface's name on the host.
    pub host_interface_name: String,
    /// The interface's name in the container.
    pub name: String,
}

/// The hook names the reference loader accepts, in OCI lifecycle order.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// One problem in a spec: the JSON path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SpecProblem {
    /// JSON path of the offending field, e.g. `devices[0].containerEdits.env[1]`.
    pub path: String,
    /// What is wrong, naming the offending value.
    pub message: String,
}

/// A spec could not be built because its content is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The content breaks one or more rules; every problem is listed.
    #[error("invalid CDI spec for kind {kind:?}: {}", join_problems(problems))]
    Invalid {
        /// The kind of the rejected spec.
        kind: String,
        /// Every problem found, in document order.
        problems: Vec<SpecProblem>,
    },
}

fn join_problems(problems: &[SpecProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Device {
    /// A device with no annotations; [`Spec::new`] validates it.
    pub fn new(name: impl Into<String>, container_edits: ContainerEdits) -> Device {
        Device {
            name: name.into(),
            annotations: BTreeMap::new(),
            container_edits,
        }
    }
}
