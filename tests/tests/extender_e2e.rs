//! `tessera-scheduler-extender` end to end on the simulated cluster: the
//! real extender binary (one or two replicas) behind the stand-in
//! kube-scheduler, which reads the shipped
//! `packaging/kubernetes/config/scheduler-config.yaml` with only the
//! extender's address changed; the extender reads the shipped
//! `config/cluster.yaml`. (The manifests themselves: `manifests.rs`.) Nodes are
//! Node objects the tests create, carrying `tessera.io/node-gpus` built from
//! the MIG catalogue (standing in for the device plugin's report) and
//! `deviceSplitCount` × GPUs of `nvidia.com/gpu`; a device plugin stand-in
//! confirms every reservation (`bind-phase: success`). No kubelet: the pods
//! are only scheduled.
//!
//! Every expectation is worked out by hand from reference/mig.md and the
//! shipped configuration (split count 10, scaling 1, default cores 0, the
//! A100-SXM4-40GB allowlist 1g.5gb / 2g.10gb / 3g.20gb / 7g.40gb), and every
//! test ends with an over-commit check that recomputes each GPU's use from
//! the pods' allocations (`gpu_cluster::check_no_overcommit`).
//!
//! These tests always start their own stand-in API server, even when
//! `TESSERA_E2E_KUBECONFIG` names a real cluster: each runs schedulers of its
//! own and creates Ready nodes that have no kubelet behind them.
//!
//! They run the binaries already built: `cargo test -p tessera-e2e` does not
//! rebuild `target/debug/tessera-scheduler-extender` or `tessera-sim` (they
//! are other packages' binaries), so build them first:
//! `cargo build -p tessera-scheduler-extender -p tessera-sim`.
//!
//! A failed check returns an error from the test's `result` block (`ensure!`,
//! [`ensure_eq!`], never a panic) so that the extenders' and schedulers' log
//! tails are attached to it; the test's directory, with the whole logs, is
//! then kept and named.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use tessera_e2e::gpu_cluster::{
    self as gc, DevicePluginStandIn, ExtenderProcess, GpuPod, GpuUse, SchedulerProcess,
};
use tessera_model::contract::{annotations, cluster};
use tessera_model::mig::placement::Placement;
use tessera_model::sched::allocation::{Allocation, DeviceAllocation};
use tessera_model::sched::inventory::NodeGpus;
use tessera_test_support::kube::{self as tkube};
use tessera_test_support::{Need, require};

const NS: &str = "default";
/// `deviceSplitCount` of the shipped cluster-config.yaml.
const SPLIT: u32 = 10;
const WAIT: Duration = Duration::from_secs(60);
const A100: &str = "A100-40GB";
/// `mig.md`: A100-SXM4-40GB 2g.10gb is profile id 14, placements {0,2,4}:2;
/// the catalogue gives it 9856 MiB (9.625 GiB, mig.md's "≈ 9.62 GiB").
const P2G10_ID: u32 = 14;
const P2G10_MIB: u64 = 9856;

/// `assert_eq!` that fails with an error instead of a panic (see the module
/// doc: the logs are attached to errors only).
macro_rules! ensure_eq {
    ($left:expr, $right:expr $(,)?) => {{
        let (left, right) = (&$left, &$right);
        ensure!(
            *left == *right,
            "{} == {}: {left:?} != {right:?}",
            stringify!($left),
            stringify!($right)
        );
    }};
    ($left:expr, $right:expr, $($what:tt)+) => {{
        let (left, right) = (&$left, &$right);
        ensure!(
            *left == *right,
            "{left:?} != {right:?}: {}",
            format!($($what)+)
        );
    }};
}

macro_rules! prerequisites {
    () => {
        let Ok(()) = require(&[
            Need::Built("tessera-sim"),
            Need::Built("tessera-scheduler-extender"),
        ]) else {
            return Ok(());
        };
    };
}

// ---------------------------------------------------------------------------
// The cluster of one test.

struct Env {
    api: tkube::StandInApiServer,
    client: kube::Client,
    dir: tempfile::TempDir,
    plugin: DevicePluginStandIn,
    inventories: BTreeMap<String, NodeGpus>,
}

impl Env {
    async fn new() -> Result<Env> {
        let api = tkube::StandInApiServer::start(&[])?;
        let client = tkube::client(api.kubeconfig()).await?;
        let dir = tempfile::Builder::new()
            .prefix("tessera-extender-e2e-")
            .tempdir()?;
        let plugin = DevicePluginStandIn::start(client.clone());
        Ok(Env {
            api,
            client,
            dir,
            plugin,
            inventories: BTreeMap::new(),
        })
    }

