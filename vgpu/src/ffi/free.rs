//! Frees that give a charge back: `cuMemFree[_v2]`, `cuArrayDestroy`,
//! `cuMipmappedArrayDestroy` (a stream-ordered allocation freed here goes
//! back to its pool's ledger).

use std::ffi::c_uint;

use super::driver::rt;
use super::guard::protect;
use super::pools::CudaPools;
use super::types::{AbiInt, CUdeviceptr, CUresult, Handle};
use crate::backend::Space;
use crate::memory;
use crate::names::Hook;

/// A free of `handle` in `space` (a stream-ordered allocation goes back
/// to its pool's ledger).
pub(super) fn tracked_free(
    hook: Hook,
    space: Space,
    handle: u64,
    call: impl Fn() -> CUresult,
) -> CUresult {
    // `release` passes the call through itself when nothing is enforced.
    protect(
        hook,
        |driver| {
            let rt = rt();
            memory::release(
                rt,
                space,
                handle,
                || driver.call(&call),
                |tracked, free| {
                    crate::pools::global().release(rt, &CudaPools, handle, tracked, free)
                },
            )
        },
        &call,
    )
}

/// A device pointer of either ABI, and the `cuMemFree` of that ABI.
pub(super) trait DevicePtr: AbiInt {
    /// Frees `ptr`, just allocated by the driver and not handed out (best
    /// effort: nothing is charged for it).
    fn free_unhanded(ptr: u64);
}

impl DevicePtr for CUdeviceptr {
    fn free_unhanded(ptr: u64) {
        if let Some(free) = cuMemFree_v2::real() {
            // SAFETY: ptr was just allocated by the driver and is not handed out.
            let _ = unsafe { free(ptr) };
        }
    }
}

impl DevicePtr for c_uint {
    fn free_unhanded(ptr: u64) {
        if let Some(free) = cuMemFree::real() {
            // SAFETY: ptr was just allocated by the driver (32-bit ABI).
            let _ = unsafe { free(ptr as c_uint) };
        }
    }
}

intercept! {
    /// `cuMemFree_v2`: gives the charge back.
    MemFreeV2 => fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    /// `cuMemFree` (CUDA < 3.2 ABI): gives the charge back.
    MemFree => fn cuMemFree(dptr: c_uint) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's argument, unchanged.
        tracked_free(hook, Space::Pointer, dptr.widen(), || unsafe { real(dptr) })
    }
}

intercept! {
    /// `cuArrayDestroy`: gives an array's charge back.
    ArrayDestroy => fn cuArrayDestroy(array: Handle) -> CUresult;
    |real| {
        let handle = array as usize as u64;
        // SAFETY: the caller's argument, unchanged.
        tracked_free(cuArrayDestroy::HOOK, Space::Array, handle, || unsafe { real(array) })
    }
}

intercept! {
    /// `cuMipmappedArrayDestroy`: gives a mipmapped array's charge back.
    MipmappedArrayDestroy => fn cuMipmappedArrayDestroy(array: Handle) -> CUresult;
    |real| {
        let handle = array as usize as u64;
        // SAFETY: the caller's argument, unchanged.
        tracked_free(cuMipmappedArrayDestroy::HOOK, Space::Mipmap, handle, || unsafe {
            real(array)
        })
    }
}
