//! `cuGetProcAddress`: driver entry points by base name and CUDA version,
//! the way the CUDA runtime (11.3 and later) finds every function it calls.
//!
//! The answer comes from [`TABLE`], this library's own list of its exports,
//! never from `dlsym`: an interposer that overrides `dlsym` cannot change
//! it. The library is linked with `-Bsymbolic-functions`, so the addresses
//! taken here are this library's definitions even when another object in
//! the process exports a function of the same name (as an `LD_PRELOAD`
//! interposer does); they equal what `dlsym` on this library's handle
//! returns.
//!
//! Each base name lists the versions at which its ABI changed, with the
//! export that implements each; a request gets the newest entry whose
//! version is ≤ `cudaVersion` (the versions are those of `cudaTypedefs.h`'s
//! `PFN_<name>_v<version>` typedefs). `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
//! returns the same functions as the default: the simulator's default
//! stream is per device either way, so no `_ptsz` variants are exported.

use std::ffi::{c_char, c_int, c_ulonglong, c_void};

use crate::config;
use crate::driver;
use crate::ffi::*;
use crate::out;

use super::{context, device, entry, init, launch, memory};

/// One ABI version of a base name: (first CUDA version, export name, address).
pub type Version = (c_int, &'static str, fn() -> *const c_void);

/// `base => [version module::export, …]` to [`TABLE`]'s rows: the export's
/// name is the identifier of the function whose address the row holds, so the
/// two cannot disagree.
macro_rules! versions {
    ($($base:ident => [$($version:literal $module:tt :: $export:ident),+ $(,)?]),* $(,)?) => {
        &[$((
            stringify!($base),
            &[$((
                $version,
                stringify!($export),
                (|| $module::$export as *const c_void) as fn() -> *const c_void,
            )),+],
        )),*]
    };
}

/// Base name → ABI versions, oldest first.
pub const TABLE: &[(&str, &[Version])] = versions! {
    cuGetErrorString => [6000 init::cuGetErrorString],
    cuGetErrorName => [6000 init::cuGetErrorName],
    cuInit => [2000 init::cuInit],
    cuDriverGetVersion => [2020 init::cuDriverGetVersion],
    cuDeviceGet => [2000 device::cuDeviceGet],
    cuDeviceGetCount => [2000 device::cuDeviceGetCount],
    cuDeviceGetName => [2000 device::cuDeviceGetName],
    cuDeviceGetAttribute => [2000 device::cuDeviceGetAttribute],
    cuDeviceGetPCIBusId => [4010 device::cuDeviceGetPCIBusId],
    cuDeviceGetDefaultMemPool => [11020 device::cuDeviceGetDefaultMemPool],
    cuDevicePrimaryCtxRetain => [7000 context::cuDevicePrimaryCtxRetain],
    cuCtxDestroy => [4000 context::cuCtxDestroy_v2],
    cuCtxSetCurrent => [4000 context::cuCtxSetCurrent],
    cuCtxGetCurrent => [4000 context::cuCtxGetCurrent],
    cuCtxGetDevice => [2000 context::cuCtxGetDevice],
    cuCtxPushCurrent => [4000 context::cuCtxPushCurrent_v2],
    cuCtxPopCurrent => [4000 context::cuCtxPopCurrent_v2],
    cuCtxSynchronize => [2000 context::cuCtxSynchronize],
    cuStreamCreate => [2000 context::cuStreamCreate],
    cuStreamDestroy => [4000 context::cuStreamDestroy_v2],
    cuStreamSynchronize => [2000 context::cuStreamSynchronize],
    cuModuleLoadData => [2000 context::cuModuleLoadData],
    cuModuleUnload => [2000 context::cuModuleUnload],
    cuModuleGetFunction => [2000 context::cuModuleGetFunction],
    cuMemAlloc => [3020 memory::cuMemAlloc_v2],
    cuMemFree => [3020 memory::cuMemFree_v2],
    cuMemAllocPitch => [3020 memory::cuMemAllocPitch_v2],
    cuMemAllocManaged => [6000 memory::cuMemAllocManaged],
    cuMemAllocHost => [3020 memory::cuMemAllocHost_v2],
    cuMemFreeHost => [2000 memory::cuMemFreeHost],
    cuMemCreate => [10020 memory::cuMemCreate],
    cuMemRelease => [10020 memory::cuMemRelease],
    cuMemAddressReserve => [10020 memory::cuMemAddressReserve],
    cuMemAddressFree => [10020 memory::cuMemAddressFree],
    cuMemMap => [10020 memory::cuMemMap],
    cuMemRetainAllocationHandle => [11000 memory::cuMemRetainAllocationHandle],
    cuMemExportToShareableHandle => [10020 memory::cuMemExportToShareableHandle],
    cuMemImportFromShareableHandle => [10020 memory::cuMemImportFromShareableHandle],
    cuMemPoolSetAttribute => [11020 memory::cuMemPoolSetAttribute],
    cuMemPoolGetAttribute => [11020 memory::cuMemPoolGetAttribute],
    cuMemPoolTrimTo => [11020 memory::cuMemPoolTrimTo],
    cuDeviceGetMemPool => [11020 memory::cuDeviceGetMemPool],
    cuDeviceSetMemPool => [11020 memory::cuDeviceSetMemPool],
    cuDevicePrimaryCtxGetState => [7000 context::cuDevicePrimaryCtxGetState],
    cuCtxSetLimit => [3010 context::cuCtxSetLimit],
    cuCtxGetLimit => [3010 context::cuCtxGetLimit],
    cuStreamGetCtx => [9020 context::cuStreamGetCtx],
    cuStreamGetDevice => [12080 context::cuStreamGetDevice],
    cuMemUnmap => [10020 memory::cuMemUnmap],
    cuMemSetAccess => [10020 memory::cuMemSetAccess],
    cuMemGetAllocationGranularity => [10020 memory::cuMemGetAllocationGranularity],
    cuMemAllocAsync => [11020 memory::cuMemAllocAsync],
    cuMemFreeAsync => [11020 memory::cuMemFreeAsync],
    cuMemPoolCreate => [11020 memory::cuMemPoolCreate],
    cuMemPoolDestroy => [11020 memory::cuMemPoolDestroy],
    cuMemAllocFromPoolAsync => [11020 memory::cuMemAllocFromPoolAsync],
    cuArrayCreate => [3020 memory::cuArrayCreate_v2],
    cuArrayDestroy => [2000 memory::cuArrayDestroy],
    cuArray3DCreate => [3020 memory::cuArray3DCreate_v2],
    cuMipmappedArrayCreate => [5000 memory::cuMipmappedArrayCreate],
    cuMipmappedArrayDestroy => [5000 memory::cuMipmappedArrayDestroy],
    cuLaunchKernel => [4000 launch::cuLaunchKernel],
    cuLaunchKernelEx => [11060 launch::cuLaunchKernelEx],
    cuLaunchCooperativeKernel => [9000 launch::cuLaunchCooperativeKernel],
    cuGraphCreate => [10000 launch::cuGraphCreate],
    cuGraphInstantiateWithFlags => [11040 launch::cuGraphInstantiateWithFlags],
    cuGraphLaunch => [10000 launch::cuGraphLaunch],
    cuGraphExecDestroy => [10000 launch::cuGraphExecDestroy],
    cuGraphDestroy => [10000 launch::cuGraphDestroy],
    // Base names whose ABI changed: one export per version, oldest first.
    cuGetProcAddress => [11030 self::cuGetProcAddress, 12000 self::cuGetProcAddress_v2],
    cuDeviceGetUuid => [9020 device::cuDeviceGetUuid, 11040 device::cuDeviceGetUuid_v2],
    cuDeviceTotalMem => [2000 device::cuDeviceTotalMem, 3020 device::cuDeviceTotalMem_v2],
    cuDevicePrimaryCtxRelease => [7000 context::cuDevicePrimaryCtxRelease, 11000 context::cuDevicePrimaryCtxRelease_v2],
    cuCtxCreate => [3020 context::cuCtxCreate_v2, 11040 context::cuCtxCreate_v3, 12050 context::cuCtxCreate_v4],
    cuMemGetInfo => [2000 memory::cuMemGetInfo, 3020 memory::cuMemGetInfo_v2],
    cuDevicePrimaryCtxReset => [7000 context::cuDevicePrimaryCtxReset, 11000 context::cuDevicePrimaryCtxReset_v2],
    cuGraphAddKernelNode => [10000 launch::cuGraphAddKernelNode, 12000 launch::cuGraphAddKernelNode_v2],
    cuGraphInstantiate => [11000 launch::cuGraphInstantiate_v2, 12000 launch::cuGraphInstantiateWithFlags],
};

/// Outcome of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The export for the requested version.
    Found(&'static str, *const c_void),
    /// No such base name.
    NotFound,
    /// The name exists, but only from a later version.
    VersionNotSufficient,
}

/// The export `name` resolves to at `cuda_version`.
pub fn lookup(name: &[u8], cuda_version: c_int) -> Lookup {
    let Some((_, versions)) = TABLE.iter().find(|(base, _)| base.as_bytes() == name) else {
        return Lookup::NotFound;
    };
    match versions.iter().rev().find(|(v, _, _)| *v <= cuda_version) {
        Some((_, export, address)) => Lookup::Found(export, address()),
        None => Lookup::VersionNotSufficient,
    }
}

/// Shared body of both exports. `Ok(status)` with `*pfn` written; for the
/// original export a miss is `CUDA_ERROR_NOT_FOUND`, for `_v2` it is
/// success with `*pfn = NULL` and the status saying why.
fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: c_ulonglong,
    miss_is_error: bool,
    status: *mut c_int,
) -> CuResult {
    entry(|| {
        // SAFETY: cuda.h contract: `symbol` is null or a NUL-terminated string.
        let name = unsafe { out::read_str(symbol) }?;
        if pfn.is_null()
            || !matches!(
                flags,
                GET_PROC_ADDRESS_DEFAULT
                    | GET_PROC_ADDRESS_LEGACY_STREAM
                    | GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            )
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver_version = match driver::get() {
            Ok(d) => d.config.driver_version,
            Err(_) => config::driver_version(),
        };
        if cuda_version > driver_version {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (address, code) = match lookup(name.to_bytes(), cuda_version) {
            Lookup::Found(_, address) => (address.cast_mut(), PROC_ADDRESS_SUCCESS),
            Lookup::NotFound => (std::ptr::null_mut(), PROC_ADDRESS_SYMBOL_NOT_FOUND),
            Lookup::VersionNotSufficient => {
                (std::ptr::null_mut(), PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
            }
        };
        // SAFETY: cuda.h contract: `pfn` is valid for one write (non-null).
        unsafe { out::write(pfn, address) }?;
        if !status.is_null() {
            // SAFETY: cuda.h contract: a non-null `symbolStatus` is valid for one write.
            unsafe { out::write(status, code) }?;
        }
        if miss_is_error && code != PROC_ADDRESS_SUCCESS {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        Ok(())
    })
}

/// `cuGetProcAddress` (CUDA 11.3 ABI): `CUDA_ERROR_NOT_FOUND` (and a NULL
/// `*pfn`) when the name is unknown or needs a later version. Works before
/// `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: c_ulonglong,
) -> CuResult {
    get_proc_address(symbol, pfn, cuda_version, flags, true, std::ptr::null_mut())
}

/// `cuGetProcAddress_v2` (CUDA 12.0 ABI): a miss is `CUDA_SUCCESS` with a
/// NULL `*pfn`, and `symbolStatus` (optional) says why; a `cudaVersion`
/// above the driver's is `CUDA_ERROR_INVALID_VALUE`. Works before `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: c_ulonglong,
    symbol_status: *mut c_int,
) -> CuResult {
    get_proc_address(symbol, pfn, cuda_version, flags, false, symbol_status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_names_resolve_to_their_exports() {
        let export = |name: &str, v| match lookup(name.as_bytes(), v) {
            Lookup::Found(export, _) => export,
            other => panic!("{name} at {v}: {other:?}"),
        };
        assert_eq!(export("cuMemAlloc", 12080), "cuMemAlloc_v2");
        assert_eq!(export("cuMemAlloc", 3020), "cuMemAlloc_v2");
        assert_eq!(export("cuMemGetInfo", 3010), "cuMemGetInfo");
        assert_eq!(export("cuCtxCreate", 11030), "cuCtxCreate_v2");
        assert_eq!(export("cuCtxCreate", 11040), "cuCtxCreate_v3");
        assert_eq!(export("cuCtxCreate", 12080), "cuCtxCreate_v4");
        assert_eq!(export("cuGraphInstantiate", 11080), "cuGraphInstantiate_v2");
        assert_eq!(
            export("cuGraphInstantiate", 12000),
            "cuGraphInstantiateWithFlags"
        );
        assert_eq!(lookup(b"cuMemAlloc", 3010), Lookup::VersionNotSufficient);
        assert_eq!(lookup(b"cuMemAlloc_v2", 12080), Lookup::NotFound);
        assert_eq!(lookup(b"cuNoSuchThing", 12080), Lookup::NotFound);
    }

    #[test]
    fn every_entry_is_ordered_and_distinct() {
        for (base, versions) in TABLE {
            assert!(!versions.is_empty(), "{base}");
            assert!(
                versions.windows(2).all(|w| w[0].0 < w[1].0),
                "{base}: versions out of order"
            );
            assert!(
                versions
                    .iter()
                    .all(|(_, export, _)| export.starts_with(base))
            );
        }
        let mut names: Vec<&str> = TABLE.iter().map(|(b, _)| *b).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "a base name twice");
    }
}
