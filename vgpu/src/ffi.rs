//! Everything raw: the C types of the driver and NVML calls the library
//! intercepts, the exported wrappers, the lookup of the real functions, and
//! the `dlsym` / `cuGetProcAddress` answers. The decisions (charge or
//! refuse, wait or launch) are made by the safe modules (`memory`,
//! `limiter`); this module reads and writes the caller's pointers and calls
//! the real functions.
//!
//! # Real functions
//!
//! Each intercepted entry point ([`Hook`]) has one cached real pointer
//! (an `AtomicPtr`, resolved once, then one atomic load per call). It is
//! seeded by the first route that meets the real function: `dlsym` on the
//! caller's handle, the real `cuGetProcAddress`'s answer, or failing those
//! the real `dlsym` on `dlopen("libcuda.so.1", RTLD_NOLOAD)` (NVML:
//! `libnvidia-ml.so.1`), then `RTLD_NEXT`. Our own wrappers are never
//! taken for real functions.
//!
//! # `dlsym`
//!
//! The exported `dlsym` answers intercepted names with wrappers (when the
//! caller's handle has the real symbol) and everything else through the
//! real `dlsym`, found with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`
//! (`GLIBC_2.2.5` on older glibc). On x86-64 it is a naked trampoline: the
//! real `dlsym` is *jumped* to with the caller's return address intact, so
//! `dlsym(RTLD_NEXT, …)` keeps meaning "after the caller", for every other
//! interposer in the process. Elsewhere it is a plain function (and
//! `RTLD_NEXT` lookups by other libraries resolve relative to this one).
//!
//! # Panics
//!
//! Every exported function catches panics: before the driver was called,
//! the call is passed through; after, the driver's result is returned. One
//! line on stderr says it happened.
#![allow(non_snake_case)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, Ordering};

