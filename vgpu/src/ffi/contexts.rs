//! Contexts: a destroyed, released or reset context gives back what it
//! held, and its own memory (measured through NVML when it is made) and
//! its malloc heap are counted (the decisions are `crate::contexts`'s).

use std::ffi::{CString, c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::driver::{current_context, current_device, rt};
use super::guard::{contained, protect};
use super::nvml::{FnNvmlGetHandleByUuid, FnNvmlInit};
use super::pools::CudaPools;
use super::resolve::Internal;
use super::types::{
    CU_LIMIT_MALLOC_HEAP_SIZE, CUdevice, CUresult, Handle, NVML_SUCCESS, NvmlProcessInfo,
    NvmlReturn,
};
use crate::contexts;
use crate::log::{self, Level, Once};
use crate::memory::SUCCESS;
use crate::names::Hook;
use crate::pools;
use crate::runtime::{self, DeviceInfo};

type FnPrimaryGetState = unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult;
type FnNvmlComputeProcs =
    unsafe extern "C" fn(Handle, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;

static PRIMARY_GET_STATE: Internal<FnPrimaryGetState> =
    Internal::cuda(c"cuDevicePrimaryCtxGetState");
static NVML_COMPUTE_PROCS: Internal<FnNvmlComputeProcs> =
    Internal::own_nvml(c"nvmlDeviceGetComputeRunningProcesses_v3");
static NVML_HANDLE_BY_UUID: Internal<FnNvmlGetHandleByUuid> =
    Internal::own_nvml(c"nvmlDeviceGetHandleByUUID");
static NVML_INIT: Internal<FnNvmlInit> = Internal::own_nvml(c"nvmlInit_v2");

/// Primary contexts as the library saw them retained, per CUDA ordinal.
static PRIMARY: [AtomicU64; runtime::MAX_ORDINALS] =
    [const { AtomicU64::new(0) }; runtime::MAX_ORDINALS];

/// NVML's processes on the device with `uuid`: `(pid, used bytes)`.
fn nvml_processes(uuid: &str) -> Option<Vec<(u32, u64)>> {
    let by_uuid = NVML_HANDLE_BY_UUID.get()?;
    let procs = NVML_COMPUTE_PROCS.get()?;
    let name = CString::new(uuid).ok()?;
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if let Some(init) = NVML_INIT.get() {
            // SAFETY: nvmlInit_v2 takes no arguments; NVML counts inits.
            let _ = unsafe { init() };
        }
    });
    let mut device: Handle = null_mut();
    // SAFETY: name is NUL-terminated; device is a valid out-pointer.
    if unsafe { by_uuid(name.as_ptr(), &mut device) } != NVML_SUCCESS {
        return None;
    }
    let mut infos = [NvmlProcessInfo::default(); 64];
    let mut count = infos.len() as c_uint;
    // SAFETY: infos has room for `count` entries.
    if unsafe { procs(device, &mut count, infos.as_mut_ptr()) } != NVML_SUCCESS {
        return None;
    }
    Some(
        infos[..(count as usize).min(infos.len())]
            .iter()
            .map(|p| (p.pid, p.used_gpu_memory))
            .collect(),
    )
}

/// This process's pid as NVML lists it, once found (0: not yet).
static NVML_PID: AtomicU32 = AtomicU32::new(0);
/// Snapshots taken without finding it; the library stops trying at a few.
static NVML_TRIES: AtomicU32 = AtomicU32::new(0);

/// The limited device at `ordinal` and its uuid, if context memory is to
/// be measured there.
fn measured_device(ordinal: CUdevice) -> Option<(&'static DeviceInfo, String)> {
    let rt = rt();
    if !rt.enforcing() {
        return None;
    }
    let device = rt.device(ordinal)?;
    device.memory_limit?;
    Some((device, device.uuid.clone()?))
}

