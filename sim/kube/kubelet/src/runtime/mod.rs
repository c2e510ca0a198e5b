//! The container runtime behind a small trait, in the terms of CRI: pod
//! sandboxes and their containers. Three implementations: CRI over a unix
//! socket (containerd), podman's command line, and a recording fake (the
//! `--dry-run` mode and the unit tests of the pod logic).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod cri;
pub mod podman;
pub mod recording;

/// Labels kubelet puts on sandboxes and containers; the stand-in finds its
/// own again by them after a restart.
pub mod labels {
    /// The pod's name.
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    /// The pod's namespace.
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// The pod's uid.
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    /// The container's name in the pod.
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// The node whose kubelet made it: several stand-in kubelets may share
    /// one runtime (podman's store is per host), and each must leave the
    /// others' pods alone.
    pub const NODE: &str = "io.tessera.kubelet.node";
}

/// Whose pid namespace a pod's containers get (CRI `NamespaceMode` of
/// `pid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PidNamespace {
    /// One per container (the Kubernetes default).
    #[default]
    Container,
    /// One for the pod (`shareProcessNamespace: true`).
    Pod,
    /// The host's (`hostPID: true`).
    Node,
}

/// What a pod sandbox is made from (CRI `PodSandboxConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxConfig {
    /// `metadata.name` of the pod.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// How many sandboxes this pod had before.
    pub attempt: u32,
    /// The pod's hostname.
    pub hostname: String,
    /// Where the containers' logs go.
    pub log_directory: String,
    /// Labels (`io.kubernetes.pod.*` and the pod's own).
    pub labels: BTreeMap<String, String>,
    /// Annotations (the pod's).
    pub annotations: BTreeMap<String, String>,
    /// The cgroup parent, empty for the runtime's default.
    pub cgroup_parent: String,
    /// The containers' pid namespace.
    pub pid: PidNamespace,
    /// The host's IPC namespace (`hostIPC: true`) instead of the pod's.
    pub host_ipc: bool,
}

/// A mount of a container (CRI `Mount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Read-only.
    pub readonly: bool,
}

/// A device node of a container (CRI `Device`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions (`rwm`).
    pub permissions: String,
}

/// What a container is made from (CRI `ContainerConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerConfig {
    /// The container's name in the pod.
    pub name: String,
    /// Its restart count: a new attempt for each restart.
    pub attempt: u32,
    /// The image reference.
    pub image: String,
    /// The entrypoint (the pod spec's `command`), empty for the image's.
    pub command: Vec<String>,
    /// Its arguments (the pod spec's `args`).
    pub args: Vec<String>,
    /// The working directory, empty for the image's.
    pub working_dir: String,
    /// Environment variables, in order.
    pub envs: Vec<(String, String)>,
    /// Mounts.
    pub mounts: Vec<Mount>,
    /// Device nodes.
    pub devices: Vec<Device>,
    /// Labels (`io.kubernetes.*`).
    pub labels: BTreeMap<String, String>,
    /// Annotations (the device plugins').
    pub annotations: BTreeMap<String, String>,
    /// The log file, relative to the sandbox's log directory.
    pub log_path: String,
    /// Fully qualified CDI device names (CRI `CDI_devices`).
    pub cdi_devices: Vec<String>,
}

/// The state of a container as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// One container's status (CRI `ContainerStatus`); times in nanoseconds
/// since the epoch, 0 when not reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    /// The container id.
    pub id: String,
    /// Its state.
    pub state: ContainerState,
    /// When it was created.
    pub created_at: i64,
    /// When it started.
    pub started_at: i64,
    /// When it exited.
    pub finished_at: i64,
    /// Its exit status.
    pub exit_code: i32,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// The runtime's message.
    pub message: String,
    /// The image it runs, resolved.
    pub image_ref: String,
}

/// A sandbox the runtime has (CRI `PodSandbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The sandbox id.
    pub id: String,
    /// The pod's uid (label `io.kubernetes.pod.uid`).
    pub pod_uid: String,
    /// The node that made it (label [`labels::NODE`]).
    pub node: String,
    /// Whether it is ready (running).
    pub ready: bool,
    /// Its attempt.
    pub attempt: u32,
}

/// A container the runtime has (CRI `Container`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The container id.
    pub id: String,
    /// Its sandbox.
    pub sandbox_id: String,
    /// The pod's uid (label `io.kubernetes.pod.uid`).
    pub pod_uid: String,
    /// The node that made it (label [`labels::NODE`]).
    pub node: String,
    /// The container's name in the pod.
    pub name: String,
    /// Its attempt (the restart count when it was made).
    pub attempt: u32,
    /// Its state.
    pub state: ContainerState,
}

/// The runtime's name and version (`containerd`, `1.7.24`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// The runtime's name.
    pub name: String,
    /// Its version.
    pub version: String,
}

impl RuntimeVersion {
    /// As a node's `status.nodeInfo.containerRuntimeVersion` shows it.
    pub fn node_info(&self) -> String {
        format!("{}://{}", self.name, self.version.trim_start_matches('v'))
    }
}

/// A failed runtime call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime does not have the sandbox or container.
    #[error("{call}: not found: {message}")]
    NotFound {
        /// The call.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime refused or failed.
    #[error("{call}: {message}")]
    Call {
        /// The call.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime could not be reached.
    #[error("container runtime {endpoint}: {message}")]
    Connect {
        /// Where it was looked for.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
}

impl RuntimeError {
    /// The runtime's message, without the call's name.
    pub fn message(&self) -> &str {
        match self {
            RuntimeError::NotFound { message, .. }
            | RuntimeError::Call { message, .. }
            | RuntimeError::Connect { message, .. } => message,
        }
    }
}

/// The result of a runtime call.
pub type RuntimeResult<T> = Result<T, RuntimeError>;

/// The calls the pod logic makes, as kubelet makes them over CRI.
#[tonic::async_trait]
pub trait ContainerRuntime: Send + Sync {
    /// The runtime's name and version.
    async fn version(&self) -> RuntimeResult<RuntimeVersion>;
    /// Runs a pod sandbox; its id.
    async fn run_sandbox(&self, config: &SandboxConfig) -> RuntimeResult<String>;
    /// The sandbox's IP, when it has one.
    async fn sandbox_ip(&self, id: &str) -> RuntimeResult<Option<String>>;
    /// Stops a sandbox (and its containers).
    async fn stop_sandbox(&self, id: &str) -> RuntimeResult<()>;
    /// Removes a stopped sandbox.
    async fn remove_sandbox(&self, id: &str) -> RuntimeResult<()>;
    /// Whether the runtime has the image (this stand-in never pulls).
    async fn image_present(&self, image: &str) -> RuntimeResult<bool>;
    /// Creates a container in a sandbox; its id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        config: &ContainerConfig,
    ) -> RuntimeResult<String>;
    /// Starts a created container.
    async fn start_container(&self, id: &str) -> RuntimeResult<()>;
    /// Stops a container: SIGTERM, SIGKILL after `timeout` seconds.
    async fn stop_container(&self, id: &str, timeout: i64) -> RuntimeResult<()>;
    /// Removes a container.
    async fn remove_container(&self, id: &str) -> RuntimeResult<()>;
    /// A container's status.
    async fn container_status(&self, id: &str) -> RuntimeResult<ContainerStatus>;
    /// Every sandbox labelled with a pod uid.
    async fn list_sandboxes(&self) -> RuntimeResult<Vec<SandboxInfo>>;
    /// Every container labelled with a pod uid.
    async fn list_containers(&self) -> RuntimeResult<Vec<ContainerInfo>>;
}
