//! Prometheus metrics, served at `/metrics` in the text exposition format.
//!
//! Under the seeds' names, so existing dashboards work:
//! - `hami_node_gpu_mig_instance_info{node, device_uuid, device_index,
//!   mig_uuid, profile, gpu_instance_id, compute_instance_id,
//!   placement_start, placement_size}` = 1 per realized MIG instance (from
//!   the allocations' `realized` fields, written by the device plugin);
//! - per GPU, HAMi scheduler's `GPUDeviceMemoryLimit` / `GPUDeviceMemoryAllocated`
//!   (bytes, as HAMi reports them), `GPUDeviceCoreLimit` / `GPUDeviceCoreAllocated`
//!   (percent; on a MIG GPU the compute slices its instances hold, as a
//!   share of the GPU's), `GPUDeviceSharedNum` (devices handed out on it),
//!   labels `nodeid, deviceuuid, deviceidx` and HAMi's constant
//!   `zone="vGPU"`, plus `devicecores` (the cores allocated) on
//!   `GPUDeviceMemoryAllocated` as HAMi has it;
//!
//! and the extender's own `tessera_extender_verb_duration_seconds{verb}`
//! (histogram) and `tessera_extender_bind_total{result}`.
//!
//! The per-GPU and MIG families are computed from the cluster state at each
//! scrape; the verb metrics live as long as the process.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tessera_model::sched::allocation::DeviceAllocation;
use tessera_model::sched::inventory::NodeGpu;

use crate::state::{ClusterState, is_terminal};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The process-long metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    verb_duration: Family<Labels, Histogram>,
    bind_total: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn new_verb_histogram() -> Histogram {
    // 0.1 ms … ~3.3 s, doubling.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.0, 16,
    ))
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Metrics {
        Metrics {
            verb_duration: Family::new_with_constructor(new_verb_histogram),
            bind_total: Family::default(),
        }
    }

    /// Records one call of `verb` that took `seconds`.
    pub fn observe_verb(&self, verb: &str, seconds: f64) {
        self.verb_duration
            .get_or_create(&vec![("verb".to_string(), verb.to_string())])
            .observe(seconds);
    }

    /// Counts one bind by result (`success`, `failure`).
    pub fn count_bind(&self, result: &str) {
        self.bind_total
            .get_or_create(&vec![("result".to_string(), result.to_string())])
            .inc();
    }

    /// The text exposition: the verb metrics and the state's GPU metrics.
    pub fn render(&self, state: &ClusterState) -> String {
        let mut registry = Registry::default();
        registry.register(
            "tessera_extender_verb_duration_seconds",
            "Time the extender took to answer a verb",
            self.verb_duration.clone(),
        );
        registry.register(
            "tessera_extender_bind",
            "Binds by result",
            self.bind_total.clone(),
        );
        let gpu = GpuFamilies::default();
        let mig_info: Family<Labels, Gauge> = Family::default();
        fill(state, &gpu, &mig_info);
        registry.register(
            "GPUDeviceMemoryLimit",
            "Device memory limit for a certain GPU (bytes)",
            gpu.memory_limit,
        );
        registry.register(
            "GPUDeviceMemoryAllocated",
            "Device memory allocated for a certain GPU (bytes)",
            gpu.memory_allocated,
        );
        registry.register(
            "GPUDeviceCoreLimit",
            "Device core limit for a certain GPU (percent)",
            gpu.core_limit,
        );
        registry.register(
            "GPUDeviceCoreAllocated",
            "Device cores allocated for a certain GPU (percent)",
            gpu.core_allocated,
        );
        registry.register(
            "GPUDeviceSharedNum",
            "Number of devices handed out on a certain GPU",
            gpu.shared_num,
        );
        registry.register(
            "hami_node_gpu_mig_instance_info",
            "A realized MIG instance of a node's GPU",
            mig_info,
        );
        let mut text = String::new();
        if let Err(e) = encode(&mut text, &registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        text
    }
}

#[derive(Default)]
struct GpuFamilies {
    memory_limit: Family<Labels, FloatGauge>,
    memory_allocated: Family<Labels, FloatGauge>,
    core_limit: Family<Labels, FloatGauge>,
    core_allocated: Family<Labels, FloatGauge>,
    shared_num: Family<Labels, FloatGauge>,
}

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Default)]
struct Held {
    memory_mib: u64,
    cores: u64,
    devices: u64,
    /// Profile ids of the MIG instances held.
    mig_profiles: Vec<u32>,
}

/// HAMi's constant label on its per-GPU families.
const ZONE: (&str, &str) = ("zone", "vGPU");

