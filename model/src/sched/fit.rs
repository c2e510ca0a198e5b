//! Fit: can a node hold a pod's GPU ask, on which GPUs, as which slices or
//! MIG instances at which placements — and if not, why not, in words a user
//! can act on.
//!
//! Inputs are the node's inventory ([`NodeGpus`]), the settings in force on
//! it ([`NodeSettings`], [`ClusterConfig`]) and what is already held there:
//! the allocations of the node's live pods, including reservations still in
//! flight ([`NodeUsage::from_allocations`]). Nothing here reads a clock or an API.
//!
//! Share GPUs (MIG mode off): a slice fits a GPU when the GPU is healthy, not
//! filtered out (node `filterdevices`, pod type and uuid annotations), has
//! fewer than the split count of slices, has the memory free (total ×
//! memory scaling − held), the cores free (100 × core scaling − held), and
//! exclusivity holds: cores 100 needs a GPU with no slice; a GPU with a
//! 100-core slice takes nothing more. Memory given as percent is of the
//! GPU's physical memory, rounded up to whole MiB; the whole GPU is its
//! physical memory.
//!
//! MIG GPUs (MIG mode on): the smallest allowlisted profile (by memory, then
//! compute slices, then id) whose memory ≥ the ask and, when cores are asked,
//! whose share of the GPU's SMs ≥ the cores; placed by the engine's LeastStranded
//! policy on the GPU's occupancy (reserved placements + foreign instances),
//! within the profile's instance limit. Profiles and placements are the
//! node's reported ones; the catalogue's only where the node reported none.
//! A percentage ask is of the whole GPU's memory. An ask for the whole GPU
//! ([`MemoryRequest::Whole`]: no memory named and `defaultMemory: 0`) gets
//! the largest allowlisted profile on a MIG GPU: the whole GPU as far as MIG
//! can hand it out. When the smallest fitting profile has no free placement
//! the GPU does not take the device (a larger profile is not used instead:
//! that would silently hold more than asked and fragment the GPU further).
//! A GPU holding devices of the other kind (share slices on a MIG GPU or MIG
//! reservations on a share GPU, after a mode change) takes nothing.
//!
//! Multi-GPU asks (`count` > 1): the devices of one container are on
//! distinct GPUs — also for MIG: two MIG instances for one container are
//! never on the same GPU (a container asking for 2 expects two devices'
//! worth of independent memory and compute, and frameworks treat them as two
//! GPUs; on one GPU they would share its memory bandwidth and L2). Different
//! containers of a pod may share a GPU.
//!
//! The unified pool (no `vgpu-mode`): each device goes to a share GPU or a
//! MIG GPU, whichever the GPU policy prefers among those that fit.
//!
//! Init containers are fitted one at a time against the node as it is; the
//! regular containers together. A pod fits when every phase fits (as kubelet
//! counts them: init containers do not run beside the others).

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::allocation::{Allocation, ContainerAllocation, DeviceAllocation};
use super::config::{ClusterConfig, NodeSettings, OperatingMode};
use super::gpu_type;
use super::inventory::{MigProfile, NodeGpu, NodeGpus};
use super::request::{ContainerRequest, MemoryRequest, ModeRequest, PodRequest, Policy};
use crate::mig::Placement;
use crate::mig::catalogue;
use crate::mig::placement::{self, MAX_AXIS_LEN, Occupancy, PlacementPolicy};

/// What is held on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuUsage {
    /// Share slices on it.
    pub slices: u32,
    /// Memory held by slices, MiB.
    pub memory_mib: u64,
    /// Cores held by slices, percent.
    pub cores: u32,
    /// A slice with cores 100 holds it.
    pub exclusive: bool,
    /// MIG instances reserved on it: `(profile id, placement)`.
    pub mig: Vec<(u32, crate::mig::Placement)>,
}

impl GpuUsage {
    /// Adds one device of this GPU.
    fn hold(&mut self, device: &DeviceAllocation) {
        match device {
            DeviceAllocation::Share {
                memory_mib, cores, ..
            } => {
                self.slices = self.slices.saturating_add(1);
                self.memory_mib = self.memory_mib.saturating_add(*memory_mib);
                self.cores = self.cores.saturating_add(*cores);
                self.exclusive |= *cores >= 100;
            }
            DeviceAllocation::Mig {
                profile_id,
                placement,
                ..
            } => self.mig.push((*profile_id, *placement)),
        }
    }

    /// The larger of two share usages, field by field (MIG lists are not touched).
    fn share_max(&mut self, other: &GpuUsage) {
        self.slices = self.slices.max(other.slices);
        self.memory_mib = self.memory_mib.max(other.memory_mib);
        self.cores = self.cores.max(other.cores);
        self.exclusive |= other.exclusive;
    }
}

/// What is held on each GPU of one node, by GPU uuid.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeUsage {
    /// Per GPU uuid.
    pub gpus: BTreeMap<String, GpuUsage>,
}

