//! Stand-in kubelet: device plugin v1beta1 manager, PodResources v1, pods through CRI (containerd) or podman.
//!
//! `tessera-sim kubelet --node NAME --root DIR --kubeconfig FILE` registers
//! the Node and keeps its status and Lease current ([`node`]), runs the pods
//! bound to it through a container runtime ([`runtime`], [`pods`]) and
//! serves the device plugins ([`devices`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};

pub mod devices;
pub mod node;
pub mod pods;
pub mod runtime;

use devices::DeviceManager;
use pods::NodeContext;
use pods::admission::NodeResources;
use pods::worker::{Adoptable, PodWorkers};
use runtime::{ContainerRuntime, RuntimeError};

/// How often the node's pods are listed again (pods the watch missed).
const RESYNC_PERIOD: Duration = Duration::from_secs(10);

/// Command-line options of `tessera-sim kubelet`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The node's name (its Node object and Lease).
    #[arg(long)]
    pub node: String,
    /// The simulated node's root directory (`tessera-sim create`); the
    /// kubelet directory is `<root>/var/lib/kubelet`.
    #[arg(long)]
    pub root: PathBuf,
    /// The kubeconfig of the API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The CRI runtime's socket, `unix:///path/containerd.sock`.
    #[arg(long, conflicts_with_all = ["podman", "dry_run"])]
    pub cri_endpoint: Option<String>,
    /// Run containers with podman (the default without --cri-endpoint).
    #[arg(long, conflicts_with = "dry_run")]
    pub podman: bool,
    /// An extra argument for each `podman create` (repeatable), e.g.
    /// `--podman-arg=--runtime=/usr/sbin/runc`.
    #[arg(long = "podman-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub podman_args: Vec<String>,
    /// Run nothing: record each CRI request as a JSON line in FILE and
    /// pretend containers run (scale tests).
    #[arg(long, value_name = "FILE")]
    pub dry_run: Option<PathBuf>,
    /// Extra node labels, `key=value,key=value`.
    #[arg(long, default_value = "")]
    pub node_labels: String,
    /// The node's `cpu` capacity (default: this host's).
    #[arg(long)]
    pub cpu: Option<String>,
    /// The node's `memory` capacity (default: this host's).
    #[arg(long)]
    pub memory: Option<String>,
    /// The node's `ephemeral-storage` capacity.
    #[arg(long, default_value = "100Gi")]
    pub ephemeral_storage: String,
    /// The node's `pods` capacity.
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// The cgroup every pod's cgroup goes below (`<parent>/pod<uid>`,
    /// cgroupfs path); default: the runtime's.
    #[arg(long, default_value = "")]
    pub cgroup_parent: String,
    /// The node's InternalIP (and the pods' IP: they run on the host network).
    #[arg(long, default_value = "127.0.0.1")]
    pub node_ip: String,
    /// Simulation only, standing in for the kernel driver every container
    /// of a real GPU node sees: give each container a read-write bind mount
    /// of this simulated node root at the same path and
    /// `TESSERA_SIM_ROOT=<DIR>`, so the stand-in driver libraries inside it
    /// serve this node.
    #[arg(long, value_name = "DIR")]
    pub sim_node_root: Option<PathBuf>,
}

/// What stops `tessera-sim kubelet`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command-line option is wrong.
    #[error("--{flag}: {message}")]
    Flag {
        /// The option.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The kubeconfig cannot be used.
    #[error("--kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The container runtime cannot be used.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The device plugin manager did not start.
    #[error("device plugin manager: {0}")]
    Devices(#[from] devices::Error),
    /// The async runtime did not start.
    #[error("starting the async runtime: {0}")]
    Io(#[from] std::io::Error),
}

/// Parses `--node-labels`: `key=value` pairs separated by commas.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, Error> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(Error::Flag {
                flag: "node-labels",
                message: format!("{pair:?}: want key=value"),
            });
        };
        if k.is_empty() {
            return Err(Error::Flag {
                flag: "node-labels",
                message: format!("{pair:?}: empty key"),
            });
        }
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(labels)
}