    /// A node with GPUs of `(catalogue model, MIG mode)`, indexes from 0.
    async fn node(&mut self, name: &str, gpus: &[(&str, bool)]) -> Result<()> {
        let inventory = gc::inventory(name, gpus)?;
        gc::add_gpu_node(&self.client, name, &inventory, SPLIT).await?;
        self.inventories.insert(name.to_owned(), inventory);
        Ok(())
    }

    /// An extender replica on a port of its own, with the shipped cluster
    /// config; ready when this returns.
    async fn extender(&self, identity: &str) -> Result<ExtenderProcess> {
        ExtenderProcess::start(
            self.dir.path(),
            self.api.kubeconfig(),
            &gc::shipped_cluster_config_path(),
            identity,
            tessera_test_support::free_port(),
        )
        .await
    }

    /// A stand-in scheduler with the shipped configuration pointed at
    /// `extender`; `profile` renames its one profile.
    fn scheduler(
        &self,
        name: &str,
        extender: &ExtenderProcess,
        profile: Option<&str>,
    ) -> Result<SchedulerProcess> {
        let config = gc::shipped_scheduler_config(extender.port, profile, self.api.kubeconfig())?;
        SchedulerProcess::start(self.dir.path(), name, &config)
    }

    /// The test's outcome: a failure gets `logs` (the processes' log tails)
    /// attached, and the directory with the whole logs is kept.
    fn outcome(&mut self, result: Result<()>, logs: impl FnOnce() -> String) -> Result<()> {
        result.map_err(|e| {
            self.dir.disable_cleanup(true);
            e.context(format!(
                "{}
(whole logs kept in {})",
                logs(),
                self.dir.path().display()
            ))
        })
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create(&self, pod: GpuPod) -> Result<Pod> {
        pod.create(&self.client, NS).await
    }

    async fn all_pods(&self) -> Result<Vec<Pod>> {
        Ok(self.pods().list(&ListParams::default()).await?.items)
    }

    /// Waits until every pod of `names` is bound; the pods then.
    async fn wait_bound(&self, names: &[&str]) -> Result<Vec<Pod>> {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut pods = Vec::new();
            for name in names {
                let pod = self.pods().get(name).await?;
                if gc::bound_node(&pod).is_none() {
                    break;
                }
                pods.push(pod);
            }
            if pods.len() == names.len() {
                return Ok(pods);
            }
            if Instant::now() > deadline {
                let events = gc::failed_scheduling(&self.client, NS).await?;
                bail!(
                    "not all of {names:?} bound in {WAIT:?} (bound: {}); FailedScheduling: {events:?}",
                    pods.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for a FailedScheduling event about `pod` whose message passes
    /// `accept`; that message.
    async fn wait_failed(&self, pod: &str, accept: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let events = gc::failed_scheduling(&self.client, NS).await?;
            let messages = events.get(pod).cloned().unwrap_or_default();
            if let Some(m) = messages.iter().find(|m| accept(m)) {
                return Ok(m.clone());
            }
            if Instant::now() > deadline {
                bail!("no matching FailedScheduling event for {pod} in {WAIT:?}: {messages:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The over-commit check over every pod of the cluster.
    async fn check(&self) -> Result<BTreeMap<String, GpuUse>> {
        gc::check_no_overcommit(&self.inventories, &self.all_pods().await?, SPLIT)
    }

    /// Waits until the node's bind Lease is free (deleted, or without a
    /// holder): the extender saw the device plugin's `success`.
    async fn wait_lease_released(&self, node: &str) -> Result<()> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), cluster::DEFAULT_NAMESPACE);
        let name = format!("{}{node}", cluster::BIND_LEASE_PREFIX);
        let deadline = Instant::now() + WAIT;
        loop {
            let lease = leases.get_opt(&name).await?;
            let holder = lease.as_ref().and_then(gc::lease_holder).map(String::from);
            if holder.is_none() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("Lease {name} still held by {holder:?} after {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // A panic (a bug in the test itself) skips `outcome`: keep the logs.
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("logs kept in {}", self.dir.path().display());
        }
    }
}

/// What went wrong, with the logs of the processes involved.
fn logs(extenders: &[&ExtenderProcess], schedulers: &[&SchedulerProcess]) -> String {
    let mut text = String::new();
    for e in extenders {
        text.push_str(&format!(
            "\n--- extender :{} ---\n{}",
            e.port,
            e.log_tail(40)
        ));
    }
    for s in schedulers {
        text.push_str(&format!("\n--- scheduler ---\n{}", s.log_tail(30)));
    }
    text
}

fn allocation(pod: &Pod) -> Result<Allocation> {
    gc::allocation_of(pod)?.with_context(|| {
        format!(
            "pod {} is bound but has no {}",
            pod.metadata.name.as_deref().unwrap_or("?"),
            annotations::ALLOCATION
        )
    })
}

/// The devices of the allocation's one container (index 0, `main`).
fn single_container_devices(pod: &Pod) -> Result<Vec<DeviceAllocation>> {
    let a = allocation(pod)?;
    ensure!(a.containers.len() == 1, "one container expected: {a:?}");
    let c = &a.containers[0];
    ensure!(
        c.index == 0 && c.name == "main" && !c.init,
        "container 0 `main` expected: {c:?}"
    );
    ensure!(
        Some(a.node.as_str()) == gc::bound_node(pod),
        "allocation names {}, pod bound to {:?}",
        a.node,
        gc::bound_node(pod)
    );
    Ok(c.devices.clone())
}

fn share(uuid: &str, memory_mib: u64, cores: u32) -> DeviceAllocation {
    DeviceAllocation::Share {
        uuid: uuid.to_owned(),
        memory_mib,
        cores,
    }
}

/// A MIG device's (uuid, profile, profile id, placement, memory).
fn mig_parts(device: &DeviceAllocation) -> Result<(String, String, u32, Placement, u64)> {
    match device {
        DeviceAllocation::Mig {
            uuid,
            profile,
            profile_id,
            placement,
            memory_mib,
            realized,
        } => {
            ensure!(
                realized.is_none(),
                "the extender never fills `realized`: {device:?}"
            );
            Ok((
                uuid.clone(),
                profile.clone(),
                *profile_id,
                *placement,
                *memory_mib,
            ))
        }
        other => bail!("a MIG reservation expected, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------

/// The over-commit check itself catches what the other tests rely on it
/// for: share memory, cores and slices over a GPU's, overlapping and illegal
/// MIG placements, a device on another node's GPU, and a bad annotation.
#[test]
fn the_over_commit_check_catches_double_booking() -> Result<()> {
    let inventories = BTreeMap::from([
        (
            "n1".to_owned(),
            gc::inventory("n1", &[(A100, false), (A100, true)])?,
        ),
        ("n2".to_owned(), gc::inventory("n2", &[(A100, false)])?),
    ]);
    let pod = |name: &str, node: &str, devices: serde_json::Value| -> Result<Pod> {
        let allocation = serde_json::json!({"version": 1, "node": node, "containers": [
            {"index": 0, "name": "main", "devices": devices}]});
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {annotations::ALLOCATION: allocation.to_string()}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        }))?)
    };
    let share = |mib: u64, cores: u32| serde_json::json!([{"uuid": "GPU-n1-0", "mode": "share", "memoryMiB": mib, "cores": cores}]);
    let mig = |profile: &str, id: u32, start: u32, size: u32| {
        serde_json::json!([{"uuid": "GPU-n1-1", "mode": "mig", "profile": profile, "profileId": id,
            "placement": {"start": start, "size": size}, "memoryMiB": 1}])
    };
    // Fits exactly: 40960 MiB, 100 %, 3g at 0-3 and 3g at 4-7.
    let fine = vec![
        pod("a", "n1", share(20_480, 50))?,
        pod("b", "n1", share(20_480, 50))?,
        pod("c", "n1", mig("3g.20gb", 9, 0, 4))?,
        pod("d", "n1", mig("3g.20gb", 9, 4, 4))?,
    ];
    let uses = gc::check_no_overcommit(&inventories, &fine, SPLIT)?;
    assert_eq!(uses["GPU-n1-0"].memory_mib, 40_960);
    assert_eq!(uses["GPU-n1-1"].mig.len(), 2);
    let cases = [
        (pod("x", "n1", share(1, 0))?, "40961 MiB reserved of 40960"),
        (pod("x", "n1", share(1, 1))?, "101 % cores"),
        (pod("x", "n1", mig("1g.5gb", 19, 3, 1))?, "overlaps"),
        (
            pod("x", "n1", mig("3g.20gb", 9, 2, 4))?,
            "not a legal placement",
        ),
        (
            pod("x", "n2", share(1, 0))?,
            "is on n1, allocation names n2",
        ),
    ];
    for (extra, want) in cases {
        let mut pods = fine.clone();
        pods.push(extra);
        let err = gc::check_no_overcommit(&inventories, &pods, SPLIT)
            .expect_err(want)
            .to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
    let mut slices: Vec<Pod> = (0..=SPLIT)
        .map(|i| pod(&format!("s{i}"), "n1", share(1, 0)))
        .collect::<Result<_>>()?;
    let err = gc::check_no_overcommit(&inventories, &slices, SPLIT).expect_err("11 slices");
    assert!(err.to_string().contains("11 slices of 10"), "{err}");
    slices.truncate(1);
    if let Some(a) = slices[0].metadata.annotations.as_mut() {
        a.insert(annotations::ALLOCATION.into(), "{\"node\":5}".into());
    }
    assert!(gc::check_no_overcommit(&inventories, &slices, SPLIT).is_err());
    Ok(())
}

/// gpushare's binpack demo: three pods of 8000 MiB with `gpu-policy:
/// binpack` share one GPU of a two-GPU node; each gets exactly its 8000 MiB
/// and the shipped default of 0 % cores; the device plugin stand-in's
/// `success` frees the node's bind Lease.
#[tokio::test(flavor = "multi_thread")]
async fn binpack_puts_three_pods_on_one_gpu() -> Result<()> {
    prerequisites!();
    let mut env = Env::new().await?;
    env.node("node-1", &[(A100, false), (A100, false)]).await?;
    let ext = env.extender("a").await?;
    let sched = env.scheduler("scheduler", &ext, None)?;
    let names = ["bp-1", "bp-2", "bp-3"];
    for name in names {
        env.create(GpuPod::new(name, 1, 8000).annotate(annotations::GPU_POLICY, "binpack"))
            .await?;
    }
    let result: Result<()> = async {
        let pods = env.wait_bound(&names).await?;
        let mut uuids = BTreeSet::new();
        for pod in &pods {
            ensure_eq!(gc::bound_node(pod), Some("node-1"));
            let devices = single_container_devices(pod)?;
            ensure!(devices.len() == 1, "one device: {devices:?}");
            let uuid = devices[0].uuid().to_owned();
            ensure_eq!(devices[0], share(&uuid, 8000, 0));
            uuids.insert(uuid);
            ensure!(
                gc::annotation(pod, annotations::BIND_TIME).is_some(),
                "no bind-time on {:?}",
                pod.metadata.name
            );
        }
        let both: BTreeSet<String> = (0..2).map(|i| gc::gpu_uuid("node-1", i)).collect();
        ensure!(
            uuids.len() == 1 && uuids.is_subset(&both),
            "binpack: all three on one GPU of node-1, got {uuids:?}"
        );
        env.wait_lease_released("node-1").await?;
        for name in names {
            let pod = env.pods().get(name).await?;
            ensure_eq!(
                gc::annotation(&pod, annotations::BIND_PHASE),
                Some("success")
            );
        }
        let uses = env.check().await?;
        let uuid = uuids.first().context("a uuid")?;
        ensure_eq!(uses[uuid].memory_mib, 24_000);
        ensure_eq!(uses[uuid].slices, 3);
        ensure_eq!(gc::http_get(ext.port, "/healthz")?.0, 200);
        Ok(())
    }
    .await;
    env.outcome(result, || logs(&[&ext], &[&sched]))
}

/// gpushare's second demo: two 36000 MiB pods take one GPU each, leaving
/// 4960 MiB on each (9920 MiB on the node); an 8000 MiB pod fits the node's
/// total but no single GPU, so it stays Pending with that reason in its
/// FailedScheduling event, and nothing is written on it.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_fitting_the_node_total_but_no_single_gpu_stays_pending() -> Result<()> {
    prerequisites!();
    let mut env = Env::new().await?;
    env.node("node-1", &[(A100, false), (A100, false)]).await?;
    let ext = env.extender("a").await?;
    let sched = env.scheduler("scheduler", &ext, None)?;
    let result: Result<()> = async {
        env.create(GpuPod::new("big-1", 1, 36_000)).await?;
        env.create(GpuPod::new("big-2", 1, 36_000)).await?;
        let pods = env.wait_bound(&["big-1", "big-2"]).await?;
        let uuids: BTreeSet<String> = pods
            .iter()
            .map(|p| Ok(single_container_devices(p)?[0].uuid().to_owned()))
            .collect::<Result<_>>()?;
        ensure_eq!(
            uuids.len(),
            2,
            "36000 + 36000 MiB cannot share a 40960 MiB GPU"
        );

        env.create(GpuPod::new("small", 1, 8000)).await?;
        let message = env
            .wait_failed("small", |m| m.contains("no single GPU"))
            .await?;
        ensure!(message.contains("8000"), "{message}");
        ensure!(message.starts_with("0/1 nodes are available"), "{message}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let small = env.pods().get("small").await?;
        ensure_eq!(gc::bound_node(&small), None);
        ensure_eq!(gc::annotation(&small, annotations::ALLOCATION), None);
        ensure_eq!(gc::annotation(&small, annotations::BIND_PHASE), None);
        env.check().await?;
        Ok(())
    }
    .await;
    env.outcome(result, || logs(&[&ext], &[&sched]))
}

/// HAMi's dynamic-MIG example: `gpu: 2`, `gpumem: 8000`, `vgpu-mode: mig` on
/// a node with two MIG A100-40GB. The smallest allowlisted profile with
/// ≥ 8000 MiB is 2g.10gb (1g.5gb has 4864), id 14, placements {0,2,4}:2 — so
/// each pod gets two 2g.10gb reservations at legal placements on distinct
/// GPUs; three such pods fill all six 2g placements (exactly starts 0, 2, 4
/// on each GPU) and a fourth stays Pending.
#[tokio::test(flavor = "multi_thread")]
async fn hami_dynamic_mig_example_reserves_the_smallest_allowed_profile() -> Result<()> {
    prerequisites!();
    let mut env = Env::new().await?;
    env.node("node-1", &[(A100, true), (A100, true)]).await?;
    let ext = env.extender("a").await?;
    let sched = env.scheduler("scheduler", &ext, None)?;
    let mig_pod = |name: &str| GpuPod::new(name, 2, 8000).annotate(annotations::VGPU_MODE, "mig");
    let result: Result<()> = async {
        let gpus: BTreeSet<String> = (0..2).map(|i| gc::gpu_uuid("node-1", i)).collect();
        env.create(mig_pod("mig-1")).await?;
        let first = env.wait_bound(&["mig-1"]).await?;
        let devices = single_container_devices(&first[0])?;
        ensure_eq!(devices.len(), 2, "gpu: 2 means two devices: {devices:?}");
        let mut seen = BTreeSet::new();
        for device in &devices {
            let (uuid, profile, id, placement, memory) = mig_parts(device)?;
            ensure_eq!(
                (profile.as_str(), id, memory),
                ("2g.10gb", P2G10_ID, P2G10_MIB)
            );
            ensure!(
                [0, 2, 4].contains(&placement.start) && placement.size == 2,
                "2g.10gb at {placement:?}"
            );
            ensure!(gpus.contains(&uuid), "{uuid}");
            seen.insert(uuid);
        }
        ensure_eq!(seen, gpus, "the two reservations are on distinct GPUs");

        env.create(mig_pod("mig-2")).await?;
        env.create(mig_pod("mig-3")).await?;
        env.wait_bound(&["mig-2", "mig-3"]).await?;
        let uses = env.check().await?;
        for uuid in &gpus {
            let starts: BTreeSet<u32> = uses[uuid]
                .mig
                .iter()
                .map(|(_, profile, p)| {
                    ensure_eq!((profile.as_str(), p.size), ("2g.10gb", 2));
                    Ok(p.start)
                })
                .collect::<Result<_>>()?;
            ensure_eq!(starts, BTreeSet::from([0, 2, 4]), "{uuid}");
        }

        env.create(mig_pod("mig-4")).await?;
        // mig.md: A100-40GB's 2g.10gb has at most 3 instances per GPU, and
        // both GPUs hold 3: the reason is the instance limit, for 2g.10gb.
        let message = env.wait_failed("mig-4", |m| m.contains("2g.10gb")).await?;
        ensure!(
            message.starts_with("0/1 nodes are available")
                && message.contains("2g.10gb instance limit reached (3 per GPU)"),
            "mig-4's reason: {message}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let fourth = env.pods().get("mig-4").await?;
        ensure_eq!(gc::bound_node(&fourth), None);
        ensure_eq!(gc::annotation(&fourth, annotations::ALLOCATION), None);
        env.check().await?;
        Ok(())
    }
    .await;
    env.outcome(result, || logs(&[&ext], &[&sched]))
}

/// The unified pool (no `vgpu-mode`) on a node with a share GPU (index 0)
/// and a MIG GPU (index 1) side by side. With the MIG GPU taken whole by a
/// 7g.40gb (the only allowlisted profile ≥ 40000 MiB), a unified 8000 MiB
/// pod lands on the share GPU as a slice; once a share pod has filled that
/// GPU (8000 + 30000 of 40960 MiB) and the 7g pod is gone, the next unified
/// 8000 MiB pod lands on the MIG GPU as a 2g.10gb.
#[tokio::test(flavor = "multi_thread")]
async fn unified_pool_pods_land_on_a_share_gpu_and_on_a_mig_gpu() -> Result<()> {
    prerequisites!();
    let mut env = Env::new().await?;
    env.node("node-1", &[(A100, false), (A100, true)]).await?;
    let ext = env.extender("a").await?;
    let sched = env.scheduler("scheduler", &ext, None)?;
    let share_gpu = gc::gpu_uuid("node-1", 0);
    let mig_gpu = gc::gpu_uuid("node-1", 1);
    let result: Result<()> = async {
        env.create(GpuPod::new("whole-mig", 1, 40_000).annotate(annotations::VGPU_MODE, "mig"))
            .await?;
        let pods = env.wait_bound(&["whole-mig"]).await?;
        let devices = single_container_devices(&pods[0])?;
        let (uuid, profile, id, placement, _) = mig_parts(&devices[0])?;
        ensure_eq!(
            (uuid.as_str(), profile.as_str(), id, placement),
            (
                mig_gpu.as_str(),
                "7g.40gb",
                0,
                Placement { start: 0, size: 8 }
            )
        );

        env.create(GpuPod::new("unified-1", 1, 8000)).await?;
        let pods = env.wait_bound(&["unified-1"]).await?;
        ensure_eq!(
            single_container_devices(&pods[0])?,
            vec![share(&share_gpu, 8000, 0)]
        );

        env.create(GpuPod::new("share-fill", 1, 30_000).annotate(annotations::VGPU_MODE, "share"))
            .await?;
        let pods = env.wait_bound(&["share-fill"]).await?;
        ensure_eq!(
            single_container_devices(&pods[0])?,
            vec![share(&share_gpu, 30_000, 0)]
        );

        let gone = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        env.pods().delete("whole-mig", &gone).await?;
        let deadline = Instant::now() + WAIT;
        while env.pods().get_opt("whole-mig").await?.is_some() {
            ensure!(Instant::now() < deadline, "whole-mig not deleted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        env.create(GpuPod::new("unified-2", 1, 8000)).await?;
        let pods = env.wait_bound(&["unified-2"]).await?;
        let devices = single_container_devices(&pods[0])?;
        ensure_eq!(devices.len(), 1);
        let (uuid, profile, id, placement, memory) = mig_parts(&devices[0])?;
        ensure_eq!(
            (uuid.as_str(), profile.as_str(), id, memory),
            (mig_gpu.as_str(), "2g.10gb", P2G10_ID, P2G10_MIB)
        );
        ensure!(
            [0, 2, 4].contains(&placement.start) && placement.size == 2,
            "{placement:?}"
        );
        env.check().await?;
        Ok(())
    }
    .await;
    env.outcome(result, || logs(&[&ext], &[&sched]))
}

/// The extender is killed (SIGKILL) while pods are being scheduled and
/// started again: it rebuilds its state from the API alone. Two nodes of two
/// A100-40GB hold 4 × 10000 MiB per GPU, 16 pods in all; of 20 pods exactly
/// 16 are bound, the other 4 stay Pending with a FailedScheduling event and
/// no allocation, and no GPU holds more than it has.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_extender_books_nothing_twice() -> Result<()> {
    prerequisites!();
    let mut env = Env::new().await?;
    for node in ["node-1", "node-2"] {
        env.node(node, &[(A100, false), (A100, false)]).await?;
    }
    let mut ext = env.extender("a").await?;
    let sched = env.scheduler("scheduler", &ext, None)?;
    let first: Vec<String> = (0..10).map(|i| format!("r1-{i}")).collect();
    let second: Vec<String> = (0..10).map(|i| format!("r2-{i}")).collect();
    let result: Result<()> = async {
        // Kill it mid-stream: the pods are created while the bound ones are
        // counted, and the kill comes once 2 are bound — and must come
        // before all 10 are, or it hit nothing in flight.
        let create_first = async {
            for name in &first {
                env.create(GpuPod::new(name, 1, 10_000)).await?;
            }
            Ok::<_, anyhow::Error>(())
        };
        let kill_mid_stream = async {
            let deadline = Instant::now() + WAIT;
            loop {
                let bound = env
                    .all_pods()
                    .await?
                    .iter()
                    .filter(|p| gc::bound_node(p).is_some())
                    .count();
                if bound >= 2 {
                    ext.kill();
                    eprintln!("killed the extender with {bound} of 10 pods bound");
                    return Ok::<_, anyhow::Error>(bound);
                }
                ensure!(Instant::now() < deadline, "not 2 pods bound in {WAIT:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let (created, killed_at) = futures::join!(create_first, kill_mid_stream);
        created?;
        let killed_at = killed_at?;
        ensure!(
            killed_at < first.len(),
            "all {killed_at} pods were bound before the kill: it hit nothing in flight"
        );
        ext.restart().await?;
        let names: Vec<&str> = first.iter().map(String::as_str).collect();
        env.wait_bound(&names).await?;
        env.check().await?;

        for name in &second {
            env.create(GpuPod::new(name, 1, 10_000)).await?;
        }
        let deadline = Instant::now() + WAIT;
        let (bound, pending) = loop {
            let pods = env.all_pods().await?;
            let events = gc::failed_scheduling(&env.client, NS).await?;
            let (bound, pending): (Vec<&Pod>, Vec<&Pod>) =
                pods.iter().partition(|p| gc::bound_node(p).is_some());
            ensure!(bound.len() <= 16, "{} pods bound, only 16 fit", bound.len());
            let reported = pending
                .iter()
                .all(|p| events.contains_key(p.metadata.name.as_deref().unwrap_or_default()));
            if bound.len() == 16 && reported {
                break (bound.len(), pending.len());
            }
            ensure!(
                Instant::now() < deadline,
                "{} bound (16 expected), pending reported: {reported}",
                bound.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        ensure_eq!((bound, pending), (16, 4));
        // Settled: nothing more is bound on a retry.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pods = env.all_pods().await?;
        for pod in &pods {
            if gc::bound_node(pod).is_none() {
                ensure_eq!(
                    gc::annotation(pod, annotations::ALLOCATION),
                    None,
                    "a pending pod holds nothing: {:?}",
                    pod.metadata.name
                );
            } else {
                let devices = single_container_devices(pod)?;
                ensure_eq!(devices.len(), 1);
                ensure!(matches!(
                    devices[0],
                    DeviceAllocation::Share {
                        memory_mib: 10_000,
                        ..
                    }
                ));
            }
        }
        let uses = env.check().await?;
        let slices: Vec<u32> = uses.values().map(|u| u.slices).collect();
        ensure_eq!(slices, vec![4, 4, 4, 4], "4 × 10000 MiB on each GPU");
        // No bind lock outlives the crash.
        for node in ["node-1", "node-2"] {
            env.wait_lease_released(node).await?;
        }
        Ok(())
    }
    .await;
    env.outcome(result, || logs(&[&ext], &[&sched]))
}

/// High availability: two extender replicas at once, each behind a stand-in
/// scheduler of its own (profiles `tessera-a` and `tessera-b`), and 1000
/// pods created concurrently, alternating between them. 40 nodes, each with
/// two share A100-40GB and one MIG A100-40GB. Two pods of three ask for a
/// share slice of 5000 MiB and 12 % cores (8 per GPU: 40000 ≤ 40960 MiB,
/// 96 ≤ 100 %, 8 ≤ 10 slices), one of three for MIG with 4000 MiB (1g.5gb,
/// 7 per GPU: placements 0..6). So 640 of the 667 share pods and 280 of the
/// 333 MIG pods fit; every other pod must stay Pending with a reason, and no
/// GPU may hold more than it has.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_and_a_thousand_pods_never_over_commit() -> Result<()> {
    prerequisites!();
    const NODES: usize = 40;
    const PODS: usize = 1000;
    const SHARE_FIT: usize = NODES * 2 * 8;
    const MIG_FIT: usize = NODES * 7;
    let started = Instant::now();
    let mut env = Env::new().await?;
    for n in 1..=NODES {
        env.node(
            &format!("node-{n:02}"),
            &[(A100, false), (A100, false), (A100, true)],
        )
        .await?;
    }
    let ext_a = env.extender("replica-a").await?;
    let ext_b = env.extender("replica-b").await?;
    let sched_a = env.scheduler("scheduler-a", &ext_a, Some("tessera-a"))?;
    let sched_b = env.scheduler("scheduler-b", &ext_b, Some("tessera-b"))?;
    let set_up = started.elapsed();

    let is_mig = |i: usize| i % 3 == 2;
    let pod_of = |i: usize| {
        let profile = if i.is_multiple_of(2) {
            "tessera-a"
        } else {
            "tessera-b"
        };
        let name = format!("ha-{i:04}");
        if is_mig(i) {
            GpuPod::new(&name, 1, 4000)
                .annotate(annotations::VGPU_MODE, "mig")
                .scheduler(profile)
        } else {
            GpuPod::new(&name, 1, 5000)
                .cores(12)
                .annotate(annotations::VGPU_MODE, "share")
                .scheduler(profile)
        }
    };
    let mig_total = (0..PODS).filter(|i| is_mig(*i)).count();
    let share_total = PODS - mig_total;
    ensure_eq!((share_total, mig_total), (667, 333));

    let result: Result<()> = async {
        let created = Instant::now();
        let env_ref = &env;
        let outcomes: Vec<Result<Pod>> = futures::stream::iter(0..PODS)
            .map(|i| async move { env_ref.create(pod_of(i)).await })
            .buffer_unordered(16)
            .collect()
            .await;
        for outcome in outcomes {
            outcome?;
        }
        let create_time = created.elapsed();

        let deadline = Instant::now() + Duration::from_secs(170);
        let (pods, settle_time) = loop {
            let pods = env.all_pods().await?;
            let events = gc::failed_scheduling(&env.client, NS).await?;
            let mut share_bound = 0;
            let mut mig_bound = 0;
            let mut unreported = 0;
            for pod in &pods {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                let mig = gc::annotation(pod, annotations::VGPU_MODE) == Some("mig");
                match (gc::bound_node(pod), mig) {
                    (Some(_), true) => mig_bound += 1,
                    (Some(_), false) => share_bound += 1,
                    (None, _) if !events.contains_key(name) => unreported += 1,
                    (None, _) => {}
                }
            }
            if share_bound > SHARE_FIT || mig_bound > MIG_FIT {
                let check = gc::check_no_overcommit(&env.inventories, &pods, SPLIT);
                bail!(
                    "over-commit: {share_bound} share pods bound (room for {SHARE_FIT}), \
                     {mig_bound} MIG pods (room for {MIG_FIT}); check: {check:?}"
                );
            }
            if share_bound == SHARE_FIT && mig_bound == MIG_FIT && unreported == 0 {
                break (pods, created.elapsed());
            }
            ensure!(
                Instant::now() < deadline,
                "after {:?}: {share_bound}/{SHARE_FIT} share and {mig_bound}/{MIG_FIT} MIG pods bound, \
                 {unreported} pending pods without a FailedScheduling event",
                created.elapsed()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        };

        let uses = gc::check_no_overcommit(&env.inventories, &pods, SPLIT)?;
        let events = gc::failed_scheduling(&env.client, NS).await?;
        let mut per_profile: BTreeMap<String, usize> = BTreeMap::new();
        for pod in &pods {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let Some(node) = gc::bound_node(pod) else {
                ensure!(
                    gc::annotation(pod, annotations::ALLOCATION).is_none(),
                    "pending {name} holds an allocation"
                );
                ensure!(
                    events[name].iter().any(|m| !m.is_empty()),
                    "pending {name} has no reason"
                );
                continue;
            };
            let devices = single_container_devices(pod)?;
            ensure!(devices.len() == 1, "{name}: {devices:?}");
            if gc::annotation(pod, annotations::VGPU_MODE) == Some("mig") {
                let (uuid, profile, id, placement, _) = mig_parts(&devices[0])?;
                ensure!(
                    (profile.as_str(), id, placement.size) == ("1g.5gb", 19, 1),
                    "{name}: 4000 MiB is a 1g.5gb (id 19, one slice), got {profile} id {id} at {placement:?}"
                );
                ensure!(uuid == gc::gpu_uuid(node, 2), "{name}: MIG on {uuid}");
            } else {
                let uuid = devices[0].uuid().to_owned();
                ensure!(
                    devices[0] == share(&uuid, 5000, 12),
                    "{name}: {:?}",
                    devices[0]
                );
            }
            *per_profile
                .entry(
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.scheduler_name.clone())
                        .unwrap_or_default(),
                )
                .or_default() += 1;
        }
        // Every GPU is full to the expected count.
        for (node, inventory) in &env.inventories {
            for gpu in &inventory.gpus {
                let used = uses.get(&gpu.uuid).cloned().unwrap_or_default();
                if gpu.mig {
                    ensure!(used.mig.len() == 7, "{node}/{}: {} MIG", gpu.uuid, used.mig.len());
                } else {
                    ensure!(
                        (used.slices, used.memory_mib, used.cores) == (8, 40_000, 96),
                        "{node}/{}: {used:?}",
                        gpu.uuid
                    );
                }
            }
        }
        ensure!(
            per_profile.len() == 2 && per_profile.values().all(|n| *n > 0),
            "both schedulers (and so both replicas) bound pods: {per_profile:?}"
        );
        // The replicas competed for the same nodes, not for disjoint ones.
        let mut profiles_per_node: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for pod in &pods {
            if let (Some(node), Some(profile)) = (
                gc::bound_node(pod),
                pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
            ) {
                profiles_per_node.entry(node).or_default().insert(profile);
            }
        }
        let shared_nodes = profiles_per_node.values().filter(|p| p.len() == 2).count();
        ensure!(shared_nodes > 0, "no node got pods of both replicas");
        for node in env.inventories.keys() {
            env.wait_lease_released(node).await?;
        }
        let confirmed = env.plugin.confirmed().len();
        eprintln!(
            "HA: set-up {set_up:?}, {PODS} pods created in {create_time:?}, all placed or \
             reported {settle_time:?} after the first was created; bound per scheduler \
             {per_profile:?}; {shared_nodes} of {NODES} nodes got pods of both replicas; \
             {confirmed} reservations confirmed by the device plugin stand-in; total {:?}",
            started.elapsed()
        );
        Ok(())
    }
    .await;
    env.outcome(result, || logs(&[&ext_a, &ext_b], &[&sched_a, &sched_b]))
}