use crate::arrays::ArrayShape;
use crate::backend::{Kind, Space};
use crate::limiter;
use crate::log::{self, Level, Once};
use crate::memory::{self, OUT_OF_MEMORY, SUCCESS};
use crate::names::{HOOK_COUNT, Hook, PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
use crate::runtime::{self, Platform};

use lifetimes::*;

// ---------------------------------------------------------------------------
// C types and constants (cuda.h, nvml.h)

/// `CUresult`.
pub type CUresult = c_int;
type CUdevice = c_int;
type CUdeviceptr = c_ulonglong;
/// Any opaque driver handle (`CUstream`, `CUarray`, `CUfunction`, …).
type Handle = *mut c_void;
type NvmlReturn = c_uint;

const CUDA_ERROR_NOT_FOUND: CUresult = 500;
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
const CU_DEVICE_CPU: CUdevice = -1;
/// `CU_GET_PROC_ADDRESS_SUCCESS` (`CUdriverProcAddressQueryResult`).
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;

const RTLD_DEFAULT: *mut c_void = null_mut();
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CuMemLocation {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (only `location` is read).
#[repr(C)]
pub struct CuMemAllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: CuMemLocation,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    num_channels: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1`.
#[repr(C)]
pub struct ArrayDescriptorV1 {
    width: c_uint,
    height: c_uint,
    format: c_uint,
    num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    num_channels: c_uint,
    flags: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
pub struct Array3dDescriptorV1 {
    width: c_uint,
    height: c_uint,
    depth: c_uint,
    format: c_uint,
    num_channels: c_uint,
    flags: c_uint,
}

/// `CUlaunchConfig` (only the grid is read).
#[repr(C)]
pub struct LaunchConfig {
    grid_dim_x: c_uint,
    grid_dim_y: c_uint,
    grid_dim_z: c_uint,
    block_dim_x: c_uint,
    block_dim_y: c_uint,
    block_dim_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessUtilizationSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

type FnDlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type FnGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type FnGetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
type FnMemAllocV2 = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
type FnMemAllocV1 = unsafe extern "C" fn(*mut c_uint, c_uint) -> CUresult;
type FnMemAllocPitchV2 =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
type FnMemAllocPitchV1 =
    unsafe extern "C" fn(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult;
type FnMemAllocManaged = unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
type FnMemFreeV2 = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
type FnMemFreeV1 = unsafe extern "C" fn(c_uint) -> CUresult;
type FnMemCreate =
    unsafe extern "C" fn(*mut u64, usize, *const CuMemAllocationProp, u64) -> CUresult;
type FnMemRelease = unsafe extern "C" fn(u64) -> CUresult;
type FnMemAllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, Handle) -> CUresult;
type FnMemAllocFromPoolAsync =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, Handle, Handle) -> CUresult;
type FnMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, Handle) -> CUresult;
type FnArrayCreateV2 = unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CUresult;
type FnArrayCreateV1 = unsafe extern "C" fn(*mut Handle, *const ArrayDescriptorV1) -> CUresult;
type FnArray3dCreateV2 = unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor) -> CUresult;
type FnArray3dCreateV1 = unsafe extern "C" fn(*mut Handle, *const Array3dDescriptorV1) -> CUresult;
type FnDestroy = unsafe extern "C" fn(Handle) -> CUresult;
type FnMipmappedArrayCreate =
    unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor, c_uint) -> CUresult;
type FnMemGetInfoV2 = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
type FnMemGetInfoV1 = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CUresult;
type FnDeviceTotalMemV2 = unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult;
type FnDeviceTotalMemV1 = unsafe extern "C" fn(*mut c_uint, CUdevice) -> CUresult;
type FnLaunchKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
type FnLaunchKernelEx = unsafe extern "C" fn(
    *const LaunchConfig,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
type FnLaunchCooperativeKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
) -> CUresult;
type FnGraphLaunch = unsafe extern "C" fn(Handle, Handle) -> CUresult;
type FnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
type FnCtxGetCurrent = unsafe extern "C" fn(*mut Handle) -> CUresult;
type FnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
type FnDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult;
type FnMemAdvise = unsafe extern "C" fn(CUdeviceptr, usize, c_int, CUdevice) -> CUresult;
type FnNvmlMemoryInfo = unsafe extern "C" fn(Handle, *mut NvmlMemory) -> NvmlReturn;
type FnNvmlMemoryInfoV2 = unsafe extern "C" fn(Handle, *mut NvmlMemoryV2) -> NvmlReturn;
type FnNvmlInit = unsafe extern "C" fn() -> NvmlReturn;
type FnNvmlGetUuid = unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> NvmlReturn;
type FnNvmlGetIndex = unsafe extern "C" fn(Handle, *mut c_uint) -> NvmlReturn;
type FnNvmlGetHandleByUuid = unsafe extern "C" fn(*const c_char, *mut Handle) -> NvmlReturn;
type FnNvmlGetProcessUtilization = unsafe extern "C" fn(
    Handle,
    *mut NvmlProcessUtilizationSample,
    *mut c_uint,
    c_ulonglong,
) -> NvmlReturn;

// ---------------------------------------------------------------------------
// The real dlsym and the libraries

/// The real `dlsym` (the naked `dlsym` below jumps through it).
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// Stands in for `dlsym` if glibc's cannot be found (never on glibc).
unsafe extern "C" fn no_dlsym(_handle: *mut c_void, _symbol: *const c_char) -> *mut c_void {
    null_mut()
}

/// glibc's own `name` (a function this library also exports): the
/// definition after this library, by symbol version (2.34, where the dl*
/// functions moved into libc, else 2.2.5); `missing` if neither exists.
fn glibc_next(name: &CStr, missing: *mut c_void) -> *mut c_void {
    [c"GLIBC_2.34", c"GLIBC_2.2.5"]
        .iter()
        // SAFETY: dlvsym is given valid NUL-terminated strings; RTLD_NEXT
        // asks for the definition after this library (libc's).
        .map(|version| unsafe { libc::dlvsym(RTLD_NEXT, name.as_ptr(), version.as_ptr()) })
        .find(|p| !p.is_null())
        .unwrap_or(missing)
}

fn real_dlsym() -> FnDlsym {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        p = glibc_next(c"dlsym", no_dlsym as *mut c_void);
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is glibc's dlsym (or no_dlsym), both with dlsym's signature.
    unsafe { std::mem::transmute::<*mut c_void, FnDlsym>(p) }
}

/// `libcuda.so.1` as loaded by the program (never loaded by us).
static CUDA_LIB: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
/// `libnvidia-ml.so.1` as loaded by the program.
static NVML_LIB: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
/// `libnvidia-ml.so.1` as loaded by the SM limiter.
static NVML_OWN: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn library(cache: &AtomicPtr<c_void>, name: &CStr, load: bool) -> *mut c_void {
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    // SAFETY: dlopen with a NUL-terminated name; RTLD_NOLOAD only returns
    // a library already in the process (and takes a reference we never drop).
    let mut handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() && load {
        // SAFETY: as above; loading the library runs its initializers, which
        // is what the program itself would do when it loads it.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
    }
    if !handle.is_null() {
        cache.store(handle, Ordering::Release);
    }
    handle
}

fn cuda_library() -> *mut c_void {
    library(&CUDA_LIB, c"libcuda.so.1", false)
}

fn nvml_library() -> *mut c_void {
    library(&NVML_LIB, c"libnvidia-ml.so.1", false)
}

/// Looks `name` up in `lib`, then after this library; never returns one
/// of our own wrappers.
fn lookup_real(lib: *mut c_void, name: &CStr) -> *mut c_void {
    let dlsym = real_dlsym();
    let mut p = null_mut();
    if !lib.is_null() {
        // SAFETY: lib is a handle from dlopen; name is NUL-terminated.
        p = unsafe { dlsym(lib, name.as_ptr()) };
    }
    if p.is_null() || is_wrapper(p) {
        // SAFETY: RTLD_NEXT from this library: the definition after ours.
        p = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) };
    }
    if is_wrapper(p) { null_mut() } else { p }
}

// ---------------------------------------------------------------------------
// Real pointers of the hooks, and the wrappers

static REAL: [AtomicPtr<c_void>; HOOK_COUNT] = [const { AtomicPtr::new(null_mut()) }; HOOK_COUNT];

fn symbol_cstr(hook: Hook) -> &'static CStr {
    CStr::from_bytes_with_nul(hook.symbol_nul().as_bytes()).unwrap_or(c"")
}

/// The real function of `hook` (null if the library lacks it).
fn resolve(hook: Hook) -> *mut c_void {
    let slot = &REAL[hook as usize];
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let lib = if hook.is_nvml() {
        nvml_library()
    } else {
        cuda_library()
    };
    seed(hook, lookup_real(lib, symbol_cstr(hook)));
    slot.load(Ordering::Acquire)
}

/// Records `p` as the real function of `hook`, unless one is known already
/// or `p` is one of ours.
fn seed(hook: Hook, p: *mut c_void) {
    if !p.is_null() && !is_wrapper(p) {
        let _ = REAL[hook as usize].compare_exchange(
            null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

macro_rules! real {
    ($hook:ident as $ty:ty) => {{
        let p = resolve(Hook::$hook);
        if p.is_null() {
            None
        } else {
            // SAFETY: p is the real entry point named by the hook, whose C
            // signature (cuda.h / nvml.h) is this type.
            Some(unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
        }
    }};
}

/// A function not found in the driver library (only possible if the
/// program calls a function its driver does not have).
fn missing(hook: Hook) -> CUresult {
    static MISSING: Once = Once::new();
    log::once(&MISSING, Level::Warn, || {
        format!("{} is not in the driver library", hook.symbol())
    });
    CUDA_ERROR_NOT_FOUND
}

/// The wrapper exported for `hook`.
fn wrapper(hook: Hook) -> *mut c_void {
    macro_rules! ptr {
        ($f:ident) => {
            $f as *mut c_void
        };
    }
    match hook {
        Hook::GetProcAddress => ptr!(cuGetProcAddress),
        Hook::GetProcAddressV2 => ptr!(cuGetProcAddress_v2),
        Hook::MemAlloc => ptr!(cuMemAlloc),
        Hook::MemAllocV2 => ptr!(cuMemAlloc_v2),
        Hook::MemAllocPitch => ptr!(cuMemAllocPitch),
        Hook::MemAllocPitchV2 => ptr!(cuMemAllocPitch_v2),
        Hook::MemAllocManaged => ptr!(cuMemAllocManaged),
        Hook::MemFree => ptr!(cuMemFree),
        Hook::MemFreeV2 => ptr!(cuMemFree_v2),
        Hook::MemCreate => ptr!(cuMemCreate),
        Hook::MemRelease => ptr!(cuMemRelease),
        Hook::MemAllocAsync => ptr!(cuMemAllocAsync),
        Hook::MemAllocAsyncPtsz => ptr!(cuMemAllocAsync_ptsz),
        Hook::MemAllocFromPoolAsync => ptr!(cuMemAllocFromPoolAsync),
        Hook::MemAllocFromPoolAsyncPtsz => ptr!(cuMemAllocFromPoolAsync_ptsz),
        Hook::MemFreeAsync => ptr!(cuMemFreeAsync),
        Hook::MemFreeAsyncPtsz => ptr!(cuMemFreeAsync_ptsz),
        Hook::MemMap => ptr!(cuMemMap),
        Hook::MemUnmap => ptr!(cuMemUnmap),
        Hook::MemAddressFree => ptr!(cuMemAddressFree),
        Hook::MemRetainAllocationHandle => ptr!(cuMemRetainAllocationHandle),
        Hook::MemImportFromShareableHandle => ptr!(cuMemImportFromShareableHandle),
        Hook::MemExportToShareableHandle => ptr!(cuMemExportToShareableHandle),
        Hook::MemPoolCreate => ptr!(cuMemPoolCreate),
        Hook::MemPoolDestroy => ptr!(cuMemPoolDestroy),
        Hook::MemPoolTrimTo => ptr!(cuMemPoolTrimTo),
        Hook::CtxCreateV2 => ptr!(cuCtxCreate_v2),
        Hook::CtxCreateV3 => ptr!(cuCtxCreate_v3),
        Hook::CtxCreateV4 => ptr!(cuCtxCreate_v4),
        Hook::CtxDestroyV2 => ptr!(cuCtxDestroy_v2),
        Hook::DevicePrimaryCtxRetain => ptr!(cuDevicePrimaryCtxRetain),
        Hook::DevicePrimaryCtxRelease => ptr!(cuDevicePrimaryCtxRelease),
        Hook::DevicePrimaryCtxReleaseV2 => ptr!(cuDevicePrimaryCtxRelease_v2),
        Hook::DevicePrimaryCtxReset => ptr!(cuDevicePrimaryCtxReset),
        Hook::DevicePrimaryCtxResetV2 => ptr!(cuDevicePrimaryCtxReset_v2),
        Hook::CtxSetLimit => ptr!(cuCtxSetLimit),
        Hook::ArrayCreate => ptr!(cuArrayCreate),
        Hook::ArrayCreateV2 => ptr!(cuArrayCreate_v2),
        Hook::Array3DCreate => ptr!(cuArray3DCreate),
        Hook::Array3DCreateV2 => ptr!(cuArray3DCreate_v2),
        Hook::ArrayDestroy => ptr!(cuArrayDestroy),
        Hook::MipmappedArrayCreate => ptr!(cuMipmappedArrayCreate),
        Hook::MipmappedArrayDestroy => ptr!(cuMipmappedArrayDestroy),
        Hook::MemGetInfo => ptr!(cuMemGetInfo),
        Hook::MemGetInfoV2 => ptr!(cuMemGetInfo_v2),
        Hook::DeviceTotalMem => ptr!(cuDeviceTotalMem),
        Hook::DeviceTotalMemV2 => ptr!(cuDeviceTotalMem_v2),
        Hook::LaunchKernel => ptr!(cuLaunchKernel),
        Hook::LaunchKernelPtsz => ptr!(cuLaunchKernel_ptsz),
        Hook::LaunchKernelEx => ptr!(cuLaunchKernelEx),
        Hook::LaunchKernelExPtsz => ptr!(cuLaunchKernelEx_ptsz),
        Hook::LaunchCooperativeKernel => ptr!(cuLaunchCooperativeKernel),
        Hook::LaunchCooperativeKernelPtsz => ptr!(cuLaunchCooperativeKernel_ptsz),
        Hook::GraphLaunch => ptr!(cuGraphLaunch),
        Hook::GraphLaunchPtsz => ptr!(cuGraphLaunch_ptsz),
        Hook::NvmlMemoryInfo => ptr!(nvmlDeviceGetMemoryInfo),
        Hook::NvmlMemoryInfoV2 => ptr!(nvmlDeviceGetMemoryInfo_v2),
    }
}

fn is_wrapper(p: *mut c_void) -> bool {
    !p.is_null() && Hook::ALL.iter().any(|&h| wrapper(h) == p)
}

// ---------------------------------------------------------------------------
// Functions the library calls itself

/// A driver or NVML function the library calls but does not intercept.
struct Internal {
    name: &'static CStr,
    nvml: bool,
    ptr: AtomicPtr<c_void>,
}

impl Internal {
    const fn cuda(name: &'static CStr) -> Internal {
        Internal {
            name,
            nvml: false,
            ptr: AtomicPtr::new(null_mut()),
        }
    }

    const fn nvml(name: &'static CStr) -> Internal {
        Internal {
            name,
            nvml: true,
            ptr: AtomicPtr::new(null_mut()),
        }
    }

    fn get(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let lib = if self.nvml {
            nvml_library()
        } else {
            cuda_library()
        };
        let p = lookup_real(lib, self.name);
        if !p.is_null() {
            self.ptr.store(p, Ordering::Release);
        }
        p
    }
}

static CTX_GET_DEVICE: Internal = Internal::cuda(c"cuCtxGetDevice");
static DEVICE_GET_COUNT: Internal = Internal::cuda(c"cuDeviceGetCount");
static DEVICE_GET_UUID: Internal = Internal::cuda(c"cuDeviceGetUuid");
static DEVICE_GET_UUID_V2: Internal = Internal::cuda(c"cuDeviceGetUuid_v2");
static MEM_ADVISE: Internal = Internal::cuda(c"cuMemAdvise");
static NVML_GET_UUID: Internal = Internal::nvml(c"nvmlDeviceGetUUID");
static NVML_GET_INDEX: Internal = Internal::nvml(c"nvmlDeviceGetIndex");

/// The device of the calling thread's current context (`cuCtxGetDevice`).
fn current_device() -> Option<i32> {
    let p = CTX_GET_DEVICE.get();
    if p.is_null() {
        return None;
    }
    // SAFETY: p is the driver's cuCtxGetDevice.
    let f = unsafe { std::mem::transmute::<*mut c_void, FnCtxGetDevice>(p) };
    let mut device: CUdevice = 0;
    // SAFETY: device is a valid out-pointer for the duration of the call.
    (unsafe { f(&mut device) } == SUCCESS).then_some(device)
}

static CTX_GET_CURRENT: Internal = Internal::cuda(c"cuCtxGetCurrent");

/// The calling thread's current context (`cuCtxGetCurrent`), as a number;
/// 0 when none (or unknown).
fn current_context() -> u64 {
    let p = CTX_GET_CURRENT.get();
    if p.is_null() {
        return 0;
    }
    // SAFETY: p is the driver's cuCtxGetCurrent.
    let f = unsafe { std::mem::transmute::<*mut c_void, FnCtxGetCurrent>(p) };
    let mut ctx: Handle = null_mut();
    // SAFETY: ctx is a valid out-pointer.
    if unsafe { f(&mut ctx) } == SUCCESS {
        ctx as usize as u64
    } else {
        0
    }
}

/// Devices the process sees (`cuDeviceGetCount`), once the driver told.
static DEVICE_COUNT: AtomicI32 = AtomicI32::new(-1);

/// The device an allocation or launch about to be made will use: with one
/// visible device (the usual container) it can only be device 0, and the
/// driver is not asked; otherwise the current context's. The driver call
/// that follows still fails on its own if no context is current.
fn target_device() -> Option<i32> {
    let mut count = DEVICE_COUNT.load(Ordering::Relaxed);
    if count < 0 {
        let p = DEVICE_GET_COUNT.get();
        if !p.is_null() {
            // SAFETY: p is the driver's cuDeviceGetCount.
            let f = unsafe { std::mem::transmute::<*mut c_void, FnDeviceGetCount>(p) };
            let mut n: c_int = 0;
            // SAFETY: n is a valid out-pointer.
            if unsafe { f(&mut n) } == SUCCESS && n >= 0 {
                count = n;
                DEVICE_COUNT.store(n, Ordering::Relaxed);
            }
        }
    }
    if count == 1 {
        Some(0)
    } else {
        current_device()
    }
}

struct CudaPlatform;

impl Platform for CudaPlatform {
    fn device_uuid(&self, ordinal: i32) -> Option<String> {
        // _v2 first: for a MIG device it names the MIG instance (the limits
        // file keys a MIG slice by its MIG uuid), where cuDeviceGetUuid names
        // the parent GPU.
        [&DEVICE_GET_UUID_V2, &DEVICE_GET_UUID]
            .iter()
            .find_map(|sym| {
                let p = sym.get();
                if p.is_null() {
                    return None;
                }
                // SAFETY: p is the driver's cuDeviceGetUuid[_v2] (same signature).
                let f = unsafe { std::mem::transmute::<*mut c_void, FnDeviceGetUuid>(p) };
                let mut uuid = [0u8; 16];
                // SAFETY: uuid is a valid 16-byte out-buffer (CUuuid).
                (unsafe { f(&mut uuid, ordinal) } == SUCCESS).then(|| runtime::format_uuid(&uuid))
            })
    }
}

static PLATFORM: CudaPlatform = CudaPlatform;

/// The real driver, as the runtime sees it.
pub fn platform() -> &'static dyn Platform {
    &PLATFORM
}

/// Brings this process's pool ledgers in line with the driver (a refused
/// charge may fit once they gave back what a synchronisation released).
pub fn reconcile_pools(rt: &runtime::Runtime) -> u64 {
    let pools = crate::pools::global();
    if pools.any() {
        pools.reconcile_if_idle(rt, &lifetimes::CudaPools)
    } else {
        0
    }
}

/// Asks the driver to keep an oversubscribed (managed) allocation in host
/// memory; best effort.
fn prefer_host(ptr: CUdeviceptr, bytes: usize) {
    let p = MEM_ADVISE.get();
    if !p.is_null() {
        // SAFETY: p is the driver's cuMemAdvise; ptr/bytes name a managed
        // allocation just made.
        let f = unsafe { std::mem::transmute::<*mut c_void, FnMemAdvise>(p) };
        // SAFETY: as above; the result is advisory and ignored.
        let _ = unsafe {
            f(
                ptr,
                bytes,
                CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                CU_DEVICE_CPU,
            )
        };
    }
}

// ---------------------------------------------------------------------------
// Panic containment

/// Makes the panic hook of this library's own copy of `std` quiet about
/// panics in this crate (the library prints its own one line instead) and
/// leaves every other panic to the hook that was there.
fn install_quiet_panic_hook() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.load(Ordering::Relaxed) || INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let ours = info
            .location()
            .is_some_and(|l| l.file().contains("vgpu/src/"));
        if !ours {
            previous(info);
        }
    }));
}

/// Runs `f` with panics caught (and silenced); `None` if it panicked.
fn contained<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    static PANICKED: Once = Once::new();
    install_quiet_panic_hook();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            log::once(&PANICKED, Level::Error, || {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                format!("internal error in {what} ({message}); the call was passed through")
            });
            None
        }
    }
}

/// Records whether (and with what result) the driver was called.
struct Driver(Cell<Option<CUresult>>);

impl Driver {
    fn call(&self, f: impl FnOnce() -> CUresult) -> CUresult {
        let rc = f();
        self.0.set(Some(rc));
        rc
    }
}

/// Runs `body`; on a panic, returns the driver's result if the driver was
/// called, else passes the call through.
fn protect(
    hook: Hook,
    body: impl FnOnce(&Driver) -> CUresult,
    passthrough: impl FnOnce() -> CUresult,
) -> CUresult {
    let driver = Driver(Cell::new(None));
    match contained(hook.symbol(), || body(&driver)) {
        Some(rc) => rc,
        None => driver.0.get().unwrap_or_else(passthrough),
    }
}

/// An allocation charged to the slice of device `ordinal()`, owned by the
/// current context.
fn tracked_alloc(
    hook: Hook,
    kind: Kind,
    bytes: u64,
    ordinal: impl FnOnce() -> Option<i32>,
    call: impl Fn() -> CUresult,
    handle: impl FnOnce() -> u64,
) -> CUresult {
    protect(
        hook,
        |driver| {
            let rt = runtime::global();
            if !rt.enforcing() {
                return driver.call(&call);
            }
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
        },
        &call,
    )
}

/// A free of `handle` in `space` (a stream-ordered allocation goes back
/// to its pool's ledger).
fn tracked_free(hook: Hook, space: Space, handle: u64, call: impl Fn() -> CUresult) -> CUresult {
    protect(
        hook,
        |driver| {
            let rt = runtime::global();
            memory::release(
                rt,
                space,
                handle,
                || driver.call(&call),
                |tracked, free| {
                    crate::pools::global().release(rt, &lifetimes::CudaPools, handle, tracked, free)
                },
            )
        },
        &call,
    )
}

// ---------------------------------------------------------------------------
// Memory: allocations

/// `cuMemAlloc_v2`: counted; falls back to managed memory when
/// oversubscription is on and the device is physically full.
///
/// # Safety
/// As the driver's `cuMemAlloc_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let Some(real) = real!(MemAllocV2 as FnMemAllocV2) else {
        return missing(Hook::MemAllocV2);
    };
    // SAFETY: the caller's arguments, passed unchanged to the function they were meant for.
    let call = || unsafe { real(dptr, bytesize) };
    if dptr.is_null() {
        return call();
    }
    protect(
        Hook::MemAllocV2,
        |driver| {
            let rt = runtime::global();
            if !rt.enforcing() {
                return driver.call(call);
            }
            memory::allocate_device(
                rt,
                target_device(),
                bytesize as u64,
                current_context(),
                || match driver.call(call) {
                    // SAFETY: dptr is non-null; the driver wrote the pointer on success.
                    SUCCESS => Ok(unsafe { dptr.read_unaligned() }),
                    rc => Err(rc),
                },
                || {
                    let Some(managed) = real!(MemAllocManaged as FnMemAllocManaged) else {
                        return Err(OUT_OF_MEMORY);
                    };
                    // SAFETY: the caller's out-pointer and size, for the managed variant.
                    match driver.call(|| unsafe { managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL) }) {
                        SUCCESS => {
                            // SAFETY: dptr is non-null; written on success.
                            let ptr = unsafe { dptr.read_unaligned() };
                            prefer_host(ptr, bytesize);
                            Ok(ptr)
                        }
                        rc => Err(rc),
                    }
                },
            )
        },
        call,
    )
}

