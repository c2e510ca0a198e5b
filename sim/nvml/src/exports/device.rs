//! Device queries: enumeration, identity, memory, MIG mode and MIG device handles.
//!
//! Calls that accept MIG device handles as real NVML does: `GetUUID` (the
//! `MIG-…` UUID), `GetName` (`<product> MIG <profile>`), `GetMemoryInfo[_v2]`
//! (the profile's memory), `GetIndex` (the MIG index), `IsMigDeviceHandle`,
//! `GetGpuInstanceId`, `GetComputeInstanceId`,
//! `GetDeviceHandleFromMigDeviceHandle`. Every other device call given a MIG
//! device handle answers `NOT_SUPPORTED`; `GetMinorNumber` included: a MIG
//! device has no `/dev/nvidia<minor>` of its own, and callers (like NVIDIA's
//! container toolkit) take the parent's.

use std::ffi::{c_char, c_uint};

use tessera_sim::state::NodeState;

use crate::ffi::*;
use crate::lookup::{self, Device, MigDevice};
use crate::node::{self, Res};
use crate::out;
use crate::profiles;

use super::{answer, entry};

fn count(state: &NodeState) -> Res<c_uint> {
    c_uint::try_from(state.gpus.len()).map_err(|_| ERROR_UNKNOWN)
}

/// # Safety
/// `device_count` is null or valid for one write.
unsafe fn write_count(device_count: *mut c_uint) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe { answer(device_count, count) }
}

/// `nvmlDeviceGetCount_v2`: the number of GPUs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { write_count(device_count) }
}

/// `nvmlDeviceGetCount` (NVML 1 name): same as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { write_count(device_count) }
}

/// # Safety
/// `device` is null or valid for one write.
unsafe fn handle_by_index(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe {
        answer(device, |s| {
            let gpu = lookup::gpu(s, index)?;
            lookup::gpu_handle(gpu.index)
        })
    }
}

/// `nvmlDeviceGetHandleByIndex_v2`: `INVALID_ARGUMENT` past the last GPU,
/// `GPU_IS_LOST` for a lost one (`nvmlDeviceGetCount` still counts it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { handle_by_index(index, device) }
}

/// `nvmlDeviceGetHandleByIndex` (NVML 1 name): same as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { handle_by_index(index, device) }
}

/// `nvmlDeviceGetHandleByUUID`: a GPU by `GPU-…` or a MIG device by `MIG-…`;
/// `NOT_FOUND` when no device has it, `GPU_IS_LOST` when its GPU is lost.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    let find = |s: &NodeState| {
        // SAFETY: NVML contract: `uuid` is null or a NUL-terminated string,
        // unchanged during the call.
        let uuid = unsafe { out::read_str(uuid) }?;
        if let Some(gpu) = s.gpu_by_uuid(uuid) {
            return lookup::gpu_handle(lookup::gpu(s, gpu.index)?.index);
        }
        for gpu in &s.gpus {
            for gi in &gpu.gpu_instances {
                if let Some(ci) = gi.compute_instances.iter().find(|ci| ci.uuid == uuid) {
                    lookup::gpu(s, gpu.index)?;
                    return lookup::mig_handle(gpu.index, gi.id, ci.id);
                }
            }
        }
        Err(ERROR_NOT_FOUND)
    };
    // SAFETY: NVML contract: `device` is null or valid for one write.
    unsafe { answer(device, find) }
}

fn mig_index(mig: &MigDevice<'_>) -> Res<u32> {
    tessera_sim::mig::mig_devices(mig.gpu)
        .iter()
        .find(|(_, gi, ci)| gi.id == mig.gi.id && ci.id == mig.ci.id)
        .map(|(index, _, _)| *index)
        .ok_or(ERROR_UNKNOWN)
}

/// `nvmlDeviceGetIndex`: the NVML index, or for a MIG device its MIG index
/// (what `nvmlDeviceGetMigDeviceHandleByIndex` takes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    // SAFETY: NVML contract: `index` is null or valid for one write.
    unsafe {
        answer(index, |s| match lookup::device(s, device)? {
            Device::Gpu(gpu) => Ok(gpu.index),
            Device::Mig(mig) => mig_index(&mig),
        })
    }
}

