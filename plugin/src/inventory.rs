//! The node's `tessera.io/node-gpus` and `tessera.io/node-handshake`
//! annotations, from live NVML discovery.
//!
//! [`discover`] reads what NVML says of every GPU (MIG mode, GPU-instance
//! profiles, each profile's legal placements, the GPU instances that exist);
//! [`node_gpus`] turns that, the checkpoint and the health map into the
//! inventory the scheduler extender reads (`model::sched::inventory`), pure
//! and unit-tested without NVML:
//!
//! - GPUs the node's device filters name (HAMi's `filterdevices`: uuids or
//!   indexes, [`DeviceSettings::filtered`]) are left out.
//! - SM counts come from the built-in catalogue where NVML has none (NVML
//!   reports SMs per GPU-instance profile, not per GPU).
//! - Every profile NVML reports is listed with its placements **as NVML
//!   reports them**; the `migProfileAllowlist` is *not* applied here: the
//!   extender applies its own (`model::sched::fit`), and an empty profile
//!   list would make it fall back to the catalogue.
//! - `foreignInstances` are the placements of GPU instances that exist on the
//!   GPU but that no checkpoint record names (made by hand or by another
//!   tool): the extender never reserves over them.
//! - A MIG GPU whose profiles or instances NVML cannot read is reported
//!   unhealthy (without profiles), so nothing is reserved on it blind.
//!
//! [`run`] publishes the result with a JSON merge patch on the Node: at
//! start, whenever the serialized inventory changes (health watch, or the
//! 2 s poll of NVML and the checkpoint), and at least every 30 s to renew the
//! handshake (RFC 3339). API errors are retried with backoff and logged once
//! per distinct error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tessera_driver::{DriverError, GpuDriver};
use tessera_model::contract::annotations;
use tessera_model::gpu::{GpuInfo, GpuInstance, GpuInstanceProfileInfo};
use tessera_model::mig::Placement;
use tessera_model::mig::catalogue;
use tessera_model::sched::inventory::{MigProfile, NODE_GPUS_VERSION, NodeGpu, NodeGpus};
use tokio::sync::watch;

use crate::checkpoint::Checkpoint;
use crate::config::DeviceSettings;
use crate::health::HealthMap;
use crate::run::NodeContext;

/// How often NVML and the checkpoint are read for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// How often the handshake is renewed when nothing changed.
pub const HANDSHAKE_INTERVAL: Duration = Duration::from_secs(30);

/// First wait after a failed patch; doubled per failure up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Longest wait between two patch attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What NVML reported for the node's GPUs at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Every GPU, in index order.
    pub gpus: Vec<GpuInfo>,
    /// GPU-instance profiles of each MIG GPU, by GPU index.
    pub profiles: BTreeMap<u32, Vec<GpuInstanceProfileInfo>>,
    /// Legal placements, by (GPU index, device profile id).
    pub placements: BTreeMap<(u32, u32), Vec<Placement>>,
    /// GPU instances that exist, by GPU index.
    pub instances: BTreeMap<u32, Vec<GpuInstance>>,
    /// MIG GPUs whose profiles or instances could not be read, by GPU index,
    /// with NVML's error.
    pub unreadable: BTreeMap<u32, String>,
}

/// Reads every GPU, and for each MIG GPU its profiles, their placements and
/// its GPU instances. Fails only when the GPU list itself cannot be read; a
/// MIG GPU whose details fail lands in [`Discovery::unreadable`].
pub fn discover(driver: &dyn GpuDriver) -> Result<Discovery, DriverError> {
    let mut found = Discovery {
        gpus: driver.gpus()?,
        ..Discovery::default()
    };
    for gpu in &found.gpus {
        if !gpu.mig_enabled() {
            continue;
        }
        let index = gpu.index;
        let read = || -> Result<_, DriverError> {
            let profiles = driver.gpu_instance_profiles(index)?;
            let mut placements = Vec::with_capacity(profiles.len());
            for profile in &profiles {
                placements.push((profile.id, driver.possible_placements(index, profile.id)?));
            }
            let instances = driver.gpu_instances(index)?;
            Ok((profiles, placements, instances))
        };
        match read() {
            Ok((profiles, placements, instances)) => {
                found.profiles.insert(index, profiles);
                for (id, list) in placements {
                    found.placements.insert((index, id), list);
                }
                found.instances.insert(index, instances);
            }
            Err(e) => {
                found.unreadable.insert(index, e.to_string());
            }
        }
    }
    Ok(found)
}

