//! Board, PCI, topology and telemetry queries: what NVIDIA's device plugin,
//! GPU feature discovery, container toolkit and DCGM ask beyond enumeration.
//!
//! Values come from the node state (PCI bus, minor, MIG instances), the MIG
//! catalogue and the board table ([`crate::hw`]); telemetry is a steady
//! reading (idle power, or the board drawing more while a CUDA stand-in
//! process runs on it; 34 °C; clocks at their maximum; no ECC errors).
//!
//! MIG device handles: identity calls (`GetPciInfo*`, `GetArchitecture`,
//! `GetBrand`, `GetCudaComputeCapability`, `GetSerial`,
//! `GetBoardPartNumber`) answer for the parent GPU, as NVML does;
//! `GetAttributes[_v2]` answers only for MIG devices (`NOT_SUPPORTED` for a
//! GPU, as NVML does); every telemetry call answers `NOT_SUPPORTED`.
//!
//! Topology: GPUs on buses below 0x80 are on one CPU socket's root complex,
//! the others on the second: `GetTopologyCommonAncestor` answers
//! `NVML_TOPOLOGY_NODE` within a socket and `NVML_TOPOLOGY_SYSTEM` across;
//! P2P reads as `OK` between any two GPUs. There is no NVLink (its calls
//! answer `NOT_SUPPORTED`, as on PCIe boards).

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_ulonglong};
use std::path::Path;

use tessera_sim::state::{NodeState, SimGpu};

use crate::ffi::*;
use crate::hw::{self, Board, PCI_VENDOR_NVIDIA};
use crate::lookup::{self, Device};
use crate::node::{self, Res};
use crate::out;
use crate::profiles;
use crate::util;

use super::{answer, entry};

/// The GPU behind a handle: itself, or a MIG device's parent.
fn parent(state: &NodeState, device: NvmlDevice) -> Res<&SimGpu> {
    match lookup::device(state, device)? {
        Device::Gpu(gpu) => Ok(gpu),
        Device::Mig(mig) => Ok(mig.gpu),
    }
}

/// Answers a board fact of the GPU behind `device` (a MIG device's parent).
///
/// # Safety
/// `result` is null or valid for one write of a `T`.
unsafe fn board_fact<T>(
    device: NvmlDevice,
    result: *mut T,
    fact: impl FnOnce(&SimGpu, Board) -> T,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe {
        answer(result, |s| {
            let gpu = parent(s, device)?;
            Ok(fact(gpu, hw::board_of(gpu)?))
        })
    }
}

/// Answers a reading of a physical GPU (`NOT_SUPPORTED` for a MIG device);
/// `busy` tells whether a CUDA stand-in process runs on it.
///
/// # Safety
/// `result` is null or valid for one write of a `T`.
unsafe fn reading<T>(
    device: NvmlDevice,
    result: *mut T,
    read: impl FnOnce(&SimGpu, Board, bool) -> Res<T>,
) -> NvmlReturn {
    entry(|| {
        let value = node::read_with_root(|s, root: &Path| {
            let gpu = lookup::physical_gpu(s, device)?;
            let busy = !util::processes(root, gpu.index).is_empty();
            read(gpu, hw::board_of(gpu)?, busy)
        })?;
        // SAFETY: the caller's contract.
        unsafe { out::write(result, value) }
    })
}

/// Runs `write` (a call's writes of fixed answers) once `device` is known
/// to be a physical GPU (`NOT_SUPPORTED` for a MIG device).
fn on_physical_gpu(device: NvmlDevice, write: impl FnOnce() -> Res<()>) -> NvmlReturn {
    entry(|| {
        node::read(|s| lookup::physical_gpu(s, device).map(|_| ()))?;
        write()
    })
}

fn c_chars<const N: usize>(text: &str) -> [c_char; N] {
    let mut field = [0; N];
    out::fill_name(&mut field, text);
    field
}

fn pci_ids(board: Board) -> (c_uint, c_uint) {
    (
        (board.pci_device << 16) | PCI_VENDOR_NVIDIA,
        (board.pci_subsystem << 16) | PCI_VENDOR_NVIDIA,
    )
}