/// Runs `tessera-sim kubelet` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(args: Args) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(args))
}

async fn client(path: &std::path::Path) -> Result<kube::Client, Error> {
    let err = |message: String| Error::Kubeconfig {
        path: path.to_owned(),
        message,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

fn container_runtime(args: &Args) -> Result<Arc<dyn ContainerRuntime>, Error> {
    if let Some(path) = &args.dry_run {
        let recorder =
            runtime::recording::RecordingRuntime::to_file(path).map_err(|e| Error::Flag {
                flag: "dry-run",
                message: format!("{}: {e}", path.display()),
            })?;
        return Ok(Arc::new(recorder));
    }
    if let Some(endpoint) = &args.cri_endpoint {
        return Ok(Arc::new(runtime::cri::CriRuntime::connect(endpoint)?));
    }
    Ok(Arc::new(runtime::podman::PodmanRuntime::new(
        args.podman_args.clone(),
    )))
}

/// The runtime's version, waiting up to 30 s for it to come up.
async fn runtime_version(rt: &dyn ContainerRuntime) -> Result<runtime::RuntimeVersion, Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rt.version().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(e) => {
                tracing::info!(error = %e, "waiting for the container runtime");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// What the runtime already runs for this node, by pod uid (a kubelet
/// restart).
async fn adoptable(
    rt: &dyn ContainerRuntime,
    node: &str,
) -> Result<HashMap<String, Adoptable>, Error> {
    let mut found: HashMap<String, Adoptable> = HashMap::new();
    for s in rt.list_sandboxes().await? {
        if s.node == node {
            found
                .entry(s.pod_uid.clone())
                .or_default()
                .sandboxes
                .push(s);
        }
    }
    for c in rt.list_containers().await? {
        if c.node == node
            && let Some(a) = found.get_mut(&c.pod_uid)
        {
            a.containers.push(c);
        }
    }
    Ok(found)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

async fn run_async(args: Args) -> Result<(), Error> {
    let labels = parse_labels(&args.node_labels)?;
    if args.node.is_empty() {
        return Err(Error::Flag {
            flag: "node",
            message: "empty node name".to_owned(),
        });
    }
    if let Some(dir) = &args.sim_node_root
        && !dir.is_absolute()
    {
        return Err(Error::Flag {
            flag: "sim-node-root",
            message: format!("{}: not an absolute path", dir.display()),
        });
    }
    let client = client(&args.kubeconfig).await?;
    let rt = container_runtime(&args)?;
    let version = runtime_version(rt.as_ref()).await?;
    tracing::info!(node = %args.node, runtime = %version.node_info(), "kubelet starting");
    let devices = DeviceManager::start(&args.root.join("var/lib/kubelet")).await?;
    let found = adoptable(rt.as_ref(), &args.node).await?;

    let config = node::NodeConfig {
        name: args.node.clone(),
        labels,
        cpu: args.cpu.clone().unwrap_or_else(node::host_cpu),
        memory: args.memory.clone().unwrap_or_else(node::host_memory),
        ephemeral_storage: args.ephemeral_storage.clone(),
        max_pods: args.max_pods,
        address: args.node_ip.clone(),
        runtime_version: version.node_info(),
    };
    // What admission checks against until the Node is read back.
    let reported: BTreeMap<String, Quantity> = [
        ("cpu", config.cpu.clone()),
        ("memory", config.memory.clone()),
        ("ephemeral-storage", config.ephemeral_storage.clone()),
        ("pods", config.max_pods.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Quantity(v)))
    .collect();
    let node_resources = Arc::new(NodeResources::new(&reported));
    let ctx = Arc::new(NodeContext {
        node_name: args.node.clone(),
        root: args.root.clone(),
        runtime: Arc::clone(&rt),
        runtime_name: version.name.clone(),
        devices: Arc::clone(&devices),
        host_ip: args.node_ip.clone(),
        cgroup_parent: args.cgroup_parent.clone(),
        node_resources: Arc::clone(&node_resources),
        sim_node_root: args.sim_node_root.clone(),
    });
    let workers = PodWorkers::new(ctx, client.clone(), found);
    let tasks = vec![
        tokio::spawn(watch_node(
            client.clone(),
            args.node.clone(),
            node_resources,
        )),
        tokio::spawn(node::status_loop(
            client.clone(),
            config,
            Arc::clone(&devices),
        )),
        tokio::spawn(node::lease_loop(client.clone(), args.node.clone())),
        tokio::spawn(watch_pods(
            client.clone(),
            args.node.clone(),
            Arc::clone(&workers),
        )),
        tokio::spawn(resync(
            client.clone(),
            args.node.clone(),
            Arc::clone(&workers),
        )),
    ];
    shutdown_signal().await;
    tracing::info!(node = %args.node, "kubelet stopping (containers keep running)");
    for t in tasks {
        t.abort();
    }
    devices.shutdown().await;
    Ok(())
}

fn node_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// Keeps admission's view of the node's allocatable as the API server has
/// it (kubelet reads its Node through an informer too): extended resources
/// someone else advertised count, and resources it lacks are ignored.
async fn watch_node(client: kube::Client, node: String, resources: Arc<NodeResources>) {
    let api: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                if let Some(allocatable) = n.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
                    resources.set_allocatable(allocatable);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "watching the node"),
        }
    }
}

/// Feeds the node's pods from the watch to their workers.
async fn watch_pods(client: kube::Client, node: String, workers: Arc<PodWorkers>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&node_selector(&node));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listed: BTreeSet<String> = BTreeSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) => workers.update(pod),
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    workers.gone(uid);
                }
            }
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    listed.insert(uid.clone());
                }
                workers.update(pod);
            }
            Ok(watcher::Event::InitDone) => {
                // A re-list (after a watch error or an API server restart):
                // pods missing from it were deleted meanwhile.
                for uid in workers.uids().difference(&listed) {
                    workers.gone(uid);
                }
                workers.synced().await;
            }
            Err(e) => tracing::warn!(error = %e, "watching the node's pods"),
        }
    }
}