fn fill(state: &ClusterState, gpu: &GpuFamilies, mig_info: &Family<Labels, Gauge>) {
    // What each GPU holds, by (node, uuid); init containers do not run
    // beside the regular ones, so only the regular containers count here.
    let mut held: BTreeMap<(String, String), Held> = BTreeMap::new();
    let mut realized = Vec::new();
    for pod in state.pods() {
        if is_terminal(&pod) {
            continue;
        }
        let Some(Ok(allocation)) = state.allocation(&pod) else {
            continue;
        };
        for (container, device) in allocation.devices() {
            if container.init {
                continue;
            }
            let entry = held
                .entry((allocation.node.clone(), device.uuid().to_string()))
                .or_default();
            entry.devices += 1;
            match device {
                DeviceAllocation::Share {
                    memory_mib, cores, ..
                } => {
                    entry.memory_mib += memory_mib;
                    entry.cores += u64::from(*cores);
                }
                DeviceAllocation::Mig {
                    uuid,
                    profile,
                    placement,
                    memory_mib,
                    profile_id,
                    realized: Some(r),
                    ..
                } => {
                    entry.memory_mib += memory_mib;
                    entry.mig_profiles.push(*profile_id);
                    realized.push((
                        allocation.node.clone(),
                        uuid.clone(),
                        profile.clone(),
                        *placement,
                        r.clone(),
                    ));
                }
                DeviceAllocation::Mig {
                    memory_mib,
                    profile_id,
                    ..
                } => {
                    entry.memory_mib += memory_mib;
                    entry.mig_profiles.push(*profile_id);
                }
            }
        }
    }
    let mut indexes: BTreeMap<(String, String), u32> = BTreeMap::new();
    for node in state.nodes() {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let Ok(inventory) = state.inventory(&node) else {
            continue;
        };
        let settings = state.config().node_settings(&name);
        for device in &inventory.gpus {
            indexes.insert((name.clone(), device.uuid.clone()), device.index);
            let labels = vec![
                ("nodeid".to_string(), name.clone()),
                ("deviceuuid".to_string(), device.uuid.clone()),
                ("deviceidx".to_string(), device.index.to_string()),
                (ZONE.0.to_string(), ZONE.1.to_string()),
            ];
            let (memory_limit, core_limit) = if device.mig {
                (device.memory_mib as f64, 100.0)
            } else {
                (
                    device.memory_mib as f64 * settings.memory_scaling,
                    100.0 * settings.core_scaling,
                )
            };
            let here = held.get(&(name.clone(), device.uuid.clone()));
            let cores = here.map_or(0.0, |h| {
                if device.mig {
                    mig_core_share(device, &h.mig_profiles)
                } else {
                    h.cores as f64
                }
            });
            gpu.memory_limit
                .get_or_create(&labels)
                .set(memory_limit * MIB);
            gpu.core_limit.get_or_create(&labels).set(core_limit);
            let mut with_cores = labels.clone();
            with_cores.insert(3, ("devicecores".to_string(), format!("{:.0}", cores)));
            gpu.memory_allocated
                .get_or_create(&with_cores)
                .set(here.map_or(0.0, |h| h.memory_mib as f64 * MIB));
            gpu.core_allocated.get_or_create(&labels).set(cores);
            gpu.shared_num
                .get_or_create(&labels)
                .set(here.map_or(0.0, |h| h.devices as f64));
        }
    }
    for (node, uuid, profile, placement, r) in realized {
        let index = indexes
            .get(&(node.clone(), uuid.clone()))
            .map(u32::to_string)
            .unwrap_or_default();
        let labels = vec![
            ("node".to_string(), node),
            ("device_uuid".to_string(), uuid),
            ("device_index".to_string(), index),
            ("mig_uuid".to_string(), r.mig_uuid),
            ("profile".to_string(), profile),
            ("gpu_instance_id".to_string(), r.gpu_instance_id.to_string()),
            (
                "compute_instance_id".to_string(),
                r.compute_instance_id.to_string(),
            ),
            ("placement_start".to_string(), placement.start.to_string()),
            ("placement_size".to_string(), placement.size.to_string()),
        ];
        mig_info.get_or_create(&labels).set(1);
    }
}

/// The percent of a MIG GPU's compute its instances hold: their compute
/// slices over the GPU's (its largest profile spans them all).
fn mig_core_share(device: &NodeGpu, profiles: &[u32]) -> f64 {
    let slices_of = |id: u32| {
        device
            .mig_profiles
            .iter()
            .find(|p| p.id == id)
            .map_or(0, |p| p.compute_slices)
    };
    let total = device
        .mig_profiles
        .iter()
        .map(|p| p.compute_slices)
        .max()
        .unwrap_or(0);
    if total == 0 {
        return 0.0;
    }
    let held: u32 = profiles.iter().map(|id| slices_of(*id)).sum();
    (f64::from(held) * 100.0 / f64::from(total)).min(100.0)
}
