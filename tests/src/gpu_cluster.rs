//! A GPU cluster on the stand-in API server for the scheduler extender's
//! end-to-end tests: Node objects carrying `tessera.io/node-gpus` (built from
//! the MIG catalogue, standing in for the device plugin's report) and
//! `nvidia.com/gpu` capacity, GPU pods as HAMi users write them, the
//! extender and the stand-in scheduler as child processes, a device plugin
//! stand-in that confirms each reservation (`bind-phase: success`), and an
//! over-commit check that recomputes every GPU's use from the pods'
//! `tessera.io/allocation` with its own arithmetic.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tessera_model::contract::{annotations, resources};
use tessera_model::mig::catalogue;
use tessera_model::mig::placement::Placement;
use tessera_model::sched::allocation::{Allocation, DeviceAllocation};
use tessera_model::sched::inventory::{NODE_GPUS_VERSION, NodeGpu, NodeGpus};

/// The shipped kube-scheduler configuration (`packaging/kubernetes/config/`).
pub fn shipped_scheduler_config_path() -> PathBuf {
    tessera_test_support::workspace_root().join("packaging/kubernetes/config/scheduler-config.yaml")
}

/// The shipped cluster configuration (`packaging/kubernetes/config/`; the
/// ConfigMap in `packaging/kubernetes/cluster-config.yaml` carries it).
pub fn shipped_cluster_config_path() -> PathBuf {
    tessera_test_support::workspace_root().join("packaging/kubernetes/config/cluster.yaml")
}

/// The shipped scheduler configuration with only what a test must change:
/// the host and port of its one extender's `urlPrefix` (to `127.0.0.1:port`),
/// `clientConnection.kubeconfig` (to `kubeconfig`: kube-scheduler takes its
/// API connection from the file once `--config` is given, so the stand-in is
/// run the same way), and, when `scheduler_name` is given, the profiles (one,
/// of that name), so that two schedulers can share a cluster.
/// `leaderElection` is kept: the stand-in accepts it and, being one process
/// per scheduler name, ignores it. Fails when the shipped file has not
/// exactly one extender with an `http://host:port` urlPrefix, or names no
/// `clientConnection.kubeconfig`.
pub fn shipped_scheduler_config(
    port: u16,
    scheduler_name: Option<&str>,
    kubeconfig: &Path,
) -> Result<String> {
    let path = shipped_scheduler_config_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let extenders = config
        .get_mut("extenders")
        .and_then(serde_yaml::Value::as_sequence_mut)
        .with_context(|| format!("{}: no extenders list", path.display()))?;
    ensure!(
        extenders.len() == 1,
        "{}: {} extenders, expected 1",
        path.display(),
        extenders.len()
    );
    let url = extenders[0]
        .get("urlPrefix")
        .and_then(serde_yaml::Value::as_str)
        .with_context(|| format!("{}: extenders[0].urlPrefix missing", path.display()))?;
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{}: urlPrefix {url:?} is not http://", path.display()))?;
    let (authority, tail) = rest.split_once('/').map_or((rest, ""), |(a, t)| (a, t));
    ensure!(
        authority.rsplit_once(':').is_some(),
        "{}: urlPrefix {url:?} names no port",
        path.display()
    );
    // The shipped host is the Service's ClusterIP; the stand-ins' extender
    // listens on the loopback.
    let new_url = if tail.is_empty() {
        format!("http://127.0.0.1:{port}")
    } else {
        format!("http://127.0.0.1:{port}/{tail}")
    };
    extenders[0]["urlPrefix"] = serde_yaml::Value::String(new_url);
    let client_connection = config
        .get_mut("clientConnection")
        .and_then(serde_yaml::Value::as_mapping_mut)
        .with_context(|| format!("{}: no clientConnection", path.display()))?;
    ensure!(
        client_connection
            .get("kubeconfig")
            .and_then(serde_yaml::Value::as_str)
            .is_some_and(|k| !k.is_empty()),
        "{}: clientConnection.kubeconfig missing: kube-scheduler ignores --kubeconfig once --config is given",
        path.display()
    );
    client_connection.insert(
        "kubeconfig".into(),
        serde_yaml::Value::String(kubeconfig.display().to_string()),
    );
    if let Some(name) = scheduler_name {
        config["profiles"] = serde_yaml::from_str(&format!("[{{schedulerName: {name}}}]"))?;
    }
    Ok(serde_yaml::to_string(&config)?)
}