/// Whether a checkpoint record names the GPU instance `gi` of GPU `uuid`:
/// one of its instances on that GPU at that placement, with that GI id or
/// none recorded yet (an intent whose create call may have completed).
pub fn owned_by_checkpoint(checkpoint: &Checkpoint, uuid: &str, gi: &GpuInstance) -> bool {
    checkpoint
        .allocations
        .values()
        .flat_map(|record| record.instances.iter())
        .any(|i| {
            i.gpu_uuid == uuid
                && i.placement == gi.placement
                && i.gpu_instance_id.is_none_or(|id| id == gi.id)
        })
}

/// The inventory to publish: the GPUs the filters leave, with their health
/// (`healthy` by uuid; a uuid absent from it counts as healthy), MIG profiles
/// and placements as NVML reported them, and the foreign instances.
pub fn node_gpus(
    nvml: &Discovery,
    checkpoint: &Checkpoint,
    healthy: &BTreeMap<String, bool>,
    settings: &DeviceSettings,
) -> NodeGpus {
    let gpus = nvml
        .gpus
        .iter()
        .filter(|gpu| !settings.filtered(gpu.index, &gpu.uuid))
        .map(|gpu| node_gpu(gpu, nvml, checkpoint, healthy))
        .collect();
    NodeGpus {
        version: NODE_GPUS_VERSION,
        gpus,
    }
}

fn node_gpu(
    gpu: &GpuInfo,
    nvml: &Discovery,
    checkpoint: &Checkpoint,
    healthy: &BTreeMap<String, bool>,
) -> NodeGpu {
    let model = catalogue::find_by_product_name(&gpu.name);
    let mig = gpu.mig_enabled();
    let mut node_gpu = NodeGpu {
        uuid: gpu.uuid.clone(),
        index: gpu.index,
        model: gpu.name.clone(),
        memory_mib: gpu.memory_mib,
        sm_count: model.map_or(0, |m| m.sm_count),
        mig,
        healthy: healthy.get(&gpu.uuid).copied().unwrap_or(true)
            && !nvml.unreadable.contains_key(&gpu.index),
        mig_profiles: Vec::new(),
        foreign_instances: Vec::new(),
    };
    if !mig || nvml.unreadable.contains_key(&gpu.index) {
        return node_gpu;
    }
    let catalogued = model.and_then(|m| m.mig);
    for info in nvml.profiles.get(&gpu.index).into_iter().flatten() {
        let spec = catalogued.and_then(|m| m.profile_by_id(info.id));
        let mut placements = nvml
            .placements
            .get(&(gpu.index, info.id))
            .cloned()
            .unwrap_or_default();
        placements.sort();
        placements.dedup();
        let memory_slices = placements
            .first()
            .map(|p| p.size)
            .or(spec.map(|s| s.memory_slices));
        let Some(memory_slices) = memory_slices else {
            tracing::debug!(
                gpu = gpu.index,
                profile = %info.name,
                "profile without placements nor catalogue entry: left out"
            );
            continue;
        };
        let sm_count = match info.multiprocessor_count {
            0 => spec.map_or(0, |s| s.sm_count),
            n => n,
        };
        node_gpu.mig_profiles.push(MigProfile {
            id: info.id,
            name: info.name.clone(),
            memory_mib: info.memory_mib,
            compute_slices: info.slice_count,
            memory_slices,
            sm_count,
            max_instances: info.instance_count,
            placements,
        });
    }
    let mut foreign: BTreeSet<Placement> = BTreeSet::new();
    for gi in nvml.instances.get(&gpu.index).into_iter().flatten() {
        if !owned_by_checkpoint(checkpoint, &gpu.uuid, gi) {
            foreign.insert(gi.placement);
        }
    }
    node_gpu.foreign_instances = foreign.into_iter().collect();
    node_gpu
}

/// Health by uuid, as [`node_gpus`] takes it.
pub fn healthy_by_uuid(map: &HealthMap) -> BTreeMap<String, bool> {
    map.iter()
        .map(|(uuid, health)| (uuid.clone(), health.healthy))
        .collect()
}

/// The merge patch that sets both annotations.
pub fn annotation_patch(inventory: &str, handshake: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {
        annotations::NODE_GPUS: inventory,
        annotations::NODE_HANDSHAKE: handshake,
    }}})
}

