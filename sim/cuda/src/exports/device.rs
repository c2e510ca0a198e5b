//! Device enumeration and queries.

use std::ffi::{c_char, c_int, c_uint};

use crate::driver::{self, Device, Res};
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::out;

use super::entry;

/// `cuDeviceGetCount`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    entry(|| {
        let n = c_int::try_from(driver::get()?.devices.len()).unwrap_or(c_int::MAX);
        // SAFETY: cuda.h contract: `count` is null or valid for one write.
        unsafe { out::write(count, n) }
    })
}

/// `cuDeviceGet`: the device handle of an ordinal (the ordinal itself).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CuDevice, ordinal: c_int) -> CuResult {
    entry(|| {
        driver::get()?.device(ordinal)?;
        // SAFETY: cuda.h contract: `device` is null or valid for one write.
        unsafe { out::write(device, ordinal) }
    })
}

/// `cuDeviceGetName`: cut to `len − 1` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CuDevice) -> CuResult {
    entry(|| {
        let d = driver::get()?.device(dev)?;
        // SAFETY: cuda.h contract: `name` is null or holds `len` bytes.
        unsafe { out::write_str(name, len, d.name.as_bytes()) }
    })
}

fn uuid(dev: CuDevice, out_uuid: *mut CuUuid, pick: fn(&Device) -> [u8; 16]) -> CuResult {
    entry(|| {
        let bytes = pick(driver::get()?.device(dev)?);
        // SAFETY: cuda.h contract: `uuid` is null or valid for one write.
        unsafe { out::write(out_uuid, CuUuid { bytes }) }
    })
}

/// `cuDeviceGetUuid` (CUDA 9.2): for a MIG device, its GPU's UUID.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid_out: *mut CuUuid, dev: CuDevice) -> CuResult {
    uuid(dev, uuid_out, |d| d.gpu_uuid)
}

/// `cuDeviceGetUuid_v2` (CUDA 11.4): the device's own UUID, a MIG device's included.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid_out: *mut CuUuid, dev: CuDevice) -> CuResult {
    uuid(dev, uuid_out, |d| d.uuid)
}

fn total_bytes(dev: CuDevice) -> Res<u64> {
    Ok(driver::get()?.device(dev)?.spec.total_bytes)
}

/// `cuDeviceTotalMem_v2`: the device's capacity in bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CuDevice) -> CuResult {
    entry(|| {
        let total = usize::try_from(total_bytes(dev)?).unwrap_or(usize::MAX);
        // SAFETY: cuda.h contract: `bytes` is null or valid for one write.
        unsafe { out::write(bytes, total) }
    })
}

/// `cuDeviceTotalMem` (CUDA 2.0 ABI: `unsigned int *bytes`): the capacity,
/// capped at `UINT_MAX`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CuDevice) -> CuResult {
    entry(|| {
        let total = c_uint::try_from(total_bytes(dev)?).unwrap_or(c_uint::MAX);
        // SAFETY: cuda.h contract: `bytes` is null or valid for one write.
        unsafe { out::write(bytes, total) }
    })
}

/// The value of `attrib` on `d`: a few real ones, 0 for the rest of the
/// enum, `None` past its end.
fn attribute_value(d: &Device, ordinal: usize, attrib: c_int) -> Option<c_int> {
    known_attribute(d, ordinal, attrib)
        .or_else(|| (1..DEVICE_ATTRIBUTE_MAX).contains(&attrib).then_some(0))
}

