//! `cuGetProcAddress[_v2]`, the way every CUDA ≥ 11.3 runtime finds the
//! driver: the driver's answer, with the export substituted for an
//! intercepted entry point (picked by `names::Hook::by_proc`).

use std::ffi::{CStr, c_char, c_int, c_void};

use super::guard::contained;
use super::intercept::{is_wrapper, wrapper};
use super::resolve::{resolve, seed};
use super::types::{CU_GET_PROC_ADDRESS_SUCCESS, CUresult};
use crate::memory::SUCCESS;
use crate::names::Hook;

/// Replaces the driver's answer for an intercepted entry point with our
/// wrapper (and remembers the driver's pointer as the real function).
fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: symbol is the caller's NUL-terminated name (the driver just read it).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let Some(mut hook) = Hook::by_proc(name, cuda_version, flags) else {
        return;
    };
    // SAFETY: pfn is non-null; the driver wrote the function there.
    let found = unsafe { pfn.read_unaligned() };
    if found.is_null() || is_wrapper(found) {
        return;
    }
    // The default-stream variant the driver picked, when it tells by identity.
    if let Some(sibling) = hook.stream_sibling()
        && found != resolve(hook)
        && found == resolve(sibling)
    {
        hook = sibling;
    }
    seed(hook, found);
    // SAFETY: pfn is non-null and writable (the driver just wrote it).
    unsafe { pfn.write_unaligned(wrapper(hook)) };
}

intercept! {
    /// `cuGetProcAddress` (CUDA 11.3–11.8): the driver's answer, with our
    /// wrappers substituted for intercepted entry points.
    GetProcAddress => fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(symbol, pfn, cuda_version, flags) };
        if rc == SUCCESS {
            let _ = contained("cuGetProcAddress", || {
                substitute(symbol, pfn, cuda_version, flags)
            });
        }
        rc
    }
}

intercept! {
    /// `cuGetProcAddress_v2` (CUDA ≥ 12.0): as [`cuGetProcAddress()`].
    GetProcAddressV2 => fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
        status: *mut c_int,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(symbol, pfn, cuda_version, flags, status) };
        // SAFETY: status, when non-null, was just written by the driver.
        let found =
            status.is_null() || unsafe { status.read_unaligned() } == CU_GET_PROC_ADDRESS_SUCCESS;
        if rc == SUCCESS && found {
            let _ = contained("cuGetProcAddress_v2", || {
                substitute(symbol, pfn, cuda_version, flags);
            });
        }
        rc
    }
}
