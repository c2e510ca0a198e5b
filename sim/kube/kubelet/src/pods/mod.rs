//! The pods of the node, as kubelet runs them: admission (device plugin
//! allocations, then the fit to the node's allocatable, see [`admission`]),
//! a sandbox and the containers through the runtime, restarts
//! with back-off, the pod status computed from what the runtime reports, and
//! the teardown when the pod is deleted. [`PodState`] is the state machine of
//! one pod, free of the API server; [`worker`] drives it from the watch.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState as K8sContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus as K8sContainerStatus, HostIP,
    Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::devices::{ContainerAllocation, ContainerKind, ContainerRequest, DeviceManager, PodRef};
use crate::runtime::{
    ContainerConfig, ContainerInfo, ContainerRuntime, ContainerState, ContainerStatus, Device,
    Mount, PidNamespace, RuntimeError, SandboxConfig, SandboxInfo, labels,
};

pub mod admission;
pub mod worker;

/// Why admission failed, as kubelet's pod status says it.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// The variable naming the simulated node root to the stand-in driver
/// libraries (`--sim-node-root`); the same name as `tessera-sim`'s
/// `libroot::ROOT_ENV` (this crate knows nothing of the simulator).
pub const SIM_ROOT_ENV: &str = "TESSERA_SIM_ROOT";

/// The first restart back-off; it doubles up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// The longest restart back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A container that ran this long restarts without back-off again.
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// What every pod of the node shares: the node's name and root, the
/// runtime, the device manager.
pub struct NodeContext {
    /// The node's name.
    pub node_name: String,
    /// The node's root directory (`<root>/var/log/pods` holds the logs).
    pub root: PathBuf,
    /// The container runtime.
    pub runtime: Arc<dyn ContainerRuntime>,
    /// The runtime's name, the prefix of `containerID`s (`containerd://`).
    pub runtime_name: String,
    /// The device plugin manager.
    pub devices: Arc<DeviceManager>,
    /// The node's IP (`status.hostIP`, and `podIP` of host-network sandboxes).
    pub host_ip: String,
    /// The cgroup each pod's goes below (`<parent>/pod<uid>`); empty for
    /// the runtime's default.
    pub cgroup_parent: String,
    /// The node's allocatable and the requests of its admitted pods.
    pub node_resources: Arc<admission::NodeResources>,
    /// Simulation only (`--sim-node-root`): the simulated node root every
    /// container gets bind-mounted read-write at the same path, with
    /// `TESSERA_SIM_ROOT` naming it (the stand-in for the kernel driver).
    pub sim_node_root: Option<PathBuf>,
}

/// A Kubernetes Event the worker posts for the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// `Failed`, `FailedCreatePodSandBox`, `Started`, ...
    pub reason: String,
    /// What happened.
    pub message: String,
}

/// One container's run in the pod.
#[derive(Debug, Clone, Default)]
struct ContainerRun {
    /// The current container, if one exists.
    id: Option<String>,
    /// Restarts so far (the current container's attempt).
    restart_count: u32,
    /// The current container's last observed status.
    status: Option<ContainerStatus>,
    /// The previous container's final status (`lastState`).
    last_terminated: Option<ContainerStatus>,
    /// What the device plugins gave it (the same for every restart).
    allocation: Option<ContainerAllocation>,
    /// The current back-off and when the next start may happen.
    backoff: Duration,
    next_start: Option<Instant>,
    /// Why it is not running (`ErrImageNeverPull`, `CrashLoopBackOff`, ...).
    waiting: Option<(String, String)>,
}

impl ContainerRun {
    fn state(&self) -> Option<ContainerState> {
        self.status.as_ref().map(|s| s.state)
    }

    fn exited(&self) -> Option<&ContainerStatus> {
        self.status
            .as_ref()
            .filter(|s| s.state == ContainerState::Exited)
    }
}

/// The sandbox the pod's containers run in.
#[derive(Debug, Clone)]
struct Sandbox {
    id: String,
    ip: Option<String>,
}

/// The state machine of one pod on the node.
pub struct PodState {
    uid: String,
    namespace: String,
    name: String,
    sandbox: Option<Sandbox>,
    /// Sandboxes found at start that are not the one in use.
    stale_sandboxes: Vec<String>,
    sandbox_attempt: u32,
    sandbox_next_try: Option<Instant>,
    admitted: bool,
    /// The pod-level failure (admission), terminal.
    failure: Option<(String, String)>,
    /// Whether the pod reached Succeeded/Failed (nothing starts any more).
    terminal: bool,
    containers: BTreeMap<String, ContainerRun>,
    start_time: Option<Time>,
    last_status: Option<PodStatus>,
    events: Vec<PodEvent>,
    last_event: BTreeMap<String, String>,
}

