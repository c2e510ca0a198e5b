//! The cluster's GPU allocation report: what `GET /inspect` returns and what
//! `kubectl tessera inspect` prints.
//!
//! [`build`] is pure: it reads plain Node and Pod objects (the node annotation
//! `tessera.io/node-gpus`, the pod annotations `tessera.io/allocation` and
//! `tessera.io/bind-phase`) and never fails: an unreadable annotation is shown
//! in the report, next to what could be read. [`fetch`] reads those objects
//! from the API for the kubectl plugin.
//!
//! # What counts
//!
//! A pod holds devices when its `tessera.io/allocation` parses and its phase
//! is neither `Succeeded` nor `Failed` (the extender's rule). It is charged to
//! the node its allocation names. Per GPU:
//!
//! - share GPU: memory = the sum of the slices' `memoryMiB`; cores = the sum
//!   of their `cores` (100 per GPU); slices = the number of slices. Per pod,
//!   as kubelet runs them: its regular containers together or its largest
//!   init container, whichever holds more, never both (the extender's rule);
//! - MIG GPU: memory = the sum of the instances' memory (the allocation's
//!   `memoryMiB`, else the profile's from the node's inventory, else from the
//!   catalogue); cores = the instances' compute slices as a share of the
//!   GPU's (`floor(100 × used / total)`, total = the compute slices of the
//!   model's largest profile in the catalogue, 7 on A100, else of the largest
//!   reported profile: at most 100 for a legal layout, and more slices than
//!   the total is named in the GPU's problems); slices = the number of
//!   reserved instances (an init container's too: an instance lives as long
//!   as its pod). Foreign instances (made outside Tessera) show in the slot
//!   map only.
//!
//! Memory totals are physical MiB (the inventory's): a node's
//! `deviceMemoryScaling` (share-GPU memory oversubscription) is not applied,
//! so with scaling above 1 a share GPU's allocated memory may exceed its
//! total. The table says so under the cluster's totals.
//!
//! # The slot map
//!
//! A MIG GPU's memory-slice axis from slot 0 to its end, each run written
//! `[what:first-last]` (`[what:n]` for one slot): `what` is the reserved
//! profile, `foreign` or `free`, e.g. `[3g.20gb:0-3][1g.5gb:4][free:5-7]`.
//! The axis length comes from the GPU's reported profiles, else the catalogue
//! model of its product name. An instance overlapping an earlier one (a
//! corrupt state: never a legal layout) is written with `!` before the closing
//! bracket, `[1g.5gb:2!]`, and named in the GPU's problems.
//!
//! # JSON (version 1)
//!
//! Every key is always present (`null` where the text says "or null"); lists
//! are sorted (nodes by name, GPUs by index, pods by namespace/name/container).
//!
//! ```json
//! {"version": 1,
//!  "nodes": [
//!   {"name": "gpu-node-1",
//!    "inventoryError": null,             // or the parse error of tessera.io/node-gpus
//!    "podsHoldingDevices": 2,            // distinct pods (all namespaces)
//!    "gpus": [
//!     {"index": 0, "uuid": "GPU-…", "model": "NVIDIA A100-SXM4-40GB",
//!      "mode": "share",                  // or "mig"
//!      "healthy": true,
//!      "memoryMiB": {"allocated": 8000, "total": 40960},   // physical: deviceMemoryScaling not applied
//!      "cores": {"allocated": 30, "total": 100},
//!      "slices": 1,
//!      "mig": null,                      // for MIG GPUs:
//!      // {"axisLen": 8, "slotMap": "[3g.20gb:0-3][free:4-7]",
//!      //  "segments": [{"kind": "reserved", "profile": "3g.20gb", "start": 0, "size": 4, "overlap": false}, …]}
//!      "pods": [{"namespace": "default", "name": "train", "container": "main",
//!                "init": false,          // true for an init container
//!                "uuid": "GPU-…", "memoryMiB": 8000,
//!                "cores": 30,            // share slices; null for MIG instances
//!                "profile": null,        // MIG instances: the profile name
//!                "placement": null,      // MIG instances: {"start": 0, "size": 4}
//!                "bindPhase": "success"}],   // or null
//!      "problems": []}],
//!    "unknownGpuDevices": [],           // devices naming a GPU the inventory lacks (same shape as "pods")
//!    "problems": []}],
//!  "unreadablePods": [{"namespace": "default", "name": "x", "node": "gpu-node-1", "error": "tessera.io/allocation: …"}],
//!  "problems": [],                      // e.g. allocations naming a node that does not exist
//!  "summary": {"gpus": 2, "memoryMiB": {"allocated": 8000, "total": 81920},
//!              "cores": {"allocated": 30, "total": 200}, "podsHoldingDevices": 2}}
//! ```

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;
use tessera_model::contract::annotations;
use tessera_model::mig::catalogue;
use tessera_model::mig::placement::Placement;
use tessera_model::sched::allocation::{Allocation, DeviceAllocation};
use tessera_model::sched::inventory::{NodeGpu, NodeGpus};
use thiserror::Error;

/// Version of the report's JSON shape; bumped on any incompatible change.
pub const REPORT_VERSION: u32 = 1;

/// Cores of one whole GPU: a share slice's `cores` are percent of a GPU.
pub const CORES_PER_GPU: u64 = 100;

/// The cluster's GPU allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// Nodes with GPUs (or with pods charged to them), by name.
    pub nodes: Vec<NodeReport>,
    /// Pods whose `tessera.io/allocation` does not parse, with the error.
    pub unreadable_pods: Vec<UnreadablePod>,
    /// Problems not tied to a node of the report (an allocation naming a
    /// node that does not exist).
    pub problems: Vec<String>,
    /// Totals over the nodes of the report.
    pub summary: Summary,
}

/// Totals over the report's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// GPUs in the readable inventories.
    pub gpus: usize,
    /// Memory of every GPU, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Usage,
    /// Cores of every GPU (100 per GPU).
    pub cores: Usage,
    /// Distinct pods holding devices on the report's nodes.
    pub pods_holding_devices: usize,
}

/// How much of something is allocated, out of how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Usage {
    /// Reserved by pods.
    pub allocated: u64,
    /// There is.
    pub total: u64,
}

impl Usage {
    fn add(&mut self, other: Usage) {
        self.allocated = self.allocated.saturating_add(other.allocated);
        self.total = self.total.saturating_add(other.total);
    }

    /// `allocated` as a whole percent of `total`, rounded down (0 of nothing is 0).
    pub fn percent(&self) -> u64 {
        self.allocated
            .saturating_mul(100)
            .checked_div(self.total)
            .unwrap_or(0)
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Node name.
    pub name: String,
    /// Why `tessera.io/node-gpus` could not be read (absent, corrupt, another
    /// version); `None` when it was.
    pub inventory_error: Option<String>,
    /// Distinct pods holding devices on the node, in every namespace.
    pub pods_holding_devices: usize,
    /// The node's GPUs, by index.
    pub gpus: Vec<GpuReport>,
    /// Devices of pods naming a GPU that is not in the node's inventory (or
    /// all of them, when the inventory is unreadable).
    pub unknown_gpu_devices: Vec<PodDevice>,
    /// Other things wrong on the node (a pod bound elsewhere than its allocation says).
    pub problems: Vec<String>,
}

/// How a GPU is handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// vGPU slices of the whole GPU.
    Share,
    /// MIG instances.
    Mig,
}