impl NodeUsage {
    /// Sums the allocations held on a node. For each allocation, what it
    /// holds at its peak: the regular containers together, or its largest
    /// init container, whichever holds more of a GPU, per GPU (so a pod's
    /// init phase is never counted on top of its main phase). MIG instances
    /// live as long as the pod, so every container's count, init or not.
    /// Devices on uuids the inventory does not list are kept (the GPU may
    /// come back).
    pub fn from_allocations<'a>(
        allocations: impl IntoIterator<Item = &'a Allocation>,
    ) -> NodeUsage {
        let mut usage = NodeUsage::default();
        for allocation in allocations {
            usage.add(allocation);
        }
        usage
    }

    /// Adds one allocation (a reservation just made) to the usage.
    pub fn add(&mut self, allocation: &Allocation) {
        let mut peak: BTreeMap<&str, GpuUsage> = BTreeMap::new();
        // The regular containers together.
        for container in allocation.containers.iter().filter(|c| !c.init) {
            for device in &container.devices {
                peak.entry(device.uuid()).or_default().hold(device);
            }
        }
        // Each init container alone; its MIG instances stay for the pod's life.
        for container in allocation.containers.iter().filter(|c| c.init) {
            let mut alone: BTreeMap<&str, GpuUsage> = BTreeMap::new();
            for device in &container.devices {
                match device {
                    DeviceAllocation::Share { .. } => {
                        alone.entry(device.uuid()).or_default().hold(device);
                    }
                    DeviceAllocation::Mig { .. } => {
                        peak.entry(device.uuid()).or_default().hold(device);
                    }
                }
            }
            for (uuid, share) in alone {
                peak.entry(uuid).or_default().share_max(&share);
            }
        }
        for (uuid, held) in peak {
            let gpu = self.gpus.entry(uuid.to_owned()).or_default();
            gpu.slices = gpu.slices.saturating_add(held.slices);
            gpu.memory_mib = gpu.memory_mib.saturating_add(held.memory_mib);
            gpu.cores = gpu.cores.saturating_add(held.cores);
            gpu.exclusive |= held.exclusive;
            gpu.mig.extend(held.mig);
        }
    }

    /// The occupancy of a MIG GPU: its reserved instances and the inventory's
    /// foreign ones. When those do not fit together on the GPU's axis (a
    /// corrupt or foreign reservation), the whole axis counts as used, so
    /// nothing more is placed there; [`NodeUsage::try_occupancy`] says why.
    pub fn occupancy(&self, gpu: &NodeGpu) -> Occupancy {
        self.try_occupancy(gpu).unwrap_or_else(|_| {
            let axis = mig_axis_len(gpu).clamp(1, MAX_AXIS_LEN);
            let mut full = Occupancy::new(axis).expect("an axis of 1..=64 slots is valid");
            // The whole axis as one instance: it lies on the axis, so this holds.
            let _ = full.occupy(Placement {
                start: 0,
                size: axis,
            });
            full
        })
    }

    /// The occupancy of a MIG GPU, or why its reservations and foreign
    /// instances cannot all be on it (overlapping, or past its axis).
    pub fn try_occupancy(&self, gpu: &NodeGpu) -> Result<Occupancy, String> {
        let axis = mig_axis_len(gpu);
        let reserved = self
            .gpus
            .get(&gpu.uuid)
            .map(|u| u.mig.as_slice())
            .unwrap_or_default();
        if axis == 0 {
            if reserved.is_empty() && gpu.foreign_instances.is_empty() {
                return Occupancy::new(1).map_err(|e| e.to_string());
            }
            return Err(format!(
                "no MIG layout known for {} but instances are held on it",
                gpu.model
            ));
        }
        let mut occupancy = Occupancy::new(axis).map_err(|e| e.to_string())?;
        for placement in gpu.foreign_instances.iter() {
            occupancy
                .occupy(*placement)
                .map_err(|e| format!("foreign MIG instance: {e}"))?;
        }
        for (_, placement) in reserved {
            occupancy
                .occupy(*placement)
                .map_err(|e| format!("reserved MIG instance: {e}"))?;
        }
        Ok(occupancy)
    }
}

/// Length of a MIG GPU's axis: from its reported profiles, else the catalogue's
/// model, else 0.
fn mig_axis_len(gpu: &NodeGpu) -> u32 {
    match gpu.axis_len() {
        0 => catalogue::find_by_product_name(&gpu.model)
            .and_then(|m| m.mig)
            .map(|m| m.axis_len)
            .unwrap_or(0),
        axis => axis,
    }
}

/// A MIG GPU's profiles: the node's reported ones, else the catalogue's for
/// its model; `None` when neither exists.
pub fn gpu_mig_profiles(gpu: &NodeGpu) -> Option<Cow<'_, [MigProfile]>> {
    if !gpu.mig_profiles.is_empty() {
        return Some(Cow::Borrowed(&gpu.mig_profiles));
    }
    let spec = catalogue::find_by_product_name(&gpu.model)?.mig?;
    Some(Cow::Owned(
        spec.profiles
            .iter()
            .map(MigProfile::from_catalogue)
            .collect(),
    ))
}