/// `nvmlDeviceGetUUID`: `GPU-…`, or `MIG-…` for a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    entry(|| {
        let text = node::read(|s| match lookup::device(s, device)? {
            Device::Gpu(gpu) => Ok(gpu.uuid.clone()),
            Device::Mig(mig) => Ok(mig.ci.uuid.clone()),
        })?;
        // SAFETY: NVML contract: `uuid` is null or holds `length` bytes.
        unsafe { out::write_str(uuid, length, &text) }
    })
}

/// `nvmlDeviceGetName`: the product name, e.g. `NVIDIA H100 80GB HBM3`; for
/// a MIG device `<product> MIG <profile>`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    entry(|| {
        let text = node::read(|s| match lookup::device(s, device)? {
            Device::Gpu(gpu) => Ok(profiles::model(gpu)?.product_name.to_string()),
            Device::Mig(mig) => {
                let profile = profiles::gi_profile_of(mig.gpu, mig.gi)?;
                Ok(profiles::mig_device_name(
                    profiles::model(mig.gpu)?,
                    profile,
                ))
            }
        })?;
        // SAFETY: NVML contract: `name` is null or holds `length` bytes.
        unsafe { out::write_str(name, length, &text) }
    })
}

/// `nvmlDeviceGetMinorNumber`: the `N` of `/dev/nvidiaN`; `NOT_SUPPORTED`
/// for a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: NvmlDevice,
    minor_number: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `minor_number` is null or valid for one write.
    unsafe { answer(minor_number, |s| Ok(lookup::physical_gpu(s, device)?.minor)) }
}

/// Total bytes of a device: the model's memory, or the MIG profile's.
fn total_memory(state: &NodeState, device: NvmlDevice) -> Res<u64> {
    match lookup::device(state, device)? {
        Device::Gpu(gpu) => Ok(profiles::bytes(profiles::model(gpu)?.memory_mib)),
        Device::Mig(mig) => Ok(profiles::bytes(
            profiles::gi_profile_of(mig.gpu, mig.gi)?.memory_mib,
        )),
    }
}

/// `nvmlDeviceGetMemoryInfo`: the device's memory; used is what the CUDA
/// stand-in's processes on it hold (0 when none runs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    entry(|| {
        let total = node::read(|s| total_memory(s, device))?;
        let used = super::process::used_memory(device)?.min(total);
        let info = NvmlMemory {
            total,
            free: total - used,
            used,
        };
        // SAFETY: NVML contract: `memory` is null or valid for one write.
        unsafe { out::write(memory, info) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: as the unversioned call, with nothing
/// reserved; `ARGUMENT_VERSION_MISMATCH` unless `version` is `nvmlMemory_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    entry(|| {
        let total = node::read(|s| total_memory(s, device))?;
        // SAFETY: NVML contract: `memory` is null or a caller-owned nvmlMemory_v2_t.
        if unsafe { out::read_version(memory) }? != MEMORY_V2 {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let used = super::process::used_memory(device)?.min(total);
        let info = NvmlMemoryV2 {
            version: MEMORY_V2,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: NVML contract: `memory` is valid for one write (non-null: read above).
        unsafe { out::write(memory, info) }
    })
}

/// `nvmlDeviceGetMigMode`: current and pending mode; `NOT_SUPPORTED` on a
/// model without MIG.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let (current, pending) = node::read(|s| {
            let gpu = lookup::physical_gpu(s, device)?;
            profiles::mig(gpu)?;
            Ok((mode(gpu.mig_enabled), mode(gpu.mig_pending)))
        })?;
        if current_mode.is_null() || pending_mode.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: NVML contract: both pointers are valid for one write (non-null).
        unsafe {
            out::write(current_mode, current)?;
            out::write(pending_mode, pending)
        }
    })
}

fn mode(enabled: bool) -> c_uint {
    if enabled {
        DEVICE_MIG_ENABLE
    } else {
        DEVICE_MIG_DISABLE
    }
}