/// `cuMemAlloc` (CUDA < 3.2 ABI, 32-bit): counted.
///
/// # Safety
/// As the driver's `cuMemAlloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult {
    let Some(real) = real!(MemAlloc as FnMemAllocV1) else {
        return missing(Hook::MemAlloc);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(dptr, bytesize) };
    if dptr.is_null() {
        return call();
    }
    tracked_alloc(
        Hook::MemAlloc,
        Kind::Device,
        u64::from(bytesize),
        target_device,
        call,
        // SAFETY: dptr is non-null; written on success.
        || u64::from(unsafe { dptr.read_unaligned() }),
    )
}

/// `cuMemAllocManaged`: counted to the current device.
///
/// # Safety
/// As the driver's `cuMemAllocManaged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    let Some(real) = real!(MemAllocManaged as FnMemAllocManaged) else {
        return missing(Hook::MemAllocManaged);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(dptr, bytesize, flags) };
    if dptr.is_null() {
        return call();
    }
    tracked_alloc(
        Hook::MemAllocManaged,
        Kind::Managed,
        bytesize as u64,
        target_device,
        call,
        // SAFETY: dptr is non-null; written on success.
        || unsafe { dptr.read_unaligned() },
    )
}

/// `cuMemAllocPitch_v2`: counted as pitch × height.
///
/// # Safety
/// As the driver's `cuMemAllocPitch_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let Some(real) = real!(MemAllocPitchV2 as FnMemAllocPitchV2) else {
        return missing(Hook::MemAllocPitchV2);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(dptr, pitch, width, height, element_size) };
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    protect(
        Hook::MemAllocPitchV2,
        |driver| {
            let rt = runtime::global();
            if !rt.enforcing() {
                return driver.call(call);
            }
            memory::allocate_pitch(
                rt,
                target_device(),
                current_context(),
                width as u64,
                height as u64,
                || match driver.call(call) {
                    SUCCESS => {
                        // SAFETY: both out-pointers are non-null and written on success.
                        let (ptr, pitch) =
                            unsafe { (dptr.read_unaligned(), pitch.read_unaligned()) };
                        Ok((ptr, pitch as u64))
                    }
                    rc => Err(rc),
                },
                |ptr| {
                    if let Some(free) = real!(MemFreeV2 as FnMemFreeV2) {
                        // SAFETY: ptr was just allocated by the driver and is not handed out.
                        let _ = unsafe { free(ptr) };
                    }
                },
            )
        },
        call,
    )
}

