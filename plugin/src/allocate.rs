//! Realizing one container's reservation: kubelet's Allocate.
//!
//! Per container request: find the pod (the node's bind lock, see
//! [`crate::cluster`]), pick its next container not yet realized whose
//! device count matches the request (init containers first, index order),
//! then per device — share: nothing to create; MIG: the GI at exactly the
//! reserved placement and a full CI in it, each step checkpointed (the
//! intent before the driver call, the ids after) — then the realized fields
//! into `tessera.io/allocation`, the files and the transient spec
//! ([`crate::transient`]), and the answer in the form `--cdi-mode` asks for.
//! After the pod's last device container: `bind-phase: success` and the bind
//! lock released. On any failure: undo what this call created, `bind-phase:
//! failed`, the lock released, and a gRPC error naming what and where.
//!
//! Also the undo half that reclaim reuses: [`destroy_instance`] (one
//! recorded instance; [`destroy_instances`] is Allocate's loop over them) and
//! [`remove_alloc_files`]; and [`lock_gpu`], the per-GPU lock every MIG
//! create or destroy takes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tessera_driver::{DriverError, GpuDriver};
use tessera_model::alloc::AllocId;
use tessera_model::cdi::Spec;
use tessera_model::contract;
use tessera_model::contract::annotations::{self, bind_phase};
use tessera_model::mig::Placement;
use tessera_model::sched::allocation::{
    Allocation, ContainerAllocation, DeviceAllocation, Realized,
};
use tracing::Instrument as _;

use crate::api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse, DeviceSpec,
    Mount as GrpcMount, PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::checkpoint::{AllocRecord, CheckpointError, InstanceRecord, Phase};
use crate::cluster::{Cluster, ClusterError, Found, PodRef, annotation};
use crate::config::PluginConfig;
use crate::failpoint;
use crate::run::NodeContext;
use crate::transient::{self, AllocPaths, GrantedDevice, SpecInput, TransientError};

/// Why undoing an allocation's instances or files failed.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    /// A driver call failed while destroying an instance.
    #[error("destroying {what} on {gpu}: {source}")]
    Driver {
        /// What was being destroyed (`CI 0 of GI 9`).
        what: String,
        /// The parent GPU's uuid.
        gpu: String,
        /// The driver's error.
        source: DriverError,
    },
    /// Removing a file or directory failed.
    #[error("removing {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why one container's Allocate failed. Each renders as one line naming
/// what failed and where (kubelet shows it on the pod).
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// Finding the pod or writing its annotations failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The reservation cannot be realized as written (bad annotation, a GPU
    /// that is gone, MIG off, a placement taken).
    #[error("{0}")]
    Reservation(String),
    /// A driver call failed.
    #[error("{call} on {gpu}: {source}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The GPU's uuid.
        gpu: String,
        /// The driver's error.
        source: DriverError,
    },
    /// Discovering the node's device nodes failed.
    #[error("discovering the node's device nodes: {0}")]
    Discover(String),
    /// The spec or its files could not be made.
    #[error(transparent)]
    Transient(#[from] TransientError),
    /// The checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl AllocateError {
    fn status(&self, context: &str) -> tonic::Status {
        let message = format!("tessera-device-plugin: {context}: {self}");
        match self {
            AllocateError::Cluster(ClusterError::NoPod { .. } | ClusterError::Ambiguous { .. })
            | AllocateError::Reservation(_) => tonic::Status::failed_precondition(message),
            // The reserved GPU vanished or fell off the bus mid-call: the
            // reservation cannot be realized, like any other that can't.
            AllocateError::Driver {
                source: DriverError::GpuLost(_) | DriverError::NotFound(_),
                ..
            } => tonic::Status::failed_precondition(message),
            AllocateError::Cluster(_) => tonic::Status::unavailable(message),
            _ => tonic::Status::internal(message),
        }
    }
}

/// Where the time of one container's Allocate went: driver (NVML) calls
/// apart from the rest, for the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocationTimings {
    /// Wall time of the whole container request.
    pub total: Duration,
    /// Time inside `GpuDriver` calls (and discovery's).
    pub driver: Duration,
    /// Time inside API server calls.
    pub api: Duration,
    /// Time writing the checkpoint, the files and the spec.
    pub files: Duration,
}

impl AllocationTimings {
    /// The plugin's own cost: the total less the driver's time.
    pub fn own(&self) -> Duration {
        self.total.saturating_sub(self.driver)
    }
}

/// Serves kubelet's Allocate.
#[derive(Debug)]
pub struct Allocator {
    ctx: Arc<NodeContext>,
    cluster: Cluster,
    /// One Allocate at a time: kubelet admits pods one by one, and the bind
    /// lock lets one pod per node be in flight.
    serial: tokio::sync::Mutex<()>,
    last: Mutex<Option<AllocationTimings>>,
}

impl Allocator {
    /// An allocator for the node.
    pub fn new(ctx: Arc<NodeContext>) -> Allocator {
        let cluster = Cluster::new(
            ctx.client.clone(),
            &ctx.config.namespace,
            &ctx.config.node_name,
        );
        Allocator {
            ctx,
            cluster,
            serial: tokio::sync::Mutex::new(()),
            last: Mutex::new(None),
        }
    }

    /// The timings of the last container request answered (or failed).
    pub fn last_timings(&self) -> Option<AllocationTimings> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kubelet's Allocate: one answer per container request, in order. A
    /// failure undoes what this call created for every container of it.
    pub async fn allocate(
        &self,
        request: AllocateRequest,
    ) -> Result<AllocateResponse, tonic::Status> {
        let _serial = self.serial.lock().await;
        let mut responses = Vec::with_capacity(request.container_requests.len());
        let mut created: Vec<(PodRef, String)> = Vec::new();
        for container in &request.container_requests {
            let mut timings = AllocationTimings::default();
            let started = Instant::now();
            let span = tracing::info_span!("allocate", devices = container.devices_ids.len());
            let result = self
                .allocate_container(&container.devices_ids, &mut timings, &mut created)
                .instrument(span)
                .await;
            timings.total = started.elapsed();
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(timings);
            tracing::debug!(
                total_us = timings.total.as_micros() as u64,
                driver_us = timings.driver.as_micros() as u64,
                api_us = timings.api.as_micros() as u64,
                files_us = timings.files.as_micros() as u64,
                own_us = timings.own().as_micros() as u64,
                "allocate timings"
            );
            match result {
                Ok(response) => responses.push(response),
                Err(status) => {
                    // Earlier containers of this very call are undone too:
                    // kubelet discards the whole answer.
                    for (pod, alloc_id) in created.iter().rev() {
                        self.undo(alloc_id);
                        tracing::warn!(pod = %pod.key(), alloc_id, "undone after a later container failed");
                    }
                    return Err(status);
                }
            }
        }
        Ok(AllocateResponse {
            container_responses: responses,
        })
    }

