//! The device plugin manager, as kubelet's: the Registration server, one
//! client per registered plugin (GetDevicePluginOptions, ListAndWatch,
//! GetPreferredAllocation, Allocate, PreStartContainer), the assignments and
//! their checkpoint, and the PodResources v1 server.
//!
//! Files: `registration` (the Registration server and the checks of a
//! RegisterRequest), `plugins` (one client per plugin, ListAndWatch),
//! `allocate` (choosing devices, Allocate, PreStartContainer),
//! `checkpoint` (the assignments and their file), `podresources` (the
//! PodResources v1 server).
//!
//! Differences from kubelet, on purpose: a resource whose plugin died stays
//! listed (all devices Unhealthy) instead of being dropped after kubelet's
//! 5 minute grace period; no Topology Manager (NUMA alignment); plugin calls
//! time out after 30 s; a preferred allocation is taken whole when it is
//! exactly the requested number of distinct devices from the offered ones,
//! including every device the container reuses, and ignored otherwise
//! (kubelet keeps its valid part and fills up); a container requesting
//! several resources is admitted whole or not at all, and so is a pod
//! given to [`DeviceManager::admit_pod`] (what one call assigned before a
//! failure is freed); PodResources knows pods without devices only when
//! told of them with [`DeviceManager::set_active_pods`] (with
//! [`DeviceManager::retain_pods`] alone it lists only pods holding
//! devices), lists init containers that hold devices, and reports no CPUs,
//! memory or dynamic resources; checkpoint writes other than an
//! allocation's (freed pods, health changes) are queued to a writer thread
//! rather than made at once (`shutdown` waits for them; a crash may lose
//! only a freeing, which the next `retain_pods` redoes). Allocation calls
//! are serialized (kubelet admits one pod at a time), so concurrent callers
//! never get the same device.
//!
//! What the pod code calls when, as kubelet's admission and container
//! start do: admitting a pod (a new one, or every pod found at a kubelet
//! start), [`DeviceManager::admit_pod`] with every init container, then
//! every app container, in spec order, each marked `running` when the
//! runtime already runs it (its checkpointed devices are then reused
//! unchecked; any other reuse of a checkpointed assignment is refused when
//! the resource is unregistered or the devices are no longer healthy, as
//! after a node reboot); before each start of a container,
//! [`DeviceManager::pre_start`]; to get the devices of a container to
//! restart when the admission's answer is not at hand,
//! [`DeviceManager::reuse_running`] (unchecked, as kubelet's container
//! start), or `allocate` when [`DeviceManager::container_devices`] lacks a
//! resource it requests (kubelet allocates again then); whenever the node's pods change,
//! [`DeviceManager::set_active_pods`] (or `retain_pods`).
//! [`DeviceManager::allocate`] is `admit_pod` for one app container that is
//! not running: no reuse of init containers' devices.

mod allocate;
mod checkpoint;
mod plugins;
mod podresources;
mod registration;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tessera_kube_proto::deviceplugin::v1beta1::registration_server::RegistrationServer;
use tessera_kube_proto::podresources::v1::pod_resources_lister_server::PodResourcesListerServer;

use checkpoint::{CHECKPOINT_FILE, CheckpointError, Ledger};
use plugins::Plugin;

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
    /// The container already holds a different number of devices of the
    /// resource (its spec changed under the same pod uid).
    #[error("container changed its request for resource {resource} from {held} to {requested}")]
    RequestChanged {
        /// The resource.
        resource: String,
        /// Devices it holds.
        held: u64,
        /// Devices it requests now.
        requested: u64,
    },
    /// The assignment could not be recorded in the checkpoint, so it was
    /// not made (a kubelet restart would have lost it).
    #[error("cannot write the device checkpoint: {message}")]
    Checkpoint {
        /// Why.
        message: String,
    },
    /// The resource holds devices in the checkpoint but no plugin
    /// registered it.
    #[error("cannot allocate unregistered device {resource}")]
    Unregistered {
        /// The resource.
        resource: String,
    },
    /// The resource has no healthy device (its plugin died, or has not
    /// registered again since a restart).
    #[error("no healthy devices present; cannot allocate unhealthy devices {resource}")]
    NoHealthyDevices {
        /// The resource.
        resource: String,
    },
    /// The container's checkpointed devices are not all healthy now.
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
    )]
    NoLongerHealthy {
        /// The resource.
        resource: String,
    },
}