// ---------------------------------------------------------------------------
// Inventories.

/// A GPU of catalogue model `model_key` (e.g. `A100-40GB`), as the device
/// plugin would report it; with `mig`, in MIG mode with every profile of the
/// model and its legal placements.
pub fn catalogue_gpu(model_key: &str, index: u32, uuid: &str, mig: bool) -> Result<NodeGpu> {
    let model =
        catalogue::find(model_key).with_context(|| format!("{model_key} not in the catalogue"))?;
    NodeGpu::from_catalogue(model, index, uuid, mig)
        .with_context(|| format!("{model_key} has no MIG"))
}

/// The uuid the tests give GPU `index` of `node`.
pub fn gpu_uuid(node: &str, index: u32) -> String {
    format!("GPU-{node}-{index}")
}

/// A node's inventory of catalogue GPUs: one `(model key, MIG mode)` per
/// GPU, indexes from 0, uuids from [`gpu_uuid`].
pub fn inventory(node: &str, gpus: &[(&str, bool)]) -> Result<NodeGpus> {
    let gpus = gpus
        .iter()
        .zip(0u32..)
        .map(|((model, mig), index)| catalogue_gpu(model, index, &gpu_uuid(node, index), *mig))
        .collect::<Result<Vec<_>>>()?;
    let inventory = NodeGpus {
        version: NODE_GPUS_VERSION,
        gpus,
    };
    inventory.validate()?;
    Ok(inventory)
}

/// Creates a Ready Node carrying `inventory` in `tessera.io/node-gpus`, with
/// `split_count` × GPUs of `nvidia.com/gpu` (what HAMi's device plugin
/// advertises), 64 cpu, 256 GiB and 250 pods.
pub async fn add_gpu_node(
    client: &kube::Client,
    name: &str,
    inventory: &NodeGpus,
    split_count: u32,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {annotations::NODE_GPUS: inventory.to_annotation()},
        },
        "spec": {},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    let slices = split_count as usize * inventory.gpus.len();
    let capacity =
        json!({"cpu": "64", "memory": "256Gi", "pods": "250", resources::GPU: slices.to_string()});
    let status = json!({"status": {
        "capacity": capacity, "allocatable": capacity,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("setting node {name}'s status"))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Pods.

/// A one-container GPU pod as HAMi users write it: limits of
/// `nvidia.com/gpu`, `nvidia.com/gpumem`, `nvidia.com/gpucores` and user
/// annotations.
#[derive(Debug, Clone, Default)]
pub struct GpuPod {
    /// Pod name.
    pub name: String,
    /// `spec.schedulerName`, when not the default.
    pub scheduler_name: Option<String>,
    /// `nvidia.com/gpu`.
    pub gpu: Option<u32>,
    /// `nvidia.com/gpumem` (MiB).
    pub gpumem: Option<u64>,
    /// `nvidia.com/gpucores` (percent).
    pub gpucores: Option<u32>,
    /// Pod annotations (e.g. `nvidia.com/vgpu-mode`, `tessera.io/gpu-policy`).
    pub annotations: BTreeMap<String, String>,
}

impl GpuPod {
    /// A pod named `name` asking for `gpu` GPUs of `gpumem` MiB each.
    pub fn new(name: &str, gpu: u32, gpumem: u64) -> GpuPod {
        GpuPod {
            name: name.to_owned(),
            gpu: Some(gpu),
            gpumem: Some(gpumem),
            ..GpuPod::default()
        }
    }

    /// Adds a pod annotation.
    pub fn annotate(mut self, key: &str, value: &str) -> GpuPod {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets `nvidia.com/gpucores`.
    pub fn cores(mut self, cores: u32) -> GpuPod {
        self.gpucores = Some(cores);
        self
    }

    /// Sets `spec.schedulerName`.
    pub fn scheduler(mut self, name: &str) -> GpuPod {
        self.scheduler_name = Some(name.to_owned());
        self
    }

    /// The Pod object in `namespace`.
    pub fn to_pod(&self, namespace: &str) -> Result<Pod> {
        let mut limits = serde_json::Map::new();
        if let Some(n) = self.gpu {
            limits.insert(resources::GPU.into(), json!(n.to_string()));
        }
        if let Some(m) = self.gpumem {
            limits.insert(resources::GPU_MEMORY.into(), json!(m.to_string()));
        }
        if let Some(c) = self.gpucores {
            limits.insert(resources::GPU_CORES.into(), json!(c.to_string()));
        }
        let mut spec = json!({
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        });
        if let Some(s) = &self.scheduler_name {
            spec["schedulerName"] = json!(s);
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": namespace, "annotations": self.annotations},
            "spec": spec,
        }))?)
    }

    /// Creates it.
    pub async fn create(&self, client: &kube::Client, namespace: &str) -> Result<Pod> {
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        api.create(&PostParams::default(), &self.to_pod(namespace)?)
            .await
            .with_context(|| format!("creating pod {}", self.name))
    }
}