/// Lists the node's pods every [`RESYNC_PERIOD`] and lets the workers drop
/// pods (and runtime sandboxes) the API server no longer has.
async fn resync(client: kube::Client, node: String, workers: Arc<PodWorkers>) {
    let api: Api<Pod> = Api::all(client);
    loop {
        tokio::time::sleep(RESYNC_PERIOD).await;
        let before = workers.uids();
        match api
            .list(&ListParams::default().fields(&node_selector(&node)))
            .await
        {
            Ok(list) => {
                let uids: BTreeSet<String> = list
                    .items
                    .iter()
                    .filter_map(|p| p.metadata.uid.clone())
                    .collect();
                workers.resync(&before, &uids).await;
            }
            Err(e) => tracing::warn!(error = %e, "resync: listing the node's pods"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_parse_and_bad_ones_name_the_flag() {
        let labels = parse_labels("zone=a, tessera.io/gpu=true,,empty=").expect("labels");
        assert_eq!(labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(
            labels.get("tessera.io/gpu").map(String::as_str),
            Some("true")
        );
        assert_eq!(labels.get("empty").map(String::as_str), Some(""));
        for bad in ["novalue", "=v"] {
            let e = parse_labels(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--node-labels: "), "{e}");
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn a_relative_cri_endpoint_is_refused() {
        let Err(e) = runtime::cri::CriRuntime::connect("unix://relative.sock") else {
            panic!("a relative socket path was accepted");
        };
        assert!(e.to_string().contains("--cri-endpoint"), "{e}");
    }
}
