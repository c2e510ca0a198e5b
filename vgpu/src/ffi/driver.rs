//! What the library asks the driver itself: the current device and
//! context, how many devices there are, a device's uuid, and the process's
//! runtime over the real driver (the `runtime::Platform` seam).

use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, Ordering};

use super::pools::CudaPools;
use super::resolve::Internal;
use super::types::{
    CU_DEVICE_CPU, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CUdevice, CUdeviceptr, CUresult, Handle,
};
use crate::memory::SUCCESS;
use crate::runtime::{self, Platform, Runtime};

type FnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
type FnCtxGetCurrent = unsafe extern "C" fn(*mut Handle) -> CUresult;
type FnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
type FnDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult;
type FnMemAdvise = unsafe extern "C" fn(CUdeviceptr, usize, c_int, CUdevice) -> CUresult;

static CTX_GET_DEVICE: Internal<FnCtxGetDevice> = Internal::cuda(c"cuCtxGetDevice");
static CTX_GET_CURRENT: Internal<FnCtxGetCurrent> = Internal::cuda(c"cuCtxGetCurrent");
static DEVICE_GET_COUNT: Internal<FnDeviceGetCount> = Internal::cuda(c"cuDeviceGetCount");
static DEVICE_GET_UUID: Internal<FnDeviceGetUuid> = Internal::cuda(c"cuDeviceGetUuid");
static DEVICE_GET_UUID_V2: Internal<FnDeviceGetUuid> = Internal::cuda(c"cuDeviceGetUuid_v2");
static MEM_ADVISE: Internal<FnMemAdvise> = Internal::cuda(c"cuMemAdvise");

/// The device of the calling thread's current context (`cuCtxGetDevice`).
pub(super) fn current_device() -> Option<i32> {
    let f = CTX_GET_DEVICE.get()?;
    let mut device: CUdevice = 0;
    // SAFETY: device is a valid out-pointer for the duration of the call.
    (unsafe { f(&mut device) } == SUCCESS).then_some(device)
}

/// The calling thread's current context (`cuCtxGetCurrent`), as a number;
/// 0 when none (or unknown).
pub(super) fn current_context() -> u64 {
    let Some(f) = CTX_GET_CURRENT.get() else {
        return 0;
    };
    let mut ctx: Handle = null_mut();
    // SAFETY: ctx is a valid out-pointer.
    if unsafe { f(&mut ctx) } == SUCCESS {
        ctx as usize as u64
    } else {
        0
    }
}

/// Devices the process sees (`cuDeviceGetCount`), once the driver told.
pub(super) static DEVICE_COUNT: AtomicI32 = AtomicI32::new(-1);

/// The device an allocation or launch about to be made will use: with one
/// visible device (the usual container) it can only be device 0, and the
/// driver is not asked; otherwise the current context's. The driver call
/// that follows still fails on its own if no context is current.
pub(super) fn target_device() -> Option<i32> {
    let mut count = DEVICE_COUNT.load(Ordering::Relaxed);
    if count < 0
        && let Some(f) = DEVICE_GET_COUNT.get()
    {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer.
        if unsafe { f(&mut n) } == SUCCESS && n >= 0 {
            count = n;
            DEVICE_COUNT.store(n, Ordering::Relaxed);
        }
    }
    if count == 1 {
        Some(0)
    } else {
        current_device()
    }
}

/// Asks the driver to keep an oversubscribed (managed) allocation in host
/// memory; best effort.
pub(super) fn prefer_host(ptr: CUdeviceptr, bytes: usize) {
    if let Some(f) = MEM_ADVISE.get() {
        // SAFETY: the driver's cuMemAdvise on a managed allocation just made
        // (ptr, bytes); the result is advisory and ignored.
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

/// The real driver, as the runtime sees it.
struct CudaPlatform;

impl Platform for CudaPlatform {
    fn device_uuid(&self, ordinal: i32) -> Option<String> {
        // _v2 first: for a MIG device it names the MIG instance (the limits
        // file keys a MIG slice by its MIG uuid), where cuDeviceGetUuid names
        // the parent GPU.
        [&DEVICE_GET_UUID_V2, &DEVICE_GET_UUID]
            .iter()
            .find_map(|sym| {
                let f = sym.get()?;
                let mut uuid = [0u8; 16];
                // SAFETY: uuid is a valid 16-byte out-buffer (CUuuid).
                (unsafe { f(&mut uuid, ordinal) } == SUCCESS).then(|| runtime::format_uuid(&uuid))
            })
    }

    /// Brings this process's pool ledgers in line with the driver (a
    /// refused charge may fit once they gave back what a synchronisation
    /// released).
    fn reconcile_pools(&self, rt: &Runtime) -> u64 {
        let pools = crate::pools::global();
        if pools.any() {
            pools.reconcile_if_idle(rt, &CudaPools)
        } else {
            0
        }
    }
}

static PLATFORM: CudaPlatform = CudaPlatform;

/// The process's runtime, over the real driver.
#[inline]
pub(super) fn rt() -> &'static Runtime {
    runtime::global(&PLATFORM)
}
