//! Handles in and out: turning a caller's handle into the objects of the
//! node state it names (checking they still exist), and objects into handles.
//!
//! Any handle this library did not make, or whose object is gone, is
//! `INVALID_ARGUMENT`; one naming a lost GPU (or an instance on it) is
//! `GPU_IS_LOST`. A valid MIG device handle given to a call that only
//! physical GPUs answer is `NOT_SUPPORTED` ("not supported by the device").

use std::ptr;

use tessera_sim::state::{NodeState, SimComputeInstance, SimGpu, SimGpuInstance};

use crate::ffi::{
    ERROR_GPU_IS_LOST, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_UNKNOWN,
    NvmlComputeInstance, NvmlDevice, NvmlEventSet, NvmlGpuInstance,
};
use crate::handle::Handle;
use crate::node::Res;

/// What an `nvmlDevice_t` names.
#[derive(Debug, Clone, Copy)]
pub enum Device<'a> {
    /// A physical GPU.
    Gpu(&'a SimGpu),
    /// A MIG device: one compute instance of one GPU instance.
    Mig(MigDevice<'a>),
}

/// A MIG device and what it is made of.
#[derive(Debug, Clone, Copy)]
pub struct MigDevice<'a> {
    /// The parent GPU.
    pub gpu: &'a SimGpu,
    /// The GPU instance.
    pub gi: &'a SimGpuInstance,
    /// The compute instance the device stands for.
    pub ci: &'a SimComputeInstance,
}

fn decode<T>(handle: *mut T) -> Res<Handle> {
    Handle::decode(handle.addr()).ok_or(ERROR_INVALID_ARGUMENT)
}

/// GPU `index`, checked to exist and to answer: a GPU marked lost
/// (`tessera-sim lose-gpu`) is `GPU_IS_LOST` to every call naming it or
/// anything on it.
pub fn gpu(state: &NodeState, index: u32) -> Res<&SimGpu> {
    let gpu = state.gpu(index).ok_or(ERROR_INVALID_ARGUMENT)?;
    if state.health.is_lost(index) {
        return Err(ERROR_GPU_IS_LOST);
    }
    Ok(gpu)
}

fn gpu_instance(gpu: &SimGpu, gi: u32) -> Res<&SimGpuInstance> {
    gpu.gpu_instance(gi).ok_or(ERROR_INVALID_ARGUMENT)
}

fn compute_instance(gi: &SimGpuInstance, ci: u32) -> Res<&SimComputeInstance> {
    gi.compute_instance(ci).ok_or(ERROR_INVALID_ARGUMENT)
}

/// The GPU or MIG device behind `handle`.
pub fn device(state: &NodeState, handle: NvmlDevice) -> Res<Device<'_>> {
    match decode(handle)? {
        Handle::Gpu { gpu: index } => Ok(Device::Gpu(gpu(state, index)?)),
        Handle::MigDevice { gpu: index, gi, ci } => {
            let gpu = gpu(state, index)?;
            let gi = gpu_instance(gpu, gi)?;
            let ci = compute_instance(gi, ci)?;
            Ok(Device::Mig(MigDevice { gpu, gi, ci }))
        }
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

/// The physical GPU behind `handle`; `NOT_SUPPORTED` for a MIG device.
pub fn physical_gpu(state: &NodeState, handle: NvmlDevice) -> Res<&SimGpu> {
    match device(state, handle)? {
        Device::Gpu(gpu) => Ok(gpu),
        Device::Mig(_) => Err(ERROR_NOT_SUPPORTED),
    }
}

/// The NVML index of the physical GPU behind `handle`, checked to exist.
pub fn physical_gpu_index(state: &NodeState, handle: NvmlDevice) -> Res<u32> {
    physical_gpu(state, handle).map(|gpu| gpu.index)
}

/// The GPU instance behind `handle`, with its GPU.
pub fn gpu_instance_of(
    state: &NodeState,
    handle: NvmlGpuInstance,
) -> Res<(&SimGpu, &SimGpuInstance)> {
    match decode(handle)? {
        Handle::GpuInstance { gpu: index, gi } => {
            let gpu = gpu(state, index)?;
            Ok((gpu, gpu_instance(gpu, gi)?))
        }
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

/// The compute instance behind `handle`, with its GPU and GPU instance.
pub fn compute_instance_of(
    state: &NodeState,
    handle: NvmlComputeInstance,
) -> Res<(&SimGpu, &SimGpuInstance, &SimComputeInstance)> {
    match decode(handle)? {
        Handle::ComputeInstance { gpu: index, gi, ci } => {
            let gpu = gpu(state, index)?;
            let gi = gpu_instance(gpu, gi)?;
            Ok((gpu, gi, compute_instance(gi, ci)?))
        }
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

fn encode(handle: Handle) -> Res<usize> {
    // Only a state file with absurd indexes or ids (≥ 4096 GPUs, ids ≥ 65536) fails here.
    handle.encode().ok_or(ERROR_UNKNOWN)
}

/// The `nvmlDevice_t` of physical GPU `gpu`.
pub fn gpu_handle(gpu: u32) -> Res<NvmlDevice> {
    encode(Handle::Gpu { gpu }).map(ptr::without_provenance_mut)
}

/// The `nvmlDevice_t` of the MIG device standing for CI `ci` of GI `gi` on GPU `gpu`.
pub fn mig_handle(gpu: u32, gi: u32, ci: u32) -> Res<NvmlDevice> {
    encode(Handle::MigDevice { gpu, gi, ci }).map(ptr::without_provenance_mut)
}

/// The `nvmlGpuInstance_t` of GI `gi` on GPU `gpu`.
pub fn gi_handle(gpu: u32, gi: u32) -> Res<NvmlGpuInstance> {
    encode(Handle::GpuInstance { gpu, gi }).map(ptr::without_provenance_mut)
}

/// The `nvmlComputeInstance_t` of CI `ci` of GI `gi` on GPU `gpu`.
pub fn ci_handle(gpu: u32, gi: u32, ci: u32) -> Res<NvmlComputeInstance> {
    encode(Handle::ComputeInstance { gpu, gi, ci }).map(ptr::without_provenance_mut)
}

/// The `nvmlEventSet_t` of event set `id`.
pub fn event_set_handle(id: u32) -> Res<NvmlEventSet> {
    encode(Handle::EventSet { id }).map(ptr::without_provenance_mut)
}

/// The id of the event set `handle` names (whether it still exists is
/// [`crate::events`]' to say).
pub fn event_set_id(handle: NvmlEventSet) -> Res<u32> {
    match decode(handle)? {
        Handle::EventSet { id } => Ok(id),
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}
