//! The node annotation `tessera.io/node-gpus`: a node's GPUs as the device
//! plugin found them, read by the scheduler extender and `kubectl tessera`.
//!
//! Versioned and strict on read: an unknown field, another `version`, a
//! duplicate uuid or index, or a placement that is not legal for its profile
//! is an error naming the field, never a guess. The extender then treats the
//! node as unusable for GPU pods, with that error as the node's reason.
//!
//! ```json
//! {"version": 1,
//!  "gpus": [
//!    {"uuid": "GPU-…", "index": 0, "model": "NVIDIA A100-SXM4-40GB",
//!     "memoryMiB": 40960, "smCount": 108, "mig": false, "healthy": true},
//!    {"uuid": "GPU-…", "index": 1, "model": "NVIDIA A100-SXM4-40GB",
//!     "memoryMiB": 40960, "smCount": 108, "mig": true, "healthy": true,
//!     "migProfiles": [
//!       {"id": 19, "name": "1g.5gb", "memoryMiB": 4864, "computeSlices": 1,
//!        "memorySlices": 1, "smCount": 14, "maxInstances": 7,
//!        "placements": [{"start": 0, "size": 1}, …]}],
//!     "foreignInstances": [{"start": 0, "size": 4}]}]}
//! ```

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{VersionedParseError, parse_versioned};
use crate::mig::catalogue::{GiProfileSpec, GpuModelSpec};
use crate::mig::placement::{MAX_AXIS_LEN, Placement, ProfileLayout};

/// The schema version this code writes and reads.
pub const NODE_GPUS_VERSION: u32 = 1;

/// Most GPUs one node may report (a larger list is refused as corrupt).
pub const MAX_GPUS_PER_NODE: usize = 64;

/// A node's GPUs: the value of `tessera.io/node-gpus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGpus {
    /// Schema version; [`NODE_GPUS_VERSION`].
    pub version: u32,
    /// The GPUs the device plugin offers (after its device filters), by index.
    pub gpus: Vec<NodeGpu>,
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGpu {
    /// `GPU-…` uuid.
    pub uuid: String,
    /// NVML index on the node.
    pub index: u32,
    /// Product name as NVML reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// Total framebuffer memory, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU (0 when unknown).
    #[serde(default)]
    pub sm_count: u32,
    /// MIG mode in force: the GPU is handed out only as MIG instances.
    pub mig: bool,
    /// Whether the device plugin considers the GPU healthy.
    pub healthy: bool,
    /// For a MIG GPU: the GPU-instance profiles with their legal placements as
    /// NVML reported them. Empty when the node reported none (the extender then
    /// falls back to the built-in catalogue for the model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_profiles: Vec<MigProfile>,
    /// For a MIG GPU: placements held by instances Tessera did not create
    /// (made by hand or by another tool); never offered to a pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_instances: Vec<Placement>,
}

/// A GPU-instance profile of one GPU, as NVML reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigProfile {
    /// Device profile id (19, 14, 9, 0 …).
    pub id: u32,
    /// Profile name, e.g. `1g.10gb` or `1g.10gb+me`.
    pub name: String,
    /// Memory of one instance, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Compute slices (the `N` of `Ng`).
    pub compute_slices: u32,
    /// Memory slices: the size of every placement of the profile.
    pub memory_slices: u32,
    /// Streaming multiprocessors of one instance.
    pub sm_count: u32,
    /// Most instances of this profile the GPU can hold.
    pub max_instances: u32,
    /// Legal placements, ascending.
    pub placements: Vec<Placement>,
}

impl MigProfile {
    /// The profile as the built-in catalogue describes it: what NVML reports
    /// for that model, with every legal placement.
    pub fn from_catalogue(spec: &GiProfileSpec) -> MigProfile {
        MigProfile {
            id: spec.id,
            name: spec.name.to_owned(),
            memory_mib: spec.memory_mib,
            compute_slices: spec.compute_slices,
            memory_slices: spec.memory_slices,
            sm_count: spec.sm_count,
            max_instances: spec.max_instances,
            placements: spec.placements().collect(),
        }
    }
}

impl ProfileLayout for MigProfile {
    fn profile_id(&self) -> u32 {
        self.id
    }

    fn profile_name(&self) -> &str {
        &self.name
    }