fn pci_info(gpu: &SimGpu, board: Board) -> NvmlPciInfo {
    let (device_id, subsystem_id) = pci_ids(board);
    NvmlPciInfo {
        bus_id_legacy: c_chars(&gpu.pci_bus_id_legacy()),
        domain: 0,
        bus: gpu.pci_bus(),
        device: 0,
        pci_device_id: device_id,
        pci_sub_system_id: subsystem_id,
        bus_id: c_chars(&gpu.pci_bus_id()),
    }
}

/// `nvmlDeviceGetPciInfo_v3`: the GPU's PCI address (`00000000:<bus>:00.0`)
/// and ids; a MIG device answers with its parent's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: NvmlDevice,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract: `pci` is null or valid for one write.
    unsafe { board_fact(device, pci, pci_info) }
}

/// # Safety
/// `pci` is null or valid for one write of the v1 struct.
unsafe fn pci_info_v1(device: NvmlDevice, pci: *mut NvmlPciInfoV1) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe {
        board_fact(device, pci, |gpu, board| {
            let info = pci_info(gpu, board);
            NvmlPciInfoV1 {
                bus_id: info.bus_id_legacy,
                domain: info.domain,
                bus: info.bus,
                device: info.device,
                pci_device_id: info.pci_device_id,
                pci_sub_system_id: info.pci_sub_system_id,
                reserved: [0; 4],
            }
        })
    }
}

/// `nvmlDeviceGetPciInfo_v2`: the struct before the 32-byte `busId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: NvmlDevice,
    pci: *mut NvmlPciInfoV1,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { pci_info_v1(device, pci) }
}

/// `nvmlDeviceGetPciInfo` (NVML 1 name): as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: NvmlDevice,
    pci: *mut NvmlPciInfoV1,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { pci_info_v1(device, pci) }
}

/// `nvmlDeviceGetPciInfoExt`: the PCI address with the class codes (3D
/// controller); `ARGUMENT_VERSION_MISMATCH` unless `version` is v1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(
    device: NvmlDevice,
    pci: *mut NvmlPciInfoExt,
) -> NvmlReturn {
    entry(|| {
        // SAFETY: NVML contract: `pci` is null or a versioned struct.
        if unsafe { out::read_version(pci) }? != PCI_INFO_EXT_V1 {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let info = node::read(|s| {
            let gpu = parent(s, device)?;
            Ok(pci_info(gpu, hw::board_of(gpu)?))
        })?;
        let ext = NvmlPciInfoExt {
            version: PCI_INFO_EXT_V1,
            domain: info.domain,
            bus: info.bus,
            device: info.device,
            pci_device_id: info.pci_device_id,
            pci_sub_system_id: info.pci_sub_system_id,
            base_class: 3,
            sub_class: 2,
            bus_id: info.bus_id,
        };
        // SAFETY: as above; valid for one write.
        unsafe { out::write(pci, ext) }
    })
}

/// The bus of a PCI address as callers write it: `[domain:]bus:device.function`,
/// hex, the domain 4 or 8 digits.
fn parse_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [domain, bus, rest] => (u32::from_str_radix(domain, 16).ok()?, *bus, *rest),
        [bus, rest] => (0, *bus, *rest),
        _ => return None,
    };
    let (device, function) = rest.split_once('.')?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let device = u32::from_str_radix(device, 16).ok()?;
    let function = u32::from_str_radix(function, 16).ok()?;
    (domain == 0 && function == 0).then_some((domain, bus, device))
}

/// # Safety
/// `bus_id` is null or NUL-terminated; `device` null or valid for one write.
unsafe fn handle_by_bus_id(bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn {
    let find = |s: &NodeState| {
        // SAFETY: the caller's contract: null or NUL-terminated, unchanged during the call.
        let text = unsafe { out::read_str(bus_id) }?;
        let (_, bus, dev) = parse_bus_id(text).ok_or(ERROR_INVALID_ARGUMENT)?;
        let gpu = s
            .gpus
            .iter()
            .find(|g| g.pci_bus() == bus && dev == 0)
            .ok_or(ERROR_NOT_FOUND)?;
        lookup::gpu_handle(lookup::gpu(s, gpu.index)?.index)
    };
    // SAFETY: the caller's contract.
    unsafe { answer(device, find) }
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: the GPU at a PCI address
/// (`00000000:07:00.0`, `0000:07:00.0` or `07:00.0`); `NOT_FOUND` if none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { handle_by_bus_id(pci_bus_id, device) }
}

/// `nvmlDeviceGetHandleByPciBusId` (NVML 1 name): as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pci_bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { handle_by_bus_id(pci_bus_id, device) }
}

