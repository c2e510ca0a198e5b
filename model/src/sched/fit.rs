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
//! GPU's physical memory.
//!
//! MIG GPUs (MIG mode on): the smallest allowlisted profile (by memory, then
//! compute slices, then id) whose memory ≥ the ask and, when cores are asked,
//! whose share of the GPU's SMs ≥ the cores; placed by the engine's MostRoom
//! policy on the GPU's occupancy (reserved placements + foreign instances),
//! within the profile's instance limit. Profiles and placements are the
//! node's reported ones; the catalogue's only where the node reported none.
//! A percentage ask is of the whole GPU's memory.
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

use std::collections::BTreeMap;

use super::allocation::{Allocation, ContainerAllocation};
use super::config::{ClusterConfig, NodeSettings};
use super::inventory::NodeGpus;
use super::request::PodRequest;
use crate::mig::placement::Occupancy;

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
    /// init phase is never counted on top of its main phase). Devices on
    /// uuids the inventory does not list are kept (the GPU may come back).
    pub fn from_allocations<'a>(
        allocations: impl IntoIterator<Item = &'a Allocation>,
    ) -> NodeUsage {
        let _ = allocations.into_iter();
        todo!()
    }

    /// Adds one allocation (a reservation just made) to the usage.
    pub fn add(&mut self, allocation: &Allocation) {
        let _ = allocation;
        todo!()
    }

    /// The occupancy of a MIG GPU: its reserved instances and the inventory's foreign ones.
    pub fn occupancy(&self, gpu: &super::inventory::NodeGpu) -> Occupancy {
        let _ = gpu;
        todo!()
    }
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

/// Fits `request` on `node`: the devices for each container, or why not.
pub fn fit(
    request: &PodRequest,
    node: NodeView<'_>,
    config: &ClusterConfig,
) -> Result<NodeFit, Unfit> {
    let _ = (request, node, config);
    todo!()
}

/// The allocation to write for a fit.
pub fn allocation_for(node: &str, fit: &NodeFit) -> Allocation {
    Allocation {
        version: super::allocation::ALLOCATION_VERSION,
        node: node.to_string(),
        containers: fit.containers.clone(),
    }
}
