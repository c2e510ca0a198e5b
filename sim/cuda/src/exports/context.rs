//! Contexts, streams and modules.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::{self, Driver, Res};
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::out;
use crate::publish;
use crate::registry::Registry;

use super::{entry, with_driver, with_handle};

fn device_index(dev: CuDevice) -> Res<u32> {
    driver::get()?.device(dev)?;
    u32::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)
}

/// The calling thread's live current context.
fn live_current() -> Res<Handle> {
    let driver = driver::get()?;
    driver.registry().live_context(driver::current_context())
}

/// Makes something in the calling thread's live current context and writes
/// it through `created`: `INVALID_VALUE` (and nothing made) when `created`
/// is null, else what `make` returns, given the driver, its registry (held
/// while `make` runs) and the context.
///
/// # Safety
/// `created` is null or valid for one write.
pub(super) unsafe fn make_in_current<T>(
    created: *mut T,
    make: impl FnOnce(&Driver, &mut Registry, Handle) -> Res<T>,
) -> Res<()> {
    if created.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let driver = driver::get()?;
    let value = {
        let mut registry = driver.registry();
        let ctx = registry.live_context(driver::current_context())?;
        make(driver, &mut registry, ctx)?
    };
    // SAFETY: the caller's contract (non-null).
    unsafe { out::write(created, value) }
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
    new_context(pctx, dev, |driver, device| {
        driver.registry().retain_primary(driver, device)
    })
}

/// Changes the contexts of device `dev` with `change` (given the driver and
/// the device's index), then publishes the node's new state.
fn change_contexts<T>(
    dev: CuDevice,
    change: impl FnOnce(&'static Driver, u32) -> Res<T>,
) -> Res<T> {
    let device = device_index(dev)?;
    let changed = change(driver::get()?, device)?;
    publish::publish_now();
    Ok(changed)
}

/// A context on device `dev` from `make`, written through `pctx`:
/// `INVALID_VALUE` (and nothing made) when `pctx` is null.
fn new_context(
    pctx: *mut CuContext,
    dev: CuDevice,
    make: impl FnOnce(&'static Driver, u32) -> Res<Handle>,
) -> CuResult {
    entry(|| {
        let ctx = change_contexts(dev, |driver, device| {
            if pctx.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            make(driver, device)
        })?;
        // SAFETY: cuda.h contract: `pctx` is valid for one write (non-null).
        unsafe { out::write(pctx, ctx.ptr()) }
    })
}

fn release_primary(dev: CuDevice) -> CuResult {
    entry(|| {
        change_contexts(dev, |driver, device| {
            driver.registry().release_primary(driver, device)
        })
    })
}

fn reset_primary(dev: CuDevice) -> CuResult {
    entry(|| {
        change_contexts(dev, |driver, device| {
            driver.device_at(device)?.timeline.wait_idle();
            driver.registry().reset_primary(driver, device)
        })
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
    with_driver(|driver| {
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
    with_driver(|driver| {
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

/// Writes what `answer` makes of `h_stream`'s context through `result`:
/// `INVALID_VALUE` when `result` is null (checked after the stream).
fn answer_for_stream<T>(
    h_stream: CuStream,
    result: *mut T,
    answer: impl FnOnce(Handle) -> Res<T>,
) -> CuResult {
    entry(|| {
        let ctx = stream_context(h_stream)?;
        if result.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let value = answer(ctx)?;
        // SAFETY: cuda.h contract: the answer's pointer is valid for one write (non-null).
        unsafe { out::write(result, value) }
    })
}

/// `cuStreamGetCtx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(h_stream: CuStream, pctx: *mut CuContext) -> CuResult {
    answer_for_stream(h_stream, pctx, |ctx| Ok(ctx.ptr()))
}

/// `cuStreamGetDevice` (CUDA 12.8).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevice(h_stream: CuStream, device: *mut CuDevice) -> CuResult {
    answer_for_stream(h_stream, device, |ctx| {
        CuDevice::try_from(ctx.device).map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
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
    new_context(pctx, dev, |driver, device| {
        let ctx = driver.registry().create_context(driver, device)?;
        driver::push_current(ctx);
        Ok(ctx)
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
    with_handle(
        ctx,
        Kind::Context,
        CUDA_ERROR_INVALID_CONTEXT,
        |driver, ctx| {
            driver.registry().destroy_context(driver, ctx)?;
            driver::forget_context(ctx);
            publish::publish_now();
            Ok(())
        },
    )
}

/// `cuCtxSetCurrent`: replaces the top of the calling thread's stack; NULL pops it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CuContext) -> CuResult {
    with_driver(|driver| {
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
    with_driver(|driver| {
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
    let create = |_: &Driver, registry: &mut Registry, ctx| Ok(registry.create_stream(ctx).ptr());
    // SAFETY: cuda.h contract: `phStream` is null or valid for one write.
    entry(|| unsafe { make_in_current(ph_stream, create) })
}

/// `cuStreamDestroy_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(h_stream: CuStream) -> CuResult {
    with_handle(
        h_stream,
        Kind::Stream,
        CUDA_ERROR_INVALID_HANDLE,
        |driver, stream| driver.registry().destroy_stream(stream),
    )
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
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let load = |_: &Driver, registry: &mut Registry, ctx| Ok(registry.load_module(ctx).ptr());
        // SAFETY: cuda.h contract: `module` is null or valid for one write.
        unsafe { make_in_current(module, load) }
    })
}

/// `cuModuleUnload`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(hmod: CuModule) -> CuResult {
    with_handle(
        hmod,
        Kind::Module,
        CUDA_ERROR_INVALID_HANDLE,
        |driver, module| driver.registry().unload_module(module),
    )
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