/// `nvmlDeviceGetHandleBySerial`: the GPU with this board serial.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    let find = |s: &NodeState| {
        // SAFETY: NVML contract: null or NUL-terminated, unchanged during the call.
        let serial = unsafe { out::read_str(serial) }?;
        let gpu = s
            .gpus
            .iter()
            .find(|g| hw::serial(g) == serial)
            .ok_or(ERROR_NOT_FOUND)?;
        lookup::gpu_handle(lookup::gpu(s, gpu.index)?.index)
    };
    // SAFETY: NVML contract: `device` is null or valid for one write.
    unsafe { answer(device, find) }
}

/// # Safety
/// `attributes` is null or valid for one write.
unsafe fn attributes(device: NvmlDevice, attributes: *mut NvmlDeviceAttributes) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe {
        answer(attributes, |s| match lookup::device(s, device)? {
            Device::Gpu(_) => Err(ERROR_NOT_SUPPORTED),
            Device::Mig(mig) => {
                let spec = profiles::mig(mig.gpu)?;
                let profile = profiles::gi_profile_of(mig.gpu, mig.gi)?;
                let engines = profiles::engines(profile, spec.axis_len);
                Ok(NvmlDeviceAttributes {
                    multiprocessor_count: profile.sm_count,
                    shared_copy_engine_count: engines.copy,
                    shared_decoder_count: engines.decoder,
                    shared_encoder_count: engines.encoder,
                    shared_jpeg_count: engines.jpeg,
                    shared_ofa_count: engines.ofa,
                    gpu_instance_slice_count: profile.compute_slices,
                    compute_instance_slice_count: profile.compute_slices,
                    memory_size_mb: profile.memory_mib,
                })
            }
        })
    }
}

/// `nvmlDeviceGetAttributes_v2`: a MIG device's SMs, shared engines, slices
/// and memory, from its GPU-instance profile (the compute instance spans
/// it); `NOT_SUPPORTED` for a GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: NvmlDevice,
    attrs: *mut NvmlDeviceAttributes,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { attributes(device, attrs) }
}

/// `nvmlDeviceGetAttributes` (first name): as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: NvmlDevice,
    attrs: *mut NvmlDeviceAttributes,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { attributes(device, attrs) }
}

/// `nvmlDeviceGetCudaComputeCapability`: e.g. 9.0 on Hopper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: NvmlDevice,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    entry(|| {
        let (ma, mi) = node::read(|s| {
            let gpu = parent(s, device)?;
            Ok(hw::board_of(gpu)?.compute_capability)
        })?;
        // SAFETY: NVML contract: both are null or valid for one write.
        unsafe {
            out::write(major, ma)?;
            out::write(minor, mi)
        }
    })
}

/// `nvmlDeviceGetArchitecture`: `NVML_DEVICE_ARCH_*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: NvmlDevice,
    arch: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `arch` is null or valid for one write.
    unsafe { board_fact(device, arch, |_, b| b.architecture) }
}

/// `nvmlDeviceGetBrand`: `NVML_BRAND_NVIDIA` (`NVIDIA_RTX` on RTX PRO).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: NvmlDevice, brand: *mut c_uint) -> NvmlReturn {
    // SAFETY: NVML contract: `brand` is null or valid for one write.
    unsafe { board_fact(device, brand, |_, b| b.brand) }
}

/// Writes a board string of the GPU behind `device`.
///
/// # Safety
/// `buf` is null or holds `length` bytes.
unsafe fn board_string(
    device: NvmlDevice,
    buf: *mut c_char,
    length: c_uint,
    text: impl FnOnce(&SimGpu, Board) -> String,
) -> NvmlReturn {
    entry(|| {
        let text = node::read(|s| {
            let gpu = parent(s, device)?;
            Ok(text(gpu, hw::board_of(gpu)?))
        })?;
        // SAFETY: the caller's contract.
        unsafe { out::write_str(buf, length, &text) }
    })
}

/// `nvmlDeviceGetSerial`: 13 digits, stable per GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: NvmlDevice,
    serial: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `serial` is null or holds `length` bytes.
    unsafe { board_string(device, serial, length, |gpu, _| hw::serial(gpu)) }
}

/// `nvmlDeviceGetBoardPartNumber`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(
    device: NvmlDevice,
    part: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `part` is null or holds `length` bytes.
    unsafe { board_string(device, part, length, |_, b| b.part_number.into()) }
}