/// Before a context is made on `ordinal`: NVML's pids, if this process is
/// not yet known to NVML (it may be listed under its host pid, which it
/// cannot see from inside a pid namespace: the pid that appears with the
/// new context is then its own).
fn before_context(ordinal: CUdevice) -> Option<Vec<u32>> {
    if NVML_PID.load(Ordering::Relaxed) != 0 || NVML_TRIES.load(Ordering::Relaxed) >= 4 {
        return None;
    }
    contained("context accounting", || {
        let (_, uuid) = measured_device(ordinal)?;
        let listed = nvml_processes(&uuid)?;
        let me = std::process::id();
        (!listed.iter().any(|&(p, _)| p == me)).then(|| listed.iter().map(|&(p, _)| p).collect())
    })
    .flatten()
}

/// A context `ctx` now exists on `ordinal`: measure its own memory once.
fn context_made(ordinal: CUdevice, ctx: Handle, before: Option<Vec<u32>>) {
    let _ = contained("context accounting", || {
        let rt = rt();
        let ctx = ctx as usize as u64;
        if ctx == 0 || contexts::measured(ctx) {
            return;
        }
        let Some((device, uuid)) = measured_device(ordinal) else {
            return;
        };
        let known = NVML_PID.load(Ordering::Relaxed);
        let listed = nvml_processes(&uuid);
        log::log(Level::Debug, || {
            format!("context {ctx:#x}: NVML lists {listed:?}; before the context {before:?}")
        });
        let own = listed.and_then(|listed| {
            contexts::own_entry(
                &listed,
                (known != 0).then_some(known),
                std::process::id(),
                before.as_deref(),
            )
        });
        match own {
            Some((pid, held)) => {
                NVML_PID.store(pid, Ordering::Relaxed);
                let charged = rt.process_used(device.slot);
                contexts::context_made(rt, device, ctx, held, charged);
            }
            None => {
                NVML_TRIES.fetch_add(1, Ordering::Relaxed);
                static UNMEASURED: Once = Once::new();
                log::once(&UNMEASURED, Level::Info, || {
                    "this process is not told apart in NVML's process list: \
                     its contexts' own memory is not charged"
                        .to_string()
                });
            }
        }
    });
}

/// A context create in any ABI: `call` makes it into `pctx` on `dev`; its
/// own memory is measured and charged.
fn context_create(pctx: *mut Handle, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let before = before_context(dev);
    let rc = call();
    if rc == SUCCESS && !pctx.is_null() {
        // SAFETY: pctx is non-null; written on success.
        context_made(dev, unsafe { pctx.read_unaligned() }, before);
    }
    rc
}

intercept! {
    /// `cuCtxCreate_v2`: creates a context; its own memory is measured and
    /// charged.
    CtxCreateV2 => fn cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        context_create(pctx, dev, || unsafe { real(pctx, flags, dev) })
    }
}

intercept! {
    /// `cuCtxCreate_v3`: as `cuCtxCreate_v2`, with execution-affinity
    /// parameters.
    CtxCreateV3 => fn cuCtxCreate_v3(
        pctx: *mut Handle,
        params: *mut c_void,
        count: c_int,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        context_create(pctx, dev, || unsafe { real(pctx, params, count, flags, dev) })
    }
}

intercept! {
    /// `cuCtxCreate_v4`: as `cuCtxCreate_v2`, with creation parameters.
    CtxCreateV4 => fn cuCtxCreate_v4(
        pctx: *mut Handle,
        params: *mut c_void,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        context_create(pctx, dev, || unsafe { real(pctx, params, flags, dev) })
    }
}

intercept! {
    /// `cuCtxDestroy_v2`: everything the context held is given back.
    CtxDestroyV2 => fn cuCtxDestroy_v2(ctx: Handle) -> CUresult;
    |real| {
        // SAFETY: the caller's argument, unchanged.
        let rc = unsafe { real(ctx) };
        if rc == SUCCESS {
            let _ = contained("cuCtxDestroy_v2", || {
                contexts::context_gone(rt(), ctx as usize as u64, false);
            });
        }
        rc
    }
}

