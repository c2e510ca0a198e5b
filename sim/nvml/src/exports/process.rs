//! GPU processes: who runs on a device, how much memory they hold and how
//! busy they keep it, from the utilization files the CUDA stand-in
//! publishes (see [`crate::util`]). A node nobody runs CUDA work on has no
//! processes: every device is idle with nothing used.

use std::ffi::{c_uint, c_ulonglong};
use std::path::PathBuf;

use tessera_sim::state::NodeState;

use crate::ffi::*;
use crate::lookup::{self, Device};
use crate::node::{self, Res};
use crate::out;
use crate::util::{self, Process};

use super::entry;

/// Window of `nvmlDeviceGetUtilizationRates`: the last second.
const RATES_WINDOW_NS: u64 = 1_000_000_000;

/// The physical GPU index of `device` and the MIG device it names, if any.
fn target(state: &NodeState, device: NvmlDevice) -> Res<(u32, Option<(u32, u32)>)> {
    Ok(match lookup::device(state, device)? {
        Device::Gpu(gpu) => (gpu.index, None),
        Device::Mig(mig) => (mig.gpu.index, Some((mig.gi.id, mig.ci.id))),
    })
}

/// Where to look for a device's processes.
struct Located {
    root: PathBuf,
    gpu: u32,
    mig: Option<(u32, u32)>,
}

/// The node root and `device`'s GPU and MIG device.
fn locate(device: NvmlDevice) -> Res<Located> {
    node::read_with_root(|state, root| {
        let (gpu, mig) = target(state, device)?;
        Ok(Located {
            root: root.to_path_buf(),
            gpu,
            mig,
        })
    })
}

/// The live processes on `device` (on a MIG device: those using it).
fn processes_on(device: NvmlDevice) -> Res<Vec<Process>> {
    let at = locate(device)?;
    let mut found = util::processes(&at.root, at.gpu);
    if at.mig.is_some() {
        found.retain(|p| p.instance == at.mig);
    }
    Ok(found)
}

/// Bytes the processes on `device` hold (for `nvmlDeviceGetMemoryInfo`).
pub fn used_memory(device: NvmlDevice) -> Res<u64> {
    Ok(processes_on(device)?
        .iter()
        .map(|p| p.newest().mem_bytes)
        .fold(0u64, u64::saturating_add))
}

/// The physical GPU of `device`, refusing MIG devices (`NOT_SUPPORTED`),
/// as utilization queries do.
fn physical(device: NvmlDevice) -> Res<(PathBuf, u32)> {
    match locate(device)? {
        Located {
            root,
            gpu,
            mig: None,
        } => Ok((root, gpu)),
        _ => Err(ERROR_NOT_SUPPORTED),
    }
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process with activity
/// newer than `lastSeenTimeStamp` (µs since the epoch), stamped with that
/// activity's time; `smUtil` is the percent of the time since the process's
/// sample at `lastSeenTimeStamp` (or its oldest, 1.28 s back at most) that
/// the GPU spent on its work. NULL `utilization`: the count needed in
/// `*processSamplesCount` and `INSUFFICIENT_SIZE`; too small a buffer:
/// likewise; no samples: `NOT_FOUND`. `NOT_SUPPORTED` for a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    utilization: *mut NvmlProcessUtilizationSample,
    process_samples_count: *mut c_uint,
    last_seen_time_stamp: c_ulonglong,
) -> NvmlReturn {
    entry(|| {
        // SAFETY: NVML contract: the count is null or valid for a read and a write.
        let capacity = unsafe { out::read(process_samples_count) }?;
        let (root, gpu) = physical(device)?;
        let samples: Vec<NvmlProcessUtilizationSample> = util::processes(&root, gpu)
            .iter()
            .filter(|p| p.newest().real_us > last_seen_time_stamp)
            .map(|p| NvmlProcessUtilizationSample {
                pid: p.pid,
                time_stamp: p.newest().real_us,
                sm_util: util::percent(p.busy_since(p.base_since(last_seen_time_stamp))),
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            })
            .collect();
        let needed = c_uint::try_from(samples.len()).unwrap_or(c_uint::MAX);
        if utilization.is_null() || capacity < needed {
            // SAFETY: as above.
            unsafe { out::write(process_samples_count, needed) }?;
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        // SAFETY: as above.
        unsafe { out::write(process_samples_count, needed) }?;
        if samples.is_empty() {
            return Err(ERROR_NOT_FOUND);
        }
        // SAFETY: NVML contract: the buffer holds `capacity` ≥ needed samples.
        unsafe { out::write_all(utilization, &samples) }
    })
}

/// `nvmlDeviceGetUtilizationRates`: `gpu` is the percent of the last second
/// the GPU was busy with any process's work (processes summed, at most
/// 100); `memory` is 0 (memory traffic is not simulated).
/// `NOT_SUPPORTED` for a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    utilization: *mut NvmlUtilization,
) -> NvmlReturn {
    entry(|| {
        let (root, gpu) = physical(device)?;
        let now = util::monotonic_ns();
        let busy: f64 = util::processes(&root, gpu)
            .iter()
            .filter(|p| p.newest().mono_ns.saturating_add(RATES_WINDOW_NS) >= now)
            .map(|p| p.busy_since(p.base_within(RATES_WINDOW_NS)))
            .sum();
        let rates = NvmlUtilization {
            gpu: util::percent(busy),
            memory: 0,
        };
        // SAFETY: NVML contract: `utilization` is null or valid for one write.
        unsafe { out::write(utilization, rates) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: every live process with a
/// context on the device (on a MIG device: using that MIG device), with the
/// device memory it holds and its GI/CI ids (`0xFFFFFFFF` off MIG).
/// `*infoCount` in: the buffer's room; out: the processes. Too little room
/// (NULL `infos` with 0 included): `INSUFFICIENT_SIZE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    entry(|| {
        // SAFETY: NVML contract: `infoCount` is null or valid for a read and a write.
        let capacity = unsafe { out::read(info_count) }?;
        let list: Vec<NvmlProcessInfo> = processes_on(device)?
            .iter()
            .map(|p| {
                let (gi, ci) = p
                    .instance
                    .unwrap_or((VALUE_NOT_AVAILABLE_UINT, VALUE_NOT_AVAILABLE_UINT));
                NvmlProcessInfo {
                    pid: p.pid,
                    used_gpu_memory: p.newest().mem_bytes,
                    gpu_instance_id: gi,
                    compute_instance_id: ci,
                }
            })
            .collect();
        let n = c_uint::try_from(list.len()).unwrap_or(c_uint::MAX);
        // SAFETY: as above.
        unsafe { out::write(info_count, n) }?;
        if capacity < n {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        if list.is_empty() {
            return Ok(());
        }
        // SAFETY: NVML contract: `infos` is null or holds `capacity` ≥ n entries.
        unsafe { out::write_all(infos, &list) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`: as `_v3` (the `_v2` struct,
/// `nvmlProcessInfo_v2_t`, has the same layout).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, info_count, infos) }
}