/// The node a pod is bound to.
pub fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// A pod annotation.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The pod's `tessera.io/allocation`, parsed (an error when present but
/// invalid).
pub fn allocation_of(pod: &Pod) -> Result<Option<Allocation>> {
    annotation(pod, annotations::ALLOCATION)
        .map(|text| {
            Allocation::parse(text).with_context(|| {
                format!(
                    "pod {}: invalid allocation",
                    pod.metadata.name.as_deref().unwrap_or("?")
                )
            })
        })
        .transpose()
}

/// FailedScheduling events per pod name in `namespace` (their messages).
pub async fn failed_scheduling(
    client: &kube::Client,
    namespace: &str,
) -> Result<BTreeMap<String, Vec<String>>> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut by_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events.list(&ListParams::default()).await?.items {
        if e.reason.as_deref() == Some("FailedScheduling")
            && let Some(name) = e.involved_object.name
        {
            by_pod
                .entry(name)
                .or_default()
                .push(e.message.unwrap_or_default());
        }
    }
    Ok(by_pod)
}

// ---------------------------------------------------------------------------
// The device plugin stand-in.

/// Stands in for the device plugin's half of the bind handshake: every pod
/// that is bound and in `bind-phase: allocating` is set to `success` (the
/// extender then releases the node's Lease). A failed patch is retried (a
/// pod left `allocating` would hold its node's Lease until it expires); a
/// pod that is gone is let be. Stops on drop.
pub struct DevicePluginStandIn {
    task: tokio::task::JoinHandle<()>,
    confirmed: Arc<Mutex<BTreeSet<String>>>,
}