/// `cuMemAllocPitch` (CUDA < 3.2 ABI): counted as pitch × height.
///
/// # Safety
/// As the driver's `cuMemAllocPitch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    element_size: c_uint,
) -> CUresult {
    let Some(real) = real!(MemAllocPitch as FnMemAllocPitchV1) else {
        return missing(Hook::MemAllocPitch);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(dptr, pitch, width, height, element_size) };
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    protect(
        Hook::MemAllocPitch,
        |driver| {
            let rt = runtime::global();
            if !rt.enforcing() {
                return driver.call(call);
            }
            memory::allocate_pitch(
                rt,
                target_device(),
                current_context(),
                u64::from(width),
                u64::from(height),
                || match driver.call(call) {
                    // SAFETY: both out-pointers are non-null and written on success.
                    SUCCESS => Ok(unsafe {
                        (
                            u64::from(dptr.read_unaligned()),
                            u64::from(pitch.read_unaligned()),
                        )
                    }),
                    rc => Err(rc),
                },
                |ptr| {
                    if let Some(free) = real!(MemFree as FnMemFreeV1) {
                        // SAFETY: ptr was just allocated by the driver (32-bit ABI).
                        let _ = unsafe { free(ptr as c_uint) };
                    }
                },
            )
        },
        call,
    )
}

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