/// `nvmlDeviceGetVbiosVersion`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: NvmlDevice,
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `version` is null or holds `length` bytes.
    unsafe { board_string(device, version, length, |_, b| b.vbios.into()) }
}

/// `nvmlDeviceGetInforomVersion`: OEM (0), ECC (1) and power (2) objects.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(
    device: NvmlDevice,
    object: c_uint,
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    if object > 2 {
        return ERROR_INVALID_ARGUMENT;
    }
    let text = ["2.1", "7.0", "N/A"][object as usize];
    // SAFETY: NVML contract: `version` is null or holds `length` bytes.
    unsafe { board_string(device, version, length, |_, _| text.into()) }
}

/// `nvmlDeviceGetInforomImageVersion`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomImageVersion(
    device: NvmlDevice,
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `version` is null or holds `length` bytes.
    unsafe {
        board_string(device, version, length, |_, b| {
            format!("G{}.0200.00.05", 500 + b.architecture)
        })
    }
}

/// NUMA side of a GPU: its bus below or above 0x80.
fn socket(gpu: &SimGpu) -> u32 {
    u32::from(gpu.pci_bus() >= 0x80)
}

/// `nvmlDeviceGetTopologyCommonAncestor`: `INTERNAL` (0) for the same GPU,
/// `NODE` (40) on one socket, `SYSTEM` (50) across.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: NvmlDevice,
    device2: NvmlDevice,
    path_info: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `path_info` is null or valid for one write.
    unsafe {
        answer(path_info, |s| {
            let a = lookup::physical_gpu(s, device1)?;
            let b = lookup::physical_gpu(s, device2)?;
            Ok(if a.index == b.index {
                0
            } else if socket(a) == socket(b) {
                40
            } else {
                50
            })
        })
    }
}

/// `nvmlDeviceGetP2PStatus`: `NVML_P2P_STATUS_OK` (0) between any two GPUs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: NvmlDevice,
    device2: NvmlDevice,
    _p2p_index: c_uint,
    status: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `status` is null or valid for one write.
    unsafe {
        answer(status, |s| {
            lookup::physical_gpu(s, device1)?;
            lookup::physical_gpu(s, device2)?;
            Ok(0)
        })
    }
}

/// `nvmlDeviceOnSameBoard`: 1 only for the same GPU (one GPU per board).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceOnSameBoard(
    device1: NvmlDevice,
    device2: NvmlDevice,
    on_same_board: *mut c_int,
) -> NvmlReturn {
    // SAFETY: NVML contract: `on_same_board` is null or valid for one write.
    unsafe {
        answer(on_same_board, |s| {
            let a = lookup::physical_gpu(s, device1)?;
            let b = lookup::physical_gpu(s, device2)?;
            Ok(c_int::from(a.index == b.index))
        })
    }
}

/// Power drawn now: idle, or 60 % of the way to the limit while busy, mW.
fn power_mw(board: Board, busy: bool) -> c_uint {
    let idle = board.idle_power_w * 1000;
    if busy {
        idle + (board.power_limit_w * 1000 - idle) * 3 / 5
    } else {
        idle
    }
}

/// `nvmlDeviceGetPowerUsage`, mW.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: NvmlDevice,
    power: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `power` is null or valid for one write.
    unsafe { reading(device, power, |_, b, busy| Ok(power_mw(b, busy))) }
}

/// `nvmlDeviceGetTotalEnergyConsumption`, mJ: the idle draw since the
/// machine booted (monotonic clock), so it only grows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: NvmlDevice,
    energy: *mut c_ulonglong,
) -> NvmlReturn {
    let seconds_ms = util::monotonic_ns() / 1_000_000;
    // SAFETY: NVML contract: `energy` is null or valid for one write.
    unsafe {
        reading(device, energy, |_, b, _| {
            Ok(u64::from(b.idle_power_w) * seconds_ms)
        })
    }
}

/// # Safety
/// `limit` is null or valid for one write.
unsafe fn power_limit(device: NvmlDevice, limit: *mut c_uint) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe { reading(device, limit, |_, b, _| Ok(b.power_limit_w * 1000)) }
}

/// `nvmlDeviceGetEnforcedPowerLimit`, mW: the board limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: NvmlDevice,
    limit: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { power_limit(device, limit) }
}