    async fn allocate_container(
        &self,
        device_ids: &[String],
        timings: &mut AllocationTimings,
        created: &mut Vec<(PodRef, String)>,
    ) -> Result<ContainerAllocateResponse, tonic::Status> {
        let node = &self.ctx.config.node_name;
        // A pod whose containers are all realized but whose `success` never
        // landed (the write failed) is finished first, then looked past.
        let mut found;
        let mut finished_one = false;
        loop {
            let api_started = Instant::now();
            found = self.cluster.find_allocating().await;
            timings.api += api_started.elapsed();
            let Ok(f) = &found else { break };
            let done = !finished_one
                && parse_allocation(f, node).is_ok_and(|a| all_ready(&self.ctx, &f.pod_ref, &a));
            if !done {
                break;
            }
            let pod = f.pod_ref.clone();
            tracing::warn!(pod = %pod.key(), "every container was realized but the pod is still allocating; finishing it");
            self.conclude(&pod, bind_phase::SUCCESS, timings).await;
            finished_one = true;
        }
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                // A repeated Allocate for a container already realized (the
                // pod is no longer allocating): answer it the same again.
                if let Some(response) = self.repeat_answer(device_ids).await {
                    return Ok(response);
                }
                let e = AllocateError::from(e);
                tracing::warn!(node, error = %e, "allocate: no pod to serve");
                return Err(e.status(&format!(
                    "Allocate of {} device(s) on node {node}",
                    device_ids.len()
                )));
            }
        };
        let pod = found.pod_ref.clone();
        let context = format!("Allocate for pod {} on node {node}", pod.key());
        let fail = |e: AllocateError| e.status(&context);

        let allocation = match parse_allocation(&found, node) {
            Ok(a) => a,
            Err(e) => {
                self.conclude(&pod, bind_phase::FAILED, timings).await;
                return Err(fail(e));
            }
        };
        // A container of this pod already realized with these very devices:
        // the same answer again.
        for container in &allocation.containers {
            let Ok(id) = alloc_id_of(&pod, container) else {
                continue;
            };
            if let Some(record) = self.ctx.checkpoint.get(id.as_str())
                && record.phase == Phase::Ready
                && same_ids(&record.device_ids, device_ids)
            {
                return self.answer_from_files(&id).map_err(fail);
            }
        }
        let Some(container) = next_container(&self.ctx, &pod, &allocation, device_ids.len()) else {
            let e = AllocateError::Reservation(format!(
                "no container of the pod reserves {} device(s) that is not yet realized (tessera.io/allocation holds containers {})",
                device_ids.len(),
                allocation
                    .containers
                    .iter()
                    .map(|c| format!("{}[{}]: {} device(s)", c.name, c.index, c.devices.len()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            // A pod whose containers all run is never marked failed.
            if !all_ready(&self.ctx, &pod, &allocation) {
                self.conclude(&pod, bind_phase::FAILED, timings).await;
            }
            return Err(fail(e));
        };
        let context = format!(
            "Allocate for container {} of pod {} on node {node}",
            container.name,
            pod.key()
        );
        let id = match alloc_id_of(&pod, container) {
            Ok(id) => id,
            Err(e) => {
                self.conclude(&pod, bind_phase::FAILED, timings).await;
                return Err(e.status(&context));
            }
        };
        // A record left by an earlier attempt that died half-way: undo it first.
        if self.ctx.checkpoint.get(id.as_str()).is_some() {
            tracing::warn!(alloc_id = %id, "an earlier attempt left a record; undoing it before realizing again");
            if !self.undo(id.as_str()) {
                let e = AllocateError::Reservation(format!(
                    "what an earlier attempt of allocation {id} created could not be undone (see the plugin's log)"
                ));
                self.conclude(&pod, bind_phase::FAILED, timings).await;
                return Err(e.status(&context));
            }
        }
        match self
            .realize(&found, container, &id, device_ids, timings)
            .await
        {
            Ok(response) => {
                created.push((pod.clone(), id.to_string()));
                failpoint::hit(failpoint::ALLOCATE_BEFORE_SUCCESS);
                if all_ready(&self.ctx, &pod, &allocation) {
                    self.conclude(&pod, bind_phase::SUCCESS, timings).await;
                }
                tracing::info!(pod = %pod.key(), container = %container.name, alloc_id = %id, "allocated");
                Ok(response)
            }
            Err(e) => {
                tracing::warn!(pod = %pod.key(), container = %container.name, alloc_id = %id, error = %e, "allocate failed; undoing");
                self.undo(id.as_str());
                self.conclude(&pod, bind_phase::FAILED, timings).await;
                Err(e.status(&context))
            }
        }
    }

    /// Sets the pod's bind phase and releases the node's bind lock if it
    /// names the pod; failures are logged (the extender's sweep releases an
    /// expired lock).
    async fn conclude(&self, pod: &PodRef, phase: &str, timings: &mut AllocationTimings) {
        let started = Instant::now();
        if let Err(e) = self.cluster.set_bind_phase(pod, phase).await {
            tracing::error!(pod = %pod.key(), phase, error = %e, "cannot write bind-phase");
        }
        match self.cluster.release_lease(pod).await {
            Ok(released) => tracing::debug!(pod = %pod.key(), released, "bind lock"),
            Err(e) => tracing::error!(pod = %pod.key(), error = %e, "cannot release the bind lock"),
        }
        timings.api += started.elapsed();
    }

    /// Undoes one allocation from its checkpoint record: its instances, its
    /// files, then the record. False when an instance could not be destroyed
    /// (the record stays, so reclaim tries again).
    fn undo(&self, alloc_id: &str) -> bool {
        let record = self.ctx.checkpoint.get(alloc_id);
        if let Some(record) = &record
            && let Err(e) =
                blocking(|| destroy_instances(self.ctx.driver.as_ref(), &record.instances))
        {
            tracing::error!(alloc_id, error = %e, "cannot destroy the instances this allocation created; the record stays");
            return false;
        }
        if let Err(e) = remove_alloc_files(&self.ctx.config, alloc_id) {
            tracing::error!(alloc_id, error = %e, "cannot remove the allocation's files");
        }
        if let Err(e) = self
            .ctx
            .checkpoint
            .update(|c| c.allocations.remove(alloc_id))
        {
            tracing::error!(alloc_id, error = %e, "cannot drop the allocation's record");
            return false;
        }
        true
    }

    /// Realizes one container: record, instances, annotation, files, spec.
    async fn realize(
        &self,
        found: &Found,
        container: &ContainerAllocation,
        id: &AllocId,
        device_ids: &[String],
        timings: &mut AllocationTimings,
    ) -> Result<ContainerAllocateResponse, AllocateError> {
        let ctx = &self.ctx;
        let pod = &found.pod_ref;
        let record = AllocRecord {
            alloc_id: id.to_string(),
            pod_uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: container.name.clone(),
            container_index: container.index,
            phase: Phase::Realizing,
            instances: Vec::new(),
            device_ids: device_ids.to_vec(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let started = Instant::now();
        ctx.checkpoint.update(|c| {
            c.allocations.insert(id.to_string(), record);
        })?;
        timings.files += started.elapsed();

        let mut granted = Vec::with_capacity(container.devices.len());
        let mut realized: Vec<(usize, Realized)> = Vec::new();
        for (d, device) in container.devices.iter().enumerate() {
            match device {
                DeviceAllocation::Share {
                    uuid,
                    memory_mib,
                    cores,
                } => {
                    let gpus = timed_driver(timings, || ctx.driver.gpus())
                        .map_err(|e| driver_err("listing GPUs", uuid, e))?;
                    let Some(gpu) = gpus.iter().find(|g| g.uuid == *uuid) else {
                        return Err(AllocateError::Reservation(format!(
                            "GPU {uuid} reserved for this container is not on node {} (it vanished, or the reservation is for another node)",
                            ctx.config.node_name
                        )));
                    };
                    if gpu.mig_enabled() {
                        return Err(AllocateError::Reservation(format!(
                            "GPU {uuid} (index {}) has MIG mode on; a vGPU slice cannot be given on it",
                            gpu.index
                        )));
                    }
                    granted.push(GrantedDevice::Share {
                        gpu_uuid: uuid.clone(),
                        memory_mib: *memory_mib,
                        cores: *cores,
                    });
                }
                DeviceAllocation::Mig {
                    uuid,
                    profile,
                    profile_id,
                    placement,
                    ..
                } => {
                    let _gpu = lock_gpu(uuid).await;
                    let (mig_uuid, gi, ci) =
                        self.create_mig(id, uuid, profile, *profile_id, *placement, timings)?;
                    granted.push(GrantedDevice::Mig {
                        gpu_uuid: uuid.clone(),
                        mig_uuid: mig_uuid.clone(),
                    });
                    realized.push((
                        d,
                        Realized {
                            mig_uuid,
                            gpu_instance_id: gi,
                            compute_instance_id: ci,
                        },
                    ));
                }
            }
        }

        if !realized.is_empty() {
            let started = Instant::now();
            let index = container.index;
            let result = self
                .cluster
                .patch_annotations(pod, |current| {
                    let text = annotation(current, annotations::ALLOCATION)
                        .ok_or("its tessera.io/allocation annotation is gone")?;
                    let mut now = Allocation::parse(text).map_err(|e| e.to_string())?;
                    let before = now.clone();
                    let Some(c) = now.containers.iter_mut().find(|c| c.index == index) else {
                        return Err(format!("tessera.io/allocation no longer holds container {index}"));
                    };
                    for (d, r) in &realized {
                        match c.devices.get_mut(*d) {
                            Some(DeviceAllocation::Mig { realized, .. }) => {
                                *realized = Some(r.clone());
                            }
                            _ => {
                                return Err(format!(
                                    "tessera.io/allocation changed: containers[index {index}].devices[{d}] is no longer a MIG device"
                                ));
                            }
                        }
                    }
                    if now == before {
                        return Ok(None);
                    }
                    Ok(Some(BTreeMap::from([(
                        annotations::ALLOCATION.to_owned(),
                        now.to_annotation(),
                    )])))
                })
                .await;
            timings.api += started.elapsed();
            result?;
            failpoint::hit(failpoint::ALLOCATE_AFTER_ANNOTATION);
        }

        let started = Instant::now();
        let layout = ctx.config.devices.layout(&ctx.config.driver_root);
        let facts =
            blocking(|| tessera_driver::discover::discover_in(&layout, ctx.driver.as_ref()))
                .map_err(|e| AllocateError::Discover(e.to_string()))?;
        timings.driver += started.elapsed();

        let started = Instant::now();
        let paths = AllocPaths::new(&ctx.config, id);
        let hook = transient::hook_settings(&ctx.config);
        let memory_scaling = ctx.config.devices.memory_scaling;
        let input = SpecInput {
            alloc_id: id,
            facts: &facts,
            devices: &granted,
            paths: &paths,
            hook: &hook,
            memory_scaling,
            library_groups: &ctx.config.devices.library_groups,
        };
        let mut spec = transient::build_spec(&input)?;
        transient::to_host_paths(
            &mut spec,
            &ctx.config.driver_root,
            &ctx.config.host_driver_root,
        );
        let limits = transient::limits_file(&granted, memory_scaling)?;
        transient::write_files(&paths, &limits, transient::mig_only(&granted))?;
        transient::write_spec(&paths.spec_file, &spec)?;
        failpoint::hit(failpoint::ALLOCATE_AFTER_SPEC);
        ctx.checkpoint.update(|c| {
            if let Some(r) = c.allocations.get_mut(id.as_str()) {
                r.phase = Phase::Ready;
            }
        })?;
        timings.files += started.elapsed();
        Ok(answer(&ctx.config, id, &spec))
    }

    /// Creates the GI at the reserved placement and a full CI in it,
    /// checkpointing the intent before and the ids after each call.
    /// Returns the MIG device's uuid, the GI id and the CI id.
    fn create_mig(
        &self,
        id: &AllocId,
        uuid: &str,
        profile: &str,
        profile_id: u32,
        placement: Placement,
        timings: &mut AllocationTimings,
    ) -> Result<(String, u32, u32), AllocateError> {
        let ctx = &self.ctx;
        let driver = ctx.driver.as_ref();
        let node = &ctx.config.node_name;
        let at = format!("{}+{}", placement.start, placement.size);
        let gpus = timed_driver(timings, || driver.gpus())
            .map_err(|e| driver_err("listing GPUs", uuid, e))?;
        let Some(gpu) = gpus.iter().find(|g| g.uuid == uuid) else {
            return Err(AllocateError::Reservation(format!(
                "GPU {uuid} reserved for MIG profile {profile} at {at} is not on node {node} (it vanished, or the reservation is for another node)"
            )));
        };
        let index = gpu.index;
        if !gpu.mig_enabled() {
            return Err(AllocateError::Reservation(format!(
                "MIG mode is off on GPU {uuid} (index {index}); the reservation needs MIG profile {profile} at {at}"
            )));
        }
        let profiles = timed_driver(timings, || driver.gpu_instance_profiles(index))
            .map_err(|e| driver_err("listing GI profiles", uuid, e))?;
        if !profiles.iter().any(|p| p.id == profile_id) {
            return Err(AllocateError::Reservation(format!(
                "MIG profile {profile} (id {profile_id}) is not supported on GPU {uuid} ({})",
                gpu.name
            )));
        }
        let legal = timed_driver(timings, || driver.possible_placements(index, profile_id))
            .map_err(|e| driver_err("listing placements", uuid, e))?;
        if !legal.contains(&placement) {
            return Err(AllocateError::Reservation(format!(
                "placement {at} is not a legal placement of MIG profile {profile} on GPU {uuid} (legal: {})",
                legal
                    .iter()
                    .map(|p| format!("{}+{}", p.start, p.size))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let existing = timed_driver(timings, || driver.gpu_instances(index))
            .map_err(|e| driver_err("listing GPU instances", uuid, e))?;
        if let Some(taken) = existing.iter().find(|g| overlaps(g.placement, placement)) {
            let owner = ctx
                .checkpoint
                .snapshot()
                .allocations
                .into_values()
                .find(|r| {
                    r.instances
                        .iter()
                        .any(|i| i.gpu_uuid == uuid && i.gpu_instance_id == Some(taken.id))
                });
            return Err(AllocateError::Reservation(match owner {
                Some(r) => format!(
                    "placement {at} on {uuid} is held by GI {} of Tessera allocation {} (pod {}/{})",
                    taken.id, r.alloc_id, r.namespace, r.pod
                ),
                None => format!(
                    "placement {at} on {uuid} is held by a GPU instance Tessera did not create (GI {})",
                    taken.id
                ),
            }));
        }

        // The intent, before the call that creates something.
        let slot = self.with_record(
            id,
            |r| {
                r.instances.push(InstanceRecord {
                    gpu_uuid: uuid.to_owned(),
                    gpu_index: index,
                    profile_id,
                    profile: profile.to_owned(),
                    placement,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                    mig_uuid: None,
                });
                r.instances.len() - 1
            },
            timings,
        )?;
        failpoint::hit(failpoint::ALLOCATE_AFTER_INTENT);

        let gi = match timed_driver(timings, || {
            driver.create_gpu_instance(index, profile_id, placement)
        }) {
            Ok(gi) => gi,
            Err(e) => {
                // NVML said no: nothing was made, so the intent goes (left in,
                // undo would match whatever GI someone else puts there).
                self.with_record(
                    id,
                    |r| {
                        r.instances.truncate(slot);
                    },
                    timings,
                )?;
                return Err(driver_err("creating the GPU instance", uuid, e));
            }
        };
        failpoint::hit(failpoint::ALLOCATE_AFTER_GI);
        if gi.placement != placement {
            // Never expected from NVML; the record still lets undo find it.
            tracing::error!(
                gpu = uuid,
                gi = gi.id,
                "GI created at {} instead of {at}",
                gi.placement
            );
        }
        self.with_record(
            id,
            |r| r.instances[slot].gpu_instance_id = Some(gi.id),
            timings,
        )?;
        if gi.placement != placement {
            return Err(AllocateError::Reservation(format!(
                "the driver created GI {} on {uuid} at {}+{} instead of the reserved {at}",
                gi.id, gi.placement.start, gi.placement.size
            )));
        }

        let ci = timed_driver(timings, || driver.create_compute_instance(index, gi.id))
            .map_err(|e| driver_err("creating the compute instance", uuid, e))?;
        failpoint::hit(failpoint::ALLOCATE_AFTER_CI);
        self.with_record(
            id,
            |r| r.instances[slot].compute_instance_id = Some(ci.id),
            timings,
        )?;

        let devices = timed_driver(timings, || driver.mig_devices(index))
            .map_err(|e| driver_err("listing MIG devices", uuid, e))?;
        let Some(device) = devices
            .iter()
            .find(|m| m.gpu_instance_id == gi.id && m.compute_instance_id == ci.id)
        else {
            return Err(AllocateError::Reservation(format!(
                "the driver lists no MIG device for GI {} CI {} on {uuid} after creating them",
                gi.id, ci.id
            )));
        };
        let mig_uuid = device.uuid.clone();
        self.with_record(
            id,
            |r| r.instances[slot].mig_uuid = Some(mig_uuid.clone()),
            timings,
        )?;
        Ok((mig_uuid, gi.id, ci.id))
    }

    fn with_record<R>(
        &self,
        id: &AllocId,
        change: impl FnOnce(&mut AllocRecord) -> R,
        timings: &mut AllocationTimings,
    ) -> Result<R, AllocateError> {
        let started = Instant::now();
        let out = self
            .ctx
            .checkpoint
            .update(|c| c.allocations.get_mut(id.as_str()).map(change))?;
        timings.files += started.elapsed();
        out.ok_or_else(|| {
            AllocateError::Reservation(format!(
                "the record of allocation {id} vanished while realizing it"
            ))
        })
    }

    /// The answer for a container realized before, rebuilt from its spec.
    fn answer_from_files(&self, id: &AllocId) -> Result<ContainerAllocateResponse, AllocateError> {
        let path = transient::AllocPaths::spec_file(&self.ctx.config, id);
        let text = std::fs::read(&path).map_err(|e| {
            AllocateError::Transient(TransientError::Io {
                path: path.clone(),
                reason: format!(
                    "the transient spec of realized allocation {id} cannot be read: {e}"
                ),
            })
        })?;
        let spec: Spec = serde_json::from_slice(&text).map_err(|e| {
            AllocateError::Transient(TransientError::Spec(format!("{}: {e}", path.display())))
        })?;
        Ok(answer(&self.ctx.config, id, &spec))
    }

    /// A repeated Allocate after the pod left `allocating`: the Ready record
    /// with exactly these device ids whose pod still exists.
    async fn repeat_answer(&self, device_ids: &[String]) -> Option<ContainerAllocateResponse> {
        let snapshot = self.ctx.checkpoint.snapshot();
        let record = snapshot
            .allocations
            .into_values()
            .find(|r| r.phase == Phase::Ready && same_ids(&r.device_ids, device_ids))?;
        let pod = PodRef {
            namespace: record.namespace.clone(),
            name: record.pod.clone(),
            uid: record.pod_uid.clone(),
        };
        match self.cluster.pod(&pod).await {
            Ok(Some(_)) => {}
            _ => return None,
        }
        let id = AllocId::new(&record.alloc_id).ok()?;
        self.answer_from_files(&id).ok()
    }

    /// Kubelet's GetPreferredAllocation: device ids on the GPUs the
    /// allocating pod's next container reserved, first; then the rest.
    pub async fn preferred_allocation(
        &self,
        request: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, tonic::Status> {
        let node = &self.ctx.config.node_name;
        let found = self.cluster.find_allocating().await.ok();
        let allocation = found.as_ref().and_then(|f| parse_allocation(f, node).ok());
        let mut responses = Vec::with_capacity(request.container_requests.len());
        for req in &request.container_requests {
            let size = usize::try_from(req.allocation_size).unwrap_or(0);
            let reserved: Vec<String> = match (&found, &allocation) {
                (Some(f), Some(a)) => next_container(&self.ctx, &f.pod_ref, a, size)
                    .map(|c| c.devices.iter().map(|d| d.uuid().to_owned()).collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            responses.push(ContainerPreferredAllocationResponse {
                device_i_ds: prefer(req, &reserved),
            });
        }
        Ok(PreferredAllocationResponse {
            container_responses: responses,
        })
    }
}

/// The preferred ids: the must-includes, then one available id on each
/// reserved GPU (an id `<uuid>::…` names its GPU, [`crate::devices::DeviceId`]), then the
/// remaining available ids in order, up to the allocation size.
pub fn prefer(req: &ContainerPreferredAllocationRequest, reserved_gpus: &[String]) -> Vec<String> {
    let size = usize::try_from(req.allocation_size).unwrap_or(0);
    let mut out: Vec<String> = Vec::new();
    let push = |out: &mut Vec<String>, id: &String| {
        if out.len() < size && !out.contains(id) {
            out.push(id.clone());
        }
    };
    for id in &req.must_include_device_i_ds {
        push(&mut out, id);
    }
    for gpu in reserved_gpus {
        if out.iter().any(|id| on_gpu(id, gpu)) {
            continue;
        }
        if let Some(id) = req
            .available_device_i_ds
            .iter()
            .find(|id| on_gpu(id, gpu) && !out.contains(id))
        {
            push(&mut out, id);
        }
    }
    for id in &req.available_device_i_ds {
        push(&mut out, id);
    }
    out
}

/// Kubelet's answer for a realized allocation, in the forms `--cdi-mode` asks for.
pub fn answer(config: &PluginConfig, id: &AllocId, spec: &Spec) -> ContainerAllocateResponse {
    let mut response = ContainerAllocateResponse::default();
    let mode = config.cdi_mode;
    if mode.cdi_field() {
        response.cdi_devices.push(CdiDevice {
            name: id.qualified_name(),
        });
    }
    if mode.cdi_annotation() {
        match tessera_model::cdi::annotations::tessera_annotation(id.as_str()) {
            Ok((key, value)) => {
                response.annotations.insert(key, value);
            }
            Err(e) => tracing::error!(alloc_id = %id, error = %e, "no CDI annotation"),
        }
    }
    if mode.native() {
        let (envs, mounts, devices) = transient::native_edits(spec);
        response.envs.extend(envs);
        response.mounts = mounts
            .into_iter()
            .map(|(container_path, host_path, read_only)| GrpcMount {
                container_path,
                host_path,
                read_only,
            })
            .collect();
        response.devices = devices
            .into_iter()
            .map(|(container_path, host_path, permissions)| DeviceSpec {
                container_path,
                host_path,
                permissions,
            })
            .collect();
    }
    response
}

fn parse_allocation(found: &Found, node: &str) -> Result<Allocation, AllocateError> {
    let text = annotation(&found.pod, annotations::ALLOCATION).ok_or_else(|| {
        AllocateError::Reservation(format!(
            "the pod has no {} annotation (was it bound by tessera-scheduler-extender?)",
            annotations::ALLOCATION
        ))
    })?;
    let allocation = Allocation::parse(text)
        .map_err(|e| AllocateError::Reservation(format!("the reservation cannot be read: {e}")))?;
    if allocation.node != node {
        return Err(AllocateError::Reservation(format!(
            "tessera.io/allocation is for node {:?}, not this node {node:?}",
            allocation.node
        )));
    }
    Ok(allocation)
}

fn alloc_id_of(pod: &PodRef, container: &ContainerAllocation) -> Result<AllocId, AllocateError> {
    let text = format!("{}-{}", pod.uid.to_ascii_lowercase(), container.index);
    AllocId::new(&text).map_err(|e| {
        AllocateError::Reservation(format!("pod uid {:?} makes no allocation id: {e}", pod.uid))
    })
}

/// Whether every container of the pod's allocation is realized (Ready).
fn all_ready(ctx: &NodeContext, pod: &PodRef, allocation: &Allocation) -> bool {
    allocation.containers.iter().all(|c| {
        alloc_id_of(pod, c).is_ok_and(|id| {
            ctx.checkpoint
                .get(id.as_str())
                .is_some_and(|r| r.phase == Phase::Ready)
        })
    })
}

/// The pod's next container (index order) not yet realized whose device
/// count is `count`.
fn next_container<'a>(
    ctx: &NodeContext,
    pod: &PodRef,
    allocation: &'a Allocation,
    count: usize,
) -> Option<&'a ContainerAllocation> {
    let mut containers: Vec<&ContainerAllocation> = allocation.containers.iter().collect();
    containers.sort_by_key(|c| c.index);
    containers.into_iter().find(|c| {
        c.devices.len() == count
            && alloc_id_of(pod, c).is_ok_and(|id| {
                ctx.checkpoint
                    .get(id.as_str())
                    .is_none_or(|r| r.phase != Phase::Ready)
            })
    })
}

/// Whether device id `id` is on GPU `uuid`.
fn on_gpu(id: &str, uuid: &str) -> bool {
    crate::devices::DeviceId::parse(id).is_some_and(|d| d.uuid() == uuid)
}

fn same_ids(a: &[String], b: &[String]) -> bool {
    let mut a: Vec<&String> = a.iter().collect();
    let mut b: Vec<&String> = b.iter().collect();
    a.sort();
    b.sort();
    a == b
}

fn overlaps(a: Placement, b: Placement) -> bool {
    a.start < b.start + b.size && b.start < a.start + a.size
}

fn driver_err(call: &'static str, gpu: &str, source: DriverError) -> AllocateError {
    AllocateError::Driver {
        call,
        gpu: gpu.to_owned(),
        source,
    }
}

/// Runs one driver call ([`blocking`]) and adds its time to `timings`.
fn timed_driver<T>(
    timings: &mut AllocationTimings,
    call: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, DriverError> {
    let started = Instant::now();
    let out = blocking(call);
    timings.driver += started.elapsed();
    out
}

/// Runs `work` — driver (NVML) calls, which can block for long (real NVML
/// on a busy GPU; the stand-in takes file locks) — without stalling the
/// async runtime: on a multi-thread runtime (the plugin's) through
/// [`tokio::task::block_in_place`], which first hands this worker's other
/// tasks to another thread; on a current-thread runtime (where that would
/// panic) or outside any runtime it simply runs `work`.
pub fn blocking<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// The per-GPU lock (by uuid) every MIG create or destroy holds, so that
/// Allocate and reclaim never interleave instance changes on one GPU.
pub async fn lock_gpu(uuid: &str) -> tokio::sync::OwnedMutexGuard<()> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let lock = {
        let mut map = LOCKS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.entry(uuid.to_owned()).or_default().clone()
    };
    lock.lock_owned().await
}

/// The GPU's current index, looked up by uuid (indexes may change across a
/// reboot; the uuid does not). `Ok(None)` when the GPU is gone.
pub(crate) fn gpu_index_of(driver: &dyn GpuDriver, uuid: &str) -> Result<Option<u32>, DriverError> {
    Ok(driver
        .gpus()?
        .into_iter()
        .find(|g| g.uuid == uuid)
        .map(|g| g.index))
}

/// Destroys the MIG instances of one allocation, last created first: each
/// record's compute instance, then its GPU instance (see
/// [`destroy_instance`]). A record whose GI id is unknown (the plugin died
/// between the intent and NVML's answer) is matched by profile and
/// placement ([`Unnamed::Match`]): Allocate's own undo.
pub fn destroy_instances(
    driver: &dyn GpuDriver,
    instances: &[InstanceRecord],
) -> Result<(), UndoError> {
    for record in instances.iter().rev() {
        destroy_instance(driver, record, Unnamed::Match, &|_| {})?;
    }
    Ok(())
}

/// What [`destroy_instance`] does with a record whose GI id is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unnamed {
    /// Destroys the GI at exactly the recorded profile and placement, if
    /// any (Allocate undoing what it may have made before a crash).
    Match,
    /// Names nothing: leaves it (reclaim; the startup sweep adopts such
    /// GIs, filling in their ids, before anything is reclaimed).
    Skip,
}

/// A step of [`destroy_instance`] done, for the caller's crash points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destroyed {
    /// The GI's compute instances are gone; the GI is not yet.
    ComputeInstances,
    /// The GI is gone.
    GpuInstance,
}

/// Destroys one recorded instance: its compute instances, then its GPU
/// instance, only while NVML shows the GI with the recorded profile at the
/// recorded placement and holding no compute instance but the recorded one
/// (anything else is not Tessera's: logged and left). An instance already
/// gone, or a GPU that vanished, counts as destroyed. `after` is called
/// after each step (reclaim's crash points).
pub fn destroy_instance(
    driver: &dyn GpuDriver,
    record: &InstanceRecord,
    unnamed: Unnamed,
    after: &dyn Fn(Destroyed),
) -> Result<(), UndoError> {
    let fail = |what: String, source: DriverError| UndoError::Driver {
        what,
        gpu: record.gpu_uuid.clone(),
        source,
    };
    if record.gpu_instance_id.is_none() && unnamed == Unnamed::Skip {
        return Ok(());
    }
    let index = match gpu_index_of(driver, &record.gpu_uuid) {
        Ok(Some(index)) => index,
        Ok(None) => {
            tracing::warn!(gpu = %record.gpu_uuid, "GPU is gone; nothing to destroy on it");
            return Ok(());
        }
        Err(e) => return Err(fail("the GPU list".to_owned(), e)),
    };
    let gis = match driver.gpu_instances(index) {
        Ok(gis) => gis,
        Err(DriverError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(fail("the GI list".to_owned(), e)),
    };
    let gi = match record.gpu_instance_id {
        Some(id) => gis.iter().find(|g| g.id == id),
        // The intent without an id: the GI at exactly the reserved placement
        // and profile, if the call went through before the crash.
        None => gis
            .iter()
            .find(|g| g.profile_id == record.profile_id && g.placement == record.placement),
    };
    let Some(gi) = gi.copied() else {
        return Ok(());
    };
    if gi.profile_id != record.profile_id || gi.placement != record.placement {
        // The id was reused by someone else's GI: not ours to destroy.
        tracing::warn!(gpu = %record.gpu_uuid, gi = gi.id, "GI id now names another profile or placement: not Tessera's, left alone");
        return Ok(());
    }
    let cis = match driver.compute_instances(index, gi.id) {
        Ok(cis) => cis,
        Err(DriverError::NotFound(_)) => Vec::new(),
        Err(e) => return Err(fail(format!("the CI list of GI {}", gi.id), e)),
    };
    if let Some(recorded) = record.compute_instance_id
        && let Some(other) = cis.iter().find(|c| c.id != recorded)
    {
        tracing::warn!(gpu = %record.gpu_uuid, gi = gi.id, ci = other.id, "GI holds a compute instance Tessera did not create; GI left alone");
        return Ok(());
    }
    for ci in &cis {
        match driver.destroy_compute_instance(index, gi.id, ci.id) {
            Ok(()) | Err(DriverError::NotFound(_)) => {}
            Err(e) => return Err(fail(format!("CI {} of GI {}", ci.id, gi.id), e)),
        }
    }
    after(Destroyed::ComputeInstances);
    match driver.destroy_gpu_instance(index, gi.id) {
        Ok(()) | Err(DriverError::NotFound(_)) => {}
        Err(e) => return Err(fail(format!("GI {}", gi.id), e)),
    }
    after(Destroyed::GpuInstance);
    Ok(())
}

/// The allocation's directory, `<state_dir>/alloc/<alloc-id>/`.
pub fn alloc_dir(config: &PluginConfig, alloc_id: &str) -> PathBuf {
    config
        .state_dir
        .join(contract::node::ALLOC_DIR)
        .join(alloc_id)
}

/// The allocation's transient spec, `<cdi_dir>/tessera.io-alloc_<alloc-id>.json`.
pub fn spec_path(config: &PluginConfig, alloc_id: &str) -> PathBuf {
    config
        .cdi_dir
        .join(contract::cdi::transient_spec_file(alloc_id))
}

/// Removes an allocation's transient spec and its directory (limits file,
/// accounting dir, preload file, the hook's binding record). Absent files are
/// fine. The id must be a valid alloc-id; an invalid one removes nothing.
pub fn remove_alloc_files(config: &PluginConfig, alloc_id: &str) -> Result<(), UndoError> {
    if let Err(e) = tessera_model::alloc::AllocId::new(alloc_id) {
        return Err(UndoError::Io {
            path: PathBuf::from(alloc_id),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        });
    }
    let spec = spec_path(config, alloc_id);
    remove(&spec, |p| std::fs::remove_file(p))?;
    remove(&alloc_dir(config, alloc_id), |p| std::fs::remove_dir_all(p))
}

fn remove(path: &Path, op: impl Fn(&Path) -> std::io::Result<()>) -> Result<(), UndoError> {
    match op(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(UndoError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use tessera_driver::fake::{FakeDriver, FakeGpu};

    use super::*;

    fn record(
        driver: &FakeDriver,
        placement: Placement,
        gi: Option<u32>,
        ci: Option<u32>,
    ) -> InstanceRecord {
        InstanceRecord {
            gpu_uuid: driver.gpus().expect("gpus")[0].uuid.clone(),
            gpu_index: 0,
            profile_id: 19,
            profile: "1g.5gb".to_owned(),
            placement,
            gpu_instance_id: gi,
            compute_instance_id: ci,
            mig_uuid: None,
        }
    }

    fn at(start: u32) -> Placement {
        Placement { start, size: 1 }
    }

    #[test]
    fn recorded_instances_are_destroyed_ci_first_and_nothing_else() {
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::a100_40gb(0))
            .with_mig_device(0, 19, at(0))
            .with_mig_device(0, 19, at(1))
            .with_gpu_instance(0, 19, at(2));
        let gis = driver.gpu_instances(0).expect("gis");
        let ours = gis.iter().find(|g| g.placement == at(0)).expect("gi at 0");
        let ci = driver.compute_instances(0, ours.id).expect("cis")[0].id;
        // A record with ids, and an intent whose ids never reached the
        // checkpoint (matched by profile and placement).
        let records = [
            record(&driver, at(0), Some(ours.id), Some(ci)),
            record(&driver, at(2), None, None),
        ];
        driver.clear_calls();
        destroy_instances(&driver, &records).expect("destroyed");
        let left: Vec<Placement> = driver
            .gpu_instances(0)
            .expect("gis")
            .iter()
            .map(|g| g.placement)
            .collect();
        assert_eq!(left, [at(1)], "only the recorded ones went");
        let calls = driver.calls();
        let ci_call = calls
            .iter()
            .position(|c| c.starts_with("destroy_compute_instance"))
            .expect("CI destroyed");
        let gi_call = calls
            .iter()
            .rposition(|c| c.starts_with("destroy_gpu_instance"))
            .expect("GI destroyed");
        assert!(ci_call < gi_call, "{calls:?}");
        // Already gone: nothing to do, no error.
        destroy_instances(&driver, &records).expect("idempotent");
    }

    #[test]
    fn a_gi_holding_an_unrecorded_ci_or_another_profile_is_left_alone() {
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::a100_40gb(0))
            .with_mig_device(0, 19, at(3));
        let gi = driver.gpu_instances(0).expect("gis")[0];
        let ci = driver.compute_instances(0, gi.id).expect("cis")[0].id;
        // The record knows the GI but another CI id.
        destroy_instances(
            &driver,
            &[record(&driver, at(3), Some(gi.id), Some(ci + 1))],
        )
        .expect("ok");
        assert_eq!(driver.gpu_instances(0).expect("gis").len(), 1);
        // The GI id now names an instance at another placement.
        destroy_instances(&driver, &[record(&driver, at(4), Some(gi.id), None)]).expect("ok");
        assert_eq!(driver.gpu_instances(0).expect("gis").len(), 1);
        // A GPU that is gone: nothing to destroy.
        let mut gone = record(&driver, at(3), Some(gi.id), Some(ci));
        gone.gpu_uuid = "GPU-gone".to_owned();
        destroy_instances(&driver, &[gone]).expect("ok");
        assert_eq!(driver.gpu_instances(0).expect("gis").len(), 1);
    }

    #[test]
    fn a_failing_destroy_is_reported_naming_the_gpu() {
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::a100_40gb(0))
            .with_mig_device(0, 19, at(0));
        let gi = driver.gpu_instances(0).expect("gis")[0];
        driver.fail_next(
            "destroy_gpu_instance",
            DriverError::InUse("busy".to_owned()),
        );
        let err = destroy_instances(&driver, &[record(&driver, at(0), Some(gi.id), None)])
            .expect_err("in use");
        let text = err.to_string();
        assert!(
            text.contains(&format!("GI {}", gi.id)) && text.contains("GPU-a100"),
            "{text}"
        );
    }

    #[test]
    fn alloc_files_are_removed_and_bad_ids_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = PluginConfig {
            node_name: "n".into(),
            kubeconfig: None,
            driver_root: "/".into(),
            host_driver_root: "/".into(),
            nvml_lib: None,
            kubelet_dir: dir.path().join("kubelet"),
            cdi_dir: dir.path().join("cdi"),
            state_dir: dir.path().join("state"),
            cdi_mode: Default::default(),
            namespace: "kube-system".into(),
            hook_path: "/usr/bin/tessera-hook".into(),
            hook_config: None,
            vgpu_library: "/usr/lib/tessera/libtessera_vgpu.so".into(),
            metrics_listen: None,
            fail_on_init_error: true,
            devices: Default::default(),
            resource_name: "nvidia.com/gpu".into(),
        };
        let id = "abc-0";
        std::fs::create_dir_all(alloc_dir(&config, id).join("accounting")).expect("dir");
        std::fs::create_dir_all(&config.cdi_dir).expect("cdi");
        std::fs::write(spec_path(&config, id), "{}").expect("spec");
        remove_alloc_files(&config, id).expect("removed");
        assert!(!alloc_dir(&config, id).exists() && !spec_path(&config, id).exists());
        remove_alloc_files(&config, id).expect("absent is fine");
        assert!(remove_alloc_files(&config, "../etc").is_err());
    }

    #[test]
    fn preferred_ids_start_on_the_reserved_gpus() {
        let req = ContainerPreferredAllocationRequest {
            available_device_i_ds: vec![
                "GPU-a::0".into(),
                "GPU-a::1".into(),
                "GPU-b::0".into(),
                "GPU-c::0".into(),
            ],
            must_include_device_i_ds: vec![],
            allocation_size: 2,
        };
        assert_eq!(
            prefer(&req, &["GPU-c".into(), "GPU-b".into()]),
            ["GPU-c::0", "GPU-b::0"]
        );
        // Unknown GPUs: kubelet's order; must-includes always first.
        assert_eq!(prefer(&req, &[]), ["GPU-a::0", "GPU-a::1"]);
        let must = ContainerPreferredAllocationRequest {
            must_include_device_i_ds: vec!["GPU-a::1".into()],
            ..req
        };
        assert_eq!(prefer(&must, &["GPU-b".into()]), ["GPU-a::1", "GPU-b::0"]);
    }

    #[test]
    fn placements_overlap_only_when_slots_are_shared_and_ids_compare_as_sets() {
        let p = |start, size| Placement { start, size };
        assert!(overlaps(p(0, 4), p(3, 1)));
        assert!(!overlaps(p(0, 4), p(4, 4)));
        assert!(overlaps(p(2, 1), p(2, 1)));
        assert!(same_ids(
            &["b".into(), "a".into()],
            &["a".into(), "b".into()]
        ));
        assert!(!same_ids(&["a".into()], &["a".into(), "b".into()]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocking_driver_call_leaves_the_runtime_free_for_other_tasks() {
        let started = Instant::now();
        let slow = tokio::spawn(async move {
            blocking(|| std::thread::sleep(Duration::from_millis(600)));
            started.elapsed()
        });
        // Give the slow task the only worker first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let quick = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            started.elapsed()
        });
        let quick = quick.await.expect("quick task");
        let slow = slow.await.expect("slow task");
        assert!(
            quick < Duration::from_millis(400) && slow >= Duration::from_millis(600),
            "the quick task waited for the blocking call: quick {quick:?}, slow {slow:?}"
        );
    }

    #[tokio::test]
    async fn blocking_runs_inline_on_a_current_thread_runtime() {
        let here = std::thread::current().id();
        assert_eq!(blocking(|| std::thread::current().id()), here);
    }

    #[test]
    fn a_reserved_gpu_lost_or_gone_mid_call_is_a_failed_precondition() {
        let driver = FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0));
        let uuid = driver.gpus().expect("gpus")[0].uuid.clone();
        let code = |e: DriverError| {
            driver_err("listing GPU instances", &uuid, e)
                .status("x")
                .code()
        };
        // The GPU vanished: its index names nothing any more.
        let gone = driver.gpu_instances(3).expect_err("no GPU 3");
        assert_eq!(code(gone), tonic::Code::FailedPrecondition);
        driver.set_lost(0, true);
        let lost = driver.gpu_instances(0).expect_err("lost");
        assert!(matches!(lost, DriverError::GpuLost(_)), "{lost:?}");
        let status = driver_err("listing GPU instances", &uuid, lost).status("Allocate");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains(&uuid), "{}", status.message());
        // Any other driver failure stays internal.
        let other = DriverError::Call {
            call: "nvmlDeviceCreateGpuInstanceWithPlacement",
            reason: "unknown error".to_owned(),
        };
        assert_eq!(code(other), tonic::Code::Internal);
    }
}