/// `cuArrayCreate_v2`: counted from the descriptor.
///
/// # Safety
/// As the driver's `cuArrayCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    let Some(real) = real!(ArrayCreateV2 as FnArrayCreateV2) else {
        return missing(Hook::ArrayCreateV2);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(array, desc) };
    if array.is_null() || desc.is_null() {
        return call();
    }
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let d = unsafe { desc.read_unaligned() };
    let shape = ArrayShape {
        width: d.width as u64,
        height: d.height as u64,
        depth: 0,
        format: d.format,
        channels: d.num_channels,
        flags: 0,
    };
    array_alloc(Hook::ArrayCreateV2, Kind::Array, shape.bytes(), array, call)
}

/// `cuArrayCreate` (CUDA < 3.2 ABI): counted from the descriptor.
///
/// # Safety
/// As the driver's `cuArrayCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(
    array: *mut Handle,
    desc: *const ArrayDescriptorV1,
) -> CUresult {
    let Some(real) = real!(ArrayCreate as FnArrayCreateV1) else {
        return missing(Hook::ArrayCreate);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(array, desc) };
    if array.is_null() || desc.is_null() {
        return call();
    }
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let d = unsafe { desc.read_unaligned() };
    let shape = ArrayShape {
        width: u64::from(d.width),
        height: u64::from(d.height),
        depth: 0,
        format: d.format,
        channels: d.num_channels,
        flags: 0,
    };
    array_alloc(Hook::ArrayCreate, Kind::Array, shape.bytes(), array, call)
}

fn shape_3d(d: &Array3dDescriptor) -> ArrayShape {
    ArrayShape {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        format: d.format,
        channels: d.num_channels,
        flags: d.flags,
    }
}

/// `cuArray3DCreate_v2`: counted from the descriptor.
///
/// # Safety
/// As the driver's `cuArray3DCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CUresult {
    let Some(real) = real!(Array3DCreateV2 as FnArray3dCreateV2) else {
        return missing(Hook::Array3DCreateV2);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(array, desc) };
    if array.is_null() || desc.is_null() {
        return call();
    }
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let shape = shape_3d(&unsafe { desc.read_unaligned() });
    array_alloc(
        Hook::Array3DCreateV2,
        Kind::Array,
        shape.bytes(),
        array,
        call,
    )
}

/// `cuArray3DCreate` (CUDA < 3.2 ABI): counted from the descriptor.
///
/// # Safety
/// As the driver's `cuArray3DCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(
    array: *mut Handle,
    desc: *const Array3dDescriptorV1,
) -> CUresult {
    let Some(real) = real!(Array3DCreate as FnArray3dCreateV1) else {
        return missing(Hook::Array3DCreate);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(array, desc) };
    if array.is_null() || desc.is_null() {
        return call();
    }
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let d = unsafe { desc.read_unaligned() };
    let shape = ArrayShape {
        width: u64::from(d.width),
        height: u64::from(d.height),
        depth: u64::from(d.depth),
        format: d.format,
        channels: d.num_channels,
        flags: d.flags,
    };
    array_alloc(Hook::Array3DCreate, Kind::Array, shape.bytes(), array, call)
}

/// `cuMipmappedArrayCreate`: counted as the sum of its levels.
///
/// # Safety
/// As the driver's `cuMipmappedArrayCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    let Some(real) = real!(MipmappedArrayCreate as FnMipmappedArrayCreate) else {
        return missing(Hook::MipmappedArrayCreate);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(array, desc, levels) };
    if array.is_null() || desc.is_null() {
        return call();
    }
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let shape = shape_3d(&unsafe { desc.read_unaligned() });
    let bytes = shape.mipmapped_bytes(levels);
    array_alloc(Hook::MipmappedArrayCreate, Kind::Mipmap, bytes, array, call)
}

// ---------------------------------------------------------------------------
// Memory: frees

/// `cuMemFree_v2`: gives the charge back.
///
/// # Safety
/// As the driver's `cuMemFree_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let Some(real) = real!(MemFreeV2 as FnMemFreeV2) else {
        return missing(Hook::MemFreeV2);
    };
    // SAFETY: the caller's argument, unchanged.
    tracked_free(Hook::MemFreeV2, Space::Pointer, dptr, || unsafe {
        real(dptr)
    })
}

/// `cuMemFree` (CUDA < 3.2 ABI): gives the charge back.
///
/// # Safety
/// As the driver's `cuMemFree`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(dptr: c_uint) -> CUresult {
    let Some(real) = real!(MemFree as FnMemFreeV1) else {
        return missing(Hook::MemFree);
    };
    // SAFETY: the caller's argument, unchanged.
    tracked_free(Hook::MemFree, Space::Pointer, u64::from(dptr), || unsafe {
        real(dptr)
    })
}

/// `cuArrayDestroy`: gives an array's charge back.
///
/// # Safety
/// As the driver's `cuArrayDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(array: Handle) -> CUresult {
    let Some(real) = real!(ArrayDestroy as FnDestroy) else {
        return missing(Hook::ArrayDestroy);
    };
    // SAFETY: the caller's argument, unchanged.
    tracked_free(
        Hook::ArrayDestroy,
        Space::Array,
        array as usize as u64,
        || unsafe { real(array) },
    )
}

/// `cuMipmappedArrayDestroy`: gives a mipmapped array's charge back.
///
/// # Safety
/// As the driver's `cuMipmappedArrayDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: Handle) -> CUresult {
    let Some(real) = real!(MipmappedArrayDestroy as FnDestroy) else {
        return missing(Hook::MipmappedArrayDestroy);
    };
    // SAFETY: the caller's argument, unchanged.
    tracked_free(
        Hook::MipmappedArrayDestroy,
        Space::Mipmap,
        array as usize as u64,
        || unsafe { real(array) },
    )
}

// ---------------------------------------------------------------------------
// Memory: what the program is told

/// `cuMemGetInfo` in both ABIs: the slice written as `T` (saturating at
/// `max`) on a limited device, the driver's answer elsewhere or when an
/// out-pointer is null.
fn mem_info<T: TryFrom<u64> + Copy>(
    hook: Hook,
    free: *mut T,
    total: *mut T,
    max: T,
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
                    free.write_unaligned(T::try_from(f).unwrap_or(max));
                    total.write_unaligned(T::try_from(t).unwrap_or(max));
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
    let rt = runtime::global();
    if !rt.enforcing() {
        return None;
    }
    let pools = crate::pools::global();
    if pools.any() {
        pools.reconcile_if_idle(rt, &lifetimes::CudaPools);
    }
    current_device().and_then(|o| memory::slice(rt, o))
}

