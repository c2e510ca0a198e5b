//! Benchmark driver of the device plugin (run by `scripts/bench-plugin.sh`,
//! which starts the stand-in API server and builds a simulated node): real
//! processes over the kubelet's gRPC sockets.
//!
//! ```text
//! bench-plugin --kubeconfig F --node-root R --plugin-bin P --baseline-bin B
//!     --sim-bin S --hook-bin H --vgpu-library L [--iterations 50]
//! ```
//!
//! The driver plays kubelet (test-support's `FakeKubelet`: Registration on
//! `<dir>/device-plugins/kubelet.sock`, an empty PodResources), starts
//! `tessera-device-plugin` and, as the baseline, the trivial
//! `example-device-plugin` (its Allocate answers a fixed CDI device: gRPC and
//! registration alone), and, per iteration, plays the extender too: a pod
//! bound to the node with its `tessera.io/allocation`, `bind-phase:
//! allocating` and the node's bind Lease naming it. It then times:
//!
//! - **Allocate**, share (a 4000 MiB / 30 % slice of the H100) and MIG (a
//!   1g.5gb instance on the A100, at each legal placement in turn), from the
//!   call to the answer, against the baseline's Allocate on the same
//!   connection kind; and beside them the NVML stand-in's own cost of what a
//!   MIG Allocate asks of it (create GI at the placement + full CI, then
//!   destroy both), measured through `tessera-driver` in this process;
//! - **reclaim**: from the pod's deletion to its transient spec being gone;
//! - **health**: from `tessera-sim lose-gpu` (and `--restore`) to the
//!   ListAndWatch list showing the GPU's devices Unhealthy (Healthy), and
//!   from `tessera-sim inject-xid` likewise, against the `tessera-sim` call's
//!   own run time.
//!
//! Prints a table (p50/p99 in ms); exits non-zero when an answer is wrong
//! (no CDI device, no spec file, a GI not at the reserved placement), never
//! because a figure is slow.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use tessera_driver::GpuDriver;
use tessera_driver::nvml::NvmlDriver;
use tessera_model::contract::kubelet::{PLUGIN_SOCKET, UNHEALTHY};
use tessera_model::contract::{annotations, cdi, cluster};
use tessera_model::mig::Placement;
use tessera_model::sched::allocation::{
    ALLOCATION_VERSION, Allocation, ContainerAllocation, DeviceAllocation,
};
use tessera_plugin::api::deviceplugin::v1beta1 as dp;
use tessera_plugin::server::unix_channel;
use tessera_test_support::kubelet::FakeKubelet;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    /// The stand-in API server's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The simulated node's root (`tessera-sim create`): one H100 for slices,
    /// one A100-40GB in MIG mode without instances.
    #[arg(long)]
    node_root: PathBuf,
    /// `tessera-device-plugin`.
    #[arg(long)]
    plugin_bin: PathBuf,
    /// The baseline plugin (`example-device-plugin`).
    #[arg(long)]
    baseline_bin: PathBuf,
    /// `tessera-sim` (lose-gpu, inject-xid).
    #[arg(long)]
    sim_bin: PathBuf,
    /// `tessera-hook`, as the specs name it.
    #[arg(long)]
    hook_bin: PathBuf,
    /// The vGPU library, as the specs mount it.
    #[arg(long)]
    vgpu_library: PathBuf,
    /// Allocations timed per kind.
    #[arg(long, default_value_t = 50)]
    iterations: usize,
    /// Health flips timed (lose + restore each).
    #[arg(long, default_value_t = 10)]
    health_flips: usize,
}

const NODE: &str = "bench-node";
const NAMESPACE: &str = "default";
const BASELINE_SOCKET: &str = "bench-baseline.sock";

/// Dials a plugin's socket.
async fn dial(socket: &Path) -> Result<Channel> {
    unix_channel(socket)
        .await
        .with_context(|| format!("dialing {}", socket.display()))
}

// ------------------------------------------------------------ the figures

#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    fn quantile(&self, q: f64) -> Option<f64> {
        let mut v: Vec<f64> = self.0.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        Some(v[i])
    }

    fn row(&self, what: &str) -> String {
        let fmt = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"));
        format!(
            "{what:<58} {:>5} {:>9} {:>9}",
            self.0.len(),
            fmt(self.quantile(0.5)),
            fmt(self.quantile(0.99))
        )
    }
}

// ------------------------------------------------------------ the extender's part

struct Cluster {
    pods: Api<Pod>,
    leases: Api<Lease>,
}

