//! CUDA arrays, charged from their descriptors: `cuArrayCreate[_v2]`,
//! `cuArray3DCreate[_v2]`, `cuMipmappedArrayCreate` (the sizes are
//! `crate::arrays`'s).

use std::ffi::c_uint;

use super::alloc::tracked_alloc;
use super::driver::target_device;
use super::types::{
    Array3dDescriptor, Array3dDescriptorV1, ArrayDescriptor, ArrayDescriptorAbi, ArrayDescriptorV1,
    CUresult, Handle,
};
use crate::arrays::ArrayShape;
use crate::backend::Kind;
use crate::names::Hook;

/// An array of `bytes` (`kind`), made by `call` into `array`.
fn array_alloc(
    hook: Hook,
    kind: Kind,
    bytes: u64,
    array: *mut Handle,
    call: impl Fn() -> CUresult,
) -> CUresult {
    tracked_alloc(
        hook,
        kind,
        bytes,
        target_device,
        call,
        // SAFETY: the callers check `array` is non-null; written on success.
        || unsafe { array.read_unaligned() } as usize as u64,
    )
}

/// An array from a descriptor of either ABI, 2D or 3D (`levels`: a
/// mipmapped array of that many levels): counted from the descriptor.
fn array_create<D: ArrayDescriptorAbi>(
    hook: Hook,
    array: *mut Handle,
    desc: *const D,
    levels: Option<c_uint>,
    call: impl Fn() -> CUresult,
) -> CUresult {
    if array.is_null() || desc.is_null() {
        return call();
    }
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let shape: ArrayShape = unsafe { desc.read_unaligned() }.shape();
    let (kind, bytes) = match levels {
        None => (Kind::Array, shape.bytes()),
        Some(levels) => (Kind::Mipmap, shape.mipmapped_bytes(levels)),
    };
    array_alloc(hook, kind, bytes, array, call)
}

intercept! {
    /// `cuArrayCreate_v2`: counted from the descriptor.
    ArrayCreateV2 => fn cuArrayCreate_v2(array: *mut Handle, desc: *const ArrayDescriptor)
        -> CUresult;
    /// `cuArrayCreate` (CUDA < 3.2 ABI): counted from the descriptor.
    ArrayCreate => fn cuArrayCreate(array: *mut Handle, desc: *const ArrayDescriptorV1)
        -> CUresult;
    /// `cuArray3DCreate_v2`: counted from the descriptor.
    Array3DCreateV2 => fn cuArray3DCreate_v2(array: *mut Handle, desc: *const Array3dDescriptor)
        -> CUresult;
    /// `cuArray3DCreate` (CUDA < 3.2 ABI): counted from the descriptor.
    Array3DCreate => fn cuArray3DCreate(array: *mut Handle, desc: *const Array3dDescriptorV1)
        -> CUresult;
    |real, hook| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(array, desc) };
        array_create(hook, array, desc, None, call)
    }
}

intercept! {
    /// `cuMipmappedArrayCreate`: counted as the sum of its levels.
    MipmappedArrayCreate => fn cuMipmappedArrayCreate(
        array: *mut Handle,
        desc: *const Array3dDescriptor,
        levels: c_uint,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(array, desc, levels) };
        array_create(cuMipmappedArrayCreate::HOOK, array, desc, Some(levels), call)
    }
}