impl GpuMode {
    /// `share` or `mig`.
    pub fn as_str(&self) -> &'static str {
        match self {
            GpuMode::Share => "share",
            GpuMode::Mig => "mig",
        }
    }
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// NVML index on the node.
    pub index: u32,
    /// `GPU-…` uuid.
    pub uuid: String,
    /// Product name as NVML reports it.
    pub model: String,
    /// Share or MIG.
    pub mode: GpuMode,
    /// Whether the device plugin considers it healthy.
    pub healthy: bool,
    /// Memory, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Usage,
    /// Cores, percent of the GPU (total 100).
    pub cores: Usage,
    /// Share slices or MIG instances reserved on it.
    pub slices: u64,
    /// The MIG layout, for a MIG GPU.
    pub mig: Option<MigLayout>,
    /// The pods' devices on this GPU.
    pub pods: Vec<PodDevice>,
    /// What is inconsistent on this GPU (overlapping instances, unknown profiles …).
    pub problems: Vec<String>,
}

/// A MIG GPU's memory-slice axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigLayout {
    /// Slots on the axis (8 on A100).
    pub axis_len: u32,
    /// The slot map, e.g. `[3g.20gb:0-3][1g.5gb:4][free:5-7]`.
    pub slot_map: String,
    /// The same, as data, in slot order.
    pub segments: Vec<Segment>,
}

/// What a run of slots holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentKind {
    /// An instance reserved by a pod's allocation.
    Reserved,
    /// An instance Tessera did not make (from the node's inventory).
    Foreign,
    /// Nothing.
    Free,
}

/// A run of slots on a MIG GPU's axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Segment {
    /// Reserved, foreign or free.
    pub kind: SegmentKind,
    /// The profile of a reserved instance; `None` otherwise.
    pub profile: Option<String>,
    /// First slot.
    pub start: u32,
    /// Slots.
    pub size: u32,
    /// True when it overlaps an earlier segment (a corrupt state).
    pub overlap: bool,
}

/// One device a pod's container holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodDevice {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Container name.
    pub container: String,
    /// True for an init container (its share slices are not held at the
    /// same time as the regular containers').
    pub init: bool,
    /// The (parent) GPU's uuid.
    pub uuid: String,
    /// Memory, MiB (a MIG instance's: see the module docs).
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// A share slice's cores (percent of the GPU); `None` for a MIG instance.
    pub cores: Option<u32>,
    /// A MIG instance's profile; `None` for a share slice.
    pub profile: Option<String>,
    /// A MIG instance's placement; `None` for a share slice.
    pub placement: Option<Placement>,
    /// The pod's `tessera.io/bind-phase`, if set.
    pub bind_phase: Option<String>,
}

/// A pod whose `tessera.io/allocation` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadablePod {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The node it is bound to (`spec.nodeName`), if any.
    pub node: Option<String>,
    /// The parse error.
    pub error: String,
}

/// Which part of the cluster a report shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Only these nodes (all when `None`).
    pub nodes: Option<BTreeSet<String>>,
    /// List only pods of this namespace. The figures still count every
    /// namespace's pods: free memory and free slots are the node's, not the
    /// namespace's.
    pub namespace: Option<String>,
}

impl Scope {
    fn has_node(&self, node: &str) -> bool {
        self.nodes.as_ref().is_none_or(|n| n.contains(node))
    }

    fn lists(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }
}

/// The report of the whole cluster: every node with a `tessera.io/node-gpus`
/// annotation or with pods charged to it, every pod.
pub fn build(nodes: &[Node], pods: &[Pod]) -> Report {
    build_scoped(nodes, pods, &Scope::default())
}

/// The report of part of the cluster (see [`Scope`]). `nodes` and `pods`
/// may hold more than the scope: what is outside it is left out.
pub fn build_scoped(nodes: &[Node], pods: &[Pod], scope: &Scope) -> Report {
    let mut problems = Vec::new();
    let mut unreadable_pods = Vec::new();

    // Devices per node, from the pods holding devices.
    let mut held: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    let mut sorted_pods: Vec<&Pod> = pods.iter().collect();
    sorted_pods.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
    for pod in sorted_pods {
        if is_finished(pod) {
            continue;
        }
        let Some(text) = annotation(&pod.metadata.annotations, annotations::ALLOCATION) else {
            continue;
        };
        let (namespace, name) = pod_name(pod);
        let bound_to = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let allocation = match Allocation::parse(text) {
            Ok(a) => a,
            Err(e) => {
                let in_scope = bound_to.as_deref().is_none_or(|n| scope.has_node(n));
                if in_scope && scope.lists(&namespace) {
                    unreadable_pods.push(UnreadablePod {
                        namespace,
                        name,
                        node: bound_to,
                        error: e.to_string(),
                    });
                }
                continue;
            }
        };
        let bind_phase =
            annotation(&pod.metadata.annotations, annotations::BIND_PHASE).map(str::to_owned);
        let held_here = held.entry(allocation.node.clone()).or_default();
        for (container, device) in allocation.devices() {
            held_here.push(Held {
                bound_to: bound_to.clone(),
                container_index: container.index,
                node: allocation.node.clone(),
                device: device.clone(),
                listed: PodDevice {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    container: container.name.clone(),
                    init: container.init,
                    uuid: device.uuid().to_owned(),
                    memory_mib: 0,
                    cores: None,
                    profile: None,
                    placement: None,
                    bind_phase: bind_phase.clone(),
                },
            });
        }
    }

    let known: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, n)))
        .collect();
    for (node, devices) in &held {
        if !known.contains_key(node.as_str()) && scope.has_node(node) {
            let pods: BTreeSet<String> = devices
                .iter()
                .map(|h| format!("{}/{}", h.listed.namespace, h.listed.name))
                .collect();
            let pods: Vec<String> = pods.into_iter().collect();
            problems.push(format!(
                "node {node} does not exist, but the allocations of {} name it",
                pods.join(", ")
            ));
        }
    }

    let mut node_reports = Vec::new();
    for (name, node) in &known {
        if !scope.has_node(name) {
            continue;
        }
        let devices = held.get(*name).map(Vec::as_slice).unwrap_or_default();
        let inventory = annotation(&node.metadata.annotations, annotations::NODE_GPUS);
        if inventory.is_none() && devices.is_empty() && scope.nodes.is_none() {
            // A node without GPUs and without pods charged to it.
            continue;
        }
        node_reports.push(node_report(name, inventory, devices, scope));
    }

    let mut summary = Summary::default();
    for node in &node_reports {
        summary.gpus += node.gpus.len();
        summary.pods_holding_devices += node.pods_holding_devices;
        for gpu in &node.gpus {
            // Saturating: a hand-edited annotation may hold any u64.
            summary.memory_mib.add(gpu.memory_mib);
            summary.cores.add(gpu.cores);
        }
    }

    Report {
        version: REPORT_VERSION,
        nodes: node_reports,
        unreadable_pods,
        problems,
        summary,
    }
}