/// One node as the fit sees it.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its GPUs.
    pub inventory: &'a NodeGpus,
    /// What is held on them.
    pub usage: &'a NodeUsage,
    /// Settings in force on it.
    pub settings: &'a NodeSettings,
}

/// A node that can take the pod: the devices chosen and the node's score.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFit {
    /// One entry per container that asks for GPUs, in request order.
    pub containers: Vec<ContainerAllocation>,
    /// Score for prioritize, 0..=10 (kube-scheduler's extender range): under
    /// binpack higher on fuller nodes, under spread higher on emptier ones,
    /// judged on the GPUs' memory and cores held after placing the pod; for
    /// MIG devices the GPU whose remaining `room` stays largest is preferred
    /// within the node, and the node score uses slots held.
    pub score: u8,
}

/// Why a node cannot take the pod: one line a user can act on, e.g.
/// "fits the node's total but no single GPU has 8000 MiB free",
/// "no allowed MIG profile ≥ 30000 MiB on NVIDIA A30",
/// "placements free but fragmented: 3g.20gb needs slots 0-3 or 4-7".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// The reason.
    pub reason: String,
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

fn unfit(reason: impl Into<String>) -> Unfit {
    Unfit {
        reason: reason.into(),
    }
}

/// Why a GPU is not offered to this pod at all.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Exclusion {
    Filtered,
    Unhealthy,
    NoUseUuid,
    NotUseUuid,
    NoUseType,
    NotUseType,
    NodeModeShare,
    NodeModeMig,
    PodModeShare,
    PodModeMig,
}

impl Exclusion {
    /// Short per-GPU words.
    fn words(&self, request: &PodRequest) -> String {
        match self {
            Exclusion::Filtered => "excluded by nodeconfig filterdevices".into(),
            Exclusion::Unhealthy => "unhealthy".into(),
            Exclusion::NoUseUuid => "listed in nouse-gpuuuid".into(),
            Exclusion::NotUseUuid => "not listed in use-gpuuuid".into(),
            Exclusion::NoUseType => format!(
                "of a type in nouse-gputype ({})",
                request.nouse_types.join(",")
            ),
            Exclusion::NotUseType => {
                format!("not of type {} (use-gputype)", request.use_types.join(","))
            }
            Exclusion::NodeModeShare => "in MIG mode, node operatingmode is share".into(),
            Exclusion::NodeModeMig => "not in MIG mode, node operatingmode is mig".into(),
            Exclusion::PodModeShare => "in MIG mode, pod asks vgpu-mode share".into(),
            Exclusion::PodModeMig => "not in MIG mode, pod asks vgpu-mode mig".into(),
        }
    }

    /// The node's reason when every GPU is excluded this way.
    fn every_gpu(&self, request: &PodRequest) -> String {
        match self {
            Exclusion::Filtered => "every GPU is excluded by nodeconfig filterdevices".into(),
            Exclusion::Unhealthy => "no healthy GPU".into(),
            Exclusion::NoUseUuid => "every GPU is listed in nouse-gpuuuid".into(),
            Exclusion::NotUseUuid => "no GPU with a uuid listed in use-gpuuuid".into(),
            Exclusion::NoUseType => format!(
                "every GPU is of a type in nouse-gputype ({})",
                request.nouse_types.join(",")
            ),
            Exclusion::NotUseType => format!(
                "no GPU of type {} (use-gputype)",
                request.use_types.join(",")
            ),
            Exclusion::NodeModeShare => {
                "node operatingmode is share but every GPU is in MIG mode".into()
            }
            Exclusion::NodeModeMig => "node operatingmode is mig but no GPU is in MIG mode".into(),
            Exclusion::PodModeShare => {
                "pod asks for share slices (vgpu-mode) but every GPU is in MIG mode".into()
            }
            Exclusion::PodModeMig => {
                "pod asks for MIG instances (vgpu-mode: mig) but no GPU is in MIG mode".into()
            }
        }
    }
}

/// Why one GPU cannot take one device.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GpuFailure {
    MemoryShort { free: u64, ask: u64 },
    CoresShort { free: u32, ask: u32 },
    SplitFull { split: u32 },
    HeldExclusively,
    NeedsEmpty { slices: u32 },
    OtherKind,
    Mig(String),
}

impl GpuFailure {
    fn words(&self) -> String {
        match self {
            GpuFailure::MemoryShort { free, ask } => {
                format!("{free} MiB free, {ask} MiB asked")
            }
            GpuFailure::CoresShort { free, ask } => {
                format!("{free}% of cores free, {ask}% asked")
            }
            GpuFailure::SplitFull { split } => format!("split count reached ({split} slices)"),
            GpuFailure::HeldExclusively => "held exclusively (gpucores 100)".into(),
            GpuFailure::NeedsEmpty { slices } => {
                format!("gpucores 100 needs a GPU with no slice, it has {slices}")
            }
            GpuFailure::OtherKind => "holds devices of the other mode".into(),
            GpuFailure::Mig(words) => words.clone(),
        }
    }
}