/// Keeps a message from being logged again while it repeats.
#[derive(Debug, Default)]
struct Once {
    last: Option<String>,
}

impl Once {
    /// Whether `message` differs from the last one recorded (and records it).
    fn first(&mut self, message: &str) -> bool {
        if self.last.as_deref() == Some(message) {
            return false;
        }
        self.last = Some(message.to_owned());
        true
    }

    /// Forgets the last message; true when there was one (a recovery).
    fn clear(&mut self) -> bool {
        self.last.take().is_some()
    }
}

/// Builds the current inventory: NVML read off the async threads, then the
/// checkpoint and health. `Err` with one line when NVML or the result fails.
async fn current(
    ctx: &Arc<NodeContext>,
    healthy: &BTreeMap<String, bool>,
) -> Result<NodeGpus, String> {
    let driver = Arc::clone(&ctx.driver);
    let nvml = tokio::task::spawn_blocking(move || discover(driver.as_ref()))
        .await
        .map_err(|e| format!("NVML discovery task: {e}"))?
        .map_err(|e| format!("NVML discovery: {e}"))?;
    for (index, error) in &nvml.unreadable {
        tracing::debug!(gpu = index, %error, "MIG details unreadable: GPU reported unhealthy");
    }
    let inventory = node_gpus(
        &nvml,
        &ctx.checkpoint.snapshot(),
        healthy,
        &ctx.config.devices,
    );
    inventory
        .validate()
        .map_err(|e| format!("the inventory NVML gave is refused by the schema: {e}"))?;
    Ok(inventory)
}

/// Publishes the node's inventory and handshake until `shutdown` turns true
/// (or its sender is dropped).
pub async fn run(
    ctx: Arc<NodeContext>,
    mut health: watch::Receiver<HealthMap>,
    mut shutdown: watch::Receiver<bool>,
) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = ctx.config.node_name.clone();
    let mut published: Option<String> = None;
    let mut handshake_at: Option<Instant> = None;
    let mut backoff = FIRST_BACKOFF;
    let mut build_errors = Once::default();
    let mut api_errors = Once::default();
    let mut health_open = true;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let healthy = healthy_by_uuid(&health.borrow_and_update());
        let mut wait = POLL_INTERVAL;
        match current(&ctx, &healthy).await {
            Err(error) => {
                if build_errors.first(&error) {
                    tracing::warn!(%error, "node inventory not published");
                }
            }
            Ok(inventory) => {
                if build_errors.clear() {
                    tracing::info!("node inventory readable again");
                }
                let value = inventory.to_annotation();
                let due = published.as_deref() != Some(value.as_str())
                    || handshake_at.is_none_or(|t| t.elapsed() >= HANDSHAKE_INTERVAL);
                if due {
                    let now = Timestamp::now().to_string();
                    let patch = annotation_patch(&value, &now);
                    match nodes
                        .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {
                            if api_errors.clear() {
                                tracing::info!(%node, "node annotations written again");
                            }
                            if published.as_deref() != Some(value.as_str()) {
                                tracing::info!(
                                    %node,
                                    gpus = inventory.gpus.len(),
                                    "node inventory published"
                                );
                            }
                            published = Some(value);
                            handshake_at = Some(Instant::now());
                            backoff = FIRST_BACKOFF;
                        }
                        Err(e) => {
                            let error = e.to_string();
                            if api_errors.first(&error) {
                                tracing::warn!(%node, %error, "patching the node's annotations failed; retrying");
                            }
                            wait = backoff;
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
            }
        }
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = health.changed(), if health_open => {
                if changed.is_err() {
                    health_open = false;
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_logs_a_repeated_error_once_and_notices_recovery() {
        let mut once = Once::default();
        assert!(once.first("a"));
        assert!(!once.first("a"));
        assert!(once.first("b"));
        assert!(once.clear());
        assert!(!once.clear());
        assert!(once.first("b"));
    }

    #[test]
    fn the_patch_sets_both_annotations() {
        let patch = annotation_patch("{}", "2026-01-01T00:00:00Z");
        let a = &patch["metadata"]["annotations"];
        assert_eq!(a[annotations::NODE_GPUS], "{}");
        assert_eq!(a[annotations::NODE_HANDSHAKE], "2026-01-01T00:00:00Z");
    }
}