/// A device held by a pod, charged to the node its allocation names.
struct Held {
    bound_to: Option<String>,
    /// The container's index in the pod (init containers are told apart by it).
    container_index: u32,
    node: String,
    device: DeviceAllocation,
    /// What the report lists (memory and the mode fields filled in later).
    listed: PodDevice,
}

fn node_report(name: &str, inventory: Option<&str>, devices: &[Held], scope: &Scope) -> NodeReport {
    let mut problems = Vec::new();
    let pods_holding_devices = devices
        .iter()
        .map(|h| (&h.listed.namespace, &h.listed.name))
        .collect::<BTreeSet<_>>()
        .len();
    let mut misbound = BTreeSet::new();
    for held in devices {
        if let Some(bound_to) = &held.bound_to
            && bound_to != &held.node
        {
            misbound.insert(format!(
                "pod {}/{} is bound to node {bound_to} but its allocation names node {}",
                held.listed.namespace, held.listed.name, held.node
            ));
        }
    }
    problems.extend(misbound);

    let (gpus, inventory_error) = match inventory.map(NodeGpus::parse) {
        Some(Ok(inventory)) => (inventory.gpus, None),
        Some(Err(e)) => (Vec::new(), Some(e.to_string())),
        None => (
            Vec::new(),
            Some(format!("no {} annotation", annotations::NODE_GPUS)),
        ),
    };
    let mut gpus: Vec<GpuReport> = {
        let mut sorted: Vec<&NodeGpu> = gpus.iter().collect();
        sorted.sort_by_key(|g| g.index);
        sorted
            .into_iter()
            .map(|gpu| {
                let on_gpu: Vec<&Held> = devices
                    .iter()
                    .filter(|h| h.device.uuid() == gpu.uuid)
                    .collect();
                gpu_report(gpu, &on_gpu, scope)
            })
            .collect()
    };
    gpus.sort_by_key(|g| g.index);

    let known: BTreeSet<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    let unknown_gpu_devices = devices
        .iter()
        .filter(|h| !known.contains(h.device.uuid()) && scope.lists(&h.listed.namespace))
        .map(|h| {
            let mut listed = h.listed.clone();
            fill_device(&mut listed, &h.device, None);
            listed
        })
        .collect();

    NodeReport {
        name: name.to_owned(),
        inventory_error,
        pods_holding_devices,
        gpus,
        unknown_gpu_devices,
        problems,
    }
}

/// What one MIG profile brings: memory and compute slices.
#[derive(Clone, Copy)]
struct ProfileFacts {
    memory_mib: u64,
    compute_slices: u32,
}

/// The facts of profile `id` on this GPU: its reported profiles, else the catalogue model.
fn profile_facts(gpu: &NodeGpu, id: u32) -> Option<ProfileFacts> {
    if let Some(p) = gpu.mig_profiles.iter().find(|p| p.id == id) {
        return Some(ProfileFacts {
            memory_mib: p.memory_mib,
            compute_slices: p.compute_slices,
        });
    }
    if !gpu.mig_profiles.is_empty() {
        return None;
    }
    catalogue_mig(gpu)
        .and_then(|mig| mig.profile_by_id(id))
        .map(|p| ProfileFacts {
            memory_mib: p.memory_mib,
            compute_slices: p.compute_slices,
        })
}

fn catalogue_mig(gpu: &NodeGpu) -> Option<catalogue::MigSpec> {
    catalogue::find_by_product_name(&gpu.model).and_then(|m| m.mig)
}

/// Compute slices of the whole GPU: the largest profile's, from the
/// catalogue when it knows the model (a device plugin may report only some
/// profiles, e.g. the allowlisted ones, and the largest reported one is then
/// not the whole GPU), else the largest reported.
fn total_compute_slices(gpu: &NodeGpu) -> u32 {
    catalogue_mig(gpu)
        .and_then(|m| m.profiles.iter().map(|p| p.compute_slices).max())
        .or_else(|| gpu.mig_profiles.iter().map(|p| p.compute_slices).max())
        .unwrap_or(0)
}

/// Fills a listed device's memory and mode fields; `gpu` gives MIG profile
/// facts when the allocation carries no memory.
fn fill_device(listed: &mut PodDevice, device: &DeviceAllocation, gpu: Option<&NodeGpu>) {
    match device {
        DeviceAllocation::Share {
            memory_mib, cores, ..
        } => {
            listed.memory_mib = *memory_mib;
            listed.cores = Some(*cores);
        }
        DeviceAllocation::Mig {
            profile,
            profile_id,
            placement,
            memory_mib,
            ..
        } => {
            listed.memory_mib = if *memory_mib > 0 {
                *memory_mib
            } else {
                gpu.and_then(|g| profile_facts(g, *profile_id))
                    .map_or(0, |f| f.memory_mib)
            };
            listed.profile = Some(profile.clone());
            listed.placement = Some(*placement);
        }
    }
}

fn gpu_report(gpu: &NodeGpu, devices: &[&Held], scope: &Scope) -> GpuReport {
    let mode = if gpu.mig {
        GpuMode::Mig
    } else {
        GpuMode::Share
    };
    let mut problems = Vec::new();
    let mut compute_slices: u64 = 0;
    let mut mig_memory: u64 = 0;
    let mut mig_instances: u64 = 0;
    // Share slices per pod: the regular containers together, each init
    // container alone (kubelet runs them one at a time, before the others).
    let mut share_by_pod: BTreeMap<(&str, &str), PodShare> = BTreeMap::new();
    let mut pods = Vec::new();
    let mut reserved: Vec<(Placement, String)> = Vec::new();

    for held in devices {
        let mut listed = held.listed.clone();
        fill_device(&mut listed, &held.device, Some(gpu));
        let who = format!(
            "pod {}/{} container {}",
            listed.namespace, listed.name, listed.container
        );
        match &held.device {
            DeviceAllocation::Share {
                memory_mib, cores, ..
            } => {
                let slice = ShareUse {
                    slices: 1,
                    memory_mib: *memory_mib,
                    cores: u64::from(*cores),
                };
                let pod = share_by_pod
                    .entry((&held.listed.namespace, &held.listed.name))
                    .or_default();
                if held.listed.init {
                    pod.init.entry(held.container_index).or_default().add(slice);
                } else {
                    pod.regular.add(slice);
                }
                if gpu.mig {
                    problems.push(format!("{who} holds a share slice of this MIG GPU"));
                }
            }
            DeviceAllocation::Mig {
                profile,
                profile_id,
                placement,
                ..
            } => {
                // A MIG instance lives as long as its pod, init container or not.
                mig_memory = mig_memory.saturating_add(listed.memory_mib);
                mig_instances += 1;
                if !gpu.mig {
                    problems.push(format!(
                        "{who} holds a MIG instance ({profile}) of this GPU, whose MIG mode is off"
                    ));
                }
                match profile_facts(gpu, *profile_id) {
                    Some(facts) => compute_slices += u64::from(facts.compute_slices),
                    None => problems.push(format!(
                        "{who}: profile id {profile_id} ({profile}) is not one of this GPU's"
                    )),
                }
                reserved.push((*placement, profile.clone()));
            }
        }
        if scope.lists(&listed.namespace) {
            pods.push(listed);
        }
    }

    let mut share = ShareUse::default();
    for pod in share_by_pod.values() {
        share.add(pod.peak());
    }
    let total_slices = u64::from(total_compute_slices(gpu));
    if total_slices > 0 && compute_slices > total_slices {
        problems.push(format!(
            "{compute_slices} compute slices reserved, more than the GPU's {total_slices}"
        ));
    }
    let mig_cores = compute_slices
        .saturating_mul(CORES_PER_GPU)
        .checked_div(total_slices)
        .unwrap_or(0);
    let memory = Usage {
        allocated: share.memory_mib.saturating_add(mig_memory),
        total: gpu.memory_mib,
    };

    let mig = gpu.mig.then(|| mig_layout(gpu, &reserved, &mut problems));

    GpuReport {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model.clone(),
        mode,
        healthy: gpu.healthy,
        memory_mib: memory,
        cores: Usage {
            allocated: share.cores.saturating_add(mig_cores),
            total: CORES_PER_GPU,
        },
        slices: share.slices.saturating_add(mig_instances),
        mig,
        pods,
        problems,
    }
}