/// One GPU as the fit sees it for this pod.
struct GpuContext<'a> {
    gpu: &'a NodeGpu,
    /// For a MIG GPU: its allowlisted profiles, or why it takes no MIG device.
    mig: Option<Result<Vec<MigProfile>, String>>,
}

/// A device one GPU can take, with how full the GPU is after it.
struct Offer {
    device: DeviceAllocation,
    /// 0 (empty) to 1 (full) after placing: the GPU policy's key.
    fullness_after: f64,
    gpu_index: u32,
}

/// Fits `request` on `node`: the devices for each container, or why not.
pub fn fit(
    request: &PodRequest,
    node: NodeView<'_>,
    config: &ClusterConfig,
) -> Result<NodeFit, Unfit> {
    let gpus = &node.inventory.gpus;
    if gpus.is_empty() {
        return Err(unfit("node inventory lists no GPU"));
    }
    let mut usable = Vec::new();
    let mut excluded: Vec<(u32, Exclusion)> = Vec::new();
    // The allowlist entry of each model, looked up once per model: a node's
    // GPUs are mostly of one model.
    let mut allowlists: Vec<(&str, Option<&[String]>)> = Vec::new();
    for gpu in gpus {
        match exclusion(gpu, request, node.settings) {
            Some(why) => excluded.push((gpu.index, why)),
            None => {
                let mig = gpu.mig.then(|| {
                    let allowed = match allowlists.iter().find(|(m, _)| *m == gpu.model) {
                        Some((_, allowed)) => *allowed,
                        None => {
                            let allowed = config.allowed_profiles(&gpu.model);
                            allowlists.push((&gpu.model, allowed));
                            allowed
                        }
                    };
                    allowed_mig_profiles(gpu, allowed)
                });
                usable.push(GpuContext { gpu, mig });
            }
        }
    }
    if usable.is_empty() {
        return Err(unfit(exclusion_reason(&excluded, request)));
    }
    let gpu_policy = request
        .gpu_policy
        .unwrap_or(config.scheduler.gpu_scheduler_policy.0);
    let node_policy = request
        .node_policy
        .unwrap_or(config.scheduler.node_scheduler_policy);
    let several = request.containers.len() > 1;
    let mut working = node.usage.clone();
    let mut chosen = Vec::with_capacity(request.containers.len());
    for container in &request.containers {
        if container.count as usize > usable.len() {
            let reason = if usable.len() == gpus.len() {
                format!(
                    "node has {} GPUs, pod asks for {} per container",
                    gpus.len(),
                    container.count
                )
            } else {
                format!(
                    "node has {} usable GPUs (of {}), pod asks for {} per container",
                    usable.len(),
                    gpus.len(),
                    container.count
                )
            };
            return Err(unfit(reason));
        }
        let devices = if container.init {
            // Runs alone: its slices are not held beside the other containers',
            // but its MIG instances live as long as the pod.
            let mut alone = working.clone();
            let devices = fit_container(container, &usable, &mut alone, node.settings, gpu_policy)
                .map_err(|reason| prefixed(several, container, reason))?;
            for device in devices
                .iter()
                .filter(|d| matches!(d, DeviceAllocation::Mig { .. }))
            {
                working
                    .gpus
                    .entry(device.uuid().to_owned())
                    .or_default()
                    .hold(device);
            }
            devices
        } else {
            fit_container(container, &usable, &mut working, node.settings, gpu_policy)
                .map_err(|reason| prefixed(several, container, reason))?
        };
        chosen.push(ContainerAllocation {
            index: container.index,
            name: container.name.clone(),
            init: container.init,
            devices,
        });
    }
    let fullness = node_fullness(gpus, &working, node.settings);
    let score = match node_policy {
        Policy::Binpack => fullness,
        Policy::Spread => 1.0 - fullness,
    };
    Ok(NodeFit {
        containers: chosen,
        score: (score * 10.0).round().clamp(0.0, 10.0) as u8,
    })
}

fn prefixed(several: bool, container: &ContainerRequest, reason: String) -> Unfit {
    if several {
        unfit(format!("container {:?}: {reason}", container.name))
    } else {
        unfit(reason)
    }
}

/// Why a GPU is not offered to this pod, if it is not.
fn exclusion(gpu: &NodeGpu, request: &PodRequest, settings: &NodeSettings) -> Option<Exclusion> {
    if settings.filter.excludes(gpu.index, &gpu.uuid) {
        return Some(Exclusion::Filtered);
    }
    if !gpu.healthy {
        return Some(Exclusion::Unhealthy);
    }
    if request.nouse_uuids.iter().any(|u| u == &gpu.uuid) {
        return Some(Exclusion::NoUseUuid);
    }
    if !request.use_uuids.is_empty() && !request.use_uuids.iter().any(|u| u == &gpu.uuid) {
        return Some(Exclusion::NotUseUuid);
    }
    if request
        .nouse_types
        .iter()
        .any(|t| gpu_type::matches(t, &gpu.model))
    {
        return Some(Exclusion::NoUseType);
    }
    if !request.use_types.is_empty()
        && !request
            .use_types
            .iter()
            .any(|t| gpu_type::matches(t, &gpu.model))
    {
        return Some(Exclusion::NotUseType);
    }
    match (settings.operating_mode, gpu.mig) {
        (Some(OperatingMode::Share), true) => return Some(Exclusion::NodeModeShare),
        (Some(OperatingMode::Mig), false) => return Some(Exclusion::NodeModeMig),
        _ => {}
    }
    match (request.mode, gpu.mig) {
        (ModeRequest::Share, true) => Some(Exclusion::PodModeShare),
        (ModeRequest::Mig, false) => Some(Exclusion::PodModeMig),
        _ => None,
    }
}

