//! What this plugin created, under `--state-dir`: the one record that lets a
//! restarted plugin finish or undo what a killed one began, and that keeps it
//! from ever touching an instance it did not make.
//!
//! The file is `<state-dir>/plugin-checkpoint.json`, written whole on every
//! change (temporary file, fsync, rename, directory fsync) under one lock, so a
//! crash leaves either the old or the new version, never a mix. Allocate writes
//! an **intent** before each driver call that creates something (the GPU, the
//! profile and the placement of a GI it is about to create) and the ids once
//! the call returned; reclaim marks an allocation `Reclaiming` before it
//! destroys anything and drops the record only when everything is gone. A
//! record is therefore always a superset of what exists, and the startup sweep
//! ([`crate::reconcile`]) settles the difference.
//!
//! A file that cannot be read or parsed stops the plugin with one line naming
//! it: guessing what was created is how instances leak or get destroyed under
//! another tool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tessera_model::mig::Placement;

/// The checkpoint's file name inside `--state-dir`.
pub const FILE_NAME: &str = "plugin-checkpoint.json";

/// The schema version this code writes and reads.
pub const VERSION: u32 = 1;

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading, writing or syncing the file failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a checkpoint of this version.
    #[error(
        "checkpoint {path}: {reason} (move it aside only after checking `tessera-sim`/`nvidia-smi mig -lgi` by hand: it lists the MIG instances Tessera created)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Checkpoint {
    /// Schema version; [`VERSION`].
    pub version: u32,
    /// Allocations by alloc-id.
    pub allocations: BTreeMap<String, AllocRecord>,
}

/// Where an allocation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Allocate is creating its instances and files (or died doing so).
    Realizing,
    /// Allocate answered kubelet: the container may run.
    Ready,
    /// Reclaim began: its instances and files are being destroyed.
    Reclaiming,
}

/// One container's allocation as this plugin realized it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AllocRecord {
    /// `<pod-uid>-<container-index>`.
    pub alloc_id: String,
    /// The pod's uid.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The container's index in `initContainers ++ containers`.
    pub container_index: u32,
    /// Where it stands.
    pub phase: Phase,
    /// MIG instances created (or about to be) for it, in creation order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceRecord>,
    /// The device ids kubelet allocated for the container (for PodResources).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_ids: Vec<String>,
    /// When the record was made, seconds since the Unix epoch.
    pub created_unix: u64,
}

/// One MIG instance: the intent first, the ids once NVML returned them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstanceRecord {
    /// The parent GPU's uuid.
    pub gpu_uuid: String,
    /// The parent GPU's index when the instance was made.
    pub gpu_index: u32,
    /// GI profile id.
    pub profile_id: u32,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// The reserved placement.
    pub placement: Placement,
    /// GPU instance id, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    /// Compute instance id, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
    /// `MIG-…` uuid, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
}

/// The checkpoint file and its in-memory copy.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    state: Mutex<Checkpoint>,
}

impl Store {
    /// Opens `<state_dir>/plugin-checkpoint.json` (an absent file is an empty
    /// checkpoint; the directory is created, mode 0755, if missing).
    pub fn open(state_dir: &Path) -> Result<Store, CheckpointError> {
        let path = state_dir.join(FILE_NAME);
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let state = match std::fs::read(&path) {
            Ok(bytes) => parse(&path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint {
                version: VERSION,
                allocations: BTreeMap::new(),
            },
            Err(e) => return Err(io(e)),
        };
        Ok(Store {
            path,
            state: Mutex::new(state),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A copy of the whole checkpoint.
    pub fn snapshot(&self) -> Checkpoint {
        self.lock().clone()
    }

    /// One allocation's record.
    pub fn get(&self, alloc_id: &str) -> Option<AllocRecord> {
        self.lock().allocations.get(alloc_id).cloned()
    }

    /// Applies `change` and writes the result durably before returning; on a
    /// write error the in-memory copy is left as it was before.
    pub fn update<R>(
        &self,
        change: impl FnOnce(&mut Checkpoint) -> R,
    ) -> Result<R, CheckpointError> {
        let mut state = self.lock();
        let mut next = state.clone();
        let result = change(&mut next);
        if next != *state {
            let bytes = serde_json::to_vec_pretty(&next).map_err(|e| CheckpointError::Corrupt {
                path: self.path.clone(),
                reason: e.to_string(),
            })?;
            tessera_cdi::writer::write_atomic(&self.path, &bytes).map_err(|e| {
                CheckpointError::Io {
                    path: self.path.clone(),
                    source: std::io::Error::other(e.to_string()),
                }
            })?;
            *state = next;
        }
        Ok(result)
    }

    fn lock(&self) -> MutexGuard<'_, Checkpoint> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let checkpoint: Checkpoint =
        serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if checkpoint.version != VERSION {
        return Err(corrupt(format!(
            "version {} is not supported (this build reads version {VERSION})",
            checkpoint.version
        )));
    }
    for (id, record) in &checkpoint.allocations {
        if *id != record.alloc_id {
            return Err(corrupt(format!(
                "allocations.{id}: holds the record of {}",
                record.alloc_id
            )));
        }
    }
    Ok(checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> AllocRecord {
        AllocRecord {
            alloc_id: id.to_owned(),
            pod_uid: "uid".to_owned(),
            namespace: "default".to_owned(),
            pod: "p".to_owned(),
            container: "c".to_owned(),
            container_index: 0,
            phase: Phase::Realizing,
            instances: vec![InstanceRecord {
                gpu_uuid: "GPU-1".to_owned(),
                gpu_index: 0,
                profile_id: 19,
                profile: "1g.10gb".to_owned(),
                placement: Placement::new(2, 1).expect("placement"),
                gpu_instance_id: None,
                compute_instance_id: None,
                mig_uuid: None,
            }],
            device_ids: Vec::new(),
            created_unix: 1,
        }
    }

    #[test]
    fn updates_survive_a_reopen_and_an_absent_file_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        assert!(store.snapshot().allocations.is_empty());
        store
            .update(|c| c.allocations.insert("a-0".to_owned(), record("a-0")))
            .expect("update");
        let reopened = Store::open(dir.path()).expect("reopen");
        assert_eq!(reopened.get("a-0"), Some(record("a-0")));
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        for (text, needle) in [
            ("{", "EOF"),
            (r#"{"version":2,"allocations":{}}"#, "version 2"),
            (r#"{"version":1,"allocations":{},"x":1}"#, "unknown field"),
        ] {
            std::fs::write(&path, text).expect("write");
            let err = Store::open(dir.path()).expect_err(text).to_string();
            assert!(err.contains(FILE_NAME) && err.contains(needle), "{err}");
        }
        let mut wrong = Checkpoint {
            version: VERSION,
            allocations: BTreeMap::new(),
        };
        wrong.allocations.insert("b-0".to_owned(), record("a-0"));
        std::fs::write(&path, serde_json::to_vec(&wrong).expect("json")).expect("write");
        let err = Store::open(dir.path()).expect_err("mismatch").to_string();
        assert!(err.contains("allocations.b-0"), "{err}");
    }
}
