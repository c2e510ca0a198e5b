//! `tessera-device-plugin` end to end on the simulated cluster (issue 12's
//! "Done when"): `tessera-sim cluster up` with containerd 1.7 (CRI, CDI on
//! or off), the shipped scheduler configuration pointed at the real
//! `tessera-scheduler-extender`, and one real plugin per node
//! (`tessera_e2e::plugin_cluster`). The node is the `dynamic` profile: an
//! H100-80GB shared as vGPU slices (index 0) and an A100-40GB in MIG mode
//! with no instances (index 1), so every MIG instance is made on demand.
//!
//! Workloads see the simulated GPU as a real node's containers see the
//! kernel driver: the kubelet stand-in bind-mounts the node root into every
//! container and names it in `TESSERA_SIM_ROOT` (simulation only); the
//! container gets `libcuda.so.1`, the vGPU library and its limits from the
//! plugin's transient CDI spec (or its native answer).
//!
//! Each phase checks what it sees from its own source: the container's own
//! view (its log: `/dev/nvidia-caps`, `tessera-cuda-probe`), the simulated
//! NVML state under the node root, the pod's `tessera.io/allocation`,
//! `kubectl tessera inspect`, the extender's and the plugin's `/metrics`,
//! the node's CDI directory. Phases of one cluster run in order and every
//! failure is reported (a failed phase does not hide the next ones).
//! Each phase prints its duration.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_e2e::gpu_cluster as gc;
use tessera_e2e::plugin_cluster::{
    self as pc, BUSYBOX_IMAGE, CUDA_PROBE, CUDA_PROBE_IMAGE, Options, PluginCluster,
};
use tessera_model::contract::{annotations, cluster, resources};
use tessera_model::sched::allocation::{Allocation, DeviceAllocation};
use tessera_test_support::require;

const NS: &str = "default";
const NODE: &str = "node-1";
/// Scheduling, Allocate, container start.
const START: Duration = Duration::from_secs(60);
/// Reclaim after a pod is deleted: "within seconds".
const RECLAIM: Duration = Duration::from_secs(20);
/// Index of the MIG GPU in the `dynamic` profile.
const MIG_GPU: u64 = 1;
/// Index of the share GPU.
const SHARE_GPU: u64 = 0;

/// One cluster at a time: they are heavy (containerd per node, images).
static CLUSTERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A phase's outcome, with its duration.
struct Phases {
    results: Vec<(String, Duration, Result<()>)>,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            results: Vec::new(),
        }
    }

    async fn run<F>(&mut self, name: &str, phase: F)
    where
        F: std::future::Future<Output = Result<()>>,
    {
        let started = Instant::now();
        let result = phase.await;
        let took = started.elapsed();
        match &result {
            Ok(()) => eprintln!("PHASE {name}: ok in {took:.1?}"),
            Err(e) => eprintln!("PHASE {name}: FAILED in {took:.1?}: {e:#}"),
        }
        self.results.push((name.to_owned(), took, result));
    }

    /// Ok when every phase passed; else every failure, with the logs.
    fn finish(self, cluster: &mut PluginCluster) -> Result<()> {
        let failures: Vec<String> = self
            .results
            .iter()
            .filter_map(|(name, took, r)| {
                r.as_ref()
                    .err()
                    .map(|e| format!("{name} ({took:.1?}): {e:#}"))
            })
            .collect();
        let summary: Vec<String> = self
            .results
            .iter()
            .map(|(name, took, r)| {
                format!(
                    "{name}: {} {took:.1?}",
                    if r.is_ok() { "ok" } else { "FAILED" }
                )
            })
            .collect();
        eprintln!("phases: {}", summary.join("; "));
        if failures.is_empty() {
            return Ok(());
        }
        cluster.keep();
        bail!(
            "{} phase(s) failed:\n{}\n{}",
            failures.len(),
            failures.join("\n"),
            cluster.logs()
        )
    }
}

fn mig_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([(annotations::VGPU_MODE.to_owned(), "mig".to_owned())])
}

fn share_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([(annotations::VGPU_MODE.to_owned(), "hami-core".to_owned())])
}

/// Lists the container's `/dev/nvidia-caps` (one `CAPS <ls -ln line>`
/// each), then sleeps.
const LIST_CAPS: &str =
    "ls -ln /dev/nvidia-caps | sed -n 's/^c/CAPS c/p'; echo CAPS-END; exec sleep 3600";

/// HAMi's dynamic-MIG example as one pod of two containers (the node has
/// one MIG GPU): each `nvidia.com/gpu: 1`, `nvidia.com/gpumem: 8000`,
/// annotation `nvidia.com/vgpu-mode: mig`; each lists its caps.
fn mig_pod(name: &str) -> Value {
    let limits: &[(&str, &str)] = &[(resources::GPU, "1"), (resources::GPU_MEMORY, "8000")];
    pc::pod_json(
        NS,
        name,
        &mig_annotations(),
        &[
            ("first", BUSYBOX_IMAGE, LIST_CAPS, limits),
            ("second", BUSYBOX_IMAGE, LIST_CAPS, limits),
        ],
    )
}