/// The node's reason when no GPU is offered at all.
fn exclusion_reason(excluded: &[(u32, Exclusion)], request: &PodRequest) -> String {
    let first = &excluded[0].1;
    if excluded.iter().all(|(_, why)| why == first) {
        return first.every_gpu(request);
    }
    let mut groups: BTreeMap<&Exclusion, Vec<u32>> = BTreeMap::new();
    for (index, why) in excluded {
        groups.entry(why).or_default().push(*index);
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(why, indexes)| format!("{} {}", gpu_list(indexes), why.words(request)))
        .collect();
    format!("no usable GPU: {}", parts.join("; "))
}

/// "GPU 1" or "GPUs 0,2".
fn gpu_list(indexes: &[u32]) -> String {
    let list: Vec<String> = indexes.iter().map(u32::to_string).collect();
    if indexes.len() == 1 {
        format!("GPU {}", list[0])
    } else {
        format!("GPUs {}", list.join(","))
    }
}

/// The allowlisted profiles of a MIG GPU, or why it takes no MIG device.
fn allowed_mig_profiles(
    gpu: &NodeGpu,
    allowed: Option<&[String]>,
) -> Result<Vec<MigProfile>, String> {
    let Some(profiles) = gpu_mig_profiles(gpu) else {
        return Err(format!(
            "{} reports no MIG profiles and the catalogue does not know the model",
            gpu.model
        ));
    };
    let Some(allowed) = allowed else {
        return Err(format!(
            "no migProfileAllowlist entry matches {}",
            gpu.model
        ));
    };
    let kept: Vec<MigProfile> = profiles
        .iter()
        .filter(|p| {
            allowed
                .iter()
                .any(|a| a.trim().eq_ignore_ascii_case(&p.name))
        })
        .cloned()
        .collect();
    if kept.is_empty() {
        return Err(format!(
            "none of the MIG profiles of {} is in migProfileAllowlist",
            gpu.model
        ));
    }
    Ok(kept)
}