/// `cuMemGetInfo_v2`: the slice (total = limit, free = limit − the
/// container's use) on a limited device; the driver's answer elsewhere.
///
/// # Safety
/// As the driver's `cuMemGetInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let Some(real) = real!(MemGetInfoV2 as FnMemGetInfoV2) else {
        return missing(Hook::MemGetInfoV2);
    };
    // SAFETY: the caller's arguments, unchanged.
    mem_info(Hook::MemGetInfoV2, free, total, usize::MAX, || unsafe {
        real(free, total)
    })
}

/// `cuMemGetInfo` (CUDA < 3.2 ABI, 32-bit; sizes saturate).
///
/// # Safety
/// As the driver's `cuMemGetInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let Some(real) = real!(MemGetInfo as FnMemGetInfoV1) else {
        return missing(Hook::MemGetInfo);
    };
    // SAFETY: the caller's arguments, unchanged.
    mem_info(Hook::MemGetInfo, free, total, c_uint::MAX, || unsafe {
        real(free, total)
    })
}

/// `cuDeviceTotalMem_v2`: the limit on a limited device.
///
/// # Safety
/// As the driver's `cuDeviceTotalMem_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult {
    let Some(real) = real!(DeviceTotalMemV2 as FnDeviceTotalMemV2) else {
        return missing(Hook::DeviceTotalMemV2);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(bytes, device) };
    protect(
        Hook::DeviceTotalMemV2,
        |driver| {
            let rc = driver.call(call);
            if rc == SUCCESS
                && !bytes.is_null()
                && let Some(limit) = device_limit(device)
            {
                // SAFETY: bytes is non-null; the driver just wrote it.
                unsafe { bytes.write_unaligned(usize::try_from(limit).unwrap_or(usize::MAX)) };
            }
            rc
        },
        call,
    )
}

/// `cuDeviceTotalMem` (CUDA < 3.2 ABI; saturates).
///
/// # Safety
/// As the driver's `cuDeviceTotalMem`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, device: CUdevice) -> CUresult {
    let Some(real) = real!(DeviceTotalMem as FnDeviceTotalMemV1) else {
        return missing(Hook::DeviceTotalMem);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(bytes, device) };
    protect(
        Hook::DeviceTotalMem,
        |driver| {
            let rc = driver.call(call);
            if rc == SUCCESS
                && !bytes.is_null()
                && let Some(limit) = device_limit(device)
            {
                // SAFETY: bytes is non-null; the driver just wrote it.
                unsafe { bytes.write_unaligned(c_uint::try_from(limit).unwrap_or(c_uint::MAX)) };
            }
            rc
        },
        call,
    )
}

fn device_limit(ordinal: CUdevice) -> Option<u64> {
    let rt = runtime::global();
    if !rt.enforcing() {
        return None;
    }
    rt.device(ordinal)?.memory_limit
}

// ---------------------------------------------------------------------------
// Launches

/// The SM limiter's state (`limiter::off` reads it).
pub(crate) static LIMITER_STATE: AtomicU8 = AtomicU8::new(limiter::UNKNOWN);

/// Per launch hook: the real function once it is known *and* the limiter
/// is off for good, else null. The launch hot path is one load of this and
/// a tail call.
static FAST_LAUNCH: [AtomicPtr<c_void>; HOOK_COUNT] =
    [const { AtomicPtr::new(null_mut()) }; HOOK_COUNT];

/// The slow path of a launch: resolves the real function and makes the
/// launch wait for its tokens when the device is limited; opens the fast
/// path once the limiter is off.
#[cold]
#[inline(never)]
fn launch_slow(hook: Hook, blocks: u64) -> *mut c_void {
    let real = resolve(hook);
    let _ = contained(hook.symbol(), || {
        limiter::admit(target_device(), blocks, nvml_source);
    });
    if limiter::off() && !real.is_null() {
        FAST_LAUNCH[hook as usize].store(real, Ordering::Release);
    }
    real
}

macro_rules! launch {
    (
        $name:ident, $hook:ident, $ty:ty,
        ($($arg:ident: $argty:ty),*),
        blocks = $blocks:expr
    ) => {
        /// Kernel launch: waits for its tokens on an SM-limited device;
        /// one atomic load and a tail call otherwise.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $argty),*) -> CUresult {
            /// The launch while the limiter is on or undecided.
            #[cold]
            #[inline(never)]
            unsafe extern "C" fn slow($($arg: $argty),*) -> CUresult {
                let blocks: u64 = $blocks;
                let real = launch_slow(Hook::$hook, blocks);
                if real.is_null() {
                    return missing(Hook::$hook);
                }
                // SAFETY: real is the driver's entry point for this hook, of
                // this C signature; the caller's arguments are passed unchanged.
                unsafe { std::mem::transmute::<*mut c_void, $ty>(real)($($arg),*) }
            }
            let fast = FAST_LAUNCH[Hook::$hook as usize].load(Ordering::Relaxed);
            if !fast.is_null() {
                // SAFETY: as in `slow`.
                return unsafe { std::mem::transmute::<*mut c_void, $ty>(fast)($($arg),*) };
            }
            // SAFETY: the caller's arguments, unchanged.
            unsafe { slow($($arg),*) }
        }
    };
}

fn grid(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x)
        .saturating_mul(u64::from(y))
        .saturating_mul(u64::from(z))
}

fn grid_of(config: *const LaunchConfig) -> u64 {
    if config.is_null() {
        return 1;
    }
    // SAFETY: config is non-null and points to the caller's CUlaunchConfig.
    let c = unsafe { config.read_unaligned() };
    grid(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z)
}

launch!(cuLaunchKernel, LaunchKernel, FnLaunchKernel,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void),
    blocks = grid(gx, gy, gz));
launch!(cuLaunchKernel_ptsz, LaunchKernelPtsz, FnLaunchKernel,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void),
    blocks = grid(gx, gy, gz));
launch!(cuLaunchKernelEx, LaunchKernelEx, FnLaunchKernelEx,
    (config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void),
    blocks = grid_of(config));
launch!(cuLaunchKernelEx_ptsz, LaunchKernelExPtsz, FnLaunchKernelEx,
    (config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void),
    blocks = grid_of(config));
launch!(cuLaunchCooperativeKernel, LaunchCooperativeKernel, FnLaunchCooperativeKernel,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shared: c_uint, stream: Handle, params: *mut *mut c_void),
    blocks = grid(gx, gy, gz));
launch!(cuLaunchCooperativeKernel_ptsz, LaunchCooperativeKernelPtsz, FnLaunchCooperativeKernel,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shared: c_uint, stream: Handle, params: *mut *mut c_void),
    blocks = grid(gx, gy, gz));
launch!(cuGraphLaunch, GraphLaunch, FnGraphLaunch,
    (exec: Handle, stream: Handle),
    blocks = limiter::GRAPH_LAUNCH_BLOCKS);
launch!(cuGraphLaunch_ptsz, GraphLaunchPtsz, FnGraphLaunch,
    (exec: Handle, stream: Handle),
    blocks = limiter::GRAPH_LAUNCH_BLOCKS);

/// Registers the after-fork handler of the SM limiter (once).
pub fn register_fork_handler() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    extern "C" fn child() {
        limiter::after_fork_in_child();
    }
    // SAFETY: the handler only stores to an atomic, which is safe in the
    // child of a fork.
    let _ = unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

// ---------------------------------------------------------------------------
// cuGetProcAddress

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

/// `cuGetProcAddress` (CUDA 11.3–11.8): the driver's answer, with our
/// wrappers substituted for intercepted entry points.
///
/// # Safety
/// As the driver's `cuGetProcAddress`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let Some(real) = real!(GetProcAddress as FnGetProcAddress) else {
        return missing(Hook::GetProcAddress);
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(symbol, pfn, cuda_version, flags) };
    if rc == SUCCESS {
        let _ = contained("cuGetProcAddress", || {
            substitute(symbol, pfn, cuda_version, flags)
        });
    }
    rc
}

