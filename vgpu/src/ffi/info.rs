//! What the program is told about memory: `cuMemGetInfo[_v2]` and
//! `cuDeviceTotalMem[_v2]` report the slice on a limited device.

use std::ffi::c_uint;

use super::driver::{current_device, rt};
use super::guard::protect;
use super::pools::CudaPools;
use super::types::{AbiInt, CUdevice, CUresult};
use crate::memory::{self, SUCCESS};
use crate::names::Hook;

/// `cuMemGetInfo` in either ABI: the slice written as `T` (saturating) on
/// a limited device, the driver's answer elsewhere or when an out-pointer
/// is null.
fn mem_info<T: AbiInt>(
    hook: Hook,
    free: *mut T,
    total: *mut T,
    call: impl Fn() -> CUresult,
) -> CUresult {
    if free.is_null() || total.is_null() {
        return call();
    }
    protect(
        hook,
        |driver| match current_slice() {
            Some((f, t)) => {
                // SAFETY: both out-pointers are non-null (checked above) and
                // the caller's contract makes them valid for one write.
                unsafe {
                    free.write_unaligned(T::saturate(f));
                    total.write_unaligned(T::saturate(t));
                }
                SUCCESS
            }
            None => driver.call(&call),
        },
        &call,
    )
}

/// The current device's slice as (free, total) when a limit applies to it.
/// Pools may have given memory back at a synchronisation the library does
/// not see: their ledgers are brought up to date first (only when the
/// process has used a pool).
fn current_slice() -> Option<(u64, u64)> {
    let rt = rt();
    if !rt.enforcing() {
        return None;
    }
    let pools = crate::pools::global();
    if pools.any() {
        pools.reconcile_if_idle(rt, &CudaPools);
    }
    current_device().and_then(|o| memory::slice(rt, o))
}

intercept! {
    /// `cuMemGetInfo_v2`: the slice (total = limit, free = limit − the
    /// container's use) on a limited device; the driver's answer elsewhere.
    MemGetInfoV2 => fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        mem_info(cuMemGetInfo_v2::HOOK, free, total, || unsafe { real(free, total) })
    }
}

intercept! {
    /// `cuMemGetInfo` (CUDA < 3.2 ABI, 32-bit; sizes saturate).
    MemGetInfo => fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        mem_info(cuMemGetInfo::HOOK, free, total, || unsafe { real(free, total) })
    }
}

/// `cuDeviceTotalMem` in either ABI: the limit (as `T`, saturating) on a
/// limited device.
fn device_total_mem<T: AbiInt>(
    hook: Hook,
    bytes: *mut T,
    device: CUdevice,
    call: impl Fn() -> CUresult,
) -> CUresult {
    protect(
        hook,
        |driver| {
            let rc = driver.call(&call);
            if rc == SUCCESS
                && !bytes.is_null()
                && let Some(limit) = device_limit(device)
            {
                // SAFETY: bytes is non-null; the driver just wrote it.
                unsafe { bytes.write_unaligned(T::saturate(limit)) };
            }
            rc
        },
        &call,
    )
}

fn device_limit(ordinal: CUdevice) -> Option<u64> {
    let rt = rt();
    if !rt.enforcing() {
        return None;
    }
    rt.device(ordinal)?.memory_limit
}

intercept! {
    /// `cuDeviceTotalMem_v2`: the limit on a limited device.
    DeviceTotalMemV2 => fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(bytes, device) };
        device_total_mem(cuDeviceTotalMem_v2::HOOK, bytes, device, call)
    }
}

intercept! {
    /// `cuDeviceTotalMem` (CUDA < 3.2 ABI; saturates).
    DeviceTotalMem => fn cuDeviceTotalMem(bytes: *mut c_uint, device: CUdevice) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(bytes, device) };
        device_total_mem(cuDeviceTotalMem::HOOK, bytes, device, call)
    }
}