impl DevicePluginStandIn {
    /// Starts watching every pod of the cluster.
    pub fn start(client: kube::Client) -> DevicePluginStandIn {
        let confirmed: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let record = confirmed.clone();
        let task = tokio::spawn(async move {
            let all: Api<Pod> = Api::all(client.clone());
            let mut pods = std::pin::pin!(
                watcher(all, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            // Uids with a `success` patch under way or done; a uid leaves
            // when the pod is seen out of `allocating`, or when its patch
            // gave up (so that the next event about it tries again).
            let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
            while let Some(next) = pods.next().await {
                let Ok(pod) = next else { continue };
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let allocating = annotation(&pod, annotations::BIND_PHASE) == Some("allocating");
                if !allocating || bound_node(&pod).is_none() {
                    in_flight.lock().map(|mut s| s.remove(&uid)).ok();
                    continue;
                }
                if !in_flight
                    .lock()
                    .map(|mut s| s.insert(uid.clone()))
                    .unwrap_or(false)
                {
                    continue;
                }
                let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                let record = record.clone();
                let in_flight = in_flight.clone();
                tokio::spawn(async move {
                    if confirm_bind(&api, &namespace, &name).await {
                        record.lock().map(|mut s| s.insert(uid)).ok();
                    } else {
                        in_flight.lock().map(|mut s| s.remove(&uid)).ok();
                    }
                });
            }
        });
        DevicePluginStandIn { task, confirmed }
    }

    /// Uids of the pods it set to `success`.
    pub fn confirmed(&self) -> BTreeSet<String> {
        self.confirmed.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Sets `bind-phase: success` on `namespace/name`, retrying a failed patch
/// for about 20 s; false when it gave up or the pod is gone.
async fn confirm_bind(api: &Api<Pod>, namespace: &str, name: &str) -> bool {
    let patch = json!({"metadata": {"annotations": {annotations::BIND_PHASE: "success"}}});
    let mut pause = Duration::from_millis(50);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return true,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                eprintln!("device plugin stand-in: {namespace}/{name} is gone");
                return false;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("device plugin stand-in: {namespace}/{name}: {e}; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                eprintln!("device plugin stand-in: {namespace}/{name}: {e}; giving up");
                return false;
            }
        }
    }
}

impl Drop for DevicePluginStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------
// Processes.

fn append_log(path: &Path) -> Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One `GET` over HTTP/1.1 to `127.0.0.1:port`: status and body.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no HTTP status in {:?}", tail(&text, 3)))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A `tessera-scheduler-extender` child process listening on a fixed port
/// of 127.0.0.1 (so a restart keeps its address); SIGTERM on drop.
pub struct ExtenderProcess {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    args: Vec<String>,
    log: PathBuf,
}

impl ExtenderProcess {
    /// Starts one with `--identity identity` and the given cluster config,
    /// and waits until `/readyz` answers 200.
    pub async fn start(
        dir: &Path,
        kubeconfig: &Path,
        config: &Path,
        identity: &str,
        port: u16,
    ) -> Result<ExtenderProcess> {
        let args = vec![
            "--kubeconfig".to_owned(),
            kubeconfig.display().to_string(),
            "--config".to_owned(),
            config.display().to_string(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--namespace".to_owned(),
            tessera_model::contract::cluster::DEFAULT_NAMESPACE.to_owned(),
            "--identity".to_owned(),
            identity.to_owned(),
            "--log-format".to_owned(),
            "text".to_owned(),
        ];
        let mut extender = ExtenderProcess {
            child: None,
            port,
            args,
            log: dir.join(format!("extender-{identity}.log")),
        };
        extender.spawn().await?;
        Ok(extender)
    }

    async fn spawn(&mut self) -> Result<()> {
        let child = Command::new(tessera_test_support::artefact("tessera-scheduler-extender"))
            .args(&self.args)
            .env("TESSERA_LOG", "info,tessera_extender=debug")
            .stdin(Stdio::null())
            .stdout(append_log(&self.log)?)
            .stderr(append_log(&self.log)?)
            .spawn()
            .context("spawning tessera-scheduler-extender")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "tessera-scheduler-extender exited with {status}:\n{}",
                    tail(&self.log_text(), 40)
                );
            }
            if let Ok((200, _)) = http_get(self.port, "/readyz") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tessera-scheduler-extender not ready in 60 s:\n{}",
                    tail(&self.log_text(), 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_text(), lines)
    }

    /// A crash: SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the same arguments (after [`Self::kill`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn().await
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for ExtenderProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            tessera_test_support::terminate(child, Duration::from_secs(5));
        }
    }
}

/// A `tessera-sim scheduler` child process with a configuration file of
/// its own, which names the API server (`clientConnection.kubeconfig`, as
/// kube-scheduler reads it once `--config` is given); SIGTERM on drop.
pub struct SchedulerProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl SchedulerProcess {
    /// Starts one with `config` (the text of a KubeSchedulerConfiguration,
    /// `clientConnection.kubeconfig` included), written to `dir/<name>.yaml`.
    pub fn start(dir: &Path, name: &str, config: &str) -> Result<Self> {
        let config_path = dir.join(format!("{name}.yaml"));
        std::fs::write(&config_path, config)?;
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(tessera_test_support::artefact("tessera-sim"))
            .arg("scheduler")
            .arg("--config")
            .arg(&config_path)
            .env_remove("KUBECONFIG")
            .env("TESSERA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(append_log(&log)?)
            .spawn()
            .context("spawning tessera-sim scheduler")?;
        Ok(SchedulerProcess {
            child: Some(child),
            log,
        })
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(
            &std::fs::read_to_string(&self.log).unwrap_or_default(),
            lines,
        )
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            tessera_test_support::terminate(child, Duration::from_secs(5));
        }
    }
}

// ---------------------------------------------------------------------------
// The over-commit check.

/// What the pods' allocations hold of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUse {
    /// Share slices: memory MiB summed.
    pub memory_mib: u64,
    /// Share slices: cores summed.
    pub cores: u32,
    /// Share slices: how many.
    pub slices: u32,
    /// MIG reservations: (pod, profile name, placement).
    pub mig: Vec<(String, String, Placement)>,
}