/// The attributes given a value of their own.
fn known_attribute(d: &Device, ordinal: usize, attrib: c_int) -> Option<c_int> {
    use crate::ffi::attribute::*;
    let (major, minor) = d.spec.compute_capability;
    let ampere = major < 9;
    let sms = c_int::try_from(d.spec.sm_count).unwrap_or(c_int::MAX);
    Some(match attrib {
        MAX_THREADS_PER_BLOCK => 1024,
        MAX_BLOCK_DIM_X | MAX_BLOCK_DIM_Y => 1024,
        MAX_BLOCK_DIM_Z => 64,
        MAX_GRID_DIM_X => c_int::MAX,
        MAX_GRID_DIM_Y | MAX_GRID_DIM_Z => 65535,
        MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        TOTAL_CONSTANT_MEMORY => 65536,
        WARP_SIZE => 32,
        MAX_PITCH => c_int::MAX,
        MAX_REGISTERS_PER_BLOCK | MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        CLOCK_RATE => {
            if ampere {
                1_410_000
            } else {
                1_980_000
            }
        }
        TEXTURE_ALIGNMENT => 512,
        TEXTURE_PITCH_ALIGNMENT => 32,
        MULTIPROCESSOR_COUNT => sms,
        MEMORY_CLOCK_RATE => {
            if ampere {
                1_215_000
            } else {
                2_619_000
            }
        }
        GLOBAL_MEMORY_BUS_WIDTH => 5120,
        L2_CACHE_SIZE => {
            if ampere {
                40 << 20
            } else {
                50 << 20
            }
        }
        MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        ASYNC_ENGINE_COUNT => 2,
        PCI_BUS_ID => c_int::try_from(d.spec.pci_bus).unwrap_or(0),
        PCI_DEVICE_ID | PCI_DOMAIN_ID => 0,
        COMPUTE_CAPABILITY_MAJOR => major,
        COMPUTE_CAPABILITY_MINOR => minor,
        MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => {
            if ampere {
                167_936
            } else {
                233_472
            }
        }
        MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => {
            if ampere {
                166_912
            } else {
                232_448
            }
        }
        MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        MULTI_GPU_BOARD_GROUP_ID => c_int::try_from(ordinal).unwrap_or(0),
        CLUSTER_LAUNCH => c_int::from(!ampere),
        GPU_OVERLAP
        | CAN_MAP_HOST_MEMORY
        | CONCURRENT_KERNELS
        | ECC_ENABLED
        | UNIFIED_ADDRESSING
        | STREAM_PRIORITIES_SUPPORTED
        | GLOBAL_L1_CACHE_SUPPORTED
        | LOCAL_L1_CACHE_SUPPORTED
        | MANAGED_MEMORY
        | CONCURRENT_MANAGED_ACCESS
        | COMPUTE_PREEMPTION_SUPPORTED
        | COOPERATIVE_LAUNCH
        | COOPERATIVE_MULTI_DEVICE_LAUNCH
        | VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        | MEMORY_POOLS_SUPPORTED => 1,
        _ => return None,
    })
}

/// `cuDeviceGetAttribute`: plausible values for the common attributes
/// (SM count, compute capability, limits, PCI bus), 0 for the others;
/// `INVALID_VALUE` outside the 12.8 enum.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CuDevice,
) -> CuResult {
    entry(|| {
        let d = driver::get()?.device(dev)?;
        let ordinal = usize::try_from(dev).unwrap_or(0);
        let value = attribute_value(d, ordinal, attrib).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: cuda.h contract: `pi` is null or valid for one write.
        unsafe { out::write(pi, value) }
    })
}

/// `cuDeviceGetPCIBusId`: `0000:<bus>:00.0`, cut to `len − 1` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    pci_bus_id: *mut c_char,
    len: c_int,
    dev: CuDevice,
) -> CuResult {
    entry(|| {
        let d = driver::get()?.device(dev)?;
        let text = format!("0000:{:02X}:00.0", d.spec.pci_bus);
        // SAFETY: cuda.h contract: `pciBusId` is null or holds `len` bytes.
        unsafe { out::write_str(pci_bus_id, len, text.as_bytes()) }
    })
}

/// `cuDeviceGetDefaultMemPool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool_out: *mut CuMemoryPool,
    dev: CuDevice,
) -> CuResult {
    entry(|| {
        driver::get()?.device(dev)?;
        let device = u32::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        // SAFETY: cuda.h contract: `pool_out` is null or valid for one write.
        unsafe { out::write(pool_out, Handle::new(Kind::Pool, device, 0).ptr()) }
    })
}
