//! The node's GPU/MIG state, shared between processes through one JSON file.
//!
//! The state file is `<root>/run/tessera-sim/state.json`; every process that
//! plays a part of the node (the NVML stand-in inside the device plugin, inside
//! `tessera-cdi`, inside a test) reads and updates the same file, so a GPU
//! instance created by one is seen by all. Concurrency is handled with
//! `flock(2)` on a separate lock file, `state.lock`: shared for a read,
//! exclusive for an update. Writes go to a temporary file in the same
//! directory and are renamed over the state file, so a reader never sees half
//! a file even without the lock.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::SimError;
use crate::health::Health;

/// The state file format version this crate writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Directory of the state, relative to the node root.
pub const STATE_DIR: &str = "run/tessera-sim";
/// State file name inside [`STATE_DIR`].
pub const STATE_FILE: &str = "state.json";
/// Lock file name inside [`STATE_DIR`].
pub const LOCK_FILE: &str = "state.lock";

/// Everything the simulated driver knows about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeState {
    /// Format version, [`STATE_VERSION`].
    pub version: u32,
    /// Driver version the stand-ins report, e.g. `570.133.20`.
    pub driver_version: String,
    /// CUDA driver version as `cuDriverGetVersion` encodes it, e.g. `12080`.
    pub cuda_driver_version: i32,
    /// The GPUs, in index order.
    pub gpus: Vec<SimGpu>,
    /// Counter bumped for every generated MIG UUID, so a re-created compute
    /// instance gets a new UUID as on real hardware.
    pub serial: u64,
    /// Lost GPUs and the XID/loss event log ([`crate::health`]); absent
    /// from the file while nothing was ever recorded.
    #[serde(default, skip_serializing_if = "Health::is_empty")]
    pub health: Health,
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpu {
    /// NVML index.
    pub index: u32,
    /// Device-node minor (`/dev/nvidia<minor>`, `nvmlDeviceGetMinorNumber`).
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Catalogue key of the model, e.g. `H100-80GB`.
    pub model: String,
    /// PCI bus number (`0000:<bus>:00.0`); `None` in state files written
    /// before the field existed: [`SimGpu::pci_bus`] then derives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus: Option<u32>,
    /// Current MIG mode.
    pub mig_enabled: bool,
    /// Pending MIG mode (what `nvmlDeviceGetMigMode` reports as pending).
    pub mig_pending: bool,
    /// GPU instances, kept sorted by id.
    pub gpu_instances: Vec<SimGpuInstance>,
}

/// One GPU instance on a simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpuInstance {
    /// Driver-assigned GPU-instance id (see [`crate::mig::gpu_instance_id`]).
    pub id: u32,
    /// Device profile id (19, 14, 9, …), not the enum index.
    pub profile_id: u32,
    /// First memory slice of the placement.
    pub start: u32,
    /// Number of memory slices of the placement.
    pub size: u32,
    /// Compute instances, kept sorted by id.
    pub compute_instances: Vec<SimComputeInstance>,
}

/// One compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimComputeInstance {
    /// Compute-instance id within its GPU instance.
    pub id: u32,
    /// Compute-instance profile id (the CI profile enum of the full-GI profile).
    pub profile_id: u32,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
}

impl NodeState {
    /// An empty node with the given driver version and no GPUs.
    pub fn new(driver_version: impl Into<String>) -> Self {
        NodeState {
            version: STATE_VERSION,
            driver_version: driver_version.into(),
            cuda_driver_version: crate::DEFAULT_CUDA_DRIVER_VERSION,
            gpus: Vec::new(),
            serial: 0,
            health: Health::default(),
        }
    }

    /// The GPU with NVML index `index`.
    pub fn gpu(&self, index: u32) -> Option<&SimGpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The GPU with NVML index `index`, mutable.
    pub fn gpu_mut(&mut self, index: u32) -> Option<&mut SimGpu> {
        self.gpus.iter_mut().find(|g| g.index == index)
    }

    /// The GPU with this UUID.
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&SimGpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The GPU with device-node minor `minor`.
    pub fn gpu_by_minor(&self, minor: u32) -> Option<&SimGpu> {
        self.gpus.iter().find(|g| g.minor == minor)
    }
}