/// The probe run of a vGPU pod: `info`, an allocation that fits (3 GiB)
/// and one beyond the slice (5 GiB), each section ended by a marker line.
fn probe_script() -> String {
    format!(
        "{CUDA_PROBE} info 2>&1; echo INFO-END; \
         {CUDA_PROBE} alloc --api mem_alloc --mib 3072 2>&1; echo FITS-END; \
         {CUDA_PROBE} alloc --api mem_alloc --mib 5120 2>&1; echo BEYOND-END; \
         exec sleep 3600"
    )
}

/// A vGPU pod: `gpu: 1, gpumem: 4096, gpucores: 30`, running the probe.
fn vgpu_pod(name: &str) -> Value {
    let limits: &[(&str, &str)] = &[
        (resources::GPU, "1"),
        (resources::GPU_MEMORY, "4096"),
        (resources::GPU_CORES, "30"),
    ];
    pc::pod_json(
        NS,
        name,
        &share_annotations(),
        &[("main", CUDA_PROBE_IMAGE, &probe_script(), limits)],
    )
}

fn allocation(pod: &Pod) -> Result<Allocation> {
    gc::allocation_of(pod)?.with_context(|| {
        format!(
            "pod {} has no {}",
            pod.metadata.name.as_deref().unwrap_or("?"),
            annotations::ALLOCATION
        )
    })
}

/// The section of a probe log between `start` (exclusive; `None`: the
/// beginning) and `end` (the marker line), as key=value pairs.
fn section(log: &str, start: Option<&str>, end: &str) -> BTreeMap<String, String> {
    let mut lines = log.lines();
    if let Some(start) = start {
        for l in lines.by_ref() {
            if l.starts_with(start) {
                break;
            }
        }
    }
    lines
        .take_while(|l| !l.starts_with(end))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// Checks a vGPU pod's probe output: 4096 MiB total, 3 GiB fits, 5 GiB is
/// out of memory.
fn check_probe_log(name: &str, log: &str) -> Result<()> {
    let info = section(log, None, "INFO-END");
    ensure!(
        info.get("device.0.total_mib").map(String::as_str) == Some("4096"),
        "{name}: cuDeviceTotalMem inside the slice is not 4096 MiB: {info:?}\nlog:\n{log}"
    );
    ensure!(
        info.get("device.0.mem_total_bytes").map(String::as_str) == Some("4294967296"),
        "{name}: cuMemGetInfo total is not 4096 MiB: {info:?}"
    );
    let fits = section(log, Some("INFO-END"), "FITS-END");
    ensure!(
        fits.get("result").map(String::as_str) == Some("CUDA_SUCCESS"),
        "{name}: 3072 MiB in a 4096 MiB slice failed: {fits:?}\nlog:\n{log}"
    );
    let beyond = section(log, Some("FITS-END"), "BEYOND-END");
    ensure!(
        beyond.get("result").map(String::as_str) == Some("CUDA_ERROR_OUT_OF_MEMORY"),
        "{name}: 5120 MiB in a 4096 MiB slice was not out of memory: {beyond:?}\nlog:\n{log}"
    );
    Ok(())
}

/// `(name, major, minor)` of each `CAPS <ls -ln line>` of a log.
fn caps_of(log: &str) -> Result<BTreeSet<(String, u32, u32)>> {
    let mut caps = BTreeSet::new();
    for line in log.lines().filter_map(|l| l.strip_prefix("CAPS ")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = fields
            .iter()
            .position(|f| f.ends_with(',') && f.trim_end_matches(',').parse::<u32>().is_ok())
            .with_context(|| format!("no `major,` in {line:?}"))?;
        let major: u32 = fields[at].trim_end_matches(',').parse()?;
        let minor: u32 = fields
            .get(at + 1)
            .with_context(|| format!("no minor in {line:?}"))?
            .parse()?;
        let name = fields.last().copied().unwrap_or_default().to_owned();
        caps.insert((name, major, minor));
    }
    Ok(caps)
}

/// The node's cap-device major (`proc/devices`) and the minors of
/// `proc/driver/nvidia-caps/mig-minors`, by entry (`gpu1/gi3/access`).
fn cap_table(cluster: &PluginCluster, node: &str) -> Result<(u32, BTreeMap<String, u32>)> {
    let dir = cluster.node_dir(node);
    let devices = std::fs::read_to_string(dir.join("proc/devices"))?;
    let major = devices
        .lines()
        .find_map(|l| {
            let (n, name) = l.trim().split_once(' ')?;
            (name.trim() == "nvidia-caps").then(|| n.parse().ok())?
        })
        .context("no nvidia-caps in the node's proc/devices")?;
    let minors = std::fs::read_to_string(dir.join("proc/driver/nvidia-caps/mig-minors"))?
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect();
    Ok((major, minors))
}

/// The GPU's `minor` in the simulated state.
fn gpu_minor(cluster: &PluginCluster, node: &str, index: u64) -> Result<u64> {
    let state = cluster.sim_state(node)?;
    state["gpus"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["index"] == index))
        .and_then(|g| g["minor"].as_u64())
        .with_context(|| format!("no minor of GPU {index}"))
}

