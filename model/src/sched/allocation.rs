//! The pod annotation `tessera.io/allocation`: the reservation the scheduler
//! extender writes at bind and the device plugin realizes (filling the
//! `realized` fields of MIG devices).
//!
//! Strict on read, like the node inventory: an unknown field, another
//! `version`, a device without a uuid, a MIG placement that is empty or too
//! long, a share slice with cores over 100 — each is an error naming the
//! field. A pod whose allocation does not parse still holds its node's
//! devices as far as the extender can tell: the extender reports the node as
//! unusable rather than over-commit it.
//!
//! ```json
//! {"version": 1, "node": "gpu-node-1",
//!  "containers": [
//!    {"index": 0, "name": "main", "devices": [
//!       {"uuid": "GPU-…", "mode": "share", "memoryMiB": 8000, "cores": 30},
//!       {"uuid": "GPU-…", "mode": "mig", "profile": "1g.10gb", "profileId": 19,
//!        "placement": {"start": 2, "size": 1},
//!        "realized": {"migUuid": "MIG-…", "gpuInstanceId": 9, "computeInstanceId": 0}}]}]}
//! ```
//! `version` may be absent (read as 1): the architecture's first example has none.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{VersionedParseError, parse_versioned};
use crate::mig::placement::{MAX_AXIS_LEN, Placement};

/// The schema version this code writes and reads.
pub const ALLOCATION_VERSION: u32 = 1;

/// Most containers one allocation may hold.
pub const MAX_CONTAINERS: usize = 256;

/// Most devices one container may hold.
pub const MAX_DEVICES_PER_CONTAINER: usize = 64;

fn default_version() -> u32 {
    ALLOCATION_VERSION
}

/// A pod's reservation: the value of `tessera.io/allocation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Allocation {
    /// Schema version; [`ALLOCATION_VERSION`] (absent reads as 1).
    #[serde(default = "default_version")]
    pub version: u32,
    /// The node the pod is bound to.
    pub node: String,
    /// Containers that hold devices (containers asking for none are left out).
    pub containers: Vec<ContainerAllocation>,
}

/// The devices of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerAllocation {
    /// Position of the container in the pod: init containers first, then the
    /// regular containers (`initContainers ++ containers`). The alloc-id is
    /// `<pod-uid>-<index>`.
    pub index: u32,
    /// Container name.
    pub name: String,
    /// True for an init container: it runs before the regular containers, so
    /// its devices are not held at the same time as theirs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub init: bool,
    /// The container's devices, one per GPU (or MIG instance) it asked for.
    pub devices: Vec<DeviceAllocation>,
}

/// One reserved device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase", deny_unknown_fields)]
pub enum DeviceAllocation {
    /// A vGPU slice of a whole GPU: memory and SM share enforced by the library.
    Share {
        /// The GPU's uuid.
        uuid: String,
        /// Memory limit, MiB.
        #[serde(rename = "memoryMiB")]
        memory_mib: u64,
        /// SM share, percent (100 = the GPU exclusively).
        cores: u32,
    },
    /// A MIG instance to create (or created) on a MIG GPU.
    Mig {
        /// The parent GPU's uuid.
        uuid: String,
        /// Profile name, e.g. `1g.10gb`.
        profile: String,
        /// Device profile id.
        #[serde(rename = "profileId")]
        profile_id: u32,
        /// Where on the memory-slice axis.
        placement: Placement,
        /// Memory of the instance, MiB (for accounting and display).
        #[serde(rename = "memoryMiB", default)]
        memory_mib: u64,
        /// Filled by the device plugin once the instance exists.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        realized: Option<Realized>,
    },
}

/// A MIG instance the device plugin created for a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Realized {
    /// `MIG-…` uuid.
    pub mig_uuid: String,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
}

/// Why a `tessera.io/allocation` value was refused. Each names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocationError {
    /// Not JSON, or not this schema (serde's message names the field).
    #[error("tessera.io/allocation: {0}")]
    Malformed(String),
    /// Written by another schema version.
    #[error(
        "tessera.io/allocation: version {found} is not supported (this build reads version {ALLOCATION_VERSION})"
    )]
    Version {
        /// The version the annotation declares.
        found: u32,
    },
    /// A field holds a value the schema forbids.
    #[error("tessera.io/allocation: {field}: {problem}")]
    Invalid {
        /// Path of the field, e.g. `containers[0].devices[1].placement`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl From<VersionedParseError> for AllocationError {
    fn from(error: VersionedParseError) -> AllocationError {
        match error {
            VersionedParseError::Version(found) => AllocationError::Version { found },
            VersionedParseError::Malformed(message) => AllocationError::Malformed(message),
        }
    }
}

impl Allocation {
    /// Parses and validates an annotation value.
    pub fn parse(text: &str) -> Result<Allocation, AllocationError> {
        let allocation: Allocation = parse_versioned(text, ALLOCATION_VERSION)?;
        allocation.validate()?;
        Ok(allocation)
    }