/// The devices of one container on distinct GPUs, added to `working`; or why not.
fn fit_container(
    container: &ContainerRequest,
    usable: &[GpuContext<'_>],
    working: &mut NodeUsage,
    settings: &NodeSettings,
    policy: Policy,
) -> Result<Vec<DeviceAllocation>, String> {
    let mut offers = Vec::new();
    let mut failures: Vec<(u32, GpuFailure)> = Vec::new();
    for context in usable {
        let offer = match &context.mig {
            None => share_offer(context.gpu, container, working, settings),
            Some(profiles) => mig_offer(context.gpu, profiles, container, working),
        };
        match offer {
            Ok(offer) => offers.push(offer),
            Err(failure) => failures.push((context.gpu.index, failure)),
        }
    }
    let count = container.count as usize;
    if offers.len() < count {
        let reason = failure_reason(&failures);
        return Err(if offers.is_empty() {
            reason
        } else {
            format!(
                "only {} of the {count} GPUs asked can take it; {reason}",
                offers.len()
            )
        });
    }
    offers.sort_by(|a, b| {
        let by_fullness = a.fullness_after.total_cmp(&b.fullness_after);
        let by_fullness = match policy {
            Policy::Binpack => by_fullness.reverse(),
            Policy::Spread => by_fullness,
        };
        by_fullness.then(a.gpu_index.cmp(&b.gpu_index))
    });
    let devices: Vec<DeviceAllocation> = offers.into_iter().take(count).map(|o| o.device).collect();
    for device in &devices {
        working
            .gpus
            .entry(device.uuid().to_owned())
            .or_default()
            .hold(device);
    }
    Ok(devices)
}

/// A share slice on a share GPU, or why not.
fn share_offer(
    gpu: &NodeGpu,
    container: &ContainerRequest,
    usage: &NodeUsage,
    settings: &NodeSettings,
) -> Result<Offer, GpuFailure> {
    let empty = GpuUsage::default();
    let held = usage.gpus.get(&gpu.uuid).unwrap_or(&empty);
    if !held.mig.is_empty() {
        return Err(GpuFailure::OtherKind);
    }
    if held.exclusive {
        return Err(GpuFailure::HeldExclusively);
    }
    if held.slices >= settings.split_count {
        return Err(GpuFailure::SplitFull {
            split: settings.split_count,
        });
    }
    if container.cores >= 100 && held.slices > 0 {
        return Err(GpuFailure::NeedsEmpty {
            slices: held.slices,
        });
    }
    let ask = ask_mib(gpu, container.memory);
    let memory_cap = scaled(gpu.memory_mib, settings.memory_scaling);
    let free = memory_cap.saturating_sub(held.memory_mib);
    if ask > free {
        return Err(GpuFailure::MemoryShort { free, ask });
    }
    let cores_cap = u32::try_from(scaled(100, settings.core_scaling)).unwrap_or(u32::MAX);
    let free_cores = cores_cap.saturating_sub(held.cores);
    if container.cores > free_cores {
        return Err(GpuFailure::CoresShort {
            free: free_cores,
            ask: container.cores,
        });
    }
    let memory_after = (held.memory_mib + ask) as f64 / memory_cap.max(1) as f64;
    let cores_after = f64::from(held.cores + container.cores) / f64::from(cores_cap.max(1));
    Ok(Offer {
        device: DeviceAllocation::Share {
            uuid: gpu.uuid.clone(),
            memory_mib: ask,
            cores: container.cores,
        },
        fullness_after: memory_after.max(cores_after).min(1.0),
        gpu_index: gpu.index,
    })
}

/// `amount × scaling`, rounded down.
fn scaled(amount: u64, scaling: f64) -> u64 {
    let value = (amount as f64 * scaling).floor();
    if value.is_finite() && value >= 0.0 {
        value.min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// A MIG instance on a MIG GPU, or why not.
fn mig_offer(
    gpu: &NodeGpu,
    profiles: &Result<Vec<MigProfile>, String>,
    container: &ContainerRequest,
    usage: &NodeUsage,
) -> Result<Offer, GpuFailure> {
    let profiles = profiles.as_ref().map_err(|e| GpuFailure::Mig(e.clone()))?;
    if usage
        .gpus
        .get(&gpu.uuid)
        .is_some_and(|u| u.slices > 0 || u.memory_mib > 0)
    {
        return Err(GpuFailure::OtherKind);
    }
    let profile = pick_profile(gpu, profiles, container).ok_or_else(|| {
        let memory = match container.memory {
            MemoryRequest::Whole => "the whole GPU".to_owned(),
            other => format!("≥ {} MiB", ask_mib(gpu, other)),
        };
        let cores = if container.cores > 0 {
            format!(" with ≥ {}% of its SMs", container.cores)
        } else {
            String::new()
        };
        GpuFailure::Mig(format!(
            "no allowed MIG profile {memory}{cores} on {}",
            gpu.model
        ))
    })?;
    let occupancy = usage
        .try_occupancy(gpu)
        .map_err(|e| GpuFailure::Mig(format!("MIG state of GPU {}: {e}", gpu.index)))?;
    let instances = usage
        .gpus
        .get(&gpu.uuid)
        .map(|u| u.mig.iter().filter(|(id, _)| *id == profile.id).count())
        .unwrap_or(0);
    if instances >= profile.max_instances as usize {
        return Err(GpuFailure::Mig(format!(
            "{} instance limit reached ({} per GPU)",
            profile.name, profile.max_instances
        )));
    }
    let Some(chosen) = placement::choose(
        &occupancy,
        profile,
        profiles,
        PlacementPolicy::LeastStranded,
    ) else {
        return Err(GpuFailure::Mig(
            if occupancy.free_slots() >= profile.memory_slices {
                format!(
                    "placements free but fragmented: {} needs slots {}",
                    profile.name,
                    slot_ranges(&profile.placements)
                )
            } else {
                format!(
                    "no room for {}: {} of {} slots free, it needs {}",
                    profile.name,
                    occupancy.free_slots(),
                    occupancy.axis_len(),
                    profile.memory_slices
                )
            },
        ));
    };
    let mut after = occupancy;
    let room_before_any = Occupancy::new(occupancy.axis_len())
        .map(|empty| placement::room(&empty, profiles))
        .unwrap_or(0);
    let fullness_after = if after.occupy(chosen).is_ok() && room_before_any > 0 {
        1.0 - placement::room(&after, profiles) as f64 / room_before_any as f64
    } else {
        1.0
    };
    Ok(Offer {
        device: DeviceAllocation::Mig {
            uuid: gpu.uuid.clone(),
            profile: profile.name.clone(),
            profile_id: profile.id,
            placement: chosen,
            memory_mib: profile.memory_mib,
            realized: None,
        },
        fullness_after,
        gpu_index: gpu.index,
    })
}

/// MiB asked of a GPU (a percentage is of its whole memory, rounded up).
fn ask_mib(gpu: &NodeGpu, memory: MemoryRequest) -> u64 {
    match memory {
        MemoryRequest::Mib(mib) => mib,
        MemoryRequest::Percent(p) => gpu.memory_mib.saturating_mul(u64::from(p)).div_ceil(100),
        MemoryRequest::Whole => gpu.memory_mib,
    }
}

/// The smallest allowlisted profile (memory, then compute slices, then id)
/// with the memory and SM share asked; the largest for a whole-GPU ask.
fn pick_profile<'p>(
    gpu: &NodeGpu,
    profiles: &'p [MigProfile],
    container: &ContainerRequest,
) -> Option<&'p MigProfile> {
    let max_compute = profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0);
    let sm_share = |p: &MigProfile| -> u64 {
        if gpu.sm_count > 0 {
            u64::from(p.sm_count) * 100 / u64::from(gpu.sm_count)
        } else if max_compute > 0 {
            u64::from(p.compute_slices) * 100 / u64::from(max_compute)
        } else {
            0
        }
    };
    let enough_cores = |p: &&MigProfile| sm_share(p) >= u64::from(container.cores);
    let order = |p: &&MigProfile| (p.memory_mib, p.compute_slices, p.id);
    match container.memory {
        MemoryRequest::Whole => profiles.iter().filter(enough_cores).max_by_key(order),
        memory => {
            let ask = ask_mib(gpu, memory);
            profiles
                .iter()
                .filter(|p| p.memory_mib >= ask)
                .filter(enough_cores)
                .min_by_key(order)
        }
    }
}