    fn legal_placements(&self) -> impl Iterator<Item = Placement> {
        self.placements.iter().copied()
    }
}

/// Why a `tessera.io/node-gpus` value was refused. Each names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InventoryError {
    /// Not JSON, or not this schema (serde's message names the field).
    #[error("tessera.io/node-gpus: {0}")]
    Malformed(String),
    /// Written by another schema version.
    #[error(
        "tessera.io/node-gpus: version {found} is not supported (this build reads version {NODE_GPUS_VERSION})"
    )]
    Version {
        /// The version the annotation declares.
        found: u32,
    },
    /// A field holds a value the schema forbids.
    #[error("tessera.io/node-gpus: {field}: {problem}")]
    Invalid {
        /// Path of the field, e.g. `gpus[1].migProfiles[0].placements[2]`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl From<VersionedParseError> for InventoryError {
    fn from(error: VersionedParseError) -> InventoryError {
        match error {
            VersionedParseError::Version(found) => InventoryError::Version { found },
            VersionedParseError::Malformed(message) => InventoryError::Malformed(message),
        }
    }
}

impl NodeGpus {
    /// Parses and validates an annotation value.
    pub fn parse(text: &str) -> Result<NodeGpus, InventoryError> {
        let inventory: NodeGpus = parse_versioned(text, NODE_GPUS_VERSION)?;
        inventory.validate()?;
        Ok(inventory)
    }