    /// The annotation value (compact JSON).
    pub fn to_annotation(&self) -> String {
        // Plain structs of strings and integers always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks every rule of the schema (what [`Allocation::parse`] enforces).
    pub fn validate(&self) -> Result<(), AllocationError> {
        let invalid = |field: String, problem: String| AllocationError::Invalid { field, problem };
        if self.version != ALLOCATION_VERSION {
            return Err(AllocationError::Version {
                found: self.version,
            });
        }
        if self.node.is_empty() || self.node.len() > 253 {
            return Err(invalid(
                "node".into(),
                format!("{:?} is not a node name", self.node),
            ));
        }
        if self.containers.len() > MAX_CONTAINERS {
            return Err(invalid(
                "containers".into(),
                format!(
                    "{} entries, more than {MAX_CONTAINERS}",
                    self.containers.len()
                ),
            ));
        }
        let mut indexes = BTreeSet::new();
        for (c, container) in self.containers.iter().enumerate() {
            if !indexes.insert(container.index) {
                return Err(invalid(
                    format!("containers[{c}].index"),
                    format!("{} appears twice", container.index),
                ));
            }
            if container.name.is_empty() {
                return Err(invalid(format!("containers[{c}].name"), "empty".into()));
            }
            if container.devices.len() > MAX_DEVICES_PER_CONTAINER {
                return Err(invalid(
                    format!("containers[{c}].devices"),
                    format!(
                        "{} devices, more than {MAX_DEVICES_PER_CONTAINER}",
                        container.devices.len()
                    ),
                ));
            }
            let mut uuids_in_container = BTreeSet::new();
            for (d, device) in container.devices.iter().enumerate() {
                let at = |field: &str| format!("containers[{c}].devices[{d}].{field}");
                if !device.uuid().starts_with("GPU-") {
                    return Err(invalid(
                        at("uuid"),
                        format!("{:?} is not a GPU uuid (GPU-…)", device.uuid()),
                    ));
                }
                match device {
                    DeviceAllocation::Share {
                        uuid,
                        memory_mib,
                        cores,
                    } => {
                        if *memory_mib == 0 {
                            return Err(invalid(at("memoryMiB"), "0".into()));
                        }
                        if *cores > 100 {
                            return Err(invalid(at("cores"), format!("{cores}, over 100")));
                        }
                        // Two slices of one GPU in one container would be one
                        // device twice in the container; the fit never does it.
                        if !uuids_in_container.insert(uuid.as_str()) {
                            return Err(invalid(at("uuid"), format!("{uuid} appears twice")));
                        }
                    }
                    DeviceAllocation::Mig {
                        profile, placement, ..
                    } => {
                        if profile.is_empty() {
                            return Err(invalid(at("profile"), "empty".into()));
                        }
                        if Placement::new(placement.start, placement.size).is_err() {
                            return Err(invalid(
                                at("placement"),
                                format!("{placement} is empty or runs past slot {MAX_AXIS_LEN}"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Every device of every container, with the container it belongs to.
    pub fn devices(&self) -> impl Iterator<Item = (&ContainerAllocation, &DeviceAllocation)> {
        self.containers
            .iter()
            .flat_map(|c| c.devices.iter().map(move |d| (c, d)))
    }
}

impl DeviceAllocation {
    /// The (parent) GPU's uuid.
    pub fn uuid(&self) -> &str {
        match self {
            DeviceAllocation::Share { uuid, .. } | DeviceAllocation::Mig { uuid, .. } => uuid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The architecture's example, as written there (no version field).
    const ARCHITECTURE_EXAMPLE: &str = r#"{"node": "gpu-node-1",
 "containers": [
   {"index": 0, "name": "main", "devices": [
      {"uuid": "GPU-1", "mode": "share", "memoryMiB": 8000, "cores": 30},
      {"uuid": "GPU-2", "mode": "mig", "profile": "1g.10gb", "profileId": 19,
       "placement": {"start": 2, "size": 1},
       "realized": {"migUuid": "MIG-x", "gpuInstanceId": 9, "computeInstanceId": 0}}]}]}"#;

    #[test]
    fn the_architecture_example_parses() {
        let allocation = Allocation::parse(ARCHITECTURE_EXAMPLE).expect("valid");
        assert_eq!(allocation.version, 1);
        assert_eq!(allocation.node, "gpu-node-1");
        assert_eq!(
            allocation.containers[0].devices[0],
            DeviceAllocation::Share {
                uuid: "GPU-1".into(),
                memory_mib: 8000,
                cores: 30
            }
        );
        match &allocation.containers[0].devices[1] {
            DeviceAllocation::Mig {
                profile_id,
                placement,
                realized: Some(realized),
                ..
            } => {
                assert_eq!(*profile_id, 19);
                assert_eq!(*placement, Placement { start: 2, size: 1 });
                assert_eq!(realized.gpu_instance_id, 9);
            }
            other => panic!("expected a realized MIG device, got {other:?}"),
        }
        let again = Allocation::parse(&allocation.to_annotation()).expect("round trip");
        assert_eq!(again, allocation);
        assert!(allocation.to_annotation().contains("\"memoryMiB\":8000"));
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases = [
            (
                ARCHITECTURE_EXAMPLE.replace("\"cores\": 30", "\"cores\": 130"),
                "containers[0].devices[0].cores",
            ),
            (
                ARCHITECTURE_EXAMPLE.replace("\"size\": 1", "\"size\": 0"),
                "containers[0].devices[1].placement",
            ),
            (
                ARCHITECTURE_EXAMPLE.replace("\"GPU-1\"", "\"gpu1\""),
                "containers[0].devices[0].uuid",
            ),
            (
                ARCHITECTURE_EXAMPLE.replace("\"mode\": \"share\"", "\"mode\": \"time\""),
                "time",
            ),
            (
                ARCHITECTURE_EXAMPLE.replace("\"name\": \"main\"", "\"name\": \"main\", \"x\": 1"),
                "x",
            ),
        ];
        for (text, needle) in cases {
            let err = Allocation::parse(&text).expect_err(needle).to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
        assert_eq!(
            Allocation::parse(r#"{"version":3,"node":"n","containers":[],"future":true}"#),
            Err(AllocationError::Version { found: 3 })
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for text in ["", "null", "{}", "[1]", "{\"node\":5}", "{\"node\":\"n\"}"] {
            assert!(Allocation::parse(text).is_err(), "{text:?}");
        }
    }
}