/// Where a container stands among its pod's containers, which decides
/// whether later containers may reuse its devices (kubelet hands the
/// devices of a finished init container on; a scheduler counts
/// `max(init, sum(app))`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// An init container: it ends before the next one starts, so its
    /// devices are reusable by every later container.
    Init,
    /// A restartable init container (`restartPolicy: Always`, a sidecar):
    /// it keeps running, so its devices are never handed on.
    SidecarInit,
    /// An app container: its devices are its own while the pod lives.
    App,
}

/// One container of a pod to admit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRequest {
    /// The container's name.
    pub name: String,
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// Extended resource -> count (limits); resources no plugin manages are
    /// the caller's business.
    pub requests: BTreeMap<String, u64>,
    /// The runtime runs it already (found at a kubelet start): it has its
    /// devices, so the checkpointed answer is returned unchecked.
    pub running: bool,
}

/// A pod active on the node, as PodResources lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivePod {
    /// The pod.
    pub pod: PodRef,
    /// Its app containers and sidecars, in spec order (PodResources lists
    /// these, with or without devices).
    pub containers: Vec<String>,
}

/// How the manager runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Serve PodResources `Get` (kubelet's `KubeletPodResourcesGet` feature
    /// gate, off by default; off, `Get` answers "PodResources API Get method
    /// disabled").
    pub pod_resources_get: bool,
}

/// What stops the manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint writer thread could not start.
    #[error("cannot start the checkpoint writer: {0}")]
    Writer(#[source] std::io::Error),
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
    shared: Arc<Shared>,
    servers: Mutex<Vec<Served>>,
}

/// What the servers, the plugin tasks and the manager share.
pub(crate) struct Shared {
    /// `<kubelet_dir>/device-plugins`.
    plugins_dir: PathBuf,
    /// Resources by name. Lock order: `plugins` before `ledger`.
    plugins: Mutex<BTreeMap<String, Plugin>>,
    /// Assignments and registered resources, as checkpointed.
    ledger: Mutex<Ledger>,
    /// Held across one whole `allocate`.
    allocation: tokio::sync::Mutex<()>,
    changes: tokio::sync::watch::Sender<u64>,
    /// Taken with `plugins` locked, so a later registration always gets a
    /// higher number.
    next_generation: AtomicU64,
    /// Set by `shutdown`: late registrations are ignored.
    stopped: AtomicBool,
    /// Writes the checkpoint off the async workers.
    writer: checkpoint::Writer,
    /// The node's active pods by uid, when the pod code said
    /// (`set_active_pods`). Lock order: after `ledger`.
    active_pods: Mutex<Option<BTreeMap<String, ActivePod>>>,
    /// PodResources `Get` is served.
    pod_resources_get: bool,
}

impl Shared {
    fn lock_plugins(&self) -> MutexGuard<'_, BTreeMap<String, Plugin>> {
        // A panic elsewhere must not take the kubelet down with it.
        self.plugins.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_active_pods(&self) -> MutexGuard<'_, Option<BTreeMap<String, ActivePod>>> {
        self.active_pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn manages(&self, resource: &str) -> bool {
        self.lock_plugins().contains_key(resource)
    }

    /// Queues a checkpoint write of `ledger` (call with it locked); a
    /// failure is logged (the in-memory state stays right, and the next
    /// write retries).
    fn save(&self, ledger: &Ledger) {
        self.writer.save(ledger);
    }