/// "0-3 or 4-7", "0, 1, 2 or 3".
fn slot_ranges(placements: &[Placement]) -> String {
    let parts: Vec<String> = placements
        .iter()
        .map(|p| {
            if p.size == 1 {
                p.start.to_string()
            } else {
                format!("{}-{}", p.start, p.end() - 1)
            }
        })
        .collect();
    match parts.split_last() {
        None => "none".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// One line from every usable GPU's failure: the most telling summary when
/// they agree, else each GPU's own.
fn failure_reason(failures: &[(u32, GpuFailure)]) -> String {
    let Some((_, first)) = failures.first() else {
        return "no GPU can take it".into();
    };
    if let GpuFailure::MemoryShort { ask, .. } = first {
        let all_memory: Option<Vec<u64>> = failures
            .iter()
            .map(|(_, f)| match f {
                GpuFailure::MemoryShort { free, ask: a } if a == ask => Some(*free),
                _ => None,
            })
            .collect();
        if let Some(frees) = all_memory {
            let total: u64 = frees.iter().sum();
            let most = frees.iter().copied().max().unwrap_or(0);
            return if frees.len() > 1 && total >= *ask {
                format!("fits the node's total but no single GPU has {ask} MiB free")
            } else {
                format!("no GPU has {ask} MiB free (most free: {most} MiB)")
            };
        }
    }
    if failures.iter().all(|(_, f)| f == first) {
        return match first {
            GpuFailure::SplitFull { split } if failures.len() > 1 => {
                format!("GPU split count reached ({split} slices) on every GPU")
            }
            GpuFailure::Mig(words) => words.clone(),
            other if failures.len() > 1 => format!("every GPU: {}", other.words()),
            other => format!("GPU {}: {}", failures[0].0, other.words()),
        };
    }
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    for (index, failure) in failures {
        let words = failure.words();
        match groups.iter_mut().find(|(w, _)| *w == words) {
            Some((_, indexes)) => indexes.push(*index),
            None => groups.push((words, vec![*index])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(words, indexes)| format!("{}: {words}", gpu_list(indexes)))
        .collect();
    parts.join("; ")
}

/// How full the node is after placing, 0..=1: per healthy, unfiltered GPU the
/// mean of memory and core fractions held (share) or the fraction of slots
/// held (MIG), averaged.
fn node_fullness(gpus: &[NodeGpu], usage: &NodeUsage, settings: &NodeSettings) -> f64 {
    let empty = GpuUsage::default();
    let mut sum = 0.0;
    let mut counted = 0u32;
    for gpu in gpus {
        if !gpu.healthy || settings.filter.excludes(gpu.index, &gpu.uuid) {
            continue;
        }
        let held = usage.gpus.get(&gpu.uuid).unwrap_or(&empty);
        let fullness = if gpu.mig {
            let occupancy = usage.occupancy(gpu);
            f64::from(occupancy.used_slots()) / f64::from(occupancy.axis_len().max(1))
        } else {
            let memory = held.memory_mib as f64
                / scaled(gpu.memory_mib, settings.memory_scaling).max(1) as f64;
            let cores = f64::from(held.cores) / scaled(100, settings.core_scaling).max(1) as f64;
            if held.exclusive {
                1.0
            } else {
                (memory + cores) / 2.0
            }
        };
        sum += fullness.clamp(0.0, 1.0);
        counted += 1;
    }
    if counted == 0 {
        0.0
    } else {
        sum / f64::from(counted)
    }
}

/// The allocation to write for a fit.
pub fn allocation_for(node: &str, fit: &NodeFit) -> Allocation {
    Allocation {
        version: super::allocation::ALLOCATION_VERSION,
        node: node.to_string(),
        containers: fit.containers.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(sm_count: u32) -> NodeGpu {
        NodeGpu {
            uuid: "GPU-a".into(),
            index: 0,
            model: "NVIDIA A100-SXM4-40GB".into(),
            memory_mib: 40960,
            sm_count,
            mig: true,
            healthy: true,
            mig_profiles: vec![],
            foreign_instances: vec![],
        }
    }

    fn ask(memory: MemoryRequest, cores: u32) -> ContainerRequest {
        ContainerRequest {
            index: 0,
            name: "main".into(),
            init: false,
            count: 1,
            memory,
            cores,
        }
    }

    fn picked(gpu: &NodeGpu, memory: MemoryRequest, cores: u32) -> Option<String> {
        let profiles = gpu_mig_profiles(gpu).expect("catalogue model");
        pick_profile(gpu, &profiles, &ask(memory, cores)).map(|p| p.name.clone())
    }

    #[test]
    fn slot_ranges_read_as_written() {
        let p = |start, size| Placement { start, size };
        assert_eq!(slot_ranges(&[p(0, 4), p(4, 4)]), "0-3 or 4-7");
        assert_eq!(
            slot_ranges(&[p(0, 1), p(1, 1), p(2, 1), p(3, 1)]),
            "0, 1, 2 or 3"
        );
        assert_eq!(slot_ranges(&[p(6, 2)]), "6-7");
        assert_eq!(slot_ranges(&[]), "none");
    }

    #[test]
    fn the_profile_is_the_smallest_with_the_memory_and_sm_share_asked() {
        // A100-40GB (mig.md): 1g 14 SMs, 2g 28, 3g 42, 4g 56, 7g 98 of 108;
        // shares 12 %, 25 %, 38 %, 51 %, 90 %.
        let gpu = a100(108);
        assert_eq!(
            picked(&gpu, MemoryRequest::Mib(1000), 0).as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            picked(&gpu, MemoryRequest::Mib(1000), 50).as_deref(),
            Some("4g.20gb")
        );
        assert_eq!(
            picked(&gpu, MemoryRequest::Mib(1000), 90).as_deref(),
            Some("7g.40gb")
        );
        assert_eq!(picked(&gpu, MemoryRequest::Mib(1000), 100), None);
        // smCount unknown: compute slices over 7 (4/7 = 57 %, 3/7 = 42 %).
        assert_eq!(
            picked(&a100(0), MemoryRequest::Mib(1000), 50).as_deref(),
            Some("4g.20gb")
        );
        // 50 % of 40960 is 20480 MiB: 3g.20gb (≈ 19.62 GiB, 20096) is short.
        assert_eq!(
            picked(&gpu, MemoryRequest::Percent(50), 0).as_deref(),
            Some("7g.40gb")
        );
        // The whole GPU: the largest profile.
        assert_eq!(
            picked(&gpu, MemoryRequest::Whole, 0).as_deref(),
            Some("7g.40gb")
        );
        assert_eq!(picked(&gpu, MemoryRequest::Mib(41000), 0), None);
    }

    #[test]
    fn a_mig_gpu_without_a_known_layout_takes_no_instance() {
        let mut gpu = a100(108);
        gpu.model = "NVIDIA Future GPU".into();
        assert!(gpu_mig_profiles(&gpu).is_none());
        let config = ClusterConfig::default();
        let reason =
            allowed_mig_profiles(&gpu, config.allowed_profiles(&gpu.model)).expect_err("unknown");
        assert_eq!(
            reason,
            "NVIDIA Future GPU reports no MIG profiles and the catalogue does not know the model"
        );
        // Its occupancy has nothing to place on, and reports no error while empty.
        assert!(NodeUsage::default().try_occupancy(&gpu).is_ok());
    }

    #[test]
    fn the_peak_of_a_pod_is_its_larger_phase_per_gpu() {
        let share = |uuid: &str, memory_mib, cores| DeviceAllocation::Share {
            uuid: uuid.into(),
            memory_mib,
            cores,
        };
        let container = |index, init, devices| ContainerAllocation {
            index,
            name: format!("c{index}"),
            init,
            devices,
        };
        let allocation = Allocation {
            version: 1,
            node: "n".into(),
            containers: vec![
                container(0, true, vec![share("GPU-a", 9000, 10)]),
                container(1, true, vec![share("GPU-a", 1000, 60)]),
                container(
                    2,
                    false,
                    vec![share("GPU-a", 3000, 20), share("GPU-b", 500, 0)],
                ),
                container(3, false, vec![share("GPU-a", 3000, 20)]),
            ],
        };
        let usage = NodeUsage::from_allocations([&allocation, &allocation]);
        // Per pod on GPU-a: memory max(9000, 1000, 6000) = 9000, cores
        // max(10, 60, 40) = 60, slices max(1, 1, 2) = 2; two pods: double.
        let a = &usage.gpus["GPU-a"];
        assert_eq!(
            (a.memory_mib, a.cores, a.slices, a.exclusive),
            (18000, 120, 4, false)
        );
        let b = &usage.gpus["GPU-b"];
        assert_eq!((b.memory_mib, b.cores, b.slices), (1000, 0, 2));
    }
}
