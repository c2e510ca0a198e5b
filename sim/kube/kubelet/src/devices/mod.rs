//! The device plugin manager, as kubelet's: the Registration server, one
//! client per registered plugin (GetDevicePluginOptions, ListAndWatch,
//! GetPreferredAllocation, Allocate, PreStartContainer), the assignments and
//! their checkpoint, and the PodResources v1 server.
//!
//! This is the interface the rest of the kubelet stand-in uses; its insides
//! are being written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// A pod as the manager records it (PodResources answers with its name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// Device counts of one extended resource, as the node status shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceCounts {
    /// Every device the plugin listed (`status.capacity`).
    pub capacity: u64,
    /// The healthy ones (`status.allocatable`).
    pub allocatable: u64,
}

/// A mount a plugin asked for (`Mount` of the Allocate response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Read-only.
    pub read_only: bool,
}

/// A device node a plugin asked for (`DeviceSpec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions, e.g. `rw`.
    pub permissions: String,
}

/// What a container gets from the device plugins it uses: the Allocate
/// responses of each resource it requests, merged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerAllocation {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Mounts.
    pub mounts: Vec<Mount>,
    /// Device nodes.
    pub devices: Vec<DeviceSpec>,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// Why a container cannot be admitted (the pod fails with
/// `UnexpectedAdmissionError`, as kubelet's does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// Fewer healthy, unassigned devices than requested.
    #[error(
        "Allocate failed due to requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}, which is unexpected"
    )]
    Unavailable {
        /// The resource.
        resource: String,
        /// Devices requested.
        requested: u64,
        /// Devices available.
        available: u64,
    },
    /// The plugin's call failed.
    #[error("{resource}: device plugin {call} failed: {message}")]
    Plugin {
        /// The resource.
        resource: String,
        /// The gRPC call.
        call: &'static str,
        /// The status message.
        message: String,
    },
}

/// What stops the manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket or file of the kubelet directory.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The device plugin manager of one kubelet.
pub struct DeviceManager {
    _private: (),
}

impl DeviceManager {
    /// Starts the Registration server under `kubelet_dir`
    /// (`<root>/var/lib/kubelet`: `device-plugins/kubelet.sock`, whose other
    /// sockets it removes first, as kubelet does) and the PodResources server
    /// (`pod-resources/kubelet.sock`), and restores the checkpoint.
    pub async fn start(kubelet_dir: &Path) -> Result<Arc<DeviceManager>, Error> {
        let _ = kubelet_dir;
        Ok(Arc::new(DeviceManager { _private: () }))
    }

    /// Every resource a plugin registered, with its counts.
    pub fn resources(&self) -> BTreeMap<String, ResourceCounts> {
        BTreeMap::new()
    }

    /// Ticks whenever [`Self::resources`] changes (a plugin registers, lists
    /// devices, dies).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        tokio::sync::watch::channel(0).1
    }

    /// Whether a registered plugin serves `resource`.
    pub fn manages(&self, resource: &str) -> bool {
        let _ = resource;
        false
    }

    /// Devices for one container: `requests` maps each extended resource the
    /// container requests (limits) to a count; resources no plugin manages
    /// are the caller's business. Idempotent per (pod uid, container): a
    /// second call (a container restart, a kubelet restart) returns the
    /// checkpointed response without calling the plugin.
    pub async fn allocate(
        &self,
        pod: &PodRef,
        container: &str,
        requests: &BTreeMap<String, u64>,
    ) -> Result<ContainerAllocation, AdmitError> {
        let _ = (pod, container, requests);
        Ok(ContainerAllocation::default())
    }

    /// PreStartContainer for each plugin that asked for it, with the
    /// container's devices; call before each start of the container.
    pub async fn pre_start(&self, pod: &PodRef, container: &str) -> Result<(), AdmitError> {
        let _ = (pod, container);
        Ok(())
    }

    /// The pods still active on the node; devices of any other pod are
    /// freed (and leave the checkpoint and PodResources).
    pub fn retain_pods(&self, active_uids: &BTreeSet<String>) {
        let _ = active_uids;
    }

    /// Stops the servers and the plugin clients.
    pub async fn shutdown(&self) {}
}