    /// Records the registered resources in the checkpoint and ticks
    /// `changes`.
    fn resources_changed(&self) {
        {
            let plugins = self.lock_plugins();
            let registered: BTreeMap<String, Vec<String>> = plugins
                .iter()
                .map(|(name, p)| (name.clone(), p.healthy_ids()))
                .collect();
            let mut ledger = self.lock_ledger();
            if ledger.registered != registered {
                ledger.registered = registered;
                self.save(&ledger);
            }
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A gRPC server on a unix socket.
struct Served {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Binds `socket` (replacing a stale one) and serves `router` on it.
fn serve(socket: PathBuf, router: tonic::transport::server::Router) -> Result<Served, Error> {
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&socket)(e)),
    }
    let listener = tokio::net::UnixListener::bind(&socket).map_err(io_error(&socket))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let name = socket.display().to_string();
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            tracing::error!("gRPC server on {name} failed: {}", plugins::error_chain(&e));
        }
    });
    Ok(Served {
        socket,
        stop: Some(stop),
        task,
    })
}

/// Removes the sockets of the device-plugins dir, as kubelet does at
/// start: plugins see their socket vanish and register again. Everything
/// else stays (the checkpoint, bad checkpoints set aside, directories,
/// whatever an operator put there). Like kubelet, a link is judged by what
/// it points to, and an entry that cannot be looked at is logged and left.
fn clean_plugins_dir(dir: &Path) -> Result<(), Error> {
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let path = entry.path();
        if entry.file_name() == CHECKPOINT_FILE {
            continue;
        }
        let is_socket = match std::fs::metadata(&path) {
            Ok(metadata) => metadata.file_type().is_socket(),
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot look at a device-plugins dir entry, leaving it: {e}");
                continue;
            }
        };
        if !is_socket {
            continue;
        }
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), "cannot remove a stale plugin socket: {e}");
            continue;
        }
        tracing::debug!(path = %path.display(), "removed a socket from the device-plugins dir");
    }
    Ok(())
}

/// The checkpoint at start: a corrupt one is set aside and the manager
/// starts empty, as kubelet carries on without it.
fn restore(path: &Path) -> Ledger {
    match checkpoint::read(path) {
        Ok(Some(ledger)) => {
            tracing::info!(
                path = %path.display(),
                assignments = ledger.assignments.len(),
                resources = ledger.registered.len(),
                "device checkpoint restored"
            );
            ledger
        }
        Ok(None) => Ledger::default(),
        Err(e @ CheckpointError::Corrupt { .. }) => {
            match checkpoint::set_aside(path) {
                Ok(aside) => tracing::warn!(
                    "{e}; starting without device assignments (the bad file is kept as {})",
                    aside.display()
                ),
                Err(move_error) => tracing::warn!(
                    "{e}; starting without device assignments (could not move the bad file aside: {move_error})"
                ),
            }
            Ledger::default()
        }
        Err(e) => {
            tracing::warn!("{e}; starting without device assignments");
            Ledger::default()
        }
    }
}

impl DeviceManager {
    /// Starts the Registration server under `kubelet_dir`
    /// (`<root>/var/lib/kubelet`: `device-plugins/kubelet.sock`, whose other
    /// sockets it removes first, as kubelet does) and the PodResources server
    /// (`pod-resources/kubelet.sock`), and restores the checkpoint; with the
    /// default [`Options`].
    pub async fn start(kubelet_dir: &Path) -> Result<Arc<DeviceManager>, Error> {
        Self::start_with(kubelet_dir, Options::default()).await
    }

