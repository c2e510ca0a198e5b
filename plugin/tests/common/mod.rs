//! What the plugin's integration tests share: the node's names, a
//! [`PluginConfig`] for a test, the prerequisites of a simulated node with a
//! stand-in API server, and pods bound the way the extender binds them
//! (allocation annotation, `bind-phase: allocating`, `bind-time`, the node's
//! Lease). The Allocate tests' in-process [`World`] (a simulated node of
//! profile `dynamic`: GPU 0 an H100 shared as vGPU slices, GPU 1 an
//! A100-40GB with MIG on and no instances, the NVML stand-in loaded in this
//! process) is here too; [`crash`] runs the real plugin binary instead.

#![allow(dead_code)]

pub mod crash;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_driver::GpuDriver;
use tessera_driver::devices::find_nvml_library;
use tessera_driver::nvml::NvmlDriver;
use tessera_model::contract::{annotations, cluster};
use tessera_model::gpu::GpuInstanceProfileInfo;
use tessera_model::sched::allocation::Allocation;
use tessera_plugin::allocate::Allocator;
use tessera_plugin::api::deviceplugin::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use tessera_plugin::checkpoint::Store;
use tessera_plugin::cluster::PodRef;
use tessera_plugin::config::{CdiMode, DeviceSettings, PluginConfig};
use tessera_plugin::run::NodeContext;
use tessera_test_support::kube::{Cluster, client, needs};
use tessera_test_support::node::SimNode;
use tessera_test_support::{Need, require};

/// The node's name.
pub const NODE: &str = "sim-node-1";
/// The bind locks' namespace.
pub const LOCK_NS: &str = cluster::DEFAULT_NAMESPACE;
/// The pods' namespace.
pub const NS: &str = "default";
/// The share GPU's index.
pub const SHARE_GPU: u32 = 0;
/// The MIG GPU's index.
pub const MIG_GPU: u32 = 1;

/// One test's world.
pub struct World {
    pub sim: SimNode,
    pub cluster: Cluster,
    pub kube: kube::Client,
    pub driver: Arc<NvmlDriver>,
    pub ctx: Arc<NodeContext>,
    pub allocator: Allocator,
}

impl World {
    /// The MIG GPU's 1-slice GPU-instance profile (1g.5gb on the A100-40GB).
    pub fn one_slice_profile(&self) -> Result<GpuInstanceProfileInfo> {
        self.driver
            .gpu_instance_profiles(MIG_GPU)?
            .into_iter()
            .find(|p| p.slice_count == 1)
            .context("a 1-slice profile")
    }
}

/// A test's configuration: node [`NODE`], the driver root `root`, every
/// directory under `state_dir`, no metrics listener, default device
/// settings.
pub fn config(root: &Path, state_dir: &Path, mode: CdiMode) -> PluginConfig {
    PluginConfig {
        node_name: NODE.to_owned(),
        kubeconfig: None,
        driver_root: root.to_owned(),
        host_driver_root: root.to_owned(),
        nvml_lib: None,
        kubelet_dir: state_dir.join("kubelet"),
        cdi_dir: state_dir.join("cdi"),
        state_dir: state_dir.to_owned(),
        cdi_mode: mode,
        namespace: LOCK_NS.to_owned(),
        hook_path: "/usr/bin/tessera-hook".into(),
        hook_config: None,
        vgpu_library: "/usr/lib/tessera/libtessera_vgpu.so".into(),
        metrics_listen: None,
        fail_on_init_error: true,
        devices: DeviceSettings::default(),
        resource_name: "nvidia.com/gpu".to_owned(),
    }
}

/// What a test on a simulated node with the shared stand-in API server
/// needs: root, the stand-ins, and `TESSERA_SIM_ROOT` unset.
pub fn sim_needs() -> Vec<Need> {
    let unset = std::env::var_os("TESSERA_SIM_ROOT").is_none_or(|v| v.is_empty());
    let mut wanted = needs();
    wanted.push(Need::condition(
        unset,
        "TESSERA_SIM_ROOT unset (the stand-in would serve that node instead)",
        "unset TESSERA_SIM_ROOT",
    ));
    wanted
}

/// A node context on `sim` with the NVML stand-in loaded in this process
/// (also returned as itself), its state under the node's directory.
pub fn sim_context(
    sim: &SimNode,
    kube: &kube::Client,
    mode: CdiMode,
) -> Result<(Arc<NvmlDriver>, Arc<NodeContext>)> {
    let lib = find_nvml_library(sim.root())?;
    let driver = Arc::new(NvmlDriver::load(&lib)?);
    let state_dir = sim.dir().join("state");
    let ctx = Arc::new(NodeContext {
        config: config(sim.root(), &state_dir, mode),
        driver: driver.clone(),
        client: kube.clone(),
        checkpoint: Arc::new(Store::open(&state_dir)?),
    });
    Ok((driver, ctx))
}

