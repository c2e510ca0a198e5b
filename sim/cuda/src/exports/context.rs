//! Contexts, streams and modules.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::{self, Res};
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::out;
use crate::publish;

use super::entry;

fn device_index(dev: CuDevice) -> Res<u32> {
    driver::get()?.device(dev)?;
    u32::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)
}

/// The calling thread's live current context.
fn live_current() -> Res<Handle> {
    let driver = driver::get()?;
    driver.registry().live_context(driver::current_context())
}

/// `cuDevicePrimaryCtxGetState`: flags 0; active while retained.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CuDevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    entry(|| {
        let device = device_index(dev)?;
        if flags.is_null() || active.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        let live = driver
            .registry()
            .context_live(Handle::new(Kind::Context, device, 0));
        // SAFETY: cuda.h contract: both are valid for one write (non-null).
        unsafe {
            out::write(flags, 0)?;
            out::write(active, c_int::from(live))
        }
    })
}

/// `cuDevicePrimaryCtxRetain`: the device's primary context, one more
/// reference; does not make it current.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CuContext, dev: CuDevice) -> CuResult {
    entry(|| {
        let device = device_index(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        let ctx = driver.registry().retain_primary(driver, device)?;
        publish::publish_now();
        // SAFETY: cuda.h contract: `pctx` is valid for one write (non-null).
        unsafe { out::write(pctx, ctx.ptr()) }
    })
}

fn release_primary(dev: CuDevice) -> CuResult {
    entry(|| {
        let device = device_index(dev)?;
        let driver = driver::get()?;
        driver.registry().release_primary(driver, device)?;
        publish::publish_now();
        Ok(())
    })
}

fn reset_primary(dev: CuDevice) -> CuResult {
    entry(|| {
        let device = device_index(dev)?;
        let driver = driver::get()?;
        driver.device_at(device)?.timeline.wait_idle();
        driver.registry().reset_primary(driver, device)?;
        publish::publish_now();
        Ok(())
    })
}

/// `cuDevicePrimaryCtxReset_v2` (what `cudaDeviceReset` does): frees all the
/// primary context's memory and the device's stream-ordered memory.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CuDevice) -> CuResult {
    reset_primary(dev)
}

/// `cuDevicePrimaryCtxReset` (CUDA 7.0 name): as `_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CuDevice) -> CuResult {
    reset_primary(dev)
}

/// `cuCtxSetLimit`: `CU_LIMIT_MALLOC_HEAP_SIZE` takes that much device
/// memory for the current context at once; stack and printf sizes are
/// accepted and not modelled.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CuResult {
    entry(|| {
        let driver = driver::get()?;
        let mut registry = driver.registry();
        let ctx = registry.live_context(driver::current_context())?;
        match limit {
            LIMIT_MALLOC_HEAP_SIZE => registry.set_heap(driver, ctx, value as u64),
            LIMIT_STACK_SIZE | LIMIT_PRINTF_FIFO_SIZE => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// `cuCtxGetLimit`: the malloc heap as set (0 until set); 1024 for the
/// stack, 1 MiB for printf.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(pvalue: *mut usize, limit: c_int) -> CuResult {
    entry(|| {
        let driver = driver::get()?;
        let registry = driver.registry();
        let ctx = registry.live_context(driver::current_context())?;
        let value = match limit {
            LIMIT_MALLOC_HEAP_SIZE => registry.heap(ctx),
            LIMIT_STACK_SIZE => 1024,
            LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: cuda.h contract: `pvalue` is null or valid for one write.
        unsafe { out::write(pvalue, value as usize) }
    })
}

/// The context work on `stream` belongs to: the stream's own, or for the
/// default streams the calling thread's current one.
fn stream_context(stream: CuStream) -> Res<Handle> {
    let driver = driver::get()?;
    let registry = driver.registry();
    match stream.addr() {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => registry.live_context(driver::current_context()),
        _ => {
            let h = Handle::of(stream, Kind::Stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            registry.stream_context(h)
        }
    }
}

/// `cuStreamGetCtx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(h_stream: CuStream, pctx: *mut CuContext) -> CuResult {
    entry(|| {
        let ctx = stream_context(h_stream)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: cuda.h contract: `pctx` is valid for one write (non-null).
        unsafe { out::write(pctx, ctx.ptr()) }
    })
}

/// `cuStreamGetDevice` (CUDA 12.8).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevice(h_stream: CuStream, device: *mut CuDevice) -> CuResult {
    entry(|| {
        let ctx = stream_context(h_stream)?;
        if device.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = CuDevice::try_from(ctx.device).map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        // SAFETY: cuda.h contract: `device` is valid for one write (non-null).
        unsafe { out::write(device, dev) }
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release frees the primary
/// context's memory, streams and modules.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CuDevice) -> CuResult {
    release_primary(dev)
}

/// `cuDevicePrimaryCtxRelease` (CUDA 7.0 name): as `_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CuDevice) -> CuResult {
    release_primary(dev)
}

/// Creates a context on `dev` and pushes it on the calling thread's stack.
fn create(pctx: *mut CuContext, dev: CuDevice) -> CuResult {
    entry(|| {
        let device = device_index(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        let ctx = driver.registry().create_context(driver, device)?;
        publish::publish_now();
        driver::push_current(ctx);
        // SAFETY: cuda.h contract: `pctx` is valid for one write (non-null).
        unsafe { out::write(pctx, ctx.ptr()) }
    })
}

/// `cuCtxCreate_v2`: a new context, made current (pushed). Flags are accepted and ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CuContext,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    create(pctx, dev)
}

/// `cuCtxCreate_v3` (CUDA 11.4, execution-affinity parameters, ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CuContext,
    _params_array: *mut c_void,
    num_params: c_int,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    if num_params < 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    create(pctx, dev)
}

/// `cuCtxCreate_v4` (CUDA 12.5, `CUctxCreateParams*`, ignored; may be NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CuContext,
    _ctx_create_params: *mut c_void,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    create(pctx, dev)
}

/// `cuCtxDestroy_v2`: frees what the context owns and removes it from the
/// calling thread's stack; `INVALID_CONTEXT` for a primary context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CuContext) -> CuResult {
    entry(|| {
        let ctx = Handle::of(ctx, Kind::Context).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let driver = driver::get()?;
        driver.registry().destroy_context(driver, ctx)?;
        driver::forget_context(ctx);
        publish::publish_now();
        Ok(())
    })
}

