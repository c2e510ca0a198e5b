//! Allocations charged before the driver is called: `cuMemAlloc[_v2]`,
//! `cuMemAllocManaged`, `cuMemAllocPitch[_v2]` (arrays are in `arrays`,
//! stream-ordered allocations in `pools`, VMM in `vmm`).

use std::ffi::c_uint;

use super::driver::{current_context, prefer_host, target_device};
use super::free::DevicePtr;
use super::guard::{Driver, enforced};
use super::types::{AbiInt, CU_MEM_ATTACH_GLOBAL, CUdeviceptr, CUresult};
use crate::backend::Kind;
use crate::memory::{self, OUT_OF_MEMORY, SUCCESS};
use crate::names::Hook;

/// An allocation charged to the slice of device `ordinal()`, owned by the
/// current context; `handle` reads what the driver made.
pub(super) fn tracked_alloc(
    hook: Hook,
    kind: Kind,
    bytes: u64,
    ordinal: impl FnOnce() -> Option<i32>,
    call: impl Fn() -> CUresult,
    handle: impl FnOnce() -> u64,
) -> CUresult {
    enforced(hook, &call, |driver, rt| {
        let owner = current_context();
        memory::allocate(
            rt,
            hook.symbol(),
            ordinal(),
            bytes,
            kind,
            owner,
            || match driver.call(&call) {
                SUCCESS => Ok(handle()),
                rc => Err(rc),
            },
        )
    })
}

/// `cuMemAlloc` in either ABI: counted; with `managed` (the `_v2` ABI),
/// falls back to managed memory when oversubscription is on and the device
/// is physically full.
fn mem_alloc<P: AbiInt>(
    hook: Hook,
    dptr: *mut P,
    bytes: u64,
    call: impl Fn() -> CUresult,
    managed: Option<impl FnOnce(&Driver) -> Result<u64, CUresult>>,
) -> CUresult {
    if dptr.is_null() {
        return call();
    }
    enforced(hook, &call, |driver, rt| {
        let (ordinal, owner) = (target_device(), current_context());
        let allocate = || match driver.call(&call) {
            // SAFETY: dptr is non-null; the driver wrote the pointer on success.
            SUCCESS => Ok(unsafe { dptr.read_unaligned() }.widen()),
            rc => Err(rc),
        };
        match managed {
            Some(managed) => {
                memory::allocate_device(rt, ordinal, bytes, owner, allocate, || managed(driver))
            }
            None => memory::allocate(
                rt,
                hook.symbol(),
                ordinal,
                bytes,
                Kind::Device,
                owner,
                allocate,
            ),
        }
    })
}

intercept! {
    /// `cuMemAlloc_v2`: counted; falls back to managed memory when
    /// oversubscription is on and the device is physically full.
    MemAllocV2 => fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, passed unchanged to the function
        // they were meant for.
        let call = || unsafe { real(dptr, bytesize) };
        let managed = |driver: &Driver| {
            let Some(managed) = cuMemAllocManaged::real() else {
                return Err(OUT_OF_MEMORY);
            };
            // SAFETY: the caller's out-pointer and size, for the managed variant.
            match driver.call(|| unsafe { managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL) }) {
                SUCCESS => {
                    // SAFETY: dptr is non-null (checked first); written on success.
                    let ptr = unsafe { dptr.read_unaligned() };
                    prefer_host(ptr, bytesize);
                    Ok(ptr)
                }
                rc => Err(rc),
            }
        };
        mem_alloc(cuMemAlloc_v2::HOOK, dptr, bytesize.widen(), call, Some(managed))
    }
}

intercept! {
    /// `cuMemAlloc` (CUDA < 3.2 ABI, 32-bit): counted.
    MemAlloc => fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(dptr, bytesize) };
        let no_fallback = None::<fn(&Driver) -> Result<u64, CUresult>>;
        mem_alloc(cuMemAlloc::HOOK, dptr, bytesize.widen(), call, no_fallback)
    }
}

intercept! {
    /// `cuMemAllocManaged`: counted to the current device.
    MemAllocManaged => fn cuMemAllocManaged(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        flags: c_uint,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(dptr, bytesize, flags) };
        if dptr.is_null() {
            return call();
        }
        tracked_alloc(
            cuMemAllocManaged::HOOK,
            Kind::Managed,
            bytesize as u64,
            target_device,
            call,
            // SAFETY: dptr is non-null; written on success.
            || unsafe { dptr.read_unaligned() },
        )
    }
}

/// `cuMemAllocPitch` in either ABI: counted as pitch × height; an
/// allocation the real pitch made too large for the slice is freed again.
fn mem_alloc_pitch<P: DevicePtr, S: AbiInt>(
    hook: Hook,
    (dptr, pitch): (*mut P, *mut S),
    (width, height): (u64, u64),
    call: impl Fn() -> CUresult,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    enforced(hook, &call, |driver, rt| {
        memory::allocate_pitch(
            rt,
            target_device(),
            current_context(),
            width,
            height,
            || match driver.call(&call) {
                SUCCESS => {
                    // SAFETY: both out-pointers are non-null and written on success.
                    let (ptr, pitch) = unsafe { (dptr.read_unaligned(), pitch.read_unaligned()) };
                    Ok((ptr.widen(), pitch.widen()))
                }
                rc => Err(rc),
            },
            P::free_unhanded,
        )
    })
}

intercept! {
    /// `cuMemAllocPitch_v2`: counted as pitch × height.
    MemAllocPitchV2 => fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize,
        width: usize, height: usize, element_size: c_uint) -> CUresult;
    /// `cuMemAllocPitch` (CUDA < 3.2 ABI): counted as pitch × height.
    MemAllocPitch => fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint,
        width: c_uint, height: c_uint, element_size: c_uint) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(dptr, pitch, width, height, element_size) };
        mem_alloc_pitch(hook, (dptr, pitch), (width.widen(), height.widen()), call)
    }
}