/// `nvmlDeviceGetPowerManagementLimit`, mW: the board limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: NvmlDevice,
    limit: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { power_limit(device, limit) }
}

/// `nvmlDeviceGetPowerManagementDefaultLimit`, mW: the board limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: NvmlDevice,
    limit: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { power_limit(device, limit) }
}

/// `nvmlDeviceGetPowerManagementLimitConstraints`, mW.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: NvmlDevice,
    min_limit: *mut c_uint,
    max_limit: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let b = node::read(|s| hw::board_of(lookup::physical_gpu(s, device)?))?;
        // SAFETY: NVML contract: both are null or valid for one write.
        unsafe {
            out::write(min_limit, b.power_min_w * 1000)?;
            out::write(max_limit, b.power_limit_w * 1000)
        }
    })
}

/// `nvmlDeviceGetTemperature`: the GPU sensor (0) only, 34 °C (42 busy).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: NvmlDevice,
    sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    if sensor != 0 {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: NVML contract: `temp` is null or valid for one write.
    unsafe { reading(device, temp, |_, _, busy| Ok(if busy { 42 } else { 34 })) }
}

/// `nvmlDeviceGetTemperatureThreshold`: shutdown 92, slowdown 89, memory
/// max 95, GPU max 87 °C; other thresholds `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: NvmlDevice,
    threshold: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `temp` is null or valid for one write.
    unsafe {
        reading(device, temp, |_, _, _| match threshold {
            0 => Ok(92),
            1 => Ok(89),
            2 => Ok(95),
            3 => Ok(87),
            _ => Err(ERROR_NOT_SUPPORTED),
        })
    }
}

fn max_clock(board: Board, clock: c_uint) -> Res<c_uint> {
    match clock {
        0 | 1 => Ok(board.max_sm_mhz),
        2 => Ok(board.max_mem_mhz),
        3 => Ok(board.max_video_mhz),
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetClockInfo`: graphics (0), SM (1), memory (2), video (3),
/// MHz: the maximum (the simulated board never down-clocks).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: NvmlDevice,
    clock: c_uint,
    mhz: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mhz` is null or valid for one write.
    unsafe { reading(device, mhz, |_, b, _| max_clock(b, clock)) }
}

/// `nvmlDeviceGetMaxClockInfo`: as `GetClockInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: NvmlDevice,
    clock: c_uint,
    mhz: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mhz` is null or valid for one write.
    unsafe { reading(device, mhz, |_, b, _| max_clock(b, clock)) }
}

/// `nvmlDeviceGetClock`: any clock id (current, target, default, boost) reads
/// as the maximum.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: NvmlDevice,
    clock: c_uint,
    _clock_id: c_uint,
    mhz: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mhz` is null or valid for one write.
    unsafe { reading(device, mhz, |_, b, _| max_clock(b, clock)) }
}

/// # Safety
/// `reasons` is null or valid for one write.
unsafe fn event_reasons(device: NvmlDevice, reasons: *mut c_ulonglong) -> NvmlReturn {
    // `nvmlClocksEventReasonGpuIdle` while nothing runs; none while busy.
    // SAFETY: the caller's contract.
    unsafe { reading(device, reasons, |_, _, busy| Ok(u64::from(!busy))) }
}