    /// [`Self::start`] with `options`.
    pub async fn start_with(
        kubelet_dir: &Path,
        options: Options,
    ) -> Result<Arc<DeviceManager>, Error> {
        let plugins_dir = kubelet_dir.join("device-plugins");
        let pod_resources_dir = kubelet_dir.join("pod-resources");
        for dir in [&plugins_dir, &pod_resources_dir] {
            std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        clean_plugins_dir(&plugins_dir)?;

        let ledger = restore(&plugins_dir.join(CHECKPOINT_FILE));
        // Resources known before the restart stay known (capacity 0) until
        // their plugins register again.
        let plugins: BTreeMap<String, Plugin> = ledger
            .registered
            .keys()
            .map(|name| (name.clone(), Plugin::restored()))
            .collect();
        let shared = Arc::new(Shared {
            plugins_dir: plugins_dir.clone(),
            plugins: Mutex::new(plugins),
            ledger: Mutex::new(ledger),
            allocation: tokio::sync::Mutex::new(()),
            changes: tokio::sync::watch::channel(0).0,
            next_generation: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            writer: checkpoint::Writer::start(plugins_dir.join(CHECKPOINT_FILE))
                .map_err(Error::Writer)?,
            active_pods: Mutex::new(None),
            pod_resources_get: options.pod_resources_get,
        });

        let registration = tonic::transport::Server::builder().add_service(
            RegistrationServer::new(registration::RegistrationService {
                shared: Arc::clone(&shared),
            }),
        );
        let pod_resources = tonic::transport::Server::builder().add_service(
            PodResourcesListerServer::new(podresources::PodResourcesService {
                shared: Arc::clone(&shared),
            }),
        );
        let mut servers = vec![serve(
            pod_resources_dir.join(registration::KUBELET_SOCKET),
            pod_resources,
        )?];
        // The Registration socket comes last: plugins watch for it to appear.
        servers.push(serve(
            plugins_dir.join(registration::KUBELET_SOCKET),
            registration,
        )?);
        tracing::info!(dir = %plugins_dir.display(), "device plugin manager serving Registration");
        Ok(Arc::new(DeviceManager {
            shared,
            servers: Mutex::new(servers),
        }))
    }

    /// Every resource a plugin registered, with its counts.
    pub fn resources(&self) -> BTreeMap<String, ResourceCounts> {
        self.shared
            .lock_plugins()
            .iter()
            .map(|(name, plugin)| {
                let counts = ResourceCounts {
                    capacity: plugin.devices.len() as u64,
                    allocatable: plugin.devices.values().filter(|d| d.healthy).count() as u64,
                };
                (name.clone(), counts)
            })
            .collect()
    }

    /// Ticks whenever [`Self::resources`] changes (a plugin registers, lists
    /// devices, dies).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// Whether a registered plugin serves `resource`.
    pub fn manages(&self, resource: &str) -> bool {
        self.shared.manages(resource)
    }

    /// Devices for one app container that is not running: `requests` maps
    /// each extended resource the container requests (limits) to a count;
    /// resources no plugin manages are the caller's business. A container
    /// that holds devices already (a container restart, a kubelet restart)
    /// gets the checkpointed response without a plugin call, provided the
    /// resource is registered and those devices are healthy, as kubelet's
    /// admission checks after a node reboot. Same as [`Self::admit_pod`]
    /// with this one container.
    pub async fn allocate(
        &self,
        pod: &PodRef,
        container: &str,
        requests: &BTreeMap<String, u64>,
    ) -> Result<ContainerAllocation, AdmitError> {
        let request = ContainerRequest {
            name: container.to_owned(),
            kind: ContainerKind::App,
            requests: requests.clone(),
            running: false,
        };
        let mut admitted = self
            .shared
            .admit_pod(pod, std::slice::from_ref(&request))
            .await?;
        Ok(admitted.remove(container).unwrap_or_default())
    }

    /// Admits a pod: devices for each of `containers`, which must be its
    /// init containers, then its app containers, in spec order (kubelet
    /// relies on the same order). Devices of a (non-restartable) init
    /// container are reused by later containers before any free device is
    /// taken, and each app container or sidecar keeps what it reused to
    /// itself, so a pod needs `max(init, sum(app))` devices as the
    /// scheduler counts. A running container gets its checkpointed answer
    /// unchecked. Returns each container's allocation, by name; on an error
    /// nothing this call assigned stays assigned.
    pub async fn admit_pod(
        &self,
        pod: &PodRef,
        containers: &[ContainerRequest],
    ) -> Result<BTreeMap<String, ContainerAllocation>, AdmitError> {
        self.shared.admit_pod(pod, containers).await
    }

    /// The checkpointed answers of a container's plugins, merged, without
    /// any check or plugin call (empty when it holds no devices): for a
    /// container the runtime still runs after a kubelet restart, or one
    /// restarting after admission, as kubelet takes them for a container
    /// start.
    pub fn reuse_running(&self, pod: &PodRef, container: &str) -> ContainerAllocation {
        self.shared.reuse_running(&pod.uid, container)
    }

    /// PreStartContainer for each plugin that asked for it, with the
    /// container's devices; call before each start of the container.
    pub async fn pre_start(&self, pod: &PodRef, container: &str) -> Result<(), AdmitError> {
        self.shared.pre_start(pod, container).await
    }

    /// The pods still active on the node; devices of any other pod are
    /// freed (and leave the checkpoint and PodResources).
    pub fn retain_pods(&self, active_uids: &BTreeSet<String>) {
        let mut ledger = self.shared.lock_ledger();
        let before = ledger.assignments.len();
        ledger
            .assignments
            .retain(|(uid, _, _), _| active_uids.contains(uid));
        if ledger.assignments.len() != before {
            tracing::info!(
                freed = before - ledger.assignments.len(),
                "devices of inactive pods freed"
            );
            self.shared.save(&ledger);
        }
        if let Some(known) = self.shared.lock_active_pods().as_mut() {
            known.retain(|uid, _| active_uids.contains(uid));
        }
    }

    /// The node's active pods, with their names and containers: devices of
    /// any other pod are freed (as [`Self::retain_pods`]), and PodResources
    /// lists these pods, holding devices or not.
    pub fn set_active_pods(&self, pods: &[ActivePod]) {
        let uids: BTreeSet<String> = pods.iter().map(|p| p.pod.uid.clone()).collect();
        self.retain_pods(&uids);
        *self.shared.lock_active_pods() = Some(
            pods.iter()
                .map(|p| (p.pod.uid.clone(), p.clone()))
                .collect(),
        );
    }

    /// Device ids held by one container, by resource (empty when none).
    pub fn container_devices(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> BTreeMap<String, Vec<String>> {
        self.shared
            .lock_ledger()
            .assignments
            .iter()
            .filter(|((uid, name, _), _)| uid == pod_uid && name == container)
            .map(|((_, _, resource), a)| (resource.clone(), a.device_ids().into_iter().collect()))
            .collect()
    }

    /// Stops the servers and the plugin clients, removes the sockets, and
    /// waits until the checkpoint is written.
    pub async fn shutdown(&self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        self.stop_plugin_tasks();
        let servers = std::mem::take(&mut *self.servers.lock().unwrap_or_else(|e| e.into_inner()));
        for mut served in servers {
            if let Some(stop) = served.stop.take() {
                let _ = stop.send(());
            }
            // Graceful first; a client holding a connection open must not
            // keep the kubelet from stopping.
            if tokio::time::timeout(Duration::from_secs(2), &mut served.task)
                .await
                .is_err()
            {
                served.task.abort();
            }
            let _ = std::fs::remove_file(&served.socket);
        }
        self.shared.writer.close().await;
    }

    fn stop_plugin_tasks(&self) {
        for plugin in self.shared.lock_plugins().values_mut() {
            if let Some(task) = plugin.task.take() {
                task.abort();
            }
            plugin.client = None;
        }
    }
}

impl Drop for DeviceManager {
    fn drop(&mut self) {
        // Without `shutdown` (a panic, a test's early return) the tasks
        // would outlive the manager and keep its sockets served.
        self.shared.stopped.store(true, Ordering::Relaxed);
        self.stop_plugin_tasks();
        for served in self
            .servers
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            served.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoint::{Assignment, NO_NUMA};
    use super::*;
    use tessera_kube_proto::deviceplugin::v1beta1 as api;

    const RESOURCE: &str = "example.com/dev";

    fn pod() -> PodRef {
        PodRef {
            uid: "uid-1".into(),
            namespace: "default".into(),
            name: "p".into(),
        }
    }

    /// A checkpoint where container `c` of `pod()` holds d0, with the
    /// resource registered or not.
    fn checkpoint_holding_d0(
        kubelet_dir: &Path,
        registered: bool,
    ) -> api::ContainerAllocateResponse {
        let response = api::ContainerAllocateResponse {
            envs: [("DEV".to_owned(), "d0".to_owned())].into(),
            ..Default::default()
        };
        let mut ledger = Ledger::default();
        ledger.assignments.insert(
            ("uid-1".into(), "c".into(), RESOURCE.into()),
            Assignment {
                pod: pod(),
                devices_by_numa: [(NO_NUMA, vec!["d0".to_owned()])].into(),
                response: response.clone(),
            },
        );
        if registered {
            ledger.registered.insert(RESOURCE.into(), vec!["d0".into()]);
        }
        let dir = kubelet_dir.join("device-plugins");
        std::fs::create_dir_all(&dir).expect("plugins dir");
        checkpoint::write(&dir.join(CHECKPOINT_FILE), &ledger).expect("checkpoint");
        response
    }

    fn kubelet_dir() -> tempfile::TempDir {
        // Short: unix socket paths are limited to 108 bytes.
        tempfile::Builder::new()
            .prefix("kdu")
            .tempdir_in("/tmp")
            .expect("tempdir")
    }

    #[tokio::test(flavor = "current_thread")]
    async fn checkpointed_devices_are_reused_only_when_registered_and_healthy() {
        let requests: BTreeMap<String, u64> = [(RESOURCE.to_owned(), 1)].into();
        for (registered, expected) in [
            (false, "cannot allocate unregistered device example.com/dev"),
            (
                true,
                "no healthy devices present; cannot allocate unhealthy devices example.com/dev",
            ),
        ] {
            let dir = kubelet_dir();
            let response = checkpoint_holding_d0(dir.path(), registered);
            let manager = DeviceManager::start(dir.path()).await.expect("start");
            let err = manager
                .allocate(&pod(), "c", &requests)
                .await
                .expect_err("a node reboot: the devices are not there yet");
            assert_eq!(err.to_string(), expected);
            // A container still running keeps them, unchecked.
            let running = ContainerRequest {
                name: "c".into(),
                kind: ContainerKind::App,
                requests: requests.clone(),
                running: true,
            };
            let admitted = manager
                .admit_pod(&pod(), &[running])
                .await
                .expect("running container");
            let envs: BTreeMap<String, String> = response.envs.clone().into_iter().collect();
            assert_eq!(admitted["c"].envs, envs);
            assert_eq!(manager.reuse_running(&pod(), "c").envs, envs);
            // Refusing changed nothing.
            assert_eq!(
                manager.container_devices("uid-1", "c")[RESOURCE],
                vec!["d0".to_owned()]
            );
            manager.shutdown().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_checkpoint_is_written_on_the_writer_thread() {
        let dir = kubelet_dir();
        checkpoint_holding_d0(dir.path(), true);
        let path = dir.path().join("device-plugins").join(CHECKPOINT_FILE);
        let writes_of_this_file = || {
            checkpoint::WRITES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|(p, _)| p == &path)
                .map(|(_, thread)| thread.clone())
                .collect::<Vec<_>>()
        };
        let before = writes_of_this_file().len();
        let manager = DeviceManager::start(dir.path()).await.expect("start");
        // Frees d0: a write, which must not run on this (async) thread.
        manager.retain_pods(&BTreeSet::new());
        manager.shutdown().await;
        let writes = writes_of_this_file();
        assert!(writes.len() > before, "retain_pods wrote nothing");
        for thread in &writes[before..] {
            assert_eq!(thread.as_deref(), Some(checkpoint::WRITER_THREAD));
        }
        // And shutdown waited for it.
        let ledger = checkpoint::read(&path).expect("read").expect("present");
        assert!(ledger.assignments.is_empty(), "{ledger:?}");
    }
}