/// `cuCtxSetCurrent`: replaces the top of the calling thread's stack; NULL pops it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CuContext) -> CuResult {
    entry(|| {
        let driver = driver::get()?;
        if ctx.is_null() {
            driver::set_current(None);
            return Ok(());
        }
        let h = driver
            .registry()
            .live_context(Handle::of(ctx, Kind::Context))?;
        driver::set_current(Some(h));
        Ok(())
    })
}

/// `cuCtxGetCurrent`: NULL when the thread has none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CuContext) -> CuResult {
    entry(|| {
        driver::get()?;
        let ctx = driver::current_context().map_or(std::ptr::null_mut(), |h| h.ptr());
        // SAFETY: cuda.h contract: `pctx` is null or valid for one write.
        unsafe { out::write(pctx, ctx) }
    })
}

/// `cuCtxGetDevice`: the current context's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CuDevice) -> CuResult {
    entry(|| {
        let ctx = live_current()?;
        let dev = CuDevice::try_from(ctx.device).map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        // SAFETY: cuda.h contract: `device` is null or valid for one write.
        unsafe { out::write(device, dev) }
    })
}

/// `cuCtxPushCurrent_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CuContext) -> CuResult {
    entry(|| {
        let driver = driver::get()?;
        let h = driver
            .registry()
            .live_context(Handle::of(ctx, Kind::Context))?;
        driver::push_current(h);
        Ok(())
    })
}

/// `cuCtxPopCurrent_v2`: `INVALID_CONTEXT` when the stack is empty; `pctx` may be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CuContext) -> CuResult {
    entry(|| {
        driver::get()?;
        let popped = driver::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: cuda.h contract: a non-null `pctx` is valid for one write.
            unsafe { out::write(pctx, popped.ptr())? };
        }
        Ok(())
    })
}

/// Waits for `device`'s timeline, lets its pools give back what they hold
/// beyond their release threshold, then publishes a utilization sample.
fn synchronize(device: u32) -> Res<()> {
    let driver = driver::get()?;
    driver.device_at(device)?.timeline.wait_idle();
    driver.registry().sync_pools(driver, device);
    publish::publish_now();
    Ok(())
}

/// `cuCtxSynchronize`: waits until the current context's device is idle.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    entry(|| synchronize(live_current()?.device))
}

/// `cuStreamCreate` in the current context. Flags are accepted and ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph_stream: *mut CuStream, _flags: c_uint) -> CuResult {
    entry(|| {
        if ph_stream.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        let stream = {
            let mut registry = driver.registry();
            let ctx = registry.live_context(driver::current_context())?;
            registry.create_stream(ctx)
        };
        // SAFETY: cuda.h contract: `phStream` is valid for one write (non-null).
        unsafe { out::write(ph_stream, stream.ptr()) }
    })
}

/// `cuStreamDestroy_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(h_stream: CuStream) -> CuResult {
    entry(|| {
        let stream = Handle::of(h_stream, Kind::Stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        driver::get()?.registry().destroy_stream(stream)
    })
}

/// `cuStreamSynchronize`: waits until the stream's device is idle (one
/// timeline per device: streams of a device are not told apart).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(h_stream: CuStream) -> CuResult {
    entry(|| {
        driver::get()?;
        synchronize(driver::stream_device(h_stream)?)
    })
}

/// `cuModuleLoadData`: any non-NULL image loads (nothing is read from it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CuModule, image: *const c_void) -> CuResult {
    entry(|| {
        if module.is_null() || image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        let h = {
            let mut registry = driver.registry();
            let ctx = registry.live_context(driver::current_context())?;
            registry.load_module(ctx)
        };
        // SAFETY: cuda.h contract: `module` is valid for one write (non-null).
        unsafe { out::write(module, h.ptr()) }
    })
}

/// `cuModuleUnload`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(hmod: CuModule) -> CuResult {
    entry(|| {
        let module = Handle::of(hmod, Kind::Module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        driver::get()?.registry().unload_module(module)
    })
}

/// `cuModuleGetFunction`: any name gives a function handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CuFunction,
    hmod: CuModule,
    name: *const c_char,
) -> CuResult {
    entry(|| {
        let module = Handle::of(hmod, Kind::Module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: cuda.h contract: `name` is null or a NUL-terminated string.
        unsafe { out::read_str(name) }?;
        if hfunc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let f = driver::get()?.registry().function(module)?;
        // SAFETY: cuda.h contract: `hfunc` is valid for one write (non-null).
        unsafe { out::write(hfunc, f.ptr()) }
    })
}