/// Share slices held on one GPU.
#[derive(Debug, Clone, Copy, Default)]
struct ShareUse {
    slices: u64,
    memory_mib: u64,
    cores: u64,
}

impl ShareUse {
    fn add(&mut self, other: ShareUse) {
        self.slices = self.slices.saturating_add(other.slices);
        self.memory_mib = self.memory_mib.saturating_add(other.memory_mib);
        self.cores = self.cores.saturating_add(other.cores);
    }
}

/// One pod's share slices on one GPU, by phase.
#[derive(Debug, Default)]
struct PodShare {
    regular: ShareUse,
    init: BTreeMap<u32, ShareUse>,
}

impl PodShare {
    /// The most the pod holds at once: its regular containers together or
    /// one init container, whichever holds more (field by field).
    fn peak(&self) -> ShareUse {
        self.init
            .values()
            .fold(self.regular, |peak, init| ShareUse {
                slices: peak.slices.max(init.slices),
                memory_mib: peak.memory_mib.max(init.memory_mib),
                cores: peak.cores.max(init.cores),
            })
    }
}

/// The axis length of a MIG GPU: its reported profiles, else the catalogue.
fn axis_len(gpu: &NodeGpu) -> Option<u32> {
    match gpu.axis_len() {
        0 => catalogue_mig(gpu).map(|m| m.axis_len),
        n => Some(n),
    }
}

fn mig_layout(
    gpu: &NodeGpu,
    reserved: &[(Placement, String)],
    problems: &mut Vec<String>,
) -> MigLayout {
    let mut instances: Vec<(Placement, SegmentKind, Option<String>)> = reserved
        .iter()
        .map(|(p, profile)| (*p, SegmentKind::Reserved, Some(profile.clone())))
        .chain(
            gpu.foreign_instances
                .iter()
                .map(|p| (*p, SegmentKind::Foreign, None)),
        )
        .collect();
    instances.sort();
    let axis_len = axis_len(gpu).unwrap_or_else(|| {
        let end = instances.iter().map(|(p, ..)| p.end()).max().unwrap_or(0);
        problems.push(format!(
            "slot axis length unknown: the node reports no MIG profiles and the catalogue has no {:?}; shown up to slot {end}",
            gpu.model
        ));
        end
    });
    let (segments, overlaps) = slot_segments(axis_len, &instances);
    for (earlier, later) in overlaps {
        problems.push(format!("instances at {earlier} and {later} overlap"));
    }
    for (placement, ..) in &instances {
        if placement.end() > axis_len {
            problems.push(format!(
                "instance at {placement} runs past the axis of {axis_len} slots"
            ));
        }
    }
    MigLayout {
        axis_len,
        slot_map: render_slot_map(&segments),
        segments,
    }
}

/// Cuts the axis `0..axis_len` into segments: the instances in order, free
/// runs between them. Returns the overlapping pairs too.
fn slot_segments(
    axis_len: u32,
    instances: &[(Placement, SegmentKind, Option<String>)],
) -> (Vec<Segment>, Vec<(Placement, Placement)>) {
    let mut segments = Vec::new();
    let mut overlaps = Vec::new();
    let mut cursor = 0u32;
    let mut previous: Vec<Placement> = Vec::new();
    for (placement, kind, profile) in instances {
        if placement.start > cursor {
            segments.push(free(cursor, placement.start));
        }
        let overlap = placement.start < cursor;
        if overlap && let Some(earlier) = previous.iter().find(|p| p.overlaps(placement)) {
            overlaps.push((*earlier, *placement));
        }
        segments.push(Segment {
            kind: *kind,
            profile: profile.clone(),
            start: placement.start,
            size: placement.size,
            overlap,
        });
        previous.push(*placement);
        cursor = cursor.max(placement.end());
    }
    if cursor < axis_len {
        segments.push(free(cursor, axis_len));
    }
    (segments, overlaps)
}

fn free(start: u32, end: u32) -> Segment {
    Segment {
        kind: SegmentKind::Free,
        profile: None,
        start,
        size: end - start,
        overlap: false,
    }
}

/// `[3g.20gb:0-3][1g.5gb:4][free:5-7]`.
fn render_slot_map(segments: &[Segment]) -> String {
    segments
        .iter()
        .map(|s| {
            let what = match s.kind {
                SegmentKind::Reserved => s.profile.as_deref().unwrap_or("?"),
                SegmentKind::Foreign => "foreign",
                SegmentKind::Free => "free",
            };
            let last = s.start + s.size.saturating_sub(1);
            let slots = if s.size <= 1 {
                s.start.to_string()
            } else {
                format!("{}-{last}", s.start)
            };
            let mark = if s.overlap { "!" } else { "" };
            format!("[{what}:{slots}{mark}]")
        })
        .collect()
}

fn annotation<'a>(annotations: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    annotations.as_ref()?.get(key).map(String::as_str)
}

fn pod_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Succeeded and Failed pods hold nothing.
fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

// ---------------------------------------------------------------------------
// The table.