impl Cluster {
    /// A pod bound to the node with `allocation` reserved, `bind-phase:
    /// allocating`, and the node's bind Lease naming it.
    async fn reserve(&self, name: &str, allocation: &Allocation) -> Result<Pod> {
        let now = Timestamp::now();
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                annotations: Some(
                    [
                        (
                            annotations::ALLOCATION.to_owned(),
                            allocation.to_annotation(),
                        ),
                        (annotations::BIND_PHASE.to_owned(), "allocating".to_owned()),
                        (annotations::BIND_TIME.to_owned(), now.to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(NODE.to_owned()),
                containers: vec![Container {
                    name: "main".to_owned(),
                    image: Some("localhost/tessera-sim/busybox:latest".to_owned()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = self.pods.create(&PostParams::default(), &pod).await?;
        let uid = pod.metadata.uid.clone().context("pod without uid")?;
        let lease_name = format!("{}{NODE}", cluster::BIND_LEASE_PREFIX);
        let spec = LeaseSpec {
            holder_identity: Some(format!("{NAMESPACE}/{name}/{uid}")),
            lease_duration_seconds: Some(300),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        };
        match self.leases.get_opt(&lease_name).await? {
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.leases
                    .replace(&lease_name, &PostParams::default(), &lease)
                    .await?;
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(lease_name),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.leases.create(&PostParams::default(), &lease).await?;
            }
        }
        Ok(pod)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        self.pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await?;
        Ok(())
    }
}

fn allocation(device: DeviceAllocation) -> Allocation {
    Allocation {
        version: ALLOCATION_VERSION,
        node: NODE.to_owned(),
        containers: vec![ContainerAllocation {
            index: 0,
            name: "main".to_owned(),
            init: false,
            devices: vec![device],
        }],
    }
}

// ------------------------------------------------------------ the run

struct Plugins {
    children: Vec<Child>,
}

impl Drop for Plugins {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The latest device list a plugin sent, and when.
type Devices = Arc<Mutex<(Instant, Vec<dp::Device>)>>;

async fn watch_devices(channel: Channel) -> Result<Devices> {
    let mut client = dp::device_plugin_client::DevicePluginClient::new(channel);
    let mut stream = client.list_and_watch(dp::Empty {}).await?.into_inner();
    let first = stream
        .next()
        .await
        .context("ListAndWatch ended before its first list")??;
    let devices: Devices = Arc::new(Mutex::new((Instant::now(), first.devices)));
    let sink = devices.clone();
    tokio::spawn(async move {
        while let Some(Ok(list)) = stream.next().await {
            if let Ok(mut d) = sink.lock() {
                *d = (Instant::now(), list.devices);
            }
        }
    });
    Ok(devices)
}

fn gpu_health(devices: &Devices, uuid: &str) -> Option<bool> {
    let d = devices.lock().ok()?;
    let mine: Vec<&dp::Device> = d.1.iter().filter(|x| x.id.starts_with(uuid)).collect();
    (!mine.is_empty()).then(|| mine.iter().all(|x| x.health != UNHEALTHY))
}

/// Runs `tessera-sim`, returns how long it took; then waits until the GPU's
/// devices are `healthy`, returns how long that took from the start.
async fn flip(
    sim: &Path,
    args: &[&str],
    devices: &Devices,
    uuid: &str,
    healthy: bool,
) -> Result<(Duration, Duration)> {
    let start = Instant::now();
    let status = Command::new(sim)
        .args(args)
        .stdout(Stdio::null())
        .status()?;
    let ran = start.elapsed();
    ensure!(status.success(), "tessera-sim {args:?} failed: {status}");
    let deadline = start + Duration::from_secs(10);
    while gpu_health(devices, uuid) != Some(healthy) {
        ensure!(
            Instant::now() < deadline,
            "{uuid} not {} 10 s after tessera-sim {args:?}",
            if healthy { "Healthy" } else { "Unhealthy" }
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let seen = devices
        .lock()
        .map(|d| d.0)
        .unwrap_or_else(|_| Instant::now());
    Ok((ran, seen.saturating_duration_since(start)))
}

async fn allocate(
    client: &mut dp::device_plugin_client::DevicePluginClient<Channel>,
    ids: Vec<String>,
) -> Result<(Duration, dp::AllocateResponse)> {
    let start = Instant::now();
    let answer = client
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }],
        })
        .await?
        .into_inner();
    Ok((start.elapsed(), answer))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let kubelet_dir = tempfile::Builder::new().prefix("bp").tempdir_in("/tmp")?;
    let kubelet = FakeKubelet::start(kubelet_dir.path())?;
    let plugins_dir = kubelet.plugins_dir();
    let state = tempfile::tempdir()?;
    let cdi_dir = state.path().join("cdi");

    let client = tessera_test_support::kube::client(&args.kubeconfig).await?;
    tessera_test_support::kube::ensure_node(&client, NODE).await?;
    let cluster = Cluster {
        pods: Api::namespaced(client.clone(), NAMESPACE),
        leases: Api::namespaced(client.clone(), cluster::DEFAULT_NAMESPACE),
    };

    let driver = NvmlDriver::load(&tessera_driver::devices::find_nvml_library(
        &args.node_root,
    )?)?;
    let gpus = driver.gpus()?;
    let share = gpus
        .iter()
        .find(|g| !g.mig_enabled())
        .context("the node has no GPU without MIG")?
        .clone();
    let mig = gpus
        .iter()
        .find(|g| g.mig_enabled())
        .context("the node has no GPU in MIG mode")?
        .clone();
    let profile = driver
        .gpu_instance_profiles(mig.index)?
        .into_iter()
        .filter(|p| p.instance_count > 0)
        .min_by_key(|p| p.memory_mib)
        .context("no GPU-instance profile on the MIG GPU")?;
    let placements = driver.possible_placements(mig.index, profile.id)?;
    ensure!(
        !placements.is_empty(),
        "no placement of profile {}",
        profile.id
    );

    let plugin_log = std::fs::File::create(state.path().join("plugin.log"))?;
    let mut plugins = Plugins {
        children: Vec::new(),
    };
    plugins.children.push(
        Command::new(&args.plugin_bin)
            .args(["--node-name", NODE, "--kubeconfig"])
            .arg(&args.kubeconfig)
            .arg("--driver-root")
            .arg(&args.node_root)
            .arg("--kubelet-dir")
            .arg(kubelet_dir.path())
            .arg("--cdi-dir")
            .arg(&cdi_dir)
            .arg("--state-dir")
            .arg(state.path().join("tessera"))
            .arg("--hook-path")
            .arg(&args.hook_bin)
            .arg("--vgpu-library")
            .arg(&args.vgpu_library)
            .args(["--metrics-listen", "off", "--log-format", "text"])
            .env("TESSERA_LOG", "warn")
            .stderr(plugin_log)
            .spawn()
            .context("starting tessera-device-plugin")?,
    );
    plugins.children.push(
        Command::new(&args.baseline_bin)
            .arg("--kubelet-dir")
            .arg(kubelet_dir.path())
            .args(["--socket-name", BASELINE_SOCKET, "--devices", "16"])
            .stderr(Stdio::null())
            .spawn()
            .context("starting the baseline plugin")?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if kubelet.registered(PLUGIN_SOCKET).is_some()
            && kubelet.registered(BASELINE_SOCKET).is_some()
        {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(state.path().join("plugin.log")).unwrap_or_default();
            bail!("the plugins did not register in 60 s; the plugin's log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let plugin_channel = dial(&plugins_dir.join(PLUGIN_SOCKET)).await?;
    let baseline_channel = dial(&plugins_dir.join(BASELINE_SOCKET)).await?;
    let devices = watch_devices(plugin_channel.clone()).await?;
    let mut plugin = dp::device_plugin_client::DevicePluginClient::new(plugin_channel);
    let mut baseline = dp::device_plugin_client::DevicePluginClient::new(baseline_channel);
    let id_on = |uuid: &str| -> Result<String> {
        let d = devices.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        d.1.iter()
            .find(|x| x.id.starts_with(uuid))
            .map(|x| x.id.clone())
            .with_context(|| format!("no device of {uuid} in ListAndWatch"))
    };

    let (mut share_alloc, mut mig_alloc, mut base_alloc) =
        (Samples::default(), Samples::default(), Samples::default());
    let (mut nvml_mig, mut reclaim_share, mut reclaim_mig) =
        (Samples::default(), Samples::default(), Samples::default());

    for i in 0..args.iterations {
        // The baseline: the same gRPC call, a fixed answer.
        let (took, _) = allocate(&mut baseline, vec!["dev-0".to_owned()]).await?;
        base_alloc.push(took);

        // The NVML stand-in's own part of a MIG Allocate.
        let placement = placements[i % placements.len()];
        let start = Instant::now();
        let gi = driver.create_gpu_instance(mig.index, profile.id, placement)?;
        let ci = driver.create_compute_instance(mig.index, gi.id)?;
        driver.destroy_compute_instance(mig.index, gi.id, ci.id)?;
        driver.destroy_gpu_instance(mig.index, gi.id)?;
        nvml_mig.push(start.elapsed());

        for (kind, device) in [
            (
                "share",
                DeviceAllocation::Share {
                    uuid: share.uuid.clone(),
                    memory_mib: 4000,
                    cores: 30,
                },
            ),
            (
                "mig",
                DeviceAllocation::Mig {
                    uuid: mig.uuid.clone(),
                    profile: profile.name.clone(),
                    profile_id: profile.id,
                    placement,
                    memory_mib: profile.memory_mib,
                    realized: None,
                },
            ),
        ] {
            let name = format!("{kind}-{i}");
            let pod = cluster.reserve(&name, &allocation(device)).await?;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let alloc_id = format!("{uid}-0");
            let gpu = if kind == "share" {
                &share.uuid
            } else {
                &mig.uuid
            };
            let (took, answer) = allocate(&mut plugin, vec![id_on(gpu)?]).await?;
            let response = answer
                .container_responses
                .first()
                .context("Allocate answered no container")?;
            ensure!(
                response
                    .cdi_devices
                    .iter()
                    .any(|d| d.name == format!("{}={alloc_id}", cdi::ALLOC_KIND)),
                "{name}: Allocate answered no CDI device for {alloc_id}: {response:?}"
            );
            let spec = cdi_dir.join(cdi::transient_spec_file(&alloc_id));
            ensure!(spec.is_file(), "{name}: no spec at {}", spec.display());
            if kind == "mig" {
                let held: Vec<Placement> = driver
                    .gpu_instances(mig.index)?
                    .into_iter()
                    .map(|g| g.placement)
                    .collect();
                ensure!(
                    held == vec![placement],
                    "{name}: GIs at {held:?}, reserved {placement:?}"
                );
                mig_alloc.push(took);
            } else {
                share_alloc.push(took);
            }

            let start = Instant::now();
            cluster.delete(&name).await?;
            let deadline = start + Duration::from_secs(30);
            while spec.exists() {
                ensure!(
                    Instant::now() < deadline,
                    "{name}: spec still there 30 s after the pod's deletion"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let took = start.elapsed();
            if kind == "mig" {
                // Reclaim is done when the instance is gone too.
                while !driver.gpu_instances(mig.index)?.is_empty() {
                    ensure!(
                        Instant::now() < deadline,
                        "{name}: GI still there 30 s after the pod's deletion"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                reclaim_mig.push(start.elapsed());
            } else {
                reclaim_share.push(took);
            }
        }
    }

    let root = args.node_root.display().to_string();
    let gpu = share.index.to_string();
    let (mut lose_run, mut lose_seen, mut restore_run, mut restore_seen) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    for _ in 0..args.health_flips {
        let (ran, seen) = flip(
            &args.sim_bin,
            &["lose-gpu", "--root", &root, "--gpu", &gpu],
            &devices,
            &share.uuid,
            false,
        )
        .await?;
        lose_run.push(ran);
        lose_seen.push(seen);
        let (ran, seen) = flip(
            &args.sim_bin,
            &["lose-gpu", "--root", &root, "--gpu", &gpu, "--restore"],
            &devices,
            &share.uuid,
            true,
        )
        .await?;
        restore_run.push(ran);
        restore_seen.push(seen);
    }
    // Last: an XID leaves the GPU unhealthy for good.
    let (mut xid_run, mut xid_seen) = (Samples::default(), Samples::default());
    let (ran, seen) = flip(
        &args.sim_bin,
        &["inject-xid", "--root", &root, "--gpu", &gpu, "--xid", "79"],
        &devices,
        &share.uuid,
        false,
    )
    .await?;
    xid_run.push(ran);
    xid_seen.push(seen);

    println!("{:<58} {:>5} {:>9} {:>9}", "what (ms)", "n", "p50", "p99");
    for (samples, what) in [
        (&base_alloc, "Allocate, baseline plugin (fixed answer)"),
        (
            &share_alloc,
            "Allocate, share slice (tessera-device-plugin)",
        ),
        (
            &mig_alloc,
            "Allocate, MIG 1g instance (tessera-device-plugin)",
        ),
        (
            &nvml_mig,
            "NVML stand-in alone: GI+CI create + destroy (same calls)",
        ),
        (&reclaim_share, "reclaim, share: pod deleted -> spec gone"),
        (
            &reclaim_mig,
            "reclaim, MIG: pod deleted -> spec and GI gone",
        ),
        (&lose_run, "tessera-sim lose-gpu (the call itself)"),
        (&lose_seen, "GPU lost -> ListAndWatch Unhealthy"),
        (
            &restore_run,
            "tessera-sim lose-gpu --restore (the call itself)",
        ),
        (&restore_seen, "GPU back -> ListAndWatch Healthy"),
        (&xid_run, "tessera-sim inject-xid 79 (the call itself)"),
        (&xid_seen, "XID 79 -> ListAndWatch Unhealthy"),
    ] {
        println!("{}", samples.row(what));
    }
    drop(plugins);
    Ok(())
}