fn gpu_uuid(cluster: &PluginCluster, node: &str, index: u64) -> Result<String> {
    let state = cluster.sim_state(node)?;
    state["gpus"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["index"] == index))
        .and_then(|g| g["uuid"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("no uuid of GPU {index}"))
}

/// The MIG device of each container of the allocation:
/// `(container, profile, profile id, placement start, size, mig uuid, gi, ci)`.
type Realized = (String, String, u32, u32, u32, String, u32, u32);

fn realized_mig(allocation: &Allocation) -> Result<Vec<Realized>> {
    let mut out = Vec::new();
    for (container, device) in allocation.devices() {
        match device {
            DeviceAllocation::Mig {
                profile,
                profile_id,
                placement,
                realized,
                ..
            } => {
                let r = realized.as_ref().with_context(|| {
                    format!(
                        "{}: no realized MIG identity written back: {device:?}",
                        container.name
                    )
                })?;
                out.push((
                    container.name.clone(),
                    profile.clone(),
                    *profile_id,
                    placement.start,
                    placement.size,
                    r.mig_uuid.clone(),
                    r.gpu_instance_id,
                    r.compute_instance_id,
                ));
            }
            other => bail!("{}: a MIG device expected, got {other:?}", container.name),
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Phases.

/// (a) HAMi's dynamic-MIG example runs; each container's `/dev/nvidia-caps`
/// holds exactly its instance's GI and CI cap nodes; the simulated NVML
/// holds the GI at the reserved placement with the realized ids;
/// `kubectl tessera inspect` and both metrics endpoints agree.
async fn dynamic_mig_runs(cluster: &PluginCluster) -> Result<()> {
    let name = "mig-example";
    cluster.create_pod(NS, mig_pod(name)).await?;
    let pod = cluster.wait_running(NS, name, START).await?;
    ensure!(
        gc::annotation(&pod, annotations::BIND_PHASE) == Some("success"),
        "bind-phase {:?}",
        gc::annotation(&pod, annotations::BIND_PHASE)
    );
    let alloc = allocation(&pod)?;
    let realized = realized_mig(&alloc)?;
    ensure!(realized.len() == 2, "two MIG devices: {realized:?}");
    let mig_uuid = gpu_uuid(cluster, NODE, MIG_GPU)?;
    for (_, device) in alloc.devices() {
        ensure!(device.uuid() == mig_uuid, "on the A100: {device:?}");
    }

    // NVML's view: exactly these two GIs, at the reserved placements.
    let gis = cluster.gpu_instances(NODE, MIG_GPU)?;
    ensure!(gis.len() == 2, "two GIs on the A100: {gis:?}");
    for (container, profile, profile_id, start, size, uuid, gi, ci) in &realized {
        let found = gis
            .iter()
            .find(|g| g.id == u64::from(*gi))
            .with_context(|| format!("{container}: GI {gi} not in NVML: {gis:?}"))?;
        ensure!(
            (found.profile_id, found.start, found.size)
                == (u64::from(*profile_id), u64::from(*start), u64::from(*size)),
            "{container}: {profile} reserved at {start}+{size} (id {profile_id}), NVML has {found:?}"
        );
        ensure!(
            found.compute_instances == vec![(u64::from(*ci), uuid.clone())],
            "{container}: one CI {ci} ({uuid}) expected, NVML has {:?}",
            found.compute_instances
        );
    }

    // The container's own view: exactly its GI's and CI's cap nodes.
    let (major, minors) = cap_table(cluster, NODE)?;
    let gpu_minor = gpu_minor(cluster, NODE, MIG_GPU)?;
    for (container, _, _, _, _, _, gi, ci) in &realized {
        let log = cluster
            .wait_log(NODE, &pod, container, "CAPS-END", START)
            .await?;
        let want: BTreeSet<(String, u32, u32)> = [
            format!("gpu{gpu_minor}/gi{gi}/access"),
            format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"),
        ]
        .iter()
        .map(|key| {
            let minor = *minors
                .get(key)
                .with_context(|| format!("{key} not in mig-minors"))?;
            Ok((format!("nvidia-cap{minor}"), major, minor))
        })
        .collect::<Result<_>>()?;
        let got = caps_of(&log)?;
        ensure!(
            got == want,
            "{container}: /dev/nvidia-caps holds {got:?}, its instance's cap nodes are {want:?}\nlog:\n{log}"
        );
    }

    // kubectl tessera inspect.
    let report = cluster.inspect()?;
    let gpu = report["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == NODE))
        .and_then(|n| n["gpus"].as_array())
        .and_then(|g| g.iter().find(|g| g["index"] == MIG_GPU))
        .cloned()
        .with_context(|| format!("inspect: no GPU {MIG_GPU} of {NODE}: {report}"))?;
    let held: BTreeSet<(String, String, u64, u64)> = gpu["pods"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|d| d["name"] == name)
                .map(|d| {
                    (
                        d["container"].as_str().unwrap_or_default().to_owned(),
                        d["profile"].as_str().unwrap_or_default().to_owned(),
                        d["placement"]["start"].as_u64().unwrap_or(u64::MAX),
                        d["placement"]["size"].as_u64().unwrap_or(u64::MAX),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let want: BTreeSet<(String, String, u64, u64)> = realized
        .iter()
        .map(|(c, p, _, start, size, ..)| {
            (c.clone(), p.clone(), u64::from(*start), u64::from(*size))
        })
        .collect();
    ensure!(
        held == want,
        "inspect shows {held:?}, the allocation {want:?}: {gpu}"
    );

    // The extender's metrics: one realized instance each, same ids.
    let text = cluster.extender_metrics()?;
    let lines = pc::metric_lines(&text, "hami_node_gpu_mig_instance_info");
    for (container, profile, _, start, _, uuid, gi, ci) in &realized {
        let line = lines
            .iter()
            .find(|l| pc::label(l, "mig_uuid") == Some(uuid.as_str()))
            .with_context(|| format!("extender: no instance {uuid} ({container}): {lines:?}"))?;
        ensure!(
            pc::label(line, "gpu_instance_id") == Some(gi.to_string().as_str())
                && pc::label(line, "compute_instance_id") == Some(ci.to_string().as_str())
                && pc::label(line, "profile") == Some(profile.as_str())
                && pc::label(line, "placement_start") == Some(start.to_string().as_str())
                && pc::label(line, "device_uuid") == Some(mig_uuid.as_str()),
            "extender: {line} disagrees with {container}'s realized {profile} GI {gi} CI {ci} at {start}"
        );
    }
    // The plugin's: hami_mig_device_info per container.
    let text = cluster.plugins.get(NODE).context("no plugin")?.metrics()?;
    let lines = pc::metric_lines(&text, "hami_mig_device_info");
    for (container, profile, _, _, _, uuid, gi, ci) in &realized {
        let line = lines
            .iter()
            .find(|l| {
                pc::label(l, "pod") == Some(name)
                    && pc::label(l, "container") == Some(container.as_str())
            })
            .with_context(|| {
                format!("plugin: no hami_mig_device_info for {container}: {lines:?}")
            })?;
        ensure!(
            pc::label(line, "mig_uuid") == Some(uuid.as_str())
                && pc::label(line, "gpu_instance_id") == Some(gi.to_string().as_str())
                && pc::label(line, "compute_instance_id") == Some(ci.to_string().as_str())
                && pc::label(line, "profile") == Some(profile.as_str())
                && pc::label(line, "device_uuid") == Some(mig_uuid.as_str())
                && pc::label(line, "namespace") == Some(NS),
            "plugin: {line} disagrees with {container}'s realized {profile} GI {gi} CI {ci}"
        );
    }
    let specs = cluster.transient_specs(NODE)?;
    ensure!(
        specs.len() == 2,
        "one transient spec per container: {specs:?}"
    );
    Ok(())
}

/// (a, end) Deleting the MIG pod destroys its CIs, GIs and specs within
/// seconds.
async fn deleting_the_mig_pod_reclaims(cluster: &PluginCluster) -> Result<()> {
    let name = "mig-example";
    let pod = cluster.pods(NS).get(name).await?;
    // Its containers' alloc ids are `<pod uid>-<index>`.
    let uid = pod.metadata.uid.clone().context("no uid")?;
    let specs_of_pod = |specs: Vec<String>| -> Vec<String> {
        specs.into_iter().filter(|s| s.contains(&uid)).collect()
    };
    let before = specs_of_pod(cluster.transient_specs(NODE)?);
    ensure!(before.len() == 2, "the pod's two specs before: {before:?}");
    let started = Instant::now();
    cluster.delete_pod(NS, name, START).await?;
    loop {
        let gis = cluster.gpu_instances(NODE, MIG_GPU)?;
        let left = specs_of_pod(cluster.transient_specs(NODE)?);
        if gis.is_empty() && left.is_empty() {
            eprintln!("MIG reclaim after delete: {:.1?}", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > RECLAIM {
            bail!("{RECLAIM:?} after delete: GIs {gis:?}, specs {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (b) A vGPU pod (`gpu: 1, gpumem: 4096, gpucores: 30`) runs the probe:
/// 4096 MiB total, out of memory beyond; three such pods binpacked on the
/// one share GPU, all Running.
async fn vgpu_pods_binpack(cluster: &PluginCluster, names: &[&str]) -> Result<()> {
    for name in names {
        cluster.create_pod(NS, vgpu_pod(name)).await?;
    }
    let share_uuid = gpu_uuid(cluster, NODE, SHARE_GPU)?;
    let mut total_cores = 0;
    for name in names {
        let pod = cluster.wait_running(NS, name, START).await?;
        let alloc = allocation(&pod)?;
        let devices: Vec<&DeviceAllocation> = alloc.devices().map(|(_, d)| d).collect();
        match devices.as_slice() {
            [
                DeviceAllocation::Share {
                    uuid,
                    memory_mib,
                    cores,
                },
            ] => {
                ensure!(
                    *uuid == share_uuid && *memory_mib == 4096 && *cores == 30,
                    "{name}: {devices:?}, want 4096 MiB / 30 % of {share_uuid}"
                );
                total_cores += cores;
            }
            other => bail!("{name}: one share slice expected: {other:?}"),
        }
        let log = cluster
            .wait_log(NODE, &pod, "main", "BEYOND-END", START)
            .await?;
        check_probe_log(name, &log)?;
    }
    ensure!(total_cores == 30 * names.len() as u32);
    for name in names {
        let pod = cluster.pods(NS).get(name).await?;
        ensure!(
            pc::phase(&pod) == "Running",
            "{name} is {}",
            pc::phase(&pod)
        );
    }
    Ok(())
}

/// Container ids and restart counts of a pod's containers.
fn container_ids(pod: &Pod) -> BTreeMap<String, (String, i32)> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            (
                c.name,
                (c.container_id.unwrap_or_default(), c.restart_count),
            )
        })
        .collect()
}

/// (d) A plugin killed (SIGKILL) and restarted with pods running: they keep
/// running (same containers, no restart), their instances and specs stay;
/// then a kubelet restart: the plugin registers again (its socket back in
/// the wiped directory, a new pod gets a device and runs).
async fn restarts_keep_pods(cluster: &mut PluginCluster, running: &[&str]) -> Result<()> {
    let mut before = BTreeMap::new();
    for name in running {
        let pod = cluster.pods(NS).get(name).await?;
        ensure!(pc::phase(&pod) == "Running", "{name} not Running before");
        before.insert(name.to_string(), container_ids(&pod));
    }
    let gis_before = cluster.gpu_instances(NODE, MIG_GPU)?;
    let specs_before = cluster.transient_specs(NODE)?;

    let started = Instant::now();
    cluster.plugin(NODE).kill();
    cluster.plugin(NODE).restart()?;
    cluster.wait_registered(NODE, START).await?;
    // Give the startup sweep time to act (wrongly) before looking.
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!(
        "plugin restart to registered + 5 s: {:.1?}",
        started.elapsed()
    );
    ensure!(
        cluster.plugin(NODE).is_running(),
        "the plugin exited after restart"
    );
    for name in running {
        let pod = cluster.pods(NS).get(name).await?;
        ensure!(
            pc::phase(&pod) == "Running" && container_ids(&pod) == before[*name],
            "{name} after a plugin restart: {} {:?} (before {:?})",
            pc::phase(&pod),
            container_ids(&pod),
            before[*name]
        );
    }
    let gis = cluster.gpu_instances(NODE, MIG_GPU)?;
    ensure!(
        gis == gis_before,
        "GIs changed over a plugin restart: {gis_before:?} → {gis:?}"
    );
    let specs = cluster.transient_specs(NODE)?;
    ensure!(
        specs == specs_before,
        "specs changed over a plugin restart: {specs_before:?} → {specs:?}"
    );

    // The kubelet restarts: the device-plugins directory is wiped.
    let socket = cluster
        .node_dir(NODE)
        .join("var/lib/kubelet/device-plugins")
        .join(tessera_model::contract::kubelet::PLUGIN_SOCKET);
    let started = Instant::now();
    cluster.restart_kubelet(NODE).await?;
    let deadline = Instant::now() + START;
    loop {
        // The new kubelet wiped the directory at its start; the plugin's
        // socket there again is the plugin registering anew.
        let kubelet_sock = socket.with_file_name("kubelet.sock");
        let fresh = std::fs::metadata(&kubelet_sock)
            .and_then(|k| Ok((k.modified()?, std::fs::metadata(&socket)?.modified()?)))
            .is_ok_and(|(k, p)| p >= k);
        if fresh {
            break;
        }
        if Instant::now() > deadline {
            bail!("the plugin did not register again in {START:?} after the kubelet restart");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.wait_registered(NODE, START).await?;
    eprintln!(
        "kubelet restart to re-registered: {:.1?}",
        started.elapsed()
    );
    let probe = "after-kubelet-restart";
    let limits: &[(&str, &str)] = &[(resources::GPU, "1"), (resources::GPU_MEMORY, "1024")];
    cluster
        .create_pod(
            NS,
            pc::pod_json(
                NS,
                probe,
                &share_annotations(),
                &[("main", BUSYBOX_IMAGE, "exec sleep 3600", limits)],
            ),
        )
        .await?;
    cluster.wait_running(NS, probe, START).await?;
    for name in running {
        let pod = cluster.pods(NS).get(name).await?;
        ensure!(
            pc::phase(&pod) == "Running" && container_ids(&pod) == before[*name],
            "{name} after a kubelet restart: {} {:?}",
            pc::phase(&pod),
            container_ids(&pod)
        );
    }
    cluster.delete_pod(NS, probe, START).await?;
    Ok(())
}

/// Writes `allocation` (raw text) and `bind-phase: allocating` on an
/// unscheduled pod, takes the node's bind Lease for it as the extender
/// would, and binds it to `NODE` with a Binding: what the extender's bind
/// does, with input the extender would never write.
async fn hand_bind(cluster: &PluginCluster, name: &str, allocation: &str) -> Result<Pod> {
    let limits: &[(&str, &str)] = &[(resources::GPU, "1"), (resources::GPU_MEMORY, "4000")];
    let mut pod = pc::pod_json(
        NS,
        name,
        &BTreeMap::new(),
        &[("main", BUSYBOX_IMAGE, "exec sleep 3600", limits)],
    );
    // No scheduler serves this name: the pod stays unscheduled.
    pod["spec"]["schedulerName"] = json!("hand-bound");
    let pod = cluster.create_pod(NS, pod).await?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let patch = json!({"metadata": {"annotations": {
        annotations::ALLOCATION: allocation,
        annotations::BIND_PHASE: "allocating",
    }}});
    cluster
        .pods(NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), cluster::DEFAULT_NAMESPACE);
    let lease_name = format!("{}{NODE}", cluster::BIND_LEASE_PREFIX);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let spec = json!({
        "holderIdentity": format!("{NS}/{name}/{uid}"),
        "leaseDurationSeconds": cluster::BIND_LEASE_SECONDS,
        "acquireTime": now,
        "renewTime": now,
    });
    match leases.get_opt(&lease_name).await? {
        Some(mut lease) => {
            if let Some(h) = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                && !h.is_empty()
            {
                bail!("{lease_name} is held by {h}: another pod is binding");
            }
            lease.spec = Some(serde_json::from_value(spec)?);
            leases
                .replace(&lease_name, &PostParams::default(), &lease)
                .await?;
        }
        None => {
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease_name, "namespace": cluster::DEFAULT_NAMESPACE},
                "spec": spec,
            }))?;
            leases.create(&PostParams::default(), &lease).await?;
        }
    }
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": NS},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    });
    let _: Value = cluster
        .pods(NS)
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await
        .context("binding the pod")?;
    Ok(pod)
}

/// Waits for the pod to fail admission; its status message.
async fn admission_failure(cluster: &PluginCluster, name: &str) -> Result<String> {
    let pod = cluster.wait_phase(NS, name, "Failed", START).await?;
    let status = pod.status.clone().unwrap_or_default();
    ensure!(
        status.reason.as_deref() == Some("UnexpectedAdmissionError"),
        "{name}: reason {:?} ({:?})",
        status.reason,
        status.message
    );
    let message = status.message.unwrap_or_default();
    eprintln!("{name}: {message}");
    let phase = gc::annotation(&pod, annotations::BIND_PHASE);
    ensure!(
        phase == Some("failed"),
        "{name}: bind-phase {phase:?}, want failed"
    );
    Ok(message)
}

/// The node's bind Lease is free.
async fn lease_free(cluster: &PluginCluster) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), cluster::DEFAULT_NAMESPACE);
    let name = format!("{}{NODE}", cluster::BIND_LEASE_PREFIX);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lease = leases.get_opt(&name).await?;
        let holder = lease.as_ref().and_then(gc::lease_holder).map(str::to_owned);
        if holder.is_none() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{name} still held by {holder:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// No transient spec of `pod` (alloc ids `<pod uid>-<index>`) on the node.
fn no_spec_of(cluster: &PluginCluster, pod: &Pod) -> Result<()> {
    let uid = pod.metadata.uid.clone().context("no uid")?;
    let specs: Vec<String> = cluster
        .transient_specs(NODE)?
        .into_iter()
        .filter(|s| s.contains(&uid))
        .collect();
    ensure!(specs.is_empty(), "spec(s) of {uid} leaked: {specs:?}");
    Ok(())
}

/// (b, end) Deleting the vGPU pods removes their specs within seconds.
async fn deleting_vgpu_pods_reclaims(cluster: &PluginCluster, names: &[&str]) -> Result<()> {
    let mut uids = Vec::new();
    for name in names {
        let pod = cluster.pods(NS).get(name).await?;
        uids.push(pod.metadata.uid.clone().context("no uid")?);
    }
    let started = Instant::now();
    for name in names {
        cluster.delete_pod(NS, name, START).await?;
    }
    loop {
        let left: Vec<String> = cluster
            .transient_specs(NODE)?
            .into_iter()
            .filter(|s| uids.iter().any(|u| s.contains(u.as_str())))
            .collect();
        if left.is_empty() {
            eprintln!("vGPU reclaim after delete: {:.1?}", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > RECLAIM {
            bail!("{RECLAIM:?} after delete: specs {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (e) Bad input end to end: a corrupt allocation annotation, and a MIG
/// reservation whose placement someone took by hand — each fails the pod
/// with the plugin's reason in its status, the Lease released, nothing
/// leaked (no spec, no GI but the hand-made one, which stays).
async fn bad_input_fails_the_pod(cluster: &PluginCluster) -> Result<()> {
    let gis_before = cluster.gpu_instances(NODE, MIG_GPU)?;
    ensure!(
        gis_before.is_empty(),
        "the A100 is not empty: {gis_before:?}"
    );

    let corrupt = hand_bind(cluster, "corrupt", "{\"version\": 1, \"node\": ").await?;
    let message = admission_failure(cluster, "corrupt").await?;
    ensure!(
        message.contains(annotations::ALLOCATION),
        "the reason should name {}: {message}",
        annotations::ALLOCATION
    );
    lease_free(cluster).await?;
    no_spec_of(cluster, &corrupt)?;
    ensure!(
        cluster.gpu_instances(NODE, MIG_GPU)?.is_empty(),
        "a GI leaked"
    );

    // Someone makes a 1g.5gb at slot 0 by hand; the reservation names a
    // 2g.10gb at 0-1.
    let node_dir = cluster.node_dir(NODE);
    let lib = tessera_driver::devices::find_nvml_library(&node_dir)?;
    let driver = tessera_driver::nvml::NvmlDriver::load(&lib)?;
    use tessera_driver::GpuDriver as _;
    let hand = driver.create_gpu_instance(
        MIG_GPU as u32,
        19,
        tessera_model::mig::placement::Placement { start: 0, size: 1 },
    )?;
    let mig_uuid = gpu_uuid(cluster, NODE, MIG_GPU)?;
    let allocation = json!({"version": 1, "node": NODE, "containers": [{
        "index": 0, "name": "main", "devices": [{
            "uuid": mig_uuid, "mode": "mig", "profile": "2g.10gb", "profileId": 14,
            "placement": {"start": 0, "size": 2}, "memoryMiB": 9856}]}]});
    Allocation::parse(&allocation.to_string()).context("the test's allocation is valid")?;
    let taken = hand_bind(cluster, "taken", &allocation.to_string()).await?;
    let message = admission_failure(cluster, "taken").await;
    let gis = cluster.gpu_instances(NODE, MIG_GPU)?;
    // Clean the hand-made GI whatever happened.
    let cleanup = driver.destroy_gpu_instance(MIG_GPU as u32, hand.id);
    let message = message?;
    ensure!(
        message.to_lowercase().contains("placement")
            || message.to_lowercase().contains("in use")
            || message.to_lowercase().contains("taken"),
        "the reason should say the placement is taken: {message}"
    );
    ensure!(
        gis.len() == 1 && gis[0].id == u64::from(hand.id) && gis[0].start == 0 && gis[0].size == 1,
        "only the hand-made GI should be there (untouched): {gis:?}"
    );
    cleanup.context("destroying the hand-made GI")?;
    lease_free(cluster).await?;
    no_spec_of(cluster, &taken)?;
    Ok(())
}

/// (e) A reservation on a GPU that fell off the bus (`tessera-sim
/// lose-gpu`) fails the pod with the plugin's reason; nothing is made, no
/// spec is left; the GPU is restored afterwards.
async fn vanished_gpu_fails_the_pod(cluster: &PluginCluster) -> Result<()> {
    let node_dir = cluster.node_dir(NODE);
    let mig_uuid = gpu_uuid(cluster, NODE, MIG_GPU)?;
    let sim = tessera_test_support::artefact("tessera-sim");
    tessera_test_support::run(
        std::process::Command::new(&sim)
            .args(["lose-gpu", "--gpu", &mig_uuid, "--root"])
            .arg(&node_dir),
    )?;
    let allocation = json!({"version": 1, "node": NODE, "containers": [{
        "index": 0, "name": "main", "devices": [{
            "uuid": mig_uuid, "mode": "mig", "profile": "1g.5gb", "profileId": 19,
            "placement": {"start": 0, "size": 1}, "memoryMiB": 4864}]}]});
    let result = async {
        Allocation::parse(&allocation.to_string()).context("the test's allocation is valid")?;
        let pod = hand_bind(cluster, "vanished", &allocation.to_string()).await?;
        let message = admission_failure(cluster, "vanished").await?;
        let lower = message.to_lowercase();
        ensure!(
            lower.contains(&mig_uuid.to_lowercase())
                && (lower.contains("lost")
                    || lower.contains("fell off")
                    || lower.contains("vanish")),
            "the reason should say the GPU is lost: {message}"
        );
        lease_free(cluster).await?;
        no_spec_of(cluster, &pod)?;
        Ok(())
    }
    .await;
    let restored = tessera_test_support::run(
        std::process::Command::new(&sim)
            .args(["lose-gpu", "--restore", "--gpu", &mig_uuid, "--root"])
            .arg(&node_dir),
    );
    result?;
    restored?;
    ensure!(
        cluster.gpu_instances(NODE, MIG_GPU)?.is_empty(),
        "a GI was made on the lost GPU"
    );
    Ok(())
}

// ---------------------------------------------------------------------------

/// The plugin on containerd with CDI: (a) dynamic MIG, (b) vGPU slices and
/// binpacking, (d) plugin and kubelet restarts, MIG reclaim, (e) bad input.
#[tokio::test(flavor = "multi_thread")]
async fn plugin_on_a_cdi_cluster() -> Result<()> {
    let Ok(()) = require(&pc::needs()) else {
        return Ok(());
    };
    let _one = CLUSTERS.lock().await;
    let mut cluster = PluginCluster::start("plugin-cdi", &Options::default()).await?;
    let mut phases = Phases::new();
    let vgpu = ["vgpu-1", "vgpu-2", "vgpu-3"];
    phases
        .run("a: dynamic MIG example runs", dynamic_mig_runs(&cluster))
        .await;
    phases
        .run(
            "b: three vGPU pods binpacked",
            vgpu_pods_binpack(&cluster, &vgpu),
        )
        .await;
    let running: Vec<&str> = std::iter::once("mig-example").chain(vgpu).collect();
    phases
        .run(
            "d: plugin and kubelet restarts",
            restarts_keep_pods(&mut cluster, &running),
        )
        .await;
    phases
        .run(
            "a: deleting the MIG pod reclaims",
            deleting_the_mig_pod_reclaims(&cluster),
        )
        .await;
    phases
        .run(
            "b: deleting the vGPU pods reclaims",
            deleting_vgpu_pods_reclaims(&cluster, &vgpu),
        )
        .await;
    phases
        .run(
            "e: bad input fails the pod",
            bad_input_fails_the_pod(&cluster),
        )
        .await;
    phases
        .run(
            "e: a reservation on a vanished GPU fails the pod",
            vanished_gpu_fails_the_pod(&cluster),
        )
        .await;
    phases.finish(&mut cluster)?;
    cluster.down()
}

/// (c) The same vGPU pod with `--cdi-mode native` on containerd without CDI.
#[tokio::test(flavor = "multi_thread")]
async fn plugin_native_mode_without_cdi() -> Result<()> {
    let Ok(()) = require(&pc::needs()) else {
        return Ok(());
    };
    let _one = CLUSTERS.lock().await;
    let options = Options {
        cdi: false,
        cdi_mode: "native".to_owned(),
        ..Options::default()
    };
    let mut cluster = PluginCluster::start("plugin-native", &options).await?;
    // The runtime really has no CDI: containerd's own configuration.
    let config = std::fs::read_to_string(cluster.node_dir(NODE).join("containerd/config.toml"))?;
    ensure!(
        config.contains("enable_cdi = false"),
        "containerd of {NODE} has CDI on:\n{config}"
    );
    let mut phases = Phases::new();
    phases
        .run(
            "c: vGPU pod with native answers",
            vgpu_pods_binpack(&cluster, &["native-1"]),
        )
        .await;
    phases.finish(&mut cluster)?;
    cluster.down()
}

/// The kubelet stand-in's name for the simulated root is the simulator's.
#[test]
fn the_kubelet_names_the_sim_root_as_the_stand_ins_read_it() {
    assert_eq!(
        tessera_kube_kubelet::pods::SIM_ROOT_ENV,
        tessera_sim::libroot::ROOT_ENV
    );
}