/// The world, or `None` when a prerequisite is missing (skipped locally,
/// a failure under CI).
pub async fn world(mode: CdiMode) -> Result<Option<World>> {
    if require(&sim_needs()).is_err() {
        return Ok(None);
    }
    let Ok(sim) = SimNode::profile("dynamic").build() else {
        return Ok(None);
    };
    let cluster = Cluster::get()?;
    let kube = client(cluster.kubeconfig()).await?;
    let (driver, ctx) = sim_context(&sim, &kube, mode)?;
    let allocator = Allocator::new(ctx.clone());
    Ok(Some(World {
        sim,
        cluster,
        kube,
        driver,
        ctx,
        allocator,
    }))
}

/// A pod on the node, as the extender binds it: the allocation annotation
/// (verbatim `allocation_text`), `bind-phase: allocating`, `bind-time` now,
/// `containers` (name) in order. With `lease`, the node's Lease names it
/// (taken just before the bind-time).
pub async fn bind_pod(
    kube: &kube::Client,
    name: &str,
    containers: &[&str],
    allocation_text: &str,
    lease: bool,
) -> Result<PodRef> {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "containers": containers.iter().map(|c| json!({"name": c, "image": "busybox"})).collect::<Vec<_>>(),
        },
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let pod_ref = PodRef::of(&pod).context("created pod has namespace, name, uid")?;
    if lease {
        take_lease(kube, &pod_ref).await?;
    }
    let patch = json!({"metadata": {"annotations": {
        annotations::ALLOCATION: allocation_text,
        annotations::BIND_PHASE: "allocating",
        annotations::BIND_TIME: Timestamp::now().to_string(),
    }}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(pod_ref)
}

/// The node's bind Lease.
pub fn lease_name() -> String {
    format!("{}{NODE}", cluster::BIND_LEASE_PREFIX)
}

/// Points the node's Lease at `pod` (acquireTime now).
pub async fn take_lease(kube: &kube::Client, pod: &PodRef) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), LOCK_NS);
    let name = lease_name();
    let now = Timestamp::now().to_string();
    let spec = json!({
        "holderIdentity": pod.holder(),
        "leaseDurationSeconds": 300,
        "acquireTime": now,
        "renewTime": now,
    });
    match leases.get_opt(&name).await? {
        None => {
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": LOCK_NS},
                "spec": spec,
            }))?;
            leases.create(&PostParams::default(), &lease).await?;
        }
        Some(_) => {
            leases
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": spec})),
                )
                .await?;
        }
    }
    // bind-time must come no earlier than acquireTime.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    Ok(())
}

/// The Lease's holder.
pub async fn lease_holder(kube: &kube::Client) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), LOCK_NS);
    Ok(leases
        .get_opt(&lease_name())
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The pod's annotations.
pub async fn pod_annotations(kube: &kube::Client, name: &str) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    Ok(pods
        .get(name)
        .await?
        .metadata
        .annotations
        .unwrap_or_default())
}

/// The pod's parsed allocation.
pub async fn pod_allocation(kube: &kube::Client, name: &str) -> Result<Allocation> {
    let a = pod_annotations(kube, name).await?;
    Ok(Allocation::parse(
        a.get(annotations::ALLOCATION)
            .context("allocation annotation")?,
    )?)
}

/// An Allocate request for one container with these device ids.
pub fn request(ids: &[&str]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }],
    }
}

/// The allocation annotation for one container `main` at index 0.
pub fn one_container(devices: serde_json::Value) -> String {
    json!({"version": 1, "node": NODE, "containers": [
        {"index": 0, "name": "main", "devices": devices}
    ]})
    .to_string()
}

/// The alloc-id of container `index` of `pod`.
pub fn alloc_id(pod: &PodRef, index: u32) -> String {
    format!("{}-{index}", pod.uid)
}

/// Where allocation `id`'s transient spec must be: the contract's name,
/// spelt out here rather than taken from the plugin under test.
pub fn transient_spec_path(world: &World, id: &str) -> PathBuf {
    world
        .ctx
        .config
        .cdi_dir
        .join(format!("tessera.io-alloc_{id}.json"))
}

/// Whether nothing of allocation `id` is left: no spec, no directory, no record.
pub fn nothing_left(world: &World, id: &str) -> Vec<String> {
    let mut left = Vec::new();
    let spec = transient_spec_path(world, id);
    if spec.exists() {
        left.push(format!("spec {}", spec.display()));
    }
    let dir = world.ctx.config.state_dir.join("alloc").join(id);
    if dir.exists() {
        left.push(format!("dir {}", dir.display()));
    }
    if world.ctx.checkpoint.get(id).is_some() {
        left.push(format!("record {id}"));
    }
    left
}

/// Waits until `check` holds, up to `within`.
pub async fn eventually<F>(within: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Result<bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