    /// The annotation value (compact JSON).
    pub fn to_annotation(&self) -> String {
        // Serializing plain structs of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks every rule of the schema (what [`NodeGpus::parse`] enforces).
    pub fn validate(&self) -> Result<(), InventoryError> {
        let invalid = |field: String, problem: String| InventoryError::Invalid { field, problem };
        if self.version != NODE_GPUS_VERSION {
            return Err(InventoryError::Version {
                found: self.version,
            });
        }
        if self.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(invalid(
                "gpus".into(),
                format!("{} GPUs, more than {MAX_GPUS_PER_NODE}", self.gpus.len()),
            ));
        }
        let mut uuids = BTreeSet::new();
        let mut indexes = BTreeSet::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let at = |field: &str| format!("gpus[{i}].{field}");
            if !gpu.uuid.starts_with("GPU-") || gpu.uuid.len() > 80 {
                return Err(invalid(
                    at("uuid"),
                    format!("{:?} is not a GPU uuid (GPU-…)", gpu.uuid),
                ));
            }
            if !uuids.insert(gpu.uuid.as_str()) {
                return Err(invalid(at("uuid"), format!("{} appears twice", gpu.uuid)));
            }
            if !indexes.insert(gpu.index) {
                return Err(invalid(at("index"), format!("{} appears twice", gpu.index)));
            }
            if gpu.model.trim().is_empty() {
                return Err(invalid(at("model"), "empty".into()));
            }
            if gpu.memory_mib == 0 {
                return Err(invalid(at("memoryMiB"), "0".into()));
            }
            if !gpu.mig && (!gpu.mig_profiles.is_empty() || !gpu.foreign_instances.is_empty()) {
                return Err(invalid(
                    at("migProfiles"),
                    "given for a GPU whose MIG mode is off".into(),
                ));
            }
            let mut ids = BTreeSet::new();
            for (k, profile) in gpu.mig_profiles.iter().enumerate() {
                let pat = |field: &str| format!("gpus[{i}].migProfiles[{k}].{field}");
                if !ids.insert(profile.id) {
                    return Err(invalid(pat("id"), format!("{} appears twice", profile.id)));
                }
                if profile.name.trim().is_empty() {
                    return Err(invalid(pat("name"), "empty".into()));
                }
                if profile.memory_mib == 0 || profile.memory_mib > gpu.memory_mib {
                    return Err(invalid(
                        pat("memoryMiB"),
                        format!(
                            "{} MiB, outside 1..={} (the GPU's memory)",
                            profile.memory_mib, gpu.memory_mib
                        ),
                    ));
                }
                if profile.memory_slices == 0 || profile.memory_slices > MAX_AXIS_LEN {
                    return Err(invalid(
                        pat("memorySlices"),
                        format!("{}, outside 1..={MAX_AXIS_LEN}", profile.memory_slices),
                    ));
                }
                for (n, placement) in profile.placements.iter().enumerate() {
                    let field = pat(&format!("placements[{n}]"));
                    if Placement::new(placement.start, placement.size).is_err() {
                        return Err(invalid(
                            field,
                            format!("{placement} runs past slot {MAX_AXIS_LEN}"),
                        ));
                    }
                    if placement.size != profile.memory_slices {
                        return Err(invalid(
                            field,
                            format!(
                                "size {} differs from the profile's memorySlices {}",
                                placement.size, profile.memory_slices
                            ),
                        ));
                    }
                }
            }
            for (n, placement) in gpu.foreign_instances.iter().enumerate() {
                if Placement::new(placement.start, placement.size).is_err() {
                    return Err(invalid(
                        format!("gpus[{i}].foreignInstances[{n}]"),
                        format!("{placement} is empty or runs past slot {MAX_AXIS_LEN}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The GPU with this uuid.
    pub fn gpu(&self, uuid: &str) -> Option<&NodeGpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

impl NodeGpu {
    /// A healthy GPU of catalogue model `model` as the device plugin would
    /// report it: the model's product name, memory and SMs; with `mig`, in MIG
    /// mode with every profile of the model and its legal placements, and no
    /// foreign instances. `None` when `mig` is asked of a model without MIG.
    pub fn from_catalogue(
        model: &GpuModelSpec,
        index: u32,
        uuid: impl Into<String>,
        mig: bool,
    ) -> Option<NodeGpu> {
        let mig_profiles = if mig {
            let spec = model.mig?;
            spec.profiles
                .iter()
                .map(MigProfile::from_catalogue)
                .collect()
        } else {
            Vec::new()
        };
        Some(NodeGpu {
            uuid: uuid.into(),
            index,
            model: model.product_name.to_owned(),
            memory_mib: model.memory_mib,
            sm_count: model.sm_count,
            mig,
            healthy: true,
            mig_profiles,
            foreign_instances: Vec::new(),
        })
    }

    /// Length of the GPU's memory-slice axis: the largest placement end over
    /// its profiles (0 for a GPU without profiles).
    pub fn axis_len(&self) -> u32 {
        self.mig_profiles
            .iter()
            .flat_map(|p| p.placements.iter())
            .map(Placement::end)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> &'static str {
        r#"{"version":1,"gpus":[
          {"uuid":"GPU-a","index":0,"model":"NVIDIA A100-SXM4-40GB","memoryMiB":40960,"smCount":108,"mig":false,"healthy":true},
          {"uuid":"GPU-b","index":1,"model":"NVIDIA A100-SXM4-40GB","memoryMiB":40960,"smCount":108,"mig":true,"healthy":true,
           "migProfiles":[{"id":19,"name":"1g.5gb","memoryMiB":4864,"computeSlices":1,"memorySlices":1,"smCount":14,"maxInstances":7,
             "placements":[{"start":0,"size":1},{"start":1,"size":1}]}],
           "foreignInstances":[{"start":4,"size":4}]}]}"#
    }

    #[test]
    fn a_valid_inventory_round_trips() {
        let inventory = NodeGpus::parse(sample()).expect("valid");
        assert_eq!(inventory.gpus.len(), 2);
        assert_eq!(inventory.gpus[1].mig_profiles[0].placements.len(), 2);
        assert_eq!(inventory.gpus[1].axis_len(), 2);
        let again = NodeGpus::parse(&inventory.to_annotation()).expect("round trip");
        assert_eq!(again, inventory);
    }

    #[test]
    fn another_version_is_named_as_such() {
        let text = r#"{"version":2,"gpus":[],"newField":1}"#;
        assert_eq!(
            NodeGpus::parse(text),
            Err(InventoryError::Version { found: 2 })
        );
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let text = sample().replace("\"healthy\":true}", "\"healthy\":true,\"extra\":1}");
        let err = NodeGpus::parse(&text)
            .expect_err("unknown field")
            .to_string();
        assert!(err.contains("extra"), "{err}");
    }

    #[test]
    fn duplicates_and_bad_placements_are_refused_naming_the_field() {
        let cases = [
            (sample().replace("\"GPU-b\"", "\"GPU-a\""), "gpus[1].uuid"),
            (
                sample().replace("\"index\":1", "\"index\":0"),
                "gpus[1].index",
            ),
            (
                sample().replace("{\"start\":1,\"size\":1}", "{\"start\":1,\"size\":2}"),
                "gpus[1].migProfiles[0].placements[1]",
            ),
            (
                sample().replace("{\"start\":1,\"size\":1}", "{\"start\":70,\"size\":1}"),
                "gpus[1].migProfiles[0].placements[1]",
            ),
            (
                sample().replace("\"memoryMiB\":4864", "\"memoryMiB\":99999"),
                "memoryMiB",
            ),
            (
                sample().replace("{\"start\":4,\"size\":4}", "{\"start\":4,\"size\":0}"),
                "foreignInstances[0]",
            ),
        ];
        for (text, field) in cases {
            let err = NodeGpus::parse(&text).expect_err(field).to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn a_catalogue_gpu_is_reported_as_nvml_would() {
        use crate::mig::catalogue;
        let a100 = catalogue::find("A100-40GB").expect("A100-40GB in the catalogue");

        let whole = NodeGpu::from_catalogue(a100, 3, "GPU-w", false).expect("whole GPU");
        assert_eq!(whole.uuid, "GPU-w");
        assert_eq!(whole.index, 3);
        assert_eq!(whole.model, "NVIDIA A100-SXM4-40GB");
        assert_eq!((whole.memory_mib, whole.sm_count), (40960, 108));
        assert!(!whole.mig && whole.healthy);
        assert!(whole.mig_profiles.is_empty() && whole.foreign_instances.is_empty());

        // mig.md, A100-SXM4-40GB: seven profiles; 1g.5gb id 19, 14 SMs, max 7,
        // ≈ 4.75 GiB (4864 MiB), {0..6}:1; 3g.20gb id 9, 42 SMs, max 2, {0,4}:4;
        // 7g.40gb id 0, 98 SMs, {0}:8.
        let mig = NodeGpu::from_catalogue(a100, 0, "GPU-m", true).expect("MIG GPU");
        assert!(mig.mig && mig.healthy);
        assert_eq!(mig.mig_profiles.len(), 7);
        assert_eq!(mig.axis_len(), 8);
        let by_id = |id: u32| {
            mig.mig_profiles
                .iter()
                .find(|p| p.id == id)
                .unwrap_or_else(|| panic!("profile {id}"))
        };
        let one = by_id(19);
        assert_eq!(one.name, "1g.5gb");
        assert_eq!(
            (one.memory_mib, one.compute_slices, one.memory_slices),
            (4864, 1, 1)
        );
        assert_eq!((one.sm_count, one.max_instances), (14, 7));
        let starts: Vec<u32> = one.placements.iter().map(|p| p.start).collect();
        assert_eq!(starts, [0, 1, 2, 3, 4, 5, 6]);
        assert!(one.placements.iter().all(|p| p.size == 1));
        let three = by_id(9);
        assert_eq!(three.name, "3g.20gb");
        assert_eq!((three.compute_slices, three.memory_slices), (3, 4));
        assert_eq!((three.sm_count, three.max_instances), (42, 2));
        assert_eq!(
            three.placements,
            [
                Placement { start: 0, size: 4 },
                Placement { start: 4, size: 4 }
            ]
        );
        let seven = by_id(0);
        assert_eq!((seven.name.as_str(), seven.sm_count), ("7g.40gb", 98));
        assert_eq!(seven.placements, [Placement { start: 0, size: 8 }]);

        let text = NodeGpus {
            version: NODE_GPUS_VERSION,
            gpus: vec![whole, mig],
        }
        .to_annotation();
        assert!(NodeGpus::parse(&text).is_ok(), "{text}");
    }

    #[test]
    fn mig_of_a_model_without_mig_is_refused() {
        let plain = GpuModelSpec {
            key: "T4",
            product_name: "Tesla T4",
            memory_mib: 15360,
            sm_count: 40,
            mig: None,
        };
        assert_eq!(NodeGpu::from_catalogue(&plain, 0, "GPU-t", true), None);
        let whole = NodeGpu::from_catalogue(&plain, 0, "GPU-t", false).expect("whole GPU");
        assert_eq!(whole.model, "Tesla T4");
        assert!(!whole.mig);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for text in [
            "",
            "null",
            "[]",
            "{",
            "{\"version\":1}",
            "{\"version\":\"1\",\"gpus\":[]}",
        ] {
            assert!(NodeGpus::parse(text).is_err(), "{text:?}");
        }
    }
}