/// `nvmlDeviceGetCurrentClocksEventReasons`: `GpuIdle` (0x1) while no
/// process runs, else none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: NvmlDevice,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { event_reasons(device, reasons) }
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons` (older name): as above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: NvmlDevice,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { event_reasons(device, reasons) }
}

/// Event reasons a data-center board can report.
const SUPPORTED_REASONS: c_ulonglong = 0x1ef;

/// `nvmlDeviceGetSupportedClocksEventReasons`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    device: NvmlDevice,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract: `reasons` is null or valid for one write.
    unsafe { reading(device, reasons, |_, _, _| Ok(SUPPORTED_REASONS)) }
}

/// `nvmlDeviceGetSupportedClocksThrottleReasons` (older name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: NvmlDevice,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract: `reasons` is null or valid for one write.
    unsafe { reading(device, reasons, |_, _, _| Ok(SUPPORTED_REASONS)) }
}

/// `nvmlDeviceGetEccMode`: enabled, current and pending.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: NvmlDevice,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    on_physical_gpu(device, || {
        // SAFETY: NVML contract: both are null or valid for one write.
        unsafe {
            out::write(current, 1)?;
            out::write(pending, 1)
        }
    })
}

/// `nvmlDeviceGetTotalEccErrors`: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: NvmlDevice,
    _error_type: c_uint,
    _counter_type: c_uint,
    count: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract: `count` is null or valid for one write.
    unsafe { reading(device, count, |_, _, _| Ok(0)) }
}

/// `nvmlDeviceGetMemoryErrorCounter`: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: NvmlDevice,
    _error_type: c_uint,
    _counter_type: c_uint,
    _location: c_uint,
    count: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract: `count` is null or valid for one write.
    unsafe { reading(device, count, |_, _, _| Ok(0)) }
}

/// `nvmlDeviceGetRemappedRows`: none remapped, none pending, no failure.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: NvmlDevice,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> NvmlReturn {
    on_physical_gpu(device, || {
        // SAFETY: NVML contract: each is null or valid for one write.
        unsafe {
            out::write(corr_rows, 0)?;
            out::write(unc_rows, 0)?;
            out::write(is_pending, 0)?;
            out::write(failure_occurred, 0)
        }
    })
}

/// `nvmlDeviceGetPcieReplayCounter`: 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: NvmlDevice,
    value: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `value` is null or valid for one write.
    unsafe { reading(device, value, |_, _, _| Ok(0)) }
}

/// `nvmlDeviceGetPcieThroughput`: 0 KB/s either way.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: NvmlDevice,
    _counter: c_uint,
    value: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `value` is null or valid for one write.
    unsafe { reading(device, value, |_, _, _| Ok(0)) }
}

/// `nvmlDeviceGetCurrPcieLinkGeneration`: the board's generation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: NvmlDevice,
    gen_: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `gen_` is null or valid for one write.
    unsafe { reading(device, gen_, |_, b, _| Ok(b.pcie_gen)) }
}

/// `nvmlDeviceGetMaxPcieLinkGeneration`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: NvmlDevice,
    gen_: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `gen_` is null or valid for one write.
    unsafe { reading(device, gen_, |_, b, _| Ok(b.pcie_gen)) }
}

/// `nvmlDeviceGetGpuMaxPcieLinkGeneration`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuMaxPcieLinkGeneration(
    device: NvmlDevice,
    gen_: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `gen_` is null or valid for one write.
    unsafe { reading(device, gen_, |_, b, _| Ok(b.pcie_gen)) }
}

/// `nvmlDeviceGetCurrPcieLinkWidth`: x16.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: NvmlDevice,
    width: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `width` is null or valid for one write.
    unsafe { reading(device, width, |_, _, _| Ok(16)) }
}

/// `nvmlDeviceGetMaxPcieLinkWidth`: x16.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: NvmlDevice,
    width: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `width` is null or valid for one write.
    unsafe { reading(device, width, |_, _, _| Ok(16)) }
}

/// Answers a fixed mode value for a physical GPU.
///
/// # Safety
/// `mode` is null or valid for one write.
unsafe fn fixed(device: NvmlDevice, mode: *mut c_uint, value: c_uint) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe { reading(device, mode, |_, _, _| Ok(value)) }
}

/// `nvmlDeviceGetPersistenceMode`: enabled (as on a node running the daemon).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mode` is null or valid for one write.
    unsafe { fixed(device, mode, 1) }
}

/// `nvmlDeviceGetComputeMode`: `NVML_COMPUTEMODE_DEFAULT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mode` is null or valid for one write.
    unsafe { fixed(device, mode, 0) }
}

/// `nvmlDeviceGetDisplayMode`: disabled (no monitor attached).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mode` is null or valid for one write.
    unsafe { fixed(device, mode, 0) }
}

/// `nvmlDeviceGetDisplayActive`: disabled.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    device: NvmlDevice,
    active: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `active` is null or valid for one write.
    unsafe { fixed(device, active, 0) }
}

/// `nvmlDeviceGetPerformanceState`: P0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: NvmlDevice,
    state: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `state` is null or valid for one write.
    unsafe { fixed(device, state, 0) }
}

/// `nvmlDeviceGetPowerState` (older name of the performance state): P0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerState(
    device: NvmlDevice,
    state: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `state` is null or valid for one write.
    unsafe { fixed(device, state, 0) }
}

/// `nvmlDeviceGetPowerManagementMode`: enabled.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mode` is null or valid for one write.
    unsafe { fixed(device, mode, 1) }
}