/// `cuGetProcAddress_v2` (CUDA ≥ 12.0): as [`cuGetProcAddress`].
///
/// # Safety
/// As the driver's `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let Some(real) = real!(GetProcAddressV2 as FnGetProcAddressV2) else {
        return missing(Hook::GetProcAddressV2);
    };
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

// Silence "unused" for the flag constant re-exported for documentation.
const _: u64 = PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

// ---------------------------------------------------------------------------
// dlsym

/// What the exported `dlsym` answers itself: the wrapper of an intercepted
/// name the handle really has; null for everything else (the real `dlsym`
/// answers those). Also makes sure the real `dlsym` is known.
extern "C" fn dlsym_lookup(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let dlsym = real_dlsym();
    if symbol.is_null() {
        return null_mut();
    }
    // SAFETY: symbol is the caller's NUL-terminated name (dlsym's contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let Some(hook) = Hook::by_symbol(name) else {
        return null_mut();
    };
    // A plain catch_unwind: nothing here can panic in practice, and the
    // dlsym path of every process should touch as little as possible.
    catch_unwind(|| {
        // SAFETY: the caller's handle and name, for the real dlsym.
        let found = unsafe { dlsym(handle, symbol) };
        if found.is_null() || is_wrapper(found) {
            return found;
        }
        seed(hook, found);
        if handle != RTLD_DEFAULT && handle != RTLD_NEXT {
            // The caller's handle has the real library: remember it.
            let cache = if hook.is_nvml() { &NVML_LIB } else { &CUDA_LIB };
            let _ = cache.compare_exchange(null_mut(), handle, Ordering::AcqRel, Ordering::Acquire);
        }
        wrapper(hook)
    })
    .unwrap_or(null_mut())
}

/// `dlsym`, exported: intercepted names get wrappers; every other lookup is
/// a tail jump to the real `dlsym`, so its caller-relative semantics
/// (`RTLD_NEXT`) hold.
///
/// # Safety
/// As glibc's `dlsym`.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // The stack is 16-byte aligned at the call: entry (8 mod 16) + two
    // pushes + 8.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {lookup}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        lookup = sym dlsym_lookup,
        real = sym REAL_DLSYM,
    )
}

/// glibc's `dlopen`, found once (null until then).
#[cfg(all(target_arch = "x86_64", not(test)))]
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

#[cfg(all(target_arch = "x86_64", not(test)))]
unsafe extern "C" fn no_dlopen(_file: *const c_char, _flags: c_int) -> *mut c_void {
    null_mut()
}

/// `RTLD_DEEPBIND`.
#[cfg(all(target_arch = "x86_64", not(test)))]
const RTLD_DEEPBIND: c_int = 0x8;

/// The flags the exported `dlopen` passes on: without `RTLD_DEEPBIND`
/// while limits are in force. A library loaded with it binds its own
/// dependencies first — libc's `dlsym` and libcuda's functions, past this
/// library — so a plugin loaded that way would reach the driver unseen.
/// Also makes sure the real `dlopen` is known.
#[cfg(all(target_arch = "x86_64", not(test)))]
extern "C" fn dlopen_flags(_file: *const c_char, flags: c_int) -> c_int {
    if REAL_DLOPEN.load(Ordering::Acquire).is_null() {
        let p = glibc_next(c"dlopen", no_dlopen as *mut c_void);
        REAL_DLOPEN.store(p, Ordering::Release);
    }
    if flags & RTLD_DEEPBIND == 0 {
        return flags;
    }
    let strip = catch_unwind(|| runtime::global().enforcing()).unwrap_or(false);
    if !strip {
        return flags;
    }
    static DEEPBIND: Once = Once::new();
    log::once(&DEEPBIND, Level::Info, || {
        "a library was loaded with RTLD_DEEPBIND; loaded without it, so that its \
         driver calls are counted"
            .to_string()
    });
    flags & !RTLD_DEEPBIND
}

/// `dlopen`, exported: drops `RTLD_DEEPBIND` (see `dlopen_flags`), then a
/// tail jump to the real `dlopen` with the caller's return address intact
/// (glibc finds the caller's search path, `$ORIGIN` and RUNPATH, by it).
///
/// # Safety
/// As glibc's `dlopen`.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, flags: c_int) -> *mut c_void {
    // As in `dlsym`: the stack is 16-byte aligned at the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {flags}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "mov esi, eax",
        "jmp qword ptr [rip + {real}]",
        flags = sym dlopen_flags,
        real = sym REAL_DLOPEN,
    )
}

/// `dlsym`, exported (portable version: lookups by other libraries with
/// `RTLD_NEXT` resolve relative to this library).
///
/// # Safety
/// As glibc's `dlsym`.
#[cfg(all(not(target_arch = "x86_64"), not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let hooked = dlsym_lookup(handle, symbol);
    if !hooked.is_null() {
        return hooked;
    }
    // SAFETY: the caller's arguments, for the real dlsym.
    unsafe { real_dlsym()(handle, symbol) }
}

// ---------------------------------------------------------------------------
// NVML

/// `(total, used)` of the slice of the NVML device, if it is limited.
fn nvml_slice(device: Handle) -> Option<(u64, u64)> {
    let rt = runtime::global();
    if !rt.enforcing() {
        return None;
    }
    let get_uuid = NVML_GET_UUID.get();
    if get_uuid.is_null() {
        return None;
    }
    // SAFETY: get_uuid is NVML's nvmlDeviceGetUUID.
    let get_uuid = unsafe { std::mem::transmute::<*mut c_void, FnNvmlGetUuid>(get_uuid) };
    let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    // SAFETY: buf is a writable buffer of the length passed.
    if unsafe { get_uuid(device, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into buf (zero-filled before).
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut index: c_uint = 0;
    let get_index = NVML_GET_INDEX.get();
    if !get_index.is_null() {
        // SAFETY: get_index is NVML's nvmlDeviceGetIndex.
        let get_index = unsafe { std::mem::transmute::<*mut c_void, FnNvmlGetIndex>(get_index) };
        // SAFETY: index is a valid out-pointer.
        let _ = unsafe { get_index(device, &mut index) };
    }
    let info = rt.device_by_uuid(&uuid, i32::try_from(index).unwrap_or(0));
    let limit = info.memory_limit?;
    // Closed accounting reports everything used (and nothing free), not
    // more than there is.
    Some((limit, rt.used(info.slot).min(limit)))
}

/// `nvmlDeviceGetMemoryInfo`: the slice on a limited device (total = limit,
/// used = the container's use, free = the rest), so `nvidia-smi` shows it.
///
/// # Safety
/// As NVML's `nvmlDeviceGetMemoryInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: Handle,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    let Some(real) = real!(NvmlMemoryInfo as FnNvmlMemoryInfo) else {
        let _ = missing(Hook::NvmlMemoryInfo);
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(device, memory) };
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    if let Some(Some((total, used))) = contained("nvmlDeviceGetMemoryInfo", || nvml_slice(device)) {
        let m = NvmlMemory {
            total,
            free: total.saturating_sub(used),
            used,
        };
        // SAFETY: memory is non-null and NVML just filled it.
        unsafe { memory.write_unaligned(m) };
    }
    rc
}