intercept! {
    /// `cuDevicePrimaryCtxRetain`: remembers the device's primary context;
    /// a new one has its own memory measured.
    DevicePrimaryCtxRetain => fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice)
        -> CUresult;
    |real| {
        // A primary context already measured needs no NVML snapshot.
        let known = primary_of(dev);
        let before = if known != 0 && contexts::measured(known) {
            None
        } else {
            before_context(dev)
        };
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(pctx, dev) };
        if rc == SUCCESS && !pctx.is_null() {
            // SAFETY: pctx is non-null; written on success.
            let ctx = unsafe { pctx.read_unaligned() };
            if let Some(entry) = usize::try_from(dev).ok().and_then(|d| PRIMARY.get(d)) {
                entry.store(ctx as usize as u64, Ordering::Relaxed);
            }
            context_made(dev, ctx, before);
        }
        rc
    }
}

/// Whether the driver says `dev`'s primary context is active; `None` when
/// it cannot tell.
fn primary_active(dev: CUdevice) -> Option<bool> {
    let f = PRIMARY_GET_STATE.get()?;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: both are valid out-pointers.
    (unsafe { f(dev, &mut flags, &mut active) } == SUCCESS).then_some(active != 0)
}

fn primary_of(dev: CUdevice) -> u64 {
    usize::try_from(dev)
        .ok()
        .and_then(|d| PRIMARY.get(d))
        .map_or(0, |e| e.load(Ordering::Relaxed))
}

/// A release of `dev`'s primary context (either ABI) made by `call`: when
/// the driver says it is gone (the last reference), everything it held is
/// given back.
fn primary_release(hook: Hook, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let rc = call();
    if rc == SUCCESS {
        let _ = contained(hook.symbol(), || {
            if primary_active(dev) == Some(false) {
                contexts::context_gone(rt(), primary_of(dev), false);
            }
        });
    }
    rc
}

intercept! {
    /// `cuDevicePrimaryCtxRelease`: see `primary_release`.
    DevicePrimaryCtxRelease => fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult;
    /// `cuDevicePrimaryCtxRelease_v2`: see `primary_release`.
    DevicePrimaryCtxReleaseV2 => fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's argument, unchanged.
        primary_release(hook, dev, || unsafe { real(dev) })
    }
}

/// A reset of `dev`'s primary context (`cudaDeviceReset`, either ABI) made
/// by `call`: every allocation it held and every stream-ordered allocation
/// of the device is given back; its own memory too if the driver says it
/// is gone.
fn primary_reset(hook: Hook, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let rc = call();
    if rc == SUCCESS {
        let _ = contained(hook.symbol(), || {
            let rt = rt();
            if !rt.enforcing() {
                return;
            }
            let alive = primary_active(dev) != Some(false);
            contexts::context_gone(rt, primary_of(dev), alive);
            if let Some(device) = rt.device(dev) {
                pools::global().device_reset(rt, &CudaPools, device.slot);
            }
        });
    }
    rc
}

intercept! {
    /// `cuDevicePrimaryCtxReset`: see `primary_reset`.
    DevicePrimaryCtxReset => fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult;
    /// `cuDevicePrimaryCtxReset_v2`: see `primary_reset`.
    DevicePrimaryCtxResetV2 => fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's argument, unchanged.
        primary_reset(hook, dev, || unsafe { real(dev) })
    }
}

intercept! {
    /// `cuCtxSetLimit`: the malloc heap is device memory of the current
    /// context, charged before the driver takes it.
    CtxSetLimit => fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(limit, value) };
        if limit != CU_LIMIT_MALLOC_HEAP_SIZE {
            return call();
        }
        protect(
            cuCtxSetLimit::HOOK,
            |driver| {
                let rt = rt();
                let ctx = current_context();
                let device = current_device()
                    .and_then(|o| rt.device(o))
                    .filter(|_| rt.enforcing());
                match (device, ctx) {
                    (Some(device), ctx) if ctx != 0 => match device.memory_limit {
                        Some(limit) => {
                            contexts::set_heap(rt, device, limit, ctx, value as u64, || {
                                driver.call(call)
                            })
                        }
                        None => driver.call(call),
                    },
                    _ => driver.call(call),
                }
            },
            call,
        )
    }
}