/// Recomputes every GPU's use from the allocations of `pods` (those not
/// Succeeded or Failed) and checks them against `inventories` with
/// `split_count` slices per share GPU and scaling 1: every device on a GPU
/// of its node in the right mode, the allocation's node the pod's node,
/// share memory ≤ the GPU's memory, cores ≤ 100, slices ≤ split count, each
/// MIG reservation one of its profile's legal placements (as the inventory
/// lists them) and no two overlapping. Init containers are counted as if they
/// ran beside the others (the tests use none). The use per GPU uuid, or every
/// violation found.
pub fn check_no_overcommit(
    inventories: &BTreeMap<String, NodeGpus>,
    pods: &[Pod],
    split_count: u32,
) -> Result<BTreeMap<String, GpuUse>> {
    let mut gpus: BTreeMap<String, (&str, &NodeGpu)> = BTreeMap::new();
    for (node, inventory) in inventories {
        for gpu in &inventory.gpus {
            gpus.insert(gpu.uuid.clone(), (node.as_str(), gpu));
        }
    }
    let mut uses: BTreeMap<String, GpuUse> = BTreeMap::new();
    let mut problems = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let allocation = match allocation_of(pod) {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(e) => {
                problems.push(format!("{e:#}"));
                continue;
            }
        };
        if let Some(node) = bound_node(pod)
            && node != allocation.node
        {
            problems.push(format!(
                "{name}: bound to {node}, allocation names {}",
                allocation.node
            ));
        }
        for (_, device) in allocation.devices() {
            let Some((node, gpu)) = gpus.get(device.uuid()) else {
                problems.push(format!("{name}: unknown GPU {}", device.uuid()));
                continue;
            };
            if *node != allocation.node {
                problems.push(format!(
                    "{name}: GPU {} is on {node}, allocation names {}",
                    gpu.uuid, allocation.node
                ));
            }
            let entry = uses.entry(gpu.uuid.clone()).or_default();
            match device {
                DeviceAllocation::Share {
                    memory_mib, cores, ..
                } => {
                    if gpu.mig {
                        problems.push(format!("{name}: share slice on MIG GPU {}", gpu.uuid));
                    }
                    entry.memory_mib += memory_mib;
                    entry.cores += cores;
                    entry.slices += 1;
                }
                DeviceAllocation::Mig {
                    profile,
                    profile_id,
                    placement,
                    ..
                } => {
                    if !gpu.mig {
                        problems.push(format!("{name}: MIG reservation on share GPU {}", gpu.uuid));
                    }
                    match gpu.mig_profiles.iter().find(|p| p.id == *profile_id) {
                        Some(p) if p.name != *profile => problems.push(format!(
                            "{name}: profile id {profile_id} is {} on {}, allocation says {profile}",
                            p.name, gpu.uuid
                        )),
                        Some(p) if !p.placements.contains(placement) => problems.push(format!(
                            "{name}: {profile} at {placement:?} is not a legal placement on {}",
                            gpu.uuid
                        )),
                        Some(_) => {}
                        None => problems.push(format!(
                            "{name}: {} has no MIG profile id {profile_id}",
                            gpu.uuid
                        )),
                    }
                    entry.mig.push((name.clone(), profile.clone(), *placement));
                }
            }
        }
    }
    for (uuid, used) in &uses {
        let Some((node, gpu)) = gpus.get(uuid) else {
            continue;
        };
        if used.memory_mib > gpu.memory_mib {
            problems.push(format!(
                "{node}/{uuid}: {} MiB reserved of {} MiB",
                used.memory_mib, gpu.memory_mib
            ));
        }
        if used.cores > 100 {
            problems.push(format!("{node}/{uuid}: {} % cores reserved", used.cores));
        }
        if used.slices > split_count {
            problems.push(format!(
                "{node}/{uuid}: {} slices of {split_count}",
                used.slices
            ));
        }
        for (i, (pod_a, profile_a, a)) in used.mig.iter().enumerate() {
            for (pod_b, profile_b, b) in &used.mig[i + 1..] {
                let overlap = a.start < b.start + b.size && b.start < a.start + a.size;
                if overlap {
                    problems.push(format!(
                        "{node}/{uuid}: {pod_a}'s {profile_a} at {}+{} overlaps {pod_b}'s {profile_b} at {}+{}",
                        a.start, a.size, b.start, b.size
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(uses)
    } else {
        bail!(
            "{} over-commit(s) or invalid reservation(s):\n{}",
            problems.len(),
            problems.join("\n")
        )
    }
}

/// A Lease's holder, if it has one.
pub fn lease_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}