impl Report {
    /// The report as text: a table per node (one row per GPU: memory, cores,
    /// slices, MIG slot map), with `details` the pods on each GPU, then the
    /// cluster's totals and the problems found.
    pub fn render_table(&self, details: bool) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            render_node(&mut out, node, details);
            out.push('\n');
        }
        if self.nodes.is_empty() {
            out.push_str("No nodes with GPUs.\n\n");
        }
        let s = &self.summary;
        out.push_str(&format!(
            "CLUSTER  GPUs {}  memory {}/{} MiB ({}%)  cores {}/{} ({}%)  pods holding GPUs {}\n",
            s.gpus,
            s.memory_mib.allocated,
            s.memory_mib.total,
            s.memory_mib.percent(),
            s.cores.allocated,
            s.cores.total,
            s.cores.percent(),
            s.pods_holding_devices,
        ));
        let share_gpus = self
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .any(|g| g.mode == GpuMode::Share);
        if share_gpus {
            out.push_str(
                "  (memory: physical MiB; share GPUs' deviceMemoryScaling is not applied)\n",
            );
        }
        for problem in &self.problems {
            out.push_str(&format!("  ! {problem}\n"));
        }
        if !self.unreadable_pods.is_empty() {
            out.push_str(&format!(
                "\nPODS WITH AN UNREADABLE {}\n",
                annotations::ALLOCATION
            ));
            for pod in &self.unreadable_pods {
                let node = pod
                    .node
                    .as_deref()
                    .map(|n| format!(" (node {n})"))
                    .unwrap_or_default();
                out.push_str(&format!(
                    "  {}/{}{node}: {}\n",
                    pod.namespace, pod.name, pod.error
                ));
            }
        }
        out
    }
}

fn render_node(out: &mut String, node: &NodeReport, details: bool) {
    out.push_str(&format!(
        "NODE {}  GPUs {}  pods {}\n",
        node.name,
        node.gpus.len(),
        node.pods_holding_devices
    ));
    if let Some(error) = &node.inventory_error {
        out.push_str(&format!("  inventory unreadable: {error}\n"));
    }
    if !node.gpus.is_empty() {
        let mut rows = vec![
            [
                "GPU",
                "MODEL",
                "MODE",
                "MEMORY(MiB)",
                "CORES",
                "SLICES",
                "MIG SLOTS",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for gpu in &node.gpus {
            let mode = if gpu.healthy {
                gpu.mode.as_str().to_owned()
            } else {
                format!("{},unhealthy", gpu.mode.as_str())
            };
            rows.push(vec![
                gpu.index.to_string(),
                gpu.model.clone(),
                mode,
                format!("{}/{}", gpu.memory_mib.allocated, gpu.memory_mib.total),
                format!("{}/{}", gpu.cores.allocated, gpu.cores.total),
                gpu.slices.to_string(),
                gpu.mig
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |m| m.slot_map.clone()),
            ]);
        }
        push_table(out, "  ", &rows);
    }
    for gpu in &node.gpus {
        for problem in &gpu.problems {
            out.push_str(&format!("  ! GPU {}: {problem}\n", gpu.index));
        }
    }
    for device in &node.unknown_gpu_devices {
        out.push_str(&format!(
            "  ! pod {}/{} container {}: {} is not in the node's inventory\n",
            device.namespace, device.name, device.container, device.uuid
        ));
    }
    for problem in &node.problems {
        out.push_str(&format!("  ! {problem}\n"));
    }
    if details {
        let listed: Vec<(&GpuReport, &PodDevice)> = node
            .gpus
            .iter()
            .flat_map(|g| g.pods.iter().map(move |p| (g, p)))
            .collect();
        if listed.is_empty() {
            out.push_str("  (no pods)\n");
        } else {
            let mut rows = vec![
                [
                    "GPU",
                    "POD",
                    "CONTAINER",
                    "MEMORY(MiB)",
                    "CORES",
                    "PROFILE",
                    "SLOTS",
                    "PHASE",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for (gpu, pod) in listed {
                rows.push(vec![
                    gpu.index.to_string(),
                    format!("{}/{}", pod.namespace, pod.name),
                    if pod.init {
                        format!("{} (init)", pod.container)
                    } else {
                        pod.container.clone()
                    },
                    pod.memory_mib.to_string(),
                    pod.cores.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                    pod.profile.clone().unwrap_or_else(|| "-".to_owned()),
                    pod.placement.map_or_else(
                        || "-".to_owned(),
                        |p| {
                            if p.size <= 1 {
                                p.start.to_string()
                            } else {
                                format!("{}-{}", p.start, p.end() - 1)
                            }
                        },
                    ),
                    pod.bind_phase.clone().unwrap_or_else(|| "-".to_owned()),
                ]);
            }
            out.push_str("  pods:\n");
            push_table(out, "    ", &rows);
        }
    }
}

/// Writes rows as columns two spaces apart, the last column unpadded.
fn push_table(out: &mut String, indent: &str, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::from(indent);
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

// ---------------------------------------------------------------------------
// Reading the API.

/// Why the objects could not be read.
#[derive(Debug, Error)]
pub enum InspectError {
    /// A node named on the command line does not exist.
    #[error("node {0} not found")]
    NodeNotFound(String),
    /// The API server answered with an error, or could not be reached.
    #[error("{what}: {}", describe(.source))]
    Api {
        /// What was being read, e.g. `listing pods`.
        what: String,
        /// The client's error.
        source: kube::Error,
    },
}

/// One line for a client error: the API's status where there is one.
fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            let mut text = format!("{} {}", status.code, status.reason);
            if !status.message.is_empty() {
                text.push_str(": ");
                text.push_str(&status.message);
            }
            text.trim().to_owned()
        }
        other => {
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                if !text.contains(&cause_text) {
                    text.push_str(": ");
                    text.push_str(&cause_text);
                }
                source = cause.source();
            }
            text.replace('\n', " ")
        }
    }
}

/// Objects per list request: big clusters are read page by page.
const PAGE: u32 = 500;

/// Reads the nodes (the named ones, else all) and every pod, then builds the
/// report for `scope` (whose `nodes` are the named ones).
pub async fn fetch(client: kube::Client, scope: &Scope) -> Result<Report, InspectError> {
    let node_api: Api<Node> = Api::all(client.clone());
    let nodes = match &scope.nodes {
        Some(names) => {
            let mut nodes = Vec::new();
            for name in names {
                match node_api.get_opt(name).await {
                    Ok(Some(node)) => nodes.push(node),
                    Ok(None) => return Err(InspectError::NodeNotFound(name.clone())),
                    Err(source) => {
                        return Err(InspectError::Api {
                            what: format!("reading node {name}"),
                            source,
                        });
                    }
                }
            }
            nodes
        }
        None => list_all(&node_api, "listing nodes").await?,
    };
    // Every namespace: the figures count every pod holding devices.
    let pods = list_all(&Api::<Pod>::all(client), "listing pods").await?;
    Ok(build_scoped(&nodes, &pods, scope))
}