/// The PCI bus a GPU at NVML index `index` sits on when its profile names
/// none: 7, 15, 23, … (ascending with the index, as NVML enumerates GPUs in
/// PCI bus order; 32 GPUs stay below 0x100).
pub fn default_pci_bus(index: u32) -> u32 {
    7 + 8 * index
}

impl SimGpu {
    /// The GPU's PCI bus number: the profile's, or [`default_pci_bus`].
    pub fn pci_bus(&self) -> u32 {
        self.pci_bus.unwrap_or_else(|| default_pci_bus(self.index))
    }

    /// The GPU's PCI address as NVML's `busIdLegacy` writes it: `0000:07:00.0`.
    pub fn pci_bus_id_legacy(&self) -> String {
        format!("0000:{:02X}:00.0", self.pci_bus())
    }

    /// The GPU's PCI address as NVML's `busId` writes it: `00000000:07:00.0`.
    pub fn pci_bus_id(&self) -> String {
        format!("00000000:{:02X}:00.0", self.pci_bus())
    }

    /// The GPU instance with id `gi_id`.
    pub fn gpu_instance(&self, gi_id: u32) -> Option<&SimGpuInstance> {
        self.gpu_instances.iter().find(|gi| gi.id == gi_id)
    }

    /// The GPU instance with id `gi_id`, mutable.
    pub fn gpu_instance_mut(&mut self, gi_id: u32) -> Option<&mut SimGpuInstance> {
        self.gpu_instances.iter_mut().find(|gi| gi.id == gi_id)
    }
}

impl SimGpuInstance {
    /// The compute instance with id `ci_id`.
    pub fn compute_instance(&self, ci_id: u32) -> Option<&SimComputeInstance> {
        self.compute_instances.iter().find(|ci| ci.id == ci_id)
    }
}

/// Cheap identity of the state file's current version: compare two stamps to
/// learn whether the file changed without reading it.
///
/// Every update renames a new file over the old one, so the inode changes;
/// together with the nanosecond mtime, ctime and size a stale stamp cannot
/// match a newer file in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// Access to the state file of one simulated node root.
#[derive(Debug, Clone)]
pub struct StateStore {
    root: PathBuf,
    state_path: PathBuf,
    lock_path: PathBuf,
}