/// `nvmlDeviceSetMigMode`: switches at once (pending and current), as Hopper
/// and later GPUs do, and as an idle Ampere GPU does after the reset NVML
/// performs; `activationStatus` is `SUCCESS`. Disabling MIG while GPU
/// instances exist sets only the pending mode and reports `IN_USE` in
/// `activationStatus`, as a real GPU that cannot be reset does. No privilege
/// check: whoever may write the node's state file may toggle MIG.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: NvmlDevice,
    mode: c_uint,
    activation_status: *mut NvmlReturn,
) -> NvmlReturn {
    entry(|| {
        let enable = match mode {
            DEVICE_MIG_ENABLE => true,
            DEVICE_MIG_DISABLE => false,
            _ => return Err(ERROR_INVALID_ARGUMENT),
        };
        if activation_status.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let index = node::read(|s| lookup::physical_gpu_index(s, device))?;
        let status = node::update(|s| {
            lookup::gpu(s, index)?;
            let gpu = s.gpu_mut(index).ok_or(ERROR_INVALID_ARGUMENT)?;
            match tessera_sim::mig::set_mig_mode(gpu, enable) {
                Ok(()) => Ok(SUCCESS),
                Err(tessera_sim::SimError::InUse(_)) => {
                    gpu.mig_pending = enable;
                    Ok(ERROR_IN_USE)
                }
                Err(e) => Err(node::sim_code(&e)),
            }
        })?;
        // SAFETY: NVML contract: `activation_status` is valid for one write (non-null).
        unsafe { out::write(activation_status, status) }
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`: the model's maximum while MIG is on,
/// else 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: NvmlDevice,
    count: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `count` is null or valid for one write.
    unsafe {
        answer(count, |s| {
            let gpu = lookup::physical_gpu(s, device)?;
            Ok(match profiles::mig_enabled(gpu) {
                Ok(spec) => spec.max_mig_devices,
                Err(_) => 0,
            })
        })
    }
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: MIG devices are numbered by
/// (GI id, CI id); `NOT_FOUND` for an empty slot below the maximum,
/// `INVALID_ARGUMENT` at or past it, `NOT_SUPPORTED` while MIG is off.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: NvmlDevice,
    index: c_uint,
    mig_device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mig_device` is null or valid for one write.
    unsafe {
        answer(mig_device, |s| {
            let gpu = lookup::physical_gpu(s, device)?;
            let spec = profiles::mig_enabled(gpu)?;
            if index >= spec.max_mig_devices {
                return Err(ERROR_INVALID_ARGUMENT);
            }
            let devices = tessera_sim::mig::mig_devices(gpu);
            let (_, gi, ci) = devices
                .iter()
                .find(|(i, _, _)| *i == index)
                .ok_or(ERROR_NOT_FOUND)?;
            lookup::mig_handle(gpu.index, gi.id, ci.id)
        })
    }
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the parent GPU;
/// `INVALID_ARGUMENT` when given a GPU handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: NvmlDevice,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: NVML contract: `device` is null or valid for one write.
    unsafe {
        answer(device, |s| match lookup::device(s, mig_device)? {
            Device::Mig(mig) => lookup::gpu_handle(mig.gpu.index),
            Device::Gpu(_) => Err(ERROR_INVALID_ARGUMENT),
        })
    }
}

/// `nvmlDeviceIsMigDeviceHandle`: 1 for a MIG device handle, 0 for a GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: NvmlDevice,
    is_mig_device: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let is_mig = node::read(|s| Ok(matches!(lookup::device(s, device)?, Device::Mig(_))))?;
        // SAFETY: NVML contract: `is_mig_device` is null or valid for one write.
        unsafe { out::write(is_mig_device, c_uint::from(is_mig)) }
    })
}

fn mig_ids(state: &NodeState, device: NvmlDevice) -> Res<(u32, u32)> {
    match lookup::device(state, device)? {
        Device::Mig(mig) => Ok((mig.gi.id, mig.ci.id)),
        Device::Gpu(_) => Err(ERROR_NOT_SUPPORTED),
    }
}

/// `nvmlDeviceGetGpuInstanceId`: the GI id of a MIG device; `NOT_SUPPORTED`
/// for a GPU handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let (gi, _) = node::read(|s| mig_ids(s, device))?;
        // SAFETY: NVML contract: `id` is null or valid for one write.
        unsafe { out::write(id, gi) }
    })
}

/// `nvmlDeviceGetComputeInstanceId`: the CI id of a MIG device;
/// `NOT_SUPPORTED` for a GPU handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let (_, ci) = node::read(|s| mig_ids(s, device))?;
        // SAFETY: NVML contract: `id` is null or valid for one write.
        unsafe { out::write(id, ci) }
    })
}