/// `nvmlDeviceGetVirtualizationMode`: `NVML_GPU_VIRTUALIZATION_MODE_NONE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `mode` is null or valid for one write.
    unsafe { fixed(device, mode, 0) }
}

/// `nvmlDeviceGetMultiGpuBoard`: no (one GPU per board).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: NvmlDevice,
    multi: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `multi` is null or valid for one write.
    unsafe { fixed(device, multi, 0) }
}

/// `nvmlDeviceGetBoardId`: the PCI bus (unique per board on the node).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardId(
    device: NvmlDevice,
    board_id: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `board_id` is null or valid for one write.
    unsafe { reading(device, board_id, |gpu, _, _| Ok(gpu.pci_bus() << 8)) }
}

/// `nvmlDeviceGetBAR1MemoryInfo`: the board's aperture, 2 MiB used.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device: NvmlDevice,
    bar1: *mut NvmlBar1Memory,
) -> NvmlReturn {
    // SAFETY: NVML contract: `bar1` is null or valid for one write.
    unsafe {
        reading(device, bar1, |_, b, _| {
            let total = profiles::bytes(b.bar1_mib);
            let used = profiles::bytes(2);
            Ok(NvmlBar1Memory {
                total,
                free: total - used,
                used,
            })
        })
    }
}

/// Writes a bit set of `words` words with bits `0..bits` set.
///
/// # Safety
/// `set` is null or holds `words` words.
unsafe fn write_bits(set: *mut c_ulong, words: c_uint, bits: usize) -> Res<()> {
    let word_bits = c_ulong::BITS as usize;
    let values: Vec<c_ulong> = (0..words as usize)
        .map(|w| {
            let from = w * word_bits;
            match bits.saturating_sub(from) {
                0 => 0,
                n if n >= word_bits => c_ulong::MAX,
                n => (1 << n) - 1,
            }
        })
        .collect();
    // SAFETY: the caller's contract.
    unsafe { out::write_all(set, &values) }
}

/// # Safety
/// `cpu_set` is null or holds `cpu_set_size` words.
unsafe fn cpu_affinity(
    device: NvmlDevice,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
) -> NvmlReturn {
    on_physical_gpu(device, || {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        // SAFETY: the caller's contract.
        unsafe { write_bits(cpu_set, cpu_set_size, cpus) }
    })
}

/// `nvmlDeviceGetCpuAffinity`: every CPU of this machine (one NUMA node).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: NvmlDevice,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { cpu_affinity(device, cpu_set_size, cpu_set) }
}

/// `nvmlDeviceGetCpuAffinityWithinScope`: as `GetCpuAffinity`, any scope.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: NvmlDevice,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
    _scope: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { cpu_affinity(device, cpu_set_size, cpu_set) }
}

/// `nvmlDeviceGetMemoryAffinity`: NUMA node 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: NvmlDevice,
    node_set_size: c_uint,
    node_set: *mut c_ulong,
    _scope: c_uint,
) -> NvmlReturn {
    on_physical_gpu(device, || {
        // SAFETY: NVML contract: `node_set` is null or holds `node_set_size` words.
        unsafe { write_bits(node_set, node_set_size, 1) }
    })
}

/// # Safety
/// `util` and `period` are null or valid for one write.
unsafe fn idle_engine(device: NvmlDevice, util: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    on_physical_gpu(device, || {
        // SAFETY: the caller's contract.
        unsafe {
            out::write(util, 0)?;
            out::write(period, 167_000)
        }
    })
}

/// `nvmlDeviceGetEncoderUtilization`: 0 % (the simulation runs no video).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: NvmlDevice,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { idle_engine(device, utilization, sampling_period_us) }
}

/// `nvmlDeviceGetDecoderUtilization`: 0 %.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: NvmlDevice,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { idle_engine(device, utilization, sampling_period_us) }
}

/// `nvmlDeviceGetEncoderStats`: no sessions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderStats(
    device: NvmlDevice,
    session_count: *mut c_uint,
    average_fps: *mut c_uint,
    average_latency: *mut c_uint,
) -> NvmlReturn {
    on_physical_gpu(device, || {
        // SAFETY: NVML contract: each is null or valid for one write.
        unsafe {
            out::write(session_count, 0)?;
            out::write(average_fps, 0)?;
            out::write(average_latency, 0)
        }
    })
}