async fn list_all<K>(api: &Api<K>, what: &str) -> Result<Vec<K>, InspectError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = api
            .list(&params)
            .await
            .map_err(|source| InspectError::Api {
                what: what.to_owned(),
                source,
            })?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    // Figures used below, from reference/mig.md and the catalogue's A100-40GB
    // row: 1g.5gb id 19, 4864 MiB, 1 compute slice, placements {0..6}:1;
    // 2g.10gb id 14, 9856 MiB, 2 slices, {0,2,4}:2; 3g.20gb id 9, 20096 MiB,
    // 3 slices, {0,4}:4; 7g.40gb id 0, 7 slices, {0}:8. The GPU: 40960 MiB.

    fn gpu(index: u32, uuid: &str, mig: bool) -> NodeGpu {
        let model = catalogue::find("A100-40GB").expect("A100-40GB in the catalogue");
        NodeGpu::from_catalogue(model, index, uuid, mig).expect("A100 has MIG")
    }

    fn node(name: &str, gpus: Vec<NodeGpu>) -> Node {
        let inventory = NodeGpus { version: 1, gpus };
        node_with(name, Some(&inventory.to_annotation()))
    }

    fn node_with(name: &str, annotation: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: annotation.map(|a| {
                    [(annotations::NODE_GPUS.to_owned(), a.to_owned())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pod(ns: &str, name: &str, node: &str, allocation: &str, phase: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                annotations: Some(
                    [
                        (annotations::ALLOCATION.to_owned(), allocation.to_owned()),
                        (annotations::BIND_PHASE.to_owned(), "success".to_owned()),
                    ]
                    .into_iter()
                    .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: phase.map(|p| PodStatus {
                phase: Some(p.into()),
                ..Default::default()
            }),
        }
    }

    fn share(node: &str, uuid: &str, memory: u64, cores: u32) -> String {
        format!(
            r#"{{"node":"{node}","containers":[{{"index":0,"name":"main","devices":[
              {{"uuid":"{uuid}","mode":"share","memoryMiB":{memory},"cores":{cores}}}]}}]}}"#
        )
    }

    fn mig(
        node: &str,
        uuid: &str,
        profile: &str,
        id: u32,
        start: u32,
        size: u32,
        memory: u64,
    ) -> String {
        format!(
            r#"{{"node":"{node}","containers":[{{"index":0,"name":"main","devices":[
              {{"uuid":"{uuid}","mode":"mig","profile":"{profile}","profileId":{id},
                "placement":{{"start":{start},"size":{size}}},"memoryMiB":{memory}}}]}}]}}"#
        )
    }

    /// A pod in `default` bound to `node` holding a share slice of `uuid`.
    fn share_pod(name: &str, node: &str, uuid: &str, memory: u64, cores: u32) -> Pod {
        pod(
            "default",
            name,
            node,
            &share(node, uuid, memory, cores),
            None,
        )
    }

    /// A pod in `default` bound to `n1` holding an instance on `GPU-m`.
    fn mig_pod(name: &str, profile: &str, id: u32, start: u32, size: u32, memory: u64) -> Pod {
        let allocation = mig("n1", "GPU-m", profile, id, start, size, memory);
        pod("default", name, "n1", &allocation, None)
    }

    fn usage(allocated: u64, total: u64) -> Usage {
        Usage { allocated, total }
    }

    fn slot_map(gpu: &GpuReport) -> Option<&str> {
        gpu.mig.as_ref().map(|m| m.slot_map.as_str())
    }

    #[test]
    fn share_gpu_sums_its_slices_and_skips_finished_pods() {
        let nodes = [node("n1", vec![gpu(0, "GPU-s", false)])];
        let pods = [
            pod(
                "default",
                "a",
                "n1",
                &share("n1", "GPU-s", 8000, 30),
                Some("Running"),
            ),
            share_pod("b", "n1", "GPU-s", 4000, 20),
            // Succeeded: holds nothing any more.
            pod(
                "default",
                "c",
                "n1",
                &share("n1", "GPU-s", 10000, 50),
                Some("Succeeded"),
            ),
        ];
        let report = build(&nodes, &pods);
        let g = &report.nodes[0].gpus[0];
        // 8000 + 4000 = 12000 MiB; 30 + 20 = 50 cores; two slices.
        assert_eq!(g.memory_mib, usage(12000, 40960));
        assert_eq!(g.cores, usage(50, 100));
        assert_eq!(g.slices, 2);
        assert_eq!(g.mig, None);
        assert_eq!(report.nodes[0].pods_holding_devices, 2);
        let names: Vec<&str> = g.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(g.pods[0].bind_phase.as_deref(), Some("success"));
        assert_eq!(report.summary.pods_holding_devices, 2);
        assert!(g.problems.is_empty(), "{:?}", g.problems);
    }

    #[test]
    fn an_init_container_is_not_counted_on_top_of_the_regular_ones() {
        let nodes = [node("n1", vec![gpu(0, "GPU-s", false)])];
        let allocation = r#"{"node":"n1","containers":[
            {"index":0,"name":"setup","init":true,"devices":[
              {"uuid":"GPU-s","mode":"share","memoryMiB":10000,"cores":50}]},
            {"index":1,"name":"main","devices":[
              {"uuid":"GPU-s","mode":"share","memoryMiB":6000,"cores":20}]},
            {"index":2,"name":"side","devices":[
              {"uuid":"GPU-s","mode":"share","memoryMiB":1000,"cores":40}]}]}"#;
        let pods = [
            pod("default", "staged", "n1", allocation, None),
            share_pod("other", "n1", "GPU-s", 2000, 5),
        ];
        let report = build(&nodes, &pods);
        let g = &report.nodes[0].gpus[0];
        // "staged" at its peak: memory max(10000, 6000 + 1000) = 10000, cores
        // max(50, 20 + 40) = 60, slices max(1, 2) = 2; plus "other": 2000,
        // 5, 1.
        assert_eq!(g.memory_mib.allocated, 12000);
        assert_eq!(g.cores.allocated, 65);
        assert_eq!(g.slices, 3);
        // Every device is listed, the init one marked.
        let listed: Vec<(&str, bool)> = g
            .pods
            .iter()
            .map(|p| (p.container.as_str(), p.init))
            .collect();
        assert_eq!(
            listed,
            [
                ("main", false),
                ("setup", true),
                ("main", false),
                ("side", false)
            ]
        );
        assert!(report.render_table(true).contains("setup (init)"));
    }

    #[test]
    fn mig_gpu_shows_its_slot_map_memory_and_compute_share() {
        let nodes = [node("n1", vec![gpu(1, "GPU-m", true)])];
        let pods = [
            mig_pod("big", "3g.20gb", 9, 0, 4, 20096),
            mig_pod("small", "1g.5gb", 19, 4, 1, 4864),
        ];
        let report = build(&nodes, &pods);
        let g = &report.nodes[0].gpus[0];
        let layout = g.mig.as_ref().expect("a MIG layout");
        assert_eq!(layout.axis_len, 8);
        assert_eq!(layout.slot_map, "[3g.20gb:0-3][1g.5gb:4][free:5-7]");
        // 20096 + 4864 = 24960 MiB; compute slices 3 + 1 of 7 = 57 %.
        assert_eq!(g.memory_mib, usage(24960, 40960));
        assert_eq!(g.cores, usage(57, 100));
        assert_eq!(g.slices, 2);
        assert_eq!(g.pods[0].cores, None);
        assert_eq!(g.pods[0].profile.as_deref(), Some("3g.20gb"));
        assert_eq!(g.pods[0].placement, Some(Placement { start: 0, size: 4 }));
        assert!(g.problems.is_empty(), "{:?}", g.problems);
    }

    #[test]
    fn foreign_instances_and_free_runs_fill_the_axis() {
        let mut m = gpu(0, "GPU-m", true);
        m.foreign_instances = vec![Placement { start: 6, size: 2 }];
        let nodes = [node("n1", vec![m])];
        let pods = [mig_pod("p", "2g.10gb", 14, 0, 2, 9856)];
        let report = build(&nodes, &pods);
        let layout = report.nodes[0].gpus[0].mig.clone().expect("layout");
        assert_eq!(layout.slot_map, "[2g.10gb:0-1][free:2-5][foreign:6-7]");
        let kinds: Vec<SegmentKind> = layout.segments.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [
                SegmentKind::Reserved,
                SegmentKind::Free,
                SegmentKind::Foreign
            ]
        );
        // The foreign instance is not charged: 9856 MiB and 2/7 = 28 %.
        assert_eq!(report.nodes[0].gpus[0].memory_mib.allocated, 9856);
        assert_eq!(report.nodes[0].gpus[0].cores.allocated, 28);
    }

    #[test]
    fn an_empty_mig_gpu_is_all_free() {
        let report = build(&[node("n1", vec![gpu(0, "GPU-m", true)])], &[]);
        let layout = report.nodes[0].gpus[0].mig.clone().expect("layout");
        assert_eq!(layout.slot_map, "[free:0-7]");
    }

    #[test]
    fn overlapping_instances_are_marked_and_named() {
        let nodes = [node("n1", vec![gpu(0, "GPU-m", true)])];
        let pods = [
            mig_pod("a", "3g.20gb", 9, 0, 4, 20096),
            mig_pod("b", "1g.5gb", 19, 2, 1, 4864),
        ];
        let report = build(&nodes, &pods);
        let g = &report.nodes[0].gpus[0];
        assert_eq!(slot_map(g), Some("[3g.20gb:0-3][1g.5gb:2!][free:4-7]"));
        assert_eq!(
            g.problems,
            ["instances at {start 0, size 4} and {start 2, size 1} overlap"]
        );
    }

    #[test]
    fn without_reported_profiles_the_catalogue_gives_axis_and_memory() {
        let mut m = gpu(0, "GPU-m", true);
        m.mig_profiles.clear();
        let nodes = [node("n1", vec![m])];
        // memoryMiB absent (0): the catalogue's 3g.20gb is 20096 MiB.
        let pods = [mig_pod("a", "3g.20gb", 9, 4, 4, 0)];
        let report = build(&nodes, &pods);
        let g = &report.nodes[0].gpus[0];
        assert_eq!(slot_map(g), Some("[free:0-3][3g.20gb:4-7]"));
        assert_eq!(g.memory_mib.allocated, 20096);
        assert_eq!(g.pods[0].memory_mib, 20096);
        // 3 of 7 compute slices: 42 %.
        assert_eq!(g.cores.allocated, 42);
    }

    #[test]
    fn mig_cores_are_a_share_of_the_whole_gpu_when_few_profiles_are_reported() {
        // Only 1g.5gb and 2g.10gb reported (say, the allowlisted ones): the
        // largest reported has 2 compute slices, the A100 has 7 (7g.40gb).
        let mut m = gpu(0, "GPU-m", true);
        m.mig_profiles
            .retain(|p| p.name == "1g.5gb" || p.name == "2g.10gb");
        assert_eq!(m.mig_profiles.len(), 2);
        let two_g = |name: &str, start: u32| mig_pod(name, "2g.10gb", 14, start, 2, 9856);
        let pods = [two_g("a", 0), two_g("b", 2), two_g("c", 4)];
        let report = build(&[node("n1", vec![m.clone()])], &pods);
        let g = &report.nodes[0].gpus[0];
        // 3 × 2 = 6 of 7 compute slices: floor(600 / 7) = 85 %.
        assert_eq!(g.cores, usage(85, 100));
        assert!(g.problems.is_empty(), "{:?}", g.problems);

        // A model the catalogue does not know: the largest reported profile
        // (2 slices) is all there is to go by; 6 slices exceed it, and say so.
        m.model = "NVIDIA Imaginary 7".into();
        let report = build(&[node("n1", vec![m])], &pods);
        let g = &report.nodes[0].gpus[0];
        assert_eq!(g.cores.allocated, 300);
        assert_eq!(
            g.problems,
            vec!["6 compute slices reserved, more than the GPU's 2".to_owned()]
        );
    }

    #[test]
    fn an_unknown_model_without_profiles_is_a_problem_not_a_panic() {
        let mut m = gpu(0, "GPU-m", true);
        m.mig_profiles.clear();
        m.model = "NVIDIA Imaginary 7".into();
        let nodes = [node("n1", vec![m])];
        let pods = [mig_pod("a", "1g.5gb", 19, 2, 1, 4864)];
        let report = build(&nodes, &pods);
        let g = &report.nodes[0].gpus[0];
        assert_eq!(slot_map(g), Some("[free:0-1][1g.5gb:2]"));
        assert_eq!(g.memory_mib.allocated, 4864);
        assert_eq!(g.problems.len(), 2, "{:?}", g.problems);
        assert!(g.problems[0].contains("profile id 19"), "{:?}", g.problems);
        assert!(
            g.problems[1].contains("axis length unknown"),
            "{:?}",
            g.problems
        );
    }

    #[test]
    fn absurd_figures_saturate_instead_of_overflowing() {
        let nodes = [
            node("n1", vec![gpu(0, "GPU-s", false)]),
            node("n2", vec![gpu(0, "GPU-t", false)]),
        ];
        let max = u64::MAX;
        let pods = [
            share_pod("a", "n1", "GPU-s", max, 100),
            share_pod("b", "n1", "GPU-s", max, 100),
            share_pod("c", "n2", "GPU-t", max, 100),
        ];
        let report = build(&nodes, &pods);
        assert_eq!(report.nodes[0].gpus[0].memory_mib.allocated, max);
        assert_eq!(report.summary.memory_mib.allocated, max);
        assert_eq!(report.summary.cores.allocated, 300);
        // Rendering copes too.
        assert!(report.render_table(true).contains(&format!("{max}/40960")));
    }

    #[test]
    fn corrupt_annotations_are_shown_with_their_errors() {
        let nodes = [
            node_with("bad", Some(r#"{"version":7,"gpus":[]}"#)),
            node_with("plain", None),
            node_with("garbage", Some("not json")),
        ];
        let pods = [
            share_pod("on-bad", "bad", "GPU-x", 1000, 10),
            pod("default", "broken", "garbage", "{\"node\":", None),
        ];
        let report = build(&nodes, &pods);
        // "plain" has no inventory and no pods: not a GPU node, left out.
        let names: Vec<&str> = report.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["bad", "garbage"]);
        let bad = &report.nodes[0];
        assert_eq!(
            bad.inventory_error.as_deref(),
            Some("tessera.io/node-gpus: version 7 is not supported (this build reads version 1)")
        );
        assert_eq!(bad.unknown_gpu_devices.len(), 1);
        assert_eq!(bad.unknown_gpu_devices[0].memory_mib, 1000);
        assert_eq!(bad.pods_holding_devices, 1);
        assert!(report.nodes[1].inventory_error.is_some());
        assert_eq!(report.unreadable_pods.len(), 1);
        assert_eq!(report.unreadable_pods[0].name, "broken");
        assert_eq!(report.unreadable_pods[0].node.as_deref(), Some("garbage"));
        assert!(
            report.unreadable_pods[0]
                .error
                .starts_with("tessera.io/allocation: "),
            "{}",
            report.unreadable_pods[0].error
        );
    }

    #[test]
    fn allocations_on_missing_nodes_or_other_nodes_are_problems() {
        let nodes = [node("n1", vec![gpu(0, "GPU-s", false)])];
        let pods = [
            share_pod("ghost", "gone", "GPU-s", 1000, 10),
            // Bound to n2 but reserved on n1.
            pod(
                "default",
                "astray",
                "n2",
                &share("n1", "GPU-s", 2000, 10),
                None,
            ),
        ];
        let report = build(&nodes, &pods);
        assert_eq!(
            report.problems,
            ["node gone does not exist, but the allocations of default/ghost name it"]
        );
        assert_eq!(
            report.nodes[0].problems,
            ["pod default/astray is bound to node n2 but its allocation names node n1"]
        );
        // The reservation still counts where it was made.
        assert_eq!(report.nodes[0].gpus[0].memory_mib.allocated, 2000);
    }

    #[test]
    fn namespace_scope_lists_fewer_pods_but_counts_all() {
        let nodes = [
            node("n1", vec![gpu(0, "GPU-s", false)]),
            node("n2", vec![gpu(0, "GPU-t", false)]),
        ];
        let pods = [
            pod("team-a", "a", "n1", &share("n1", "GPU-s", 8000, 30), None),
            pod("team-b", "b", "n1", &share("n1", "GPU-s", 4000, 20), None),
        ];
        let scope = Scope {
            nodes: Some(["n1".to_owned()].into_iter().collect()),
            namespace: Some("team-a".into()),
        };
        let report = build_scoped(&nodes, &pods, &scope);
        assert_eq!(report.nodes.len(), 1);
        let g = &report.nodes[0].gpus[0];
        assert_eq!(g.memory_mib.allocated, 12000);
        let names: Vec<&str> = g.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(report.summary.memory_mib, usage(12000, 40960));
    }

    #[test]
    fn the_table_lines_up_per_node() {
        let nodes = [node(
            "n1",
            vec![gpu(0, "GPU-s", false), gpu(1, "GPU-m", true)],
        )];
        let pods = [
            share_pod("train", "n1", "GPU-s", 8000, 30),
            mig_pod("infer", "3g.20gb", 9, 0, 4, 20096),
        ];
        let report = build(&nodes, &pods);
        // Totals: memory 8000 + 20096 = 28096 of 81920 MiB (34 %); cores 30 +
        // 42 (3 of 7 slices) = 72 of 200 (36 %).
        let expected = "\
NODE n1  GPUs 2  pods 2
  GPU  MODEL                  MODE   MEMORY(MiB)  CORES   SLICES  MIG SLOTS
  0    NVIDIA A100-SXM4-40GB  share  8000/40960   30/100  1       -
  1    NVIDIA A100-SXM4-40GB  mig    20096/40960  42/100  1       [3g.20gb:0-3][free:4-7]

CLUSTER  GPUs 2  memory 28096/81920 MiB (34%)  cores 72/200 (36%)  pods holding GPUs 2
  (memory: physical MiB; share GPUs' deviceMemoryScaling is not applied)
";
        assert_eq!(report.render_table(false), expected);
        let detailed = report.render_table(true);
        let expected_pods = "\
  pods:
    GPU  POD            CONTAINER  MEMORY(MiB)  CORES  PROFILE  SLOTS  PHASE
    0    default/train  main       8000         30     -        -      success
    1    default/infer  main       20096        -      3g.20gb  0-3    success
";
        assert!(detailed.contains(expected_pods), "{detailed}");
    }

    proptest::proptest! {
        /// Any set of instances, legal or not, gives a slot map that covers
        /// the axis slot by slot, free runs only where nothing is, and one
        /// bracket per segment; never a panic.
        #[test]
        fn slot_maps_cover_the_axis_whatever_the_instances(
            reserved in proptest::collection::vec((0u32..10, 1u32..9, proptest::sample::select(vec![0u32, 5, 9, 14, 15, 19, 20, 99])), 0..6),
            foreign in proptest::collection::vec((0u32..8, 1u32..4), 0..3),
        ) {
            let mut m = gpu(0, "GPU-m", true);
            m.foreign_instances = foreign.iter().map(|&(start, size)| Placement { start, size }).collect();
            let pods: Vec<Pod> = reserved
                .iter()
                .enumerate()
                .map(|(i, &(start, size, id))| {
                    pod("default", &format!("p{i}"), "n1", &mig("n1", "GPU-m", "xg", id, start, size, 0), None)
                })
                .collect();
            let report = build(&[node("n1", vec![m])], &pods);
            let g = &report.nodes[0].gpus[0];
            let layout = g.mig.as_ref().expect("a MIG GPU has a layout");
            proptest::prop_assert_eq!(layout.axis_len, 8);
            let mut used = [false; 32];
            for &(start, size, _) in &reserved {
                for slot in start..start + size { used[slot as usize] = true; }
            }
            for &(start, size) in &foreign {
                for slot in start..start + size { used[slot as usize] = true; }
            }
            let mut covered = [false; 32];
            let mut previous_start = 0;
            for segment in &layout.segments {
                proptest::prop_assert!(segment.start >= previous_start, "segments in slot order");
                previous_start = segment.start;
                for slot in segment.start..segment.start + segment.size {
                    covered[slot as usize] = true;
                    if segment.kind == SegmentKind::Free {
                        proptest::prop_assert!(!used[slot as usize], "slot {} is used but shown free", slot);
                    }
                }
            }
            for (slot, covered) in covered.iter().enumerate().take(8) {
                proptest::prop_assert!(*covered, "slot {} not covered", slot);
            }
            proptest::prop_assert_eq!(layout.slot_map.matches('[').count(), layout.segments.len());
            proptest::prop_assert_eq!(g.slices, reserved.len() as u64);
        }
    }

    #[test]
    fn json_keys_are_camel_case_and_always_present() {
        let report = build(&[node("n1", vec![gpu(0, "GPU-s", false)])], &[]);
        let value = serde_json::to_value(&report).expect("serializable");
        let gpu = &value["nodes"][0]["gpus"][0];
        assert_eq!(gpu["memoryMiB"]["total"], 40960);
        assert_eq!(gpu["mode"], "share");
        assert!(gpu["mig"].is_null());
        assert!(value["nodes"][0]["inventoryError"].is_null());
        assert_eq!(value["version"], 1);
        assert_eq!(value["summary"]["podsHoldingDevices"], 0);
    }
}
