//! The node monitor's `/metrics` (and `/healthz`) on `--metrics-listen`
//! (`0.0.0.0:31992`), under HAMi's vGPU-monitor names and labels so existing
//! dashboards work. Every family carries HAMi's constant `zone="vGPU"`.
//!
//! From the checkpoint, 1 per realized MIG instance of a `Ready` allocation:
//! - `hami_mig_device_info{namespace, pod, container, vdevice_index,
//!   device_uuid, mig_uuid, profile, gpu_instance_id, compute_instance_id}`
//!   (`device_uuid` is the parent GPU's, `vdevice_index` the instance's
//!   position among the container's devices), and HAMi's legacy
//!   `MigInfo{podnamespace, podname, ctrname, vdeviceid, deviceuuid,
//!   instanceid}`.
//!
//! From the node monitor ([`crate::monitor::Monitor::snapshot`]), per
//! container and device, labels `namespace, pod, container, vdevice_index,
//! device_uuid` (legacy: `podnamespace, podname, ctrname, vdeviceid,
//! deviceuuid`):
//! - `hami_vgpu_memory_used_bytes` / legacy `vGPU_device_memory_usage_in_bytes`:
//!   what the vGPU library accounted in the allocation's region, or, without
//!   one, what NVML shows its processes holding;
//! - `hami_vgpu_memory_limit_bytes` / legacy `vGPU_device_memory_limit_in_bytes`
//!   (when the allocation's `vgpu.json` limits the device);
//! - `hami_container_device_utilization_ratio` / legacy
//!   `Device_utilization_desc_of_container`: SM utilization, percent.
//!
//! Per GPU of the node, read from the driver at scrape time (on a blocking
//! thread), labels `node, device_index, device_uuid, device_type` (legacy:
//! `nodeid, deviceidx, deviceuuid, devicetype`; the type is `NVIDIA-<product
//! name>`):
//! - `hami_host_gpu_memory_used_bytes` / legacy `HostGPUMemoryUsage`: device
//!   memory in use on the whole GPU
//!   ([`tessera_driver::GpuDriver::memory_info`]);
//! - `hami_host_gpu_utilization_ratio` / legacy `HostCoreUtilization`: the
//!   whole GPU's utilization, percent
//!   ([`tessera_driver::GpuDriver::utilization`]).
//!
//! A GPU the driver cannot answer for (lost, or a figure it does not
//! report) is left out of that family.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use tessera_driver::GpuDriver;

use crate::checkpoint::{AllocRecord, Checkpoint, Phase};
use crate::monitor::{AllocationUsage, Monitor};
use crate::run::NodeContext;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// HAMi's constant label on every node-monitor family.
const ZONE: (&str, &str) = ("zone", "vGPU");

/// The content type of `/metrics` (OpenMetrics text, as the extender serves).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the metrics endpoint could not be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The listen address could not be bound.
    #[error("--metrics-listen {address}: {reason}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The OS error, one line.
        reason: String,
    },
    /// Serving failed after the bind.
    #[error("metrics endpoint {address}: {reason}")]
    Serve {
        /// The address.
        address: SocketAddr,
        /// What failed.
        reason: String,
    },
}

#[derive(Clone)]
struct Shared {
    ctx: Arc<NodeContext>,
    monitor: Arc<Monitor>,
}

/// Serves `/metrics` and `/healthz` on `config.metrics_listen` until
/// `shutdown` turns true (or its sender is dropped); returns at once when
/// metrics are off.
pub async fn serve(
    ctx: Arc<NodeContext>,
    monitor: Arc<Monitor>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), MetricsError> {
    let Some(address) = ctx.config.metrics_listen else {
        tracing::info!("metrics off");
        return Ok(());
    };
    let listener =
        tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| MetricsError::Bind {
                address,
                reason: one_line(&e.to_string()),
            })?;
    let bound = listener.local_addr().unwrap_or(address);
    tracing::info!(address = %bound, "serving metrics");
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(Shared { ctx, monitor });
    let stop = async move {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
    };
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| MetricsError::Serve {
            address,
            reason: one_line(&e.to_string()),
        })
}