impl StateStore {
    /// Opens the state of the node built at `root`; fails with
    /// [`SimError::NoNode`] when no state file is there.
    pub fn open(root: &Path) -> Result<StateStore, SimError> {
        let store = StateStore::at(root);
        match fs::metadata(&store.state_path) {
            Ok(_) => Ok(store),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SimError::NoNode {
                root: root.to_path_buf(),
                state: store.state_path.clone(),
            }),
            Err(e) => Err(SimError::io(&store.state_path, e)),
        }
    }

    /// Writes `state` as the initial state of the node at `root` (creating
    /// `run/tessera-sim/`), replacing any previous state; used by the builder.
    pub fn write_new(root: &Path, state: &NodeState) -> Result<StateStore, SimError> {
        let store = StateStore::at(root);
        let dir = store.dir();
        fs::create_dir_all(&dir).map_err(|e| SimError::io(&dir, e))?;
        let _lock = store.lock(true)?;
        store.write_locked(state)?;
        Ok(store)
    }

    fn at(root: &Path) -> StateStore {
        let dir = root.join(STATE_DIR);
        StateStore {
            root: root.to_path_buf(),
            state_path: dir.join(STATE_FILE),
            lock_path: dir.join(LOCK_FILE),
        }
    }

    /// The node root this store belongs to.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Path of the state file.
    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    fn dir(&self) -> PathBuf {
        self.root.join(STATE_DIR)
    }

    /// Reads the current state under a shared lock.
    pub fn read(&self) -> Result<NodeState, SimError> {
        let _lock = self.lock(false)?;
        self.read_locked()
    }

    /// Applies `f` to the current state under an exclusive lock and writes
    /// the result atomically. When `f` fails nothing is written.
    pub fn update<T>(
        &self,
        f: impl FnOnce(&mut NodeState) -> Result<T, SimError>,
    ) -> Result<T, SimError> {
        let _lock = self.lock(true)?;
        let mut state = self.read_locked()?;
        let value = f(&mut state)?;
        self.write_locked(&state)?;
        Ok(value)
    }

    /// The state file's current [`StateStamp`] (one `stat`, no lock).
    pub fn stamp(&self) -> Result<StateStamp, SimError> {
        let m = fs::metadata(&self.state_path).map_err(|e| SimError::io(&self.state_path, e))?;
        Ok(StateStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Takes the lock file's flock; released when the returned file drops.
    fn lock(&self, exclusive: bool) -> Result<File, SimError> {
        let io = |e| SimError::io(&self.lock_path, e);
        let file = if exclusive {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.lock_path)
                .map_err(io)?
        } else {
            // A reader may lack write access to the node; a read-only fd
            // takes a shared flock just as well.
            match File::open(&self.lock_path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.lock_path)
                    .map_err(io)?,
                Err(e) => return Err(io(e)),
            }
        };
        if exclusive {
            file.lock().map_err(io)?;
        } else {
            file.lock_shared().map_err(io)?;
        }
        Ok(file)
    }

    fn read_locked(&self) -> Result<NodeState, SimError> {
        let text = match fs::read_to_string(&self.state_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SimError::NoNode {
                    root: self.root.clone(),
                    state: self.state_path.clone(),
                });
            }
            Err(e) => return Err(SimError::io(&self.state_path, e)),
        };
        let state: NodeState = serde_json::from_str(&text).map_err(|e| SimError::Corrupt {
            path: self.state_path.clone(),
            reason: format!("not a tessera-sim state file: {e}"),
        })?;
        if state.version != STATE_VERSION {
            return Err(SimError::Corrupt {
                path: self.state_path.clone(),
                reason: format!(
                    "version: {} is not supported (expected {STATE_VERSION}); rebuild the node with `tessera-sim create --force`",
                    state.version
                ),
            });
        }
        Ok(state)
    }

    fn write_locked(&self, state: &NodeState) -> Result<(), SimError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir()
            .join(format!(".{STATE_FILE}.tmp.{}.{n}", std::process::id()));
        let mut text = serde_json::to_string_pretty(state).map_err(|e| SimError::Corrupt {
            path: self.state_path.clone(),
            reason: format!("cannot serialize state: {e}"),
        })?;
        text.push('\n');
        let result = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &self.state_path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(SimError::io(&self.state_path, e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeState {
        let mut s = NodeState::new("570.133.20");
        s.gpus.push(SimGpu {
            index: 0,
            minor: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            model: "A100-40GB".into(),
            pci_bus: None,
            mig_enabled: true,
            mig_pending: true,
            gpu_instances: vec![SimGpuInstance {
                id: 1,
                profile_id: 9,
                start: 4,
                size: 4,
                compute_instances: vec![SimComputeInstance {
                    id: 0,
                    profile_id: 2,
                    uuid: "MIG-00000000-0000-0000-0000-000000000000".into(),
                }],
            }],
        });
        s
    }

    #[test]
    fn state_round_trips_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::write_new(dir.path(), &sample()).unwrap();
        assert_eq!(store.read().unwrap(), sample());
        assert_eq!(
            StateStore::open(dir.path()).unwrap().read().unwrap(),
            sample()
        );
    }

    #[test]
    fn failed_update_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::write_new(dir.path(), &sample()).unwrap();
        let before = store.stamp().unwrap();
        let r: Result<(), _> = store.update(|s| {
            s.serial = 99;
            Err(SimError::InUse("x".into()))
        });
        assert!(matches!(r, Err(SimError::InUse(_))));
        assert_eq!(store.stamp().unwrap(), before);
        assert_eq!(store.read().unwrap().serial, 0);
    }

    #[test]
    fn stamp_changes_on_update() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::write_new(dir.path(), &sample()).unwrap();
        let before = store.stamp().unwrap();
        store
            .update(|s| {
                s.serial += 1;
                Ok(())
            })
            .unwrap();
        assert_ne!(store.stamp().unwrap(), before);
    }

    #[test]
    fn open_without_state_says_no_node() {
        let dir = tempfile::tempdir().unwrap();
        let err = StateStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, SimError::NoNode { .. }), "{err}");
        assert!(err.to_string().contains("tessera-sim create"), "{err}");
    }

    #[test]
    fn corrupt_state_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::write_new(dir.path(), &sample()).unwrap();
        fs::write(store.state_path(), "{").unwrap();
        let err = store.read().unwrap_err().to_string();
        assert!(err.contains("state.json"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