/// `nvmlDeviceGetMemoryInfo_v2`: as [`nvmlDeviceGetMemoryInfo`], with no
/// memory reserved.
///
/// # Safety
/// As NVML's `nvmlDeviceGetMemoryInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Handle,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    let Some(real) = real!(NvmlMemoryInfoV2 as FnNvmlMemoryInfoV2) else {
        let _ = missing(Hook::NvmlMemoryInfoV2);
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(device, memory) };
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    if let Some(Some((total, used))) =
        contained("nvmlDeviceGetMemoryInfo_v2", || nvml_slice(device))
    {
        // SAFETY: memory is non-null and NVML just filled it (version checked).
        unsafe {
            let m = memory.read_unaligned();
            memory.write_unaligned(NvmlMemoryV2 {
                version: m.version,
                total,
                reserved: 0,
                free: total.saturating_sub(used),
                used,
            });
        }
    }
    rc
}

/// NVML as the SM limiter's measurement.
struct NvmlSource {
    get_handle: FnNvmlGetHandleByUuid,
    get_utilization: FnNvmlGetProcessUtilization,
    handles: std::collections::HashMap<String, Handle>,
    last_seen: std::collections::HashMap<String, u64>,
}

/// Opens NVML (loading `libnvidia-ml.so.1` if the program has not) for the
/// SM limiter.
fn nvml_source() -> Result<Box<dyn limiter::UtilSource>, String> {
    let lib = library(&NVML_OWN, c"libnvidia-ml.so.1", true);
    if lib.is_null() {
        return Err("cannot load libnvidia-ml.so.1".into());
    }
    let sym = |name: &CStr| {
        let p = lookup_real(lib, name);
        if p.is_null() {
            Err(format!(
                "{} is not in libnvidia-ml.so.1",
                name.to_string_lossy()
            ))
        } else {
            Ok(p)
        }
    };
    let init = sym(c"nvmlInit_v2")?;
    let get_handle = sym(c"nvmlDeviceGetHandleByUUID")?;
    let get_utilization = sym(c"nvmlDeviceGetProcessUtilization")?;
    // SAFETY: each pointer is the NVML function of that name and signature.
    let (init, get_handle, get_utilization) = unsafe {
        (
            std::mem::transmute::<*mut c_void, FnNvmlInit>(init),
            std::mem::transmute::<*mut c_void, FnNvmlGetHandleByUuid>(get_handle),
            std::mem::transmute::<*mut c_void, FnNvmlGetProcessUtilization>(get_utilization),
        )
    };
    // SAFETY: nvmlInit_v2 takes no arguments; NVML counts inits.
    let rc = unsafe { init() };
    if rc != NVML_SUCCESS {
        return Err(format!("nvmlInit_v2 failed ({rc})"));
    }
    Ok(Box::new(NvmlSource {
        get_handle,
        get_utilization,
        handles: Default::default(),
        last_seen: Default::default(),
    }))
}

impl limiter::UtilSource for NvmlSource {
    fn utilization(&mut self, uuid: &str, pids: &[u32]) -> Option<f64> {
        let device = match self.handles.get(uuid) {
            Some(&h) => h,
            None => {
                let name = std::ffi::CString::new(uuid).ok()?;
                let mut h: Handle = null_mut();
                // SAFETY: name is NUL-terminated; h is a valid out-pointer.
                if unsafe { (self.get_handle)(name.as_ptr(), &mut h) } != NVML_SUCCESS {
                    return None;
                }
                self.handles.insert(uuid.to_owned(), h);
                h
            }
        };
        let last = self.last_seen.get(uuid).copied().unwrap_or(0);
        let mut count: c_uint = 0;
        // SAFETY: a null buffer with count 0 asks for the sample count.
        let rc = unsafe { (self.get_utilization)(device, null_mut(), &mut count, last) };
        if rc == NVML_ERROR_NOT_FOUND || (rc != NVML_SUCCESS && rc != NVML_ERROR_INSUFFICIENT_SIZE)
        {
            return None;
        }
        if count == 0 {
            return None;
        }
        // Room for samples arriving between the two calls.
        count += 8;
        let mut samples = vec![NvmlProcessUtilizationSample::default(); count as usize];
        // SAFETY: samples has room for count entries.
        let rc = unsafe { (self.get_utilization)(device, samples.as_mut_ptr(), &mut count, last) };
        if rc != NVML_SUCCESS {
            return None;
        }
        samples.truncate(count as usize);
        let newest = samples.iter().map(|s| s.time_stamp).max().unwrap_or(last);
        self.last_seen.insert(uuid.to_owned(), newest.max(last));
        let pairs: Vec<(u32, u32)> = samples
            .iter()
            .filter(|s| s.time_stamp > last)
            .map(|s| (s.pid, s.sm_util))
            .collect();
        limiter::container_utilization(&pairs, pids)
    }
}

// After the macros above: the lifetime wrappers (VMM, pools, contexts) use them.
mod lifetimes;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_layouts_match_the_c_headers() {
        assert_eq!(size_of::<CuMemAllocationProp>(), 32);
        assert_eq!(offset_of!(CuMemAllocationProp, location), 8);
        assert_eq!(size_of::<ArrayDescriptor>(), 24);
        assert_eq!(size_of::<Array3dDescriptor>(), 40);
        assert_eq!(size_of::<ArrayDescriptorV1>(), 16);
        assert_eq!(size_of::<Array3dDescriptorV1>(), 24);
        assert_eq!(offset_of!(LaunchConfig, stream), 32);
        assert_eq!(size_of::<LaunchConfig>(), 56);
        assert_eq!(size_of::<NvmlMemory>(), 24);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(size_of::<NvmlProcessUtilizationSample>(), 32);
        assert_eq!(
            lifetimes::layouts(),
            (88, 24),
            "CUmemPoolProps, nvmlProcessInfo_t"
        );
    }

    #[test]
    fn a_panic_before_the_driver_call_passes_the_call_through() {
        let rc = protect(Hook::MemAllocV2, |_| panic!("before"), || 42);
        assert_eq!(rc, 42);
    }

    #[test]
    fn a_panic_after_the_driver_call_returns_the_drivers_result() {
        let passed_through = Cell::new(false);
        let rc = protect(
            Hook::MemAllocV2,
            |driver| {
                driver.call(|| 7);
                panic!("after")
            },
            || {
                passed_through.set(true);
                42
            },
        );
        assert_eq!(rc, 7);
        assert!(!passed_through.get(), "the driver is never called twice");
    }

    #[test]
    fn every_hook_has_its_own_wrapper() {
        let mut seen = std::collections::HashSet::new();
        for &hook in Hook::ALL {
            assert!(
                seen.insert(wrapper(hook) as usize),
                "{hook:?} shares a wrapper"
            );
            assert!(is_wrapper(wrapper(hook)));
        }
        assert!(!is_wrapper(null_mut()));
    }

    #[test]
    fn the_real_dlsym_is_found_and_is_not_ours() {
        let f = real_dlsym();
        assert_ne!(f as *const (), no_dlsym as *const ());
        // SAFETY: a lookup of a libc symbol by the real dlsym.
        let p = unsafe { f(RTLD_DEFAULT, c"malloc".as_ptr()) };
        assert!(!p.is_null());
    }

    #[test]
    fn the_lookup_leaves_foreign_names_to_the_real_dlsym() {
        assert!(dlsym_lookup(RTLD_DEFAULT, c"malloc".as_ptr()).is_null());
        assert!(dlsym_lookup(RTLD_DEFAULT, std::ptr::null()).is_null());
        // No libcuda in this process: the real lookup finds nothing to wrap.
        assert!(
            dlsym_lookup(RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()).is_null()
                || is_wrapper(dlsym_lookup(RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()))
        );
    }
}