fn one_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_owned()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn metrics(State(shared): State<Shared>) -> Response {
    let checkpoint = shared.ctx.checkpoint.snapshot();
    let usage = shared.monitor.snapshot();
    let driver = shared.ctx.driver.clone();
    let node = shared.ctx.config.node_name.clone();
    // NVML may block: off the runtime's workers.
    let host = match tokio::task::spawn_blocking(move || read_host(&node, driver.as_ref())).await {
        Ok(host) => host,
        Err(e) => {
            tracing::warn!(error = %e, "reading the GPUs' usage failed");
            Host::default()
        }
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        render(&checkpoint, &usage, &host),
    )
        .into_response()
}

/// The node's GPUs as the host families show them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Host {
    /// This node's name.
    pub node: String,
    /// Every GPU the driver lists, in index order.
    pub gpus: Vec<HostGpu>,
}

/// One GPU's whole-device figures.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` uuid.
    pub uuid: String,
    /// Product name (`NVIDIA A100-SXM4-40GB`).
    pub name: String,
    /// Device memory in use, bytes; `None` when the driver could not tell.
    pub memory_used_bytes: Option<u64>,
    /// Utilization, percent; `None` when the driver could not tell.
    pub utilization_percent: Option<u32>,
}

/// Reads every GPU's memory use and utilization from `driver` (blocking
/// calls). A figure the driver cannot give is `None`; no GPU list, no GPUs.
pub fn read_host(node: &str, driver: &(dyn GpuDriver + Send + Sync)) -> Host {
    let gpus = match driver.gpus() {
        Ok(gpus) => gpus,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list GPUs for the host metrics");
            Vec::new()
        }
    };
    let figure = |gpu: u32, what: &str, e: tessera_driver::DriverError| {
        tracing::debug!(gpu, what, error = %e, "host metric not available");
    };
    Host {
        node: node.to_owned(),
        gpus: gpus
            .into_iter()
            .map(|g| HostGpu {
                memory_used_bytes: driver
                    .memory_info(g.index)
                    .map(|(used, _total)| used)
                    .map_err(|e| figure(g.index, "memory", e))
                    .ok(),
                utilization_percent: driver
                    .utilization(g.index)
                    .map_err(|e| figure(g.index, "utilization", e))
                    .ok(),
                index: g.index,
                uuid: g.uuid,
                name: g.name,
            })
            .collect(),
    }
}

fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .chain(std::iter::once((ZONE.0.to_owned(), ZONE.1.to_owned())))
        .collect()
}

/// The new (`hami_…`) and the legacy label sets of one container device.
fn container_labels(record: &AllocRecord, vdevice: usize, uuid: &str) -> (Labels, Labels) {
    let modern = labels(&[
        ("namespace", record.namespace.clone()),
        ("pod", record.pod.clone()),
        ("container", record.container.clone()),
        ("vdevice_index", vdevice.to_string()),
        ("device_uuid", uuid.to_owned()),
    ]);
    let legacy = labels(&[
        ("podnamespace", record.namespace.clone()),
        ("podname", record.pod.clone()),
        ("ctrname", record.container.clone()),
        ("vdeviceid", vdevice.to_string()),
        ("deviceuuid", uuid.to_owned()),
    ]);
    (modern, legacy)
}

/// One gauge family under its new and its legacy name.
#[derive(Default)]
struct Pair {
    modern: Family<Labels, FloatGauge>,
    legacy: Family<Labels, FloatGauge>,
}

impl Pair {
    fn set(&self, (modern, legacy): &(Labels, Labels), value: f64) {
        self.modern.get_or_create(modern).set(value);
        self.legacy.get_or_create(legacy).set(value);
    }
}

