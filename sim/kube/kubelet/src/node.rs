//! The Node object of this kubelet and its Lease: registration (labels),
//! `nodes/status` (conditions with heartbeats, capacity and allocatable with
//! the device plugins' resources, addresses, nodeInfo), and the
//! `kube-node-lease` Lease renewed every 10 s. Every loop outlives API
//! server restarts: a failed call is retried with back-off, a Node that
//! vanished is registered again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};

use crate::devices::DeviceManager;

/// The kubelet version the node reports.
pub const KUBELET_VERSION: &str = "v1.33.0-tessera-sim";
/// The namespace of the node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How often the lease is renewed.
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
/// The lease's duration.
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// How often the node status is written when nothing changed.
pub const STATUS_HEARTBEAT: Duration = Duration::from_secs(30);

/// What the node reports about itself.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// Extra labels (`--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// `cpu` capacity.
    pub cpu: String,
    /// `memory` capacity.
    pub memory: String,
    /// `ephemeral-storage` capacity.
    pub ephemeral_storage: String,
    /// `pods` capacity.
    pub max_pods: u32,
    /// The node's InternalIP.
    pub address: String,
    /// `nodeInfo.containerRuntimeVersion`.
    pub runtime_version: String,
}

/// What stops the node side.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

fn api_err(what: &str) -> impl FnOnce(kube::Error) -> NodeError + '_ {
    move |source| NodeError::Api {
        what: what.to_owned(),
        source,
    }
}

/// The `cpu` of this host (its available parallelism).
pub fn host_cpu() -> String {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .to_string()
}

/// The `memory` of this host (`MemTotal` of /proc/meminfo, in Ki).
pub fn host_memory() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next().map(|kb| format!("{kb}Ki")))
        })
        .unwrap_or_else(|| "16Gi".to_owned())
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| "Linux".to_owned())
}

/// The architecture as Kubernetes names it.
pub fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl NodeConfig {
    /// The node's labels.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), self.name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ("kubernetes.io/arch".to_owned(), architecture().to_owned()),
            ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
            (
                "beta.kubernetes.io/arch".to_owned(),
                architecture().to_owned(),
            ),
        ]);
        labels.extend(self.labels.clone());
        labels
    }

    fn node_info(&self) -> Value {
        let machine_id = read_trimmed("/etc/machine-id").unwrap_or_else(|| self.name.clone());
        json!({
            "machineID": machine_id,
            "systemUUID": machine_id,
            "bootID": read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
            "kernelVersion": read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
            "osImage": os_image(),
            "containerRuntimeVersion": self.runtime_version,
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": architecture(),
        })
    }

    /// The `status` patch: `previous` are the device resources written last
    /// time (those gone are removed with `null`).
    fn status(
        &self,
        devices: &BTreeMap<String, crate::devices::ResourceCounts>,
        previous: &[String],
        since: &Time,
    ) -> Value {
        let mut capacity = Map::new();
        let mut allocatable = Map::new();
        for (k, v) in [
            ("cpu", self.cpu.clone()),
            ("memory", self.memory.clone()),
            ("ephemeral-storage", self.ephemeral_storage.clone()),
            ("pods", self.max_pods.to_string()),
        ] {
            capacity.insert(k.to_owned(), v.clone().into());
            allocatable.insert(k.to_owned(), v.into());
        }
        for gone in previous.iter().filter(|r| !devices.contains_key(*r)) {
            capacity.insert(gone.clone(), Value::Null);
            allocatable.insert(gone.clone(), Value::Null);
        }
        for (name, counts) in devices {
            capacity.insert(name.clone(), counts.capacity.to_string().into());
            allocatable.insert(name.clone(), counts.allocatable.to_string().into());
        }
        let now = Time(Timestamp::now());
        let condition = |kind: &str, status: &str, reason: &str, message: &str| {
            json!({
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            })
        };
        json!({
            "status": {
                "capacity": capacity,
                "allocatable": allocatable,
                "conditions": [
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                ],
                "addresses": [
                    {"type": "InternalIP", "address": self.address},
                    {"type": "Hostname", "address": self.name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": self.node_info(),
            }
        })
    }
}

/// Creates the Node, or brings an existing one's labels up to date.
pub async fn register(client: &kube::Client, config: &NodeConfig) -> Result<(), NodeError> {
    let api: Api<Node> = Api::all(client.clone());
    let labels = config.node_labels();
    match api
        .get_opt(&config.name)
        .await
        .map_err(api_err("reading the Node"))?
    {
        Some(_) => {
            let patch = json!({"metadata": {"labels": labels}});
            api.patch(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_err("updating the Node's labels"))?;
        }
        None => {
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    labels: Some(labels),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            };
            match api.create(&PostParams::default(), &node).await {
                Ok(_) => tracing::info!(node = %config.name, "node registered"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(api_err("creating the Node")(e)),
            }
        }
    }
    Ok(())
}

/// Registers the node and keeps its status current: at once, whenever the
/// device plugins' resources change, and every [`STATUS_HEARTBEAT`].
pub async fn status_loop(client: kube::Client, config: NodeConfig, devices: Arc<DeviceManager>) {
    let api: Api<Node> = Api::all(client.clone());
    let since = Time(Timestamp::now());
    let mut changes = devices.changes();
    let mut written: Vec<String> = Vec::new();
    let mut registered = false;
    let mut backoff = Duration::from_millis(500);
    loop {
        if !registered {
            match register(&client, &config).await {
                Ok(()) => registered = true,
                Err(e) => {
                    tracing::warn!(error = %e, "registering the node; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            }
        }
        let resources = devices.resources();
        let patch = config.status(&resources, &written, &since);
        match api
            .patch_status(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                written = resources.keys().cloned().collect();
                backoff = Duration::from_millis(500);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::warn!(node = %config.name, "the Node is gone; registering it again");
                registered = false;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "writing the node status; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    // The manager is gone (shutting down); heartbeats only.
                    changes = tokio::sync::watch::channel(0).1;
                    tokio::time::sleep(STATUS_HEARTBEAT).await;
                }
            }
            () = tokio::time::sleep(STATUS_HEARTBEAT) => {}
        }
    }
}

/// Keeps the node's Lease renewed every [`LEASE_RENEW`].
pub async fn lease_loop(client: kube::Client, node: String) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let mut failures = 0_u32;
    loop {
        match renew(&namespaces, &leases, &node).await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(node = %node, "lease renewed again");
                }
                failures = 0;
                tokio::time::sleep(LEASE_RENEW).await;
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, failures, "renewing the node lease");
                }
                tokio::time::sleep(Duration::from_millis(500) * failures.min(10)).await;
            }
        }
    }
}

async fn renew(
    namespaces: &Api<Namespace>,
    leases: &Api<Lease>,
    node: &str,
) -> Result<(), NodeError> {
    let now = MicroTime(Timestamp::now());
    let patch = json!({"spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": now}});
    match leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(api_err("renewing the Lease")(e)),
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(LEASE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => return Err(api_err("creating namespace kube-node-lease")(e)),
    }
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_owned()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }),
    };
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(api_err("creating the Lease")(e)),
    }
}