/// An extended resource: not a native one (no domain, or `kubernetes.io/`).
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// The extended resources a container asks for (limits, else requests) with
/// their counts.
pub fn extended_requests(container: &Container) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    let Some(resources) = &container.resources else {
        return Ok(out);
    };
    for map in [&resources.requests, &resources.limits]
        .into_iter()
        .flatten()
    {
        for (name, quantity) in map {
            if !is_extended_resource(name) {
                continue;
            }
            let count = quantity.0.trim().parse::<u64>().map_err(|_| {
                format!(
                    "container {}: resources[{name}]: {:?} is not a whole number of devices",
                    container.name, quantity.0
                )
            })?;
            // Limits come second and win, as they must equal requests.
            out.insert(name.clone(), count);
        }
    }
    out.retain(|_, count| *count > 0);
    Ok(out)
}

fn time_from_ns(ns: i64) -> Option<Time> {
    if ns <= 0 {
        return None;
    }
    Timestamp::from_nanosecond(i128::from(ns)).ok().map(Time)
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

fn app_containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

/// A restartable init container (`restartPolicy: Always`).
fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// Every container of the pod with its kind, init containers first, in
/// spec order (the order the device manager admits them in).
fn containers_with_kind(pod: &Pod) -> impl Iterator<Item = (&Container, ContainerKind)> {
    let init = init_containers(pod).iter().map(|c| {
        let kind = if is_sidecar(c) {
            ContainerKind::SidecarInit
        } else {
            ContainerKind::Init
        };
        (c, kind)
    });
    init.chain(app_containers(pod).iter().map(|c| (c, ContainerKind::App)))
}

/// The containers PodResources lists for the pod: sidecars and app
/// containers, in spec order.
pub fn listed_containers(pod: &Pod) -> Vec<String> {
    containers_with_kind(pod)
        .filter(|(_, kind)| *kind != ContainerKind::Init)
        .map(|(c, _)| c.name.clone())
        .collect()
}

/// Whether a container that exited with `exit_code` restarts under `policy`.
fn restarts(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

impl PodState {
    /// A pod the node has not run anything for yet.
    pub fn new(pod: &Pod) -> PodState {
        let meta = &pod.metadata;
        PodState {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            name: meta.name.clone().unwrap_or_default(),
            sandbox: None,
            stale_sandboxes: Vec::new(),
            sandbox_attempt: 0,
            sandbox_next_try: None,
            admitted: false,
            failure: None,
            terminal: false,
            containers: BTreeMap::new(),
            start_time: pod.status.as_ref().and_then(|s| s.start_time.clone()),
            last_status: None,
            events: Vec::new(),
            last_event: BTreeMap::new(),
        }
    }

    /// Takes over what the runtime already runs for this pod (a kubelet
    /// restart): the newest ready sandbox and, per container name, the
    /// newest container in it. The pod is admitted again, as kubelet admits
    /// every pod at its start: containers still running keep their
    /// checkpointed devices unchecked.
    pub fn adopt(&mut self, sandboxes: &[SandboxInfo], containers: &[ContainerInfo]) {
        let newest = sandboxes
            .iter()
            .filter(|s| s.ready)
            .max_by_key(|s| s.attempt);
        if let Some(s) = newest {
            self.sandbox = Some(Sandbox {
                id: s.id.clone(),
                ip: None,
            });
            self.sandbox_attempt = s.attempt;
            for c in containers.iter().filter(|c| c.sandbox_id == s.id) {
                let run = self.containers.entry(c.name.clone()).or_default();
                if run.id.is_none() || c.attempt >= run.restart_count {
                    if let Some(old) = run.id.replace(c.id.clone()) {
                        tracing::debug!(pod = %self.name, container = %old, "older attempt left in the runtime");
                    }
                    run.restart_count = c.attempt;
                    run.backoff = INITIAL_BACKOFF;
                }
            }
        }
        self.stale_sandboxes = sandboxes
            .iter()
            .filter(|s| Some(&s.id) != self.sandbox.as_ref().map(|x| &x.id))
            .map(|s| s.id.clone())
            .collect();
    }

    /// The pod as the device manager knows it.
    pub fn pod_ref(&self) -> PodRef {
        PodRef {
            uid: self.uid.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// Whether the pod has reached Succeeded or Failed.
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// The events to post since the last call.
    pub fn take_events(&mut self) -> Vec<PodEvent> {
        std::mem::take(&mut self.events)
    }

    fn event(&mut self, kind: &'static str, reason: &str, message: String) {
        // A warning repeated every sync (the same failure every second) is
        // posted once, as kubelet's aggregation would show it.
        if kind == "Warning" && self.last_event.get(reason) == Some(&message) {
            return;
        }
        self.last_event.insert(reason.to_owned(), message.clone());
        self.events.push(PodEvent {
            kind,
            reason: reason.to_owned(),
            message,
        });
    }

    /// The extended resources a container asks for that a device plugin
    /// serves (the others are not the device manager's business).
    fn device_requests(
        ctx: &NodeContext,
        container: &Container,
    ) -> Result<BTreeMap<String, u64>, String> {
        let mut requests = extended_requests(container)?;
        requests.retain(|r, _| ctx.devices.manages(r));
        Ok(requests)
    }

    /// Admission, in kubelet's order: devices for every container from the
    /// device manager (one call for the pod: init containers' devices are
    /// reused by later ones), then the pod's requests against the node's
    /// allocatable. `(reason, message)` when the pod is rejected.
    async fn admit(&mut self, ctx: &NodeContext, pod: &Pod) -> Result<(), (String, String)> {
        let unexpected = |m: String| (UNEXPECTED_ADMISSION_ERROR.to_owned(), m);
        let mut requests = Vec::new();
        for (container, kind) in containers_with_kind(pod) {
            let running = self
                .containers
                .get(&container.name)
                .and_then(ContainerRun::state)
                == Some(ContainerState::Running);
            requests.push(ContainerRequest {
                name: container.name.clone(),
                kind,
                requests: Self::device_requests(ctx, container).map_err(unexpected)?,
                running,
            });
        }
        if requests.iter().any(|r| !r.requests.is_empty()) {
            let admitted = ctx
                .devices
                .admit_pod(&self.pod_ref(), &requests)
                .await
                .map_err(|e| unexpected(e.to_string()))?;
            for (name, allocation) in admitted {
                self.containers.entry(name).or_default().allocation = Some(allocation);
            }
        }
        ctx.node_resources
            .admit(&self.uid, pod, |r| ctx.devices.manages(r))
            .map_err(|e| (e.reason(), e.to_string()))
    }

    fn sandbox_config(&self, ctx: &NodeContext, pod: &Pod) -> SandboxConfig {
        let mut sandbox_labels: BTreeMap<String, String> =
            pod.metadata.labels.clone().unwrap_or_default();
        sandbox_labels.insert(labels::POD_NAME.to_owned(), self.name.clone());
        sandbox_labels.insert(labels::POD_NAMESPACE.to_owned(), self.namespace.clone());
        sandbox_labels.insert(labels::POD_UID.to_owned(), self.uid.clone());
        sandbox_labels.insert(labels::NODE.to_owned(), ctx.node_name.clone());
        // Every sandbox runs on the host's network (no CNI here), and a
        // host-network pod has the node's hostname: kubelet sends none.
        let hostname = String::new();
        let spec = pod.spec.as_ref();
        let pid = if spec.and_then(|s| s.host_pid) == Some(true) {
            PidNamespace::Node
        } else if spec.and_then(|s| s.share_process_namespace) == Some(true) {
            PidNamespace::Pod
        } else {
            PidNamespace::Container
        };
        SandboxConfig {
            pid,
            host_ipc: spec.and_then(|s| s.host_ipc) == Some(true),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            attempt: self.sandbox_attempt,
            hostname,
            log_directory: self.log_directory(ctx).display().to_string(),
            labels: sandbox_labels,
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            cgroup_parent: if ctx.cgroup_parent.is_empty() {
                String::new()
            } else {
                format!(
                    "{}/pod{}",
                    ctx.cgroup_parent.trim_end_matches('/'),
                    self.uid
                )
            },
        }
    }

    /// `<root>/var/log/pods/<namespace>_<name>_<uid>`, as kubelet's.
    pub fn log_directory(&self, ctx: &NodeContext) -> PathBuf {
        ctx.root
            .join("var/log/pods")
            .join(format!("{}_{}_{}", self.namespace, self.name, self.uid))
    }

    fn container_config(
        &self,
        ctx: &NodeContext,
        container: &Container,
        attempt: u32,
        allocation: &ContainerAllocation,
    ) -> ContainerConfig {
        let mut envs: Vec<(String, String)> = Vec::new();
        for env in container.env.iter().flatten() {
            let value = match (&env.value, &env.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.name") => self.name.clone(),
                        Some("metadata.namespace") => self.namespace.clone(),
                        Some("metadata.uid") => self.uid.clone(),
                        Some("spec.nodeName") => ctx.node_name.clone(),
                        Some("status.hostIP" | "status.podIP") => ctx.host_ip.clone(),
                        _ => {
                            tracing::warn!(pod = %self.name, env = %env.name, "valueFrom not supported by the stand-in; left empty");
                            String::new()
                        }
                    }
                }
                (None, None) => String::new(),
            };
            envs.push((env.name.clone(), value));
        }
        for (k, v) in &allocation.envs {
            envs.push((k.clone(), v.clone()));
        }
        let mut mounts: Vec<Mount> = allocation
            .mounts
            .iter()
            .map(|m| Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.read_only,
            })
            .collect();
        if let Some(root) = &ctx.sim_node_root {
            let root = root.display().to_string();
            envs.push((SIM_ROOT_ENV.to_owned(), root.clone()));
            mounts.push(Mount {
                container_path: root.clone(),
                host_path: root,
                readonly: false,
            });
        }
        let mut container_labels = BTreeMap::new();
        container_labels.insert(labels::POD_NAME.to_owned(), self.name.clone());
        container_labels.insert(labels::POD_NAMESPACE.to_owned(), self.namespace.clone());
        container_labels.insert(labels::POD_UID.to_owned(), self.uid.clone());
        container_labels.insert(labels::CONTAINER_NAME.to_owned(), container.name.clone());
        container_labels.insert(labels::NODE.to_owned(), ctx.node_name.clone());
        ContainerConfig {
            name: container.name.clone(),
            attempt,
            image: container.image.clone().unwrap_or_default(),
            command: container.command.clone().unwrap_or_default(),
            args: container.args.clone().unwrap_or_default(),
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs,
            mounts,
            devices: allocation
                .devices
                .iter()
                .map(|d| Device {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            labels: container_labels,
            annotations: allocation.annotations.clone(),
            log_path: format!("{}/{attempt}.log", container.name),
            cdi_devices: allocation.cdi_devices.clone(),
        }
    }

    /// One pass: admit, make the sandbox, start or restart what should run,
    /// observe the containers; the pod status that results.
    pub async fn sync(&mut self, ctx: &NodeContext, pod: &Pod) -> PodStatus {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if !self.admitted && matches!(phase, Some("Succeeded" | "Failed")) {
            // Finished before this kubelet (re)started: nothing to run.
            self.terminal = true;
            self.admitted = true;
            return pod.status.clone().unwrap_or_default();
        }
        if !self.admitted {
            self.admitted = true;
            // Adopted containers: admission needs to know which still run.
            self.observe(ctx).await;
            if let Err((reason, message)) = self.admit(ctx, pod).await {
                self.event("Warning", &reason, message.clone());
                // kubelet's rejection: the status message says so.
                self.failure = Some((reason, format!("Pod was rejected: {message}")));
            }
        }
        if self.start_time.is_none() {
            self.start_time = Some(now());
        }
        if self.failure.is_none() && !self.terminal {
            self.observe(ctx).await;
            self.run_sandbox(ctx, pod).await;
            if self.sandbox.is_some() {
                self.advance(ctx, pod).await;
            }
        }
        let status = self.status(ctx, pod);
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) && !self.terminal {
            self.terminal = true;
            ctx.node_resources.release(&self.uid);
            // Kubelet stops a finished pod's sandbox; its containers stay
            // (exited) until the pod is deleted.
            if let Some(sandbox) = &self.sandbox
                && let Err(e) = ctx.runtime.stop_sandbox(&sandbox.id).await
            {
                tracing::warn!(pod = %self.name, error = %e, "stopping the sandbox of a finished pod");
            }
        }
        self.last_status = Some(status.clone());
        status
    }

    async fn observe(&mut self, ctx: &NodeContext) {
        for (name, run) in &mut self.containers {
            let Some(id) = run.id.clone() else { continue };
            match ctx.runtime.container_status(&id).await {
                Ok(status) => run.status = Some(status),
                Err(RuntimeError::NotFound { .. }) => {
                    tracing::warn!(pod = %self.name, container = %name, %id, "container gone from the runtime; it is made again");
                    run.id = None;
                    run.status = None;
                }
                Err(e) => {
                    tracing::warn!(pod = %self.name, container = %name, error = %e, "ContainerStatus")
                }
            }
        }
    }

    async fn run_sandbox(&mut self, ctx: &NodeContext, pod: &Pod) {
        if self.sandbox.is_some() {
            if let Some(s) = &mut self.sandbox
                && s.ip.is_none()
            {
                s.ip = ctx.runtime.sandbox_ip(&s.id).await.ok().flatten();
            }
            return;
        }
        if self.sandbox_next_try.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let config = self.sandbox_config(ctx, pod);
        if let Err(e) = std::fs::create_dir_all(&config.log_directory) {
            tracing::warn!(dir = %config.log_directory, error = %e, "pod log directory");
        }
        match ctx.runtime.run_sandbox(&config).await {
            Ok(id) => {
                let ip = ctx.runtime.sandbox_ip(&id).await.ok().flatten();
                self.sandbox = Some(Sandbox { id, ip });
                self.sandbox_next_try = None;
            }
            Err(e) => {
                self.sandbox_attempt += 1;
                self.sandbox_next_try = Some(Instant::now() + INITIAL_BACKOFF * 2);
                self.event(
                    "Warning",
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {}", e.message()),
                );
            }
        }
    }

    /// Starts what should run now: init containers one after another, then
    /// every app container; restarts exited ones per restartPolicy.
    async fn advance(&mut self, ctx: &NodeContext, pod: &Pod) {
        let policy = restart_policy(pod).to_owned();
        // Init containers restart on failure unless the pod never restarts
        // anything (then a failed one fails the pod, see `status`).
        let init_policy = if policy == "Never" {
            "Never"
        } else {
            "OnFailure"
        };
        for container in init_containers(pod) {
            let run = self.containers.entry(container.name.clone()).or_default();
            match run.exited() {
                Some(s) if s.exit_code == 0 => continue,
                Some(_) if init_policy == "Never" => return,
                _ => {}
            }
            if run.state() != Some(ContainerState::Running) {
                self.start(ctx, pod, container, init_policy).await;
            }
            // One init container at a time: the next waits for this one.
            return;
        }
        for container in app_containers(pod) {
            self.start(ctx, pod, container, &policy).await;
        }
    }

    /// Creates and starts the container if it has none, or restarts it when
    /// it exited and the policy says so and its back-off has passed.
    async fn start(&mut self, ctx: &NodeContext, pod: &Pod, container: &Container, policy: &str) {
        let name = container.name.clone();
        let run = self.containers.entry(name.clone()).or_default();
        let mut attempt = run.restart_count;
        match run.state() {
            Some(ContainerState::Running | ContainerState::Unknown) => return,
            Some(ContainerState::Created) => {
                // Made but not started (a start that failed, or a restart
                // of the kubelet in between): start it below, after the
                // back-off of a failed start.
                if run.next_start.is_some_and(|t| Instant::now() < t) {
                    return;
                }
            }
            Some(ContainerState::Exited) => {
                let Some(exited) = run.status.clone() else {
                    return;
                };
                if !restarts(policy, exited.exit_code) {
                    return;
                }
                let now = Instant::now();
                match run.next_start {
                    None => {
                        let ran = Duration::from_nanos(
                            u64::try_from(exited.finished_at - exited.started_at).unwrap_or(0),
                        );
                        if run.backoff.is_zero() || ran > BACKOFF_RESET {
                            run.backoff = INITIAL_BACKOFF;
                        }
                        run.next_start = Some(now + run.backoff);
                        run.waiting = Some((
                            "CrashLoopBackOff".to_owned(),
                            format!(
                                "back-off {:?} restarting failed container={name} pod={}_{}({})",
                                run.backoff, self.name, self.namespace, self.uid
                            ),
                        ));
                        return;
                    }
                    Some(t) if now < t => return,
                    Some(_) => {}
                }
                run.next_start = None;
                run.backoff = (run.backoff * 2).min(MAX_BACKOFF);
                // The dead container goes; its status stays as lastState.
                if let Some(old) = run.id.take()
                    && let Err(e) = ctx.runtime.remove_container(&old).await
                {
                    tracing::warn!(pod = %self.name, container = %name, error = %e, "removing the exited container");
                }
                let run = self.containers.entry(name.clone()).or_default();
                run.last_terminated = Some(exited);
                run.status = None;
                run.restart_count += 1;
                attempt = run.restart_count;
            }
            None => {
                if run.next_start.is_some_and(|t| Instant::now() < t) {
                    return;
                }
            }
        }
        let run = self.containers.entry(name.clone()).or_default();
        if run.id.is_none() {
            match self.create(ctx, pod, container, attempt).await {
                Ok(id) => {
                    let run = self.containers.entry(name.clone()).or_default();
                    run.id = Some(id);
                }
                Err((reason, message)) => {
                    let run = self.containers.entry(name.clone()).or_default();
                    run.waiting = Some((reason.clone(), message.clone()));
                    run.next_start = Some(Instant::now() + run.backoff.max(INITIAL_BACKOFF));
                    let event_reason = if reason == "ErrImageNeverPull" {
                        reason
                    } else {
                        "Failed".to_owned()
                    };
                    self.event("Warning", &event_reason, message);
                    return;
                }
            }
        }
        let run = self.containers.entry(name.clone()).or_default();
        let Some(id) = run.id.clone() else { return };
        if let Err(e) = ctx.devices.pre_start(&self.pod_ref(), &name).await {
            let run = self.containers.entry(name.clone()).or_default();
            run.waiting = Some(("PreStartContainerError".to_owned(), e.to_string()));
            run.next_start = Some(Instant::now() + run.backoff.max(INITIAL_BACKOFF));
            self.event("Warning", "Failed", e.to_string());
            return;
        }
        match ctx.runtime.start_container(&id).await {
            Ok(()) => {
                let run = self.containers.entry(name.clone()).or_default();
                run.waiting = None;
                run.next_start = None;
                if run.backoff.is_zero() {
                    run.backoff = INITIAL_BACKOFF;
                }
                run.status = ctx.runtime.container_status(&id).await.ok();
                self.event("Normal", "Started", format!("Started container {name}"));
            }
            Err(e) => {
                // The container is left as the runtime has it (exited with
                // the start error); it restarts per policy.
                let message = format!("Error: {}", e.message());
                let run = self.containers.entry(name.clone()).or_default();
                run.waiting = Some(("RunContainerError".to_owned(), message.clone()));
                run.next_start = Some(Instant::now() + run.backoff.max(INITIAL_BACKOFF));
                run.status = ctx.runtime.container_status(&id).await.ok();
                self.event("Warning", "Failed", message);
            }
        }
    }

    /// Image check, allocation, CreateContainer; `(reason, message)` when
    /// the container cannot be made now.
    async fn create(
        &mut self,
        ctx: &NodeContext,
        pod: &Pod,
        container: &Container,
        attempt: u32,
    ) -> Result<String, (String, String)> {
        let image = container.image.clone().unwrap_or_default();
        match ctx.runtime.image_present(&image).await {
            Ok(true) => {}
            Ok(false) => {
                return Err((
                    "ErrImageNeverPull".to_owned(),
                    format!(
                        "Container image \"{image}\" is not present on node {}: this stand-in kubelet never pulls; import it into the node's runtime (ctr -n k8s.io images import)",
                        ctx.node_name
                    ),
                ));
            }
            Err(e) => return Err(("ErrImagePull".to_owned(), e.to_string())),
        }
        let allocation = match self
            .containers
            .get(&container.name)
            .and_then(|r| r.allocation.clone())
        {
            Some(a) => a,
            None => {
                let allocation = self
                    .devices_for_start(ctx, pod, container)
                    .await
                    .map_err(|m| (UNEXPECTED_ADMISSION_ERROR.to_owned(), m))?;
                self.containers
                    .entry(container.name.clone())
                    .or_default()
                    .allocation = Some(allocation.clone());
                allocation
            }
        };
        let config = self.container_config(ctx, container, attempt, &allocation);
        let sandbox_config = self.sandbox_config(ctx, pod);
        let sandbox_id = self
            .sandbox
            .as_ref()
            .map(|s| s.id.clone())
            .unwrap_or_default();
        let _ = std::fs::create_dir_all(
            std::path::Path::new(&sandbox_config.log_directory).join(&container.name),
        );
        ctx.runtime
            .create_container(&sandbox_id, &sandbox_config, &config)
            .await
            .map_err(|e| {
                (
                    "CreateContainerError".to_owned(),
                    format!("Error: {}", e.message()),
                )
            })
    }

    /// The devices of a container to start when admission's answer is not
    /// at hand, as kubelet's container start: the checkpointed ones when
    /// they cover every device plugin resource it requests (a plugin need
    /// not be registered: the container has them), else a new allocation (a
    /// resource whose plugin registered after admission).
    async fn devices_for_start(
        &self,
        ctx: &NodeContext,
        pod: &Pod,
        container: &Container,
    ) -> Result<ContainerAllocation, String> {
        let requests = Self::device_requests(ctx, container)?;
        if requests.is_empty() {
            return Ok(ContainerAllocation::default());
        }
        let pod_ref = self.pod_ref();
        let held = ctx.devices.container_devices(&self.uid, &container.name);
        if requests.keys().all(|r| held.contains_key(r)) {
            return Ok(ctx.devices.reuse_running(&pod_ref, &container.name));
        }
        let kind = containers_with_kind(pod)
            .find(|(c, _)| c.name == container.name)
            .map_or(ContainerKind::App, |(_, kind)| kind);
        let request = ContainerRequest {
            name: container.name.clone(),
            kind,
            requests,
            running: false,
        };
        let mut admitted = ctx
            .devices
            .admit_pod(&pod_ref, std::slice::from_ref(&request))
            .await
            .map_err(|e| e.to_string())?;
        Ok(admitted.remove(&container.name).unwrap_or_default())
    }

    /// Stops and removes every container and sandbox of the pod, the
    /// containers with `grace` seconds to exit.
    pub async fn tear_down(&mut self, ctx: &NodeContext, grace: i64) -> Result<(), RuntimeError> {
        let mut first_error = None;
        let mut keep = |r: Result<(), RuntimeError>| match r {
            Ok(()) | Err(RuntimeError::NotFound { .. }) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        };
        let ids: Vec<String> = self
            .containers
            .values()
            .filter_map(|r| r.id.clone())
            .collect();
        for id in &ids {
            keep(ctx.runtime.stop_container(id, grace).await);
        }
        for id in &ids {
            keep(ctx.runtime.remove_container(id).await);
        }
        let mut sandboxes: Vec<String> = self.sandbox.iter().map(|s| s.id.clone()).collect();
        sandboxes.extend(self.stale_sandboxes.iter().cloned());
        for id in &sandboxes {
            keep(ctx.runtime.stop_sandbox(id).await);
            keep(ctx.runtime.remove_sandbox(id).await);
        }
        match first_error {
            Some(e) => Err(e),
            None => {
                for run in self.containers.values_mut() {
                    run.id = None;
                }
                self.sandbox = None;
                self.stale_sandboxes.clear();
                self.terminal = true;
                ctx.node_resources.release(&self.uid);
                Ok(())
            }
        }
    }

    fn container_status(&self, ctx: &NodeContext, container: &Container) -> K8sContainerStatus {
        let run = self
            .containers
            .get(&container.name)
            .cloned()
            .unwrap_or_default();
        let terminated = |s: &ContainerStatus| ContainerStateTerminated {
            exit_code: s.exit_code,
            reason: Some(if s.reason.is_empty() {
                if s.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .to_owned()
            } else {
                s.reason.clone()
            }),
            message: (!s.message.is_empty()).then(|| s.message.clone()),
            started_at: time_from_ns(s.started_at),
            finished_at: time_from_ns(s.finished_at),
            container_id: Some(format!("{}://{}", ctx.runtime_name, s.id)),
            signal: None,
        };
        let waiting = |reason: &str, message: Option<&str>| K8sContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                message: message.map(str::to_owned),
            }),
            ..K8sContainerState::default()
        };
        // An exited container shows as terminated, unless it waits to be
        // restarted (then: waiting, and it is lastState).
        let backing_off = matches!(&run.waiting, Some((r, _)) if r == "CrashLoopBackOff");
        let state = match (&run.status, &run.waiting) {
            (Some(s), _) if s.state == ContainerState::Running => K8sContainerState {
                running: Some(ContainerStateRunning {
                    started_at: time_from_ns(s.started_at),
                }),
                ..K8sContainerState::default()
            },
            (Some(s), _) if s.state == ContainerState::Exited && !backing_off => {
                K8sContainerState {
                    terminated: Some(terminated(s)),
                    ..K8sContainerState::default()
                }
            }
            (_, Some((reason, message))) => waiting(reason, Some(message)),
            _ => waiting("ContainerCreating", None),
        };
        let running = state.running.is_some();
        // Waiting to restart: the container that just exited is lastState.
        let just_exited = run
            .exited()
            .filter(|_| state.waiting.is_some())
            .or(run.last_terminated.as_ref());
        let last_state = just_exited.map(|s| K8sContainerState {
            terminated: Some(terminated(s)),
            ..K8sContainerState::default()
        });
        K8sContainerStatus {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            image_id: run
                .status
                .as_ref()
                .map(|s| s.image_ref.clone())
                .unwrap_or_default(),
            container_id: run
                .id
                .as_ref()
                .map(|id| format!("{}://{id}", ctx.runtime_name)),
            restart_count: i32::try_from(run.restart_count).unwrap_or(i32::MAX),
            ready: running,
            started: Some(running),
            state: Some(state),
            last_state,
            ..K8sContainerStatus::default()
        }
    }

    /// The pod status from what was observed (kubelet's phase rules).
    fn status(&self, ctx: &NodeContext, pod: &Pod) -> PodStatus {
        let previous = self
            .last_status
            .clone()
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        let policy = restart_policy(pod);
        let init_statuses: Vec<K8sContainerStatus> = init_containers(pod)
            .iter()
            .map(|c| self.container_status(ctx, c))
            .collect();
        let statuses: Vec<K8sContainerStatus> = app_containers(pod)
            .iter()
            .map(|c| self.container_status(ctx, c))
            .collect();

        let terminated = |s: &K8sContainerStatus| {
            s.state
                .as_ref()
                .and_then(|x| x.terminated.as_ref())
                .map(|t| t.exit_code)
        };
        let init_done = init_statuses.iter().all(|s| terminated(s) == Some(0));
        let init_failed = policy == "Never"
            && init_statuses
                .iter()
                .any(|s| terminated(s).is_some_and(|c| c != 0));

        let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
        for s in &statuses {
            let state = s.state.clone().unwrap_or_default();
            if state.running.is_some() {
                running += 1;
            } else if let Some(t) = &state.terminated {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            } else if s
                .last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some()
            {
                // Waiting to restart after it ran: counts as stopped.
                stopped += 1;
            } else {
                waiting += 1;
            }
        }
        let (phase, reason, message) = if let Some((reason, message)) = &self.failure {
            ("Failed", Some(reason.clone()), Some(message.clone()))
        } else if init_failed {
            ("Failed", None, None)
        } else if !init_done || waiting > 0 {
            ("Pending", None, None)
        } else if running > 0 {
            ("Running", None, None)
        } else if stopped > 0 {
            if policy == "Always" {
                ("Running", None, None)
            } else if stopped == succeeded {
                ("Succeeded", None, None)
            } else if policy == "Never" {
                ("Failed", None, None)
            } else {
                ("Running", None, None)
            }
        } else {
            ("Pending", None, None)
        };

        let all_ready = !statuses.is_empty() && statuses.iter().all(|s| s.ready);
        let condition = |kind: &str, ok: bool, reason: Option<&str>| {
            let status = if ok { "True" } else { "False" }.to_owned();
            let since = previous
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == kind && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(now);
            PodCondition {
                type_: kind.to_owned(),
                status,
                reason: reason.map(str::to_owned),
                last_transition_time: Some(since),
                ..PodCondition::default()
            }
        };
        let finished = matches!(phase, "Succeeded" | "Failed");
        let not_ready_reason = if finished {
            Some("PodCompleted")
        } else {
            Some("ContainersNotReady")
        };
        let conditions = if self.failure.is_some() {
            vec![condition("PodScheduled", true, None)]
        } else {
            vec![
                condition(
                    "Initialized",
                    init_done,
                    if init_done {
                        None
                    } else {
                        Some("ContainersNotInitialized")
                    },
                ),
                condition(
                    "Ready",
                    all_ready,
                    if all_ready { None } else { not_ready_reason },
                ),
                condition(
                    "ContainersReady",
                    all_ready,
                    if all_ready { None } else { not_ready_reason },
                ),
                condition("PodScheduled", true, None),
            ]
        };
        let pod_ip = self
            .sandbox
            .as_ref()
            .and_then(|s| s.ip.clone())
            .unwrap_or_else(|| ctx.host_ip.clone());
        let ran = self.failure.is_none();
        PodStatus {
            phase: Some(phase.to_owned()),
            reason,
            message,
            conditions: Some(conditions),
            host_ip: Some(ctx.host_ip.clone()),
            host_ips: Some(vec![HostIP {
                ip: ctx.host_ip.clone(),
            }]),
            pod_ip: ran.then(|| pod_ip.clone()),
            pod_ips: ran.then(|| vec![PodIP { ip: pod_ip }]),
            start_time: self.start_time.clone(),
            container_statuses: ran.then_some(statuses),
            init_container_statuses: (ran && !init_statuses.is_empty()).then_some(init_statuses),
            qos_class: previous.qos_class.clone(),
            ..PodStatus::default()
        }
    }

    /// The pod's uid.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The pod's namespace and name.
    pub fn name(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

#[cfg(test)]
mod tests;