/// The text exposition of the checkpoint's MIG instances, the monitor's
/// per-container usage and the host's GPUs.
pub fn render(checkpoint: &Checkpoint, usage: &[AllocationUsage], host: &Host) -> String {
    let mig_info: Family<Labels, Gauge> = Family::default();
    let legacy_mig_info: Family<Labels, Gauge> = Family::default();
    for record in checkpoint.allocations.values() {
        if record.phase != Phase::Ready {
            continue;
        }
        for (vdevice, instance) in record.instances.iter().enumerate() {
            let (Some(gi), Some(ci), Some(mig_uuid)) = (
                instance.gpu_instance_id,
                instance.compute_instance_id,
                instance.mig_uuid.as_ref(),
            ) else {
                continue;
            };
            mig_info
                .get_or_create(&labels(&[
                    ("namespace", record.namespace.clone()),
                    ("pod", record.pod.clone()),
                    ("container", record.container.clone()),
                    ("vdevice_index", vdevice.to_string()),
                    ("device_uuid", instance.gpu_uuid.clone()),
                    ("mig_uuid", mig_uuid.clone()),
                    ("profile", instance.profile.clone()),
                    ("gpu_instance_id", gi.to_string()),
                    ("compute_instance_id", ci.to_string()),
                ]))
                .set(1);
            legacy_mig_info
                .get_or_create(&labels(&[
                    ("podnamespace", record.namespace.clone()),
                    ("podname", record.pod.clone()),
                    ("ctrname", record.container.clone()),
                    ("vdeviceid", vdevice.to_string()),
                    ("deviceuuid", instance.gpu_uuid.clone()),
                    ("instanceid", gi.to_string()),
                ]))
                .set(1);
        }
    }

    let used = Pair::default();
    let limit = Pair::default();
    let utilization = Pair::default();
    // The container's devices in the order the monitor lists them.
    let mut seen: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for entry in usage {
        let Some(record) = checkpoint.allocations.get(&entry.alloc_id) else {
            continue;
        };
        let devices = seen.entry(entry.alloc_id.as_str()).or_default();
        let vdevice = match devices.iter().position(|u| *u == entry.device_uuid) {
            Some(i) => i,
            None => {
                devices.push(&entry.device_uuid);
                devices.len() - 1
            }
        };
        let set = container_labels(record, vdevice, &entry.device_uuid);
        let used_bytes = entry.region_used_bytes.unwrap_or(entry.nvml_memory_bytes);
        used.set(&set, used_bytes as f64);
        if let Some(bytes) = entry.limit_bytes {
            limit.set(&set, bytes as f64);
        }
        utilization.set(&set, entry.sm_percent);
    }

    let host_memory = Pair::default();
    let host_utilization = Pair::default();
    for gpu in &host.gpus {
        let device_type = format!("NVIDIA-{}", gpu.name);
        let set = (
            labels(&[
                ("node", host.node.clone()),
                ("device_index", gpu.index.to_string()),
                ("device_uuid", gpu.uuid.clone()),
                ("device_type", device_type.clone()),
            ]),
            labels(&[
                ("nodeid", host.node.clone()),
                ("deviceidx", gpu.index.to_string()),
                ("deviceuuid", gpu.uuid.clone()),
                ("devicetype", device_type),
            ]),
        );
        if let Some(bytes) = gpu.memory_used_bytes {
            host_memory.set(&set, bytes as f64);
        }
        if let Some(percent) = gpu.utilization_percent {
            host_utilization.set(&set, f64::from(percent));
        }
    }

    let mut registry = Registry::default();
    registry.register(
        "hami_host_gpu_memory_used_bytes",
        "Device memory in use on the whole GPU, in bytes",
        host_memory.modern,
    );
    registry.register(
        "HostGPUMemoryUsage",
        "Device memory in use on the whole GPU",
        host_memory.legacy,
    );
    registry.register(
        "hami_host_gpu_utilization_ratio",
        "Utilization of the whole GPU, percent (0-100)",
        host_utilization.modern,
    );
    registry.register(
        "HostCoreUtilization",
        "Utilization of the whole GPU",
        host_utilization.legacy,
    );
    registry.register(
        "hami_mig_device_info",
        "MIG runtime identity for a container allocation",
        mig_info,
    );
    registry.register(
        "MigInfo",
        "Mig device information for container",
        legacy_mig_info,
    );
    registry.register(
        "hami_vgpu_memory_used_bytes",
        "vGPU device memory usage in bytes",
        used.modern,
    );
    registry.register(
        "vGPU_device_memory_usage_in_bytes",
        "vGPU device usage",
        used.legacy,
    );
    registry.register(
        "hami_vgpu_memory_limit_bytes",
        "vGPU device memory limit in bytes",
        limit.modern,
    );
    registry.register(
        "vGPU_device_memory_limit_in_bytes",
        "vGPU device limit",
        limit.legacy,
    );
    registry.register(
        "hami_container_device_utilization_ratio",
        "Container device SM utilization ratio",
        utilization.modern,
    );
    registry.register(
        "Device_utilization_desc_of_container",
        "Container device utilization description",
        utilization.legacy,
    );
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &registry) {
        tracing::warn!(error = %e, "encoding metrics");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::InstanceRecord;
    use tessera_model::mig::Placement;

    fn record(id: &str, phase: Phase, instances: Vec<InstanceRecord>) -> AllocRecord {
        AllocRecord {
            alloc_id: id.to_owned(),
            pod_uid: "uid".to_owned(),
            namespace: "team".to_owned(),
            pod: format!("pod-{id}"),
            container: "main".to_owned(),
            container_index: 0,
            phase,
            instances,
            device_ids: Vec::new(),
            created_unix: 1,
        }
    }

    fn instance(gi: Option<u32>) -> InstanceRecord {
        InstanceRecord {
            gpu_uuid: "GPU-parent".to_owned(),
            gpu_index: 1,
            profile_id: 9,
            profile: "3g.20gb".to_owned(),
            placement: Placement { start: 4, size: 4 },
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
            mig_uuid: gi.map(|g| format!("MIG-{g}")),
        }
    }

    fn checkpoint(records: Vec<AllocRecord>) -> Checkpoint {
        Checkpoint {
            version: crate::checkpoint::VERSION,
            allocations: records
                .into_iter()
                .map(|r| (r.alloc_id.clone(), r))
                .collect(),
        }
    }

    fn usage(
        alloc: &str,
        uuid: &str,
        sm_percent: f64,
        nvml: u64,
        region: Option<u64>,
        limit: Option<u64>,
    ) -> AllocationUsage {
        AllocationUsage {
            alloc_id: alloc.to_owned(),
            device_uuid: uuid.to_owned(),
            sm_percent,
            nvml_memory_bytes: nvml,
            processes: 1,
            region_used_bytes: region,
            limit_bytes: limit,
            published: true,
        }
    }

    fn lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    }

    #[test]
    fn realized_instances_of_ready_allocations_are_listed_with_hami_labels() {
        let cp = checkpoint(vec![
            record("a-0", Phase::Ready, vec![instance(Some(2))]),
            record("b-0", Phase::Realizing, vec![instance(Some(3))]),
            record("c-0", Phase::Ready, vec![instance(None)]),
        ]);
        let text = render(&cp, &[], &Host::default());
        let info = lines(&text, "hami_mig_device_info");
        assert_eq!(info.len(), 1, "{text}");
        assert_eq!(
            info[0],
            "hami_mig_device_info{namespace=\"team\",pod=\"pod-a-0\",container=\"main\",\
             vdevice_index=\"0\",device_uuid=\"GPU-parent\",mig_uuid=\"MIG-2\",profile=\"3g.20gb\",\
             gpu_instance_id=\"2\",compute_instance_id=\"0\",zone=\"vGPU\"} 1"
        );
        let legacy = lines(&text, "MigInfo");
        assert_eq!(legacy.len(), 1, "{text}");
        assert!(legacy[0].contains("instanceid=\"2\""), "{}", legacy[0]);
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn container_usage_is_served_under_new_and_legacy_names() {
        let cp = checkpoint(vec![record("a-0", Phase::Ready, Vec::new())]);
        let usage = [
            usage("a-0", "GPU-x", 30.0, 7, Some(1 << 30), Some(4 << 30)),
            usage("a-0", "GPU-y", 5.0, 1 << 20, None, None),
            usage("gone-0", "GPU-x", 1.0, 1, None, None),
        ];
        let text = render(&cp, &usage, &Host::default());
        let used = lines(&text, "hami_vgpu_memory_used_bytes");
        assert_eq!(used.len(), 2, "{text}");
        assert!(used.contains(
            &"hami_vgpu_memory_used_bytes{namespace=\"team\",pod=\"pod-a-0\",container=\"main\",\
              vdevice_index=\"0\",device_uuid=\"GPU-x\",zone=\"vGPU\"} 1073741824.0"
        ));
        // Without a region figure, NVML's.
        assert!(
            used.iter()
                .any(|l| l.contains("vdevice_index=\"1\"") && l.ends_with(" 1048576.0")),
            "{used:?}"
        );
        let legacy = lines(&text, "vGPU_device_memory_limit_in_bytes");
        assert!(legacy.contains(
            &"vGPU_device_memory_limit_in_bytes{podnamespace=\"team\",podname=\"pod-a-0\",\
              ctrname=\"main\",vdeviceid=\"0\",deviceuuid=\"GPU-x\",zone=\"vGPU\"} 4294967296.0"
        ));
        assert_eq!(legacy.len(), 1, "no limit without vgpu.json: {legacy:?}");
        let util = lines(&text, "Device_utilization_desc_of_container");
        assert_eq!(util.len(), 2);
        assert_eq!(
            lines(&text, "hami_container_device_utilization_ratio").len(),
            2
        );
        assert!(!text.contains("gone-0"));
    }

    #[test]
    fn host_gpus_are_served_under_hami_names_and_labels_from_the_driver() {
        use tessera_driver::fake::{FakeDriver, FakeGpu};

        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::plain(0, "NVIDIA H100 80GB HBM3", 81_559))
            .with_gpu(FakeGpu::a100_40gb(1));
        driver.set_usage(0, 3 << 30, 42);
        driver.fail_next(
            "utilization",
            tessera_driver::DriverError::NotSupported("no rates".to_owned()),
        );
        let host = read_host("node-1", &driver);
        assert_eq!(host.gpus.len(), 2);
        assert_eq!(host.gpus[0].memory_used_bytes, Some(3 << 30));
        assert_eq!(host.gpus[0].utilization_percent, None, "NotSupported");
        assert_eq!(host.gpus[1].utilization_percent, Some(0));

        let text = render(&checkpoint(Vec::new()), &[], &host);
        let uuid0 = &host.gpus[0].uuid;
        let mut memory = lines(&text, "hami_host_gpu_memory_used_bytes");
        memory.sort_unstable();
        assert_eq!(
            memory,
            [
                format!(
                    "hami_host_gpu_memory_used_bytes{{node=\"node-1\",device_index=\"0\",\
                     device_uuid=\"{uuid0}\",device_type=\"NVIDIA-NVIDIA H100 80GB HBM3\",\
                     zone=\"vGPU\"}} 3221225472.0"
                ),
                format!(
                    "hami_host_gpu_memory_used_bytes{{node=\"node-1\",device_index=\"1\",\
                     device_uuid=\"{}\",device_type=\"NVIDIA-{}\",zone=\"vGPU\"}} 0.0",
                    host.gpus[1].uuid, host.gpus[1].name
                )
            ]
        );
        let mut legacy = lines(&text, "HostGPUMemoryUsage");
        legacy.sort_unstable();
        assert_eq!(legacy.len(), 2, "{text}");
        assert!(
            legacy[0].starts_with(&format!(
                "HostGPUMemoryUsage{{nodeid=\"node-1\",deviceidx=\"0\",deviceuuid=\"{uuid0}\",\
                 devicetype=\"NVIDIA-NVIDIA H100 80GB HBM3\""
            )),
            "{}",
            legacy[0]
        );
        // GPU 0's utilization was not available: only GPU 1's is served.
        let util = lines(&text, "HostCoreUtilization");
        assert_eq!(util.len(), 1, "{text}");
        assert!(util[0].contains("deviceidx=\"1\"") && util[0].ends_with(" 0.0"));
        assert_eq!(lines(&text, "hami_host_gpu_utilization_ratio").len(), 1);

        // A GPU lost between the listing and its query drops out of that
        // family; a listing that fails (NVML fails it while any GPU is lost)
        // leaves no GPUs and no host series.
        driver.fail_next(
            "memory_info",
            tessera_driver::DriverError::GpuLost("fell off the bus".to_owned()),
        );
        let host = read_host("node-1", &driver);
        assert_eq!(host.gpus[0].memory_used_bytes, None);
        assert_eq!(host.gpus[1].memory_used_bytes, Some(0));
        let text = render(&checkpoint(Vec::new()), &[], &host);
        assert_eq!(lines(&text, "HostGPUMemoryUsage").len(), 1, "{text}");
        driver.set_lost(1, true);
        let host = read_host("node-1", &driver);
        assert!(host.gpus.is_empty());
        let text = render(&checkpoint(Vec::new()), &[], &host);
        assert!(lines(&text, "HostCoreUtilization").is_empty(), "{text}");
    }

    #[test]
    fn one_line_keeps_the_first_line() {
        assert_eq!(one_line("a\nb"), "a");
        assert_eq!(one_line(""), "");
    }
}