/// # Safety
/// `count` is null or valid for a read and a write.
unsafe fn no_entries(device: NvmlDevice, count: *mut c_uint) -> NvmlReturn {
    entry(|| {
        node::read(|s| lookup::device(s, device).map(|_| ()))?;
        // SAFETY: the caller's contract.
        unsafe { out::write(count, 0) }
    })
}

/// `nvmlDeviceGetEncoderSessions`: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(
    device: NvmlDevice,
    session_count: *mut c_uint,
    _session_infos: *mut u8,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, session_count) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3`: none (no graphics runs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    _infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, info_count) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v2`: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    _infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, info_count) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses` (first struct): none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: NvmlDevice,
    info_count: *mut c_uint,
    _infos: *mut u8,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, info_count) }
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3`: none (no MPS server runs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    _infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, info_count) }
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v2`: none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    _infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, info_count) }
}

/// `nvmlDeviceGetMPSComputeRunningProcesses` (first struct): none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: NvmlDevice,
    info_count: *mut c_uint,
    _infos: *mut u8,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { no_entries(device, info_count) }
}

/// `nvmlDeviceGetViolationStatus`: no time lost to any policy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetViolationStatus(
    device: NvmlDevice,
    _policy: c_uint,
    time: *mut NvmlViolationTime,
) -> NvmlReturn {
    let now = util::monotonic_ns();
    // SAFETY: NVML contract: `time` is null or valid for one write.
    unsafe {
        reading(device, time, |_, _, _| {
            Ok(NvmlViolationTime {
                reference_time: now,
                violation_time: 0,
            })
        })
    }
}

/// `nvmlDeviceGetFieldValues`: every requested field answers its own
/// `NOT_SUPPORTED` (the call itself succeeds, as NVML's does for fields a
/// board lacks).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: NvmlDevice,
    values_count: c_int,
    values: *mut NvmlFieldValue,
) -> NvmlReturn {
    entry(|| {
        node::read(|s| lookup::device(s, device).map(|_| ()))?;
        let n = usize::try_from(values_count).map_err(|_| ERROR_INVALID_ARGUMENT)?;
        if values.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        for i in 0..n {
            // SAFETY: NVML contract: `values` holds `values_count` entries
            // whose fieldId/scopeId the caller set; entry i < n is in it.
            let slot = unsafe { values.add(i) };
            // SAFETY: as above.
            let mut field = unsafe { slot.read_unaligned() };
            field.timestamp = stamp;
            field.latency_usec = 0;
            field.nvml_return = ERROR_NOT_SUPPORTED;
            field.value = 0;
            // SAFETY: as above.
            unsafe { slot.write_unaligned(field) };
        }
        Ok(())
    })
}

/// `nvmlSystemGetProcessName`: the process's command (`argv[0]` from
/// `/proc/<pid>/cmdline`, else its `comm`); `NOT_FOUND` for no such process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    entry(|| {
        node::read(|_| Ok(()))?;
        let proc_dir = Path::new("/proc").join(pid.to_string());
        let from_cmdline = std::fs::read(proc_dir.join("cmdline")).ok().and_then(|b| {
            let first = b.split(|&c| c == 0).next()?.to_vec();
            (!first.is_empty()).then(|| String::from_utf8_lossy(&first).into_owned())
        });
        let text = match from_cmdline {
            Some(t) => t,
            None => std::fs::read_to_string(proc_dir.join("comm"))
                .map(|c| c.trim_end().to_string())
                .map_err(|_| ERROR_NOT_FOUND)?,
        };
        let cut: String = text
            .chars()
            .take(length.saturating_sub(1) as usize)
            .collect();
        // SAFETY: NVML contract: `name` is null or holds `length` bytes.
        unsafe { out::write_str(name, length, &cut) }
    })
}

/// `nvmlUnitGetCount`: no S-class units.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetCount(unit_count: *mut c_uint) -> NvmlReturn {
    // SAFETY: NVML contract: `unit_count` is null or valid for one write.
    unsafe { answer(unit_count, |_| Ok(0)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_every_form() {
        assert_eq!(parse_bus_id("00000000:1B:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(parse_bus_id("0000:1b:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(parse_bus_id("1b:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(parse_bus_id("0001:1b:00.0"), None);
        assert_eq!(parse_bus_id("garbage"), None);
    }
}
