//! Stream-ordered allocations: a pool is charged for what it holds, not
//! what is allocated from it (the ledgers are `crate::pools`'s). This file
//! finds the device a stream or pool belongs to, reads and writes the
//! caller's pointers, and calls the real functions.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

use super::driver::{DEVICE_COUNT, current_device, rt, target_device};
use super::free::{cuMemFree_v2, tracked_free};
use super::guard::{contained, enforced};
use super::resolve::Internal;
use super::types::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_STREAM_LEGACY,
    CU_STREAM_PER_THREAD, CUdevice, CUdeviceptr, CUresult, CuMemPoolProps, Handle,
};
use crate::backend::Space;
use crate::log::{self, Level, Once};
use crate::memory::{OUT_OF_MEMORY, SUCCESS};
use crate::names::Hook;
use crate::pools::{self, PoolDriver};

type FnMemPoolGetAttribute = unsafe extern "C" fn(Handle, c_int, *mut c_void) -> CUresult;
type FnDeviceGetMemPool = unsafe extern "C" fn(*mut Handle, CUdevice) -> CUresult;
type FnStreamGetDevice = unsafe extern "C" fn(Handle, *mut CUdevice) -> CUresult;
type FnStreamGetCtx = unsafe extern "C" fn(Handle, *mut Handle) -> CUresult;
type FnCtxPush = unsafe extern "C" fn(Handle) -> CUresult;
type FnCtxPop = unsafe extern "C" fn(*mut Handle) -> CUresult;

static MEM_POOL_GET_ATTRIBUTE: Internal<FnMemPoolGetAttribute> =
    Internal::cuda(c"cuMemPoolGetAttribute");
static DEVICE_GET_MEM_POOL: Internal<FnDeviceGetMemPool> = Internal::cuda(c"cuDeviceGetMemPool");
static DEVICE_GET_DEFAULT_MEM_POOL: Internal<FnDeviceGetMemPool> =
    Internal::cuda(c"cuDeviceGetDefaultMemPool");
static STREAM_GET_DEVICE: Internal<FnStreamGetDevice> = Internal::cuda(c"cuStreamGetDevice");
static STREAM_GET_CTX: Internal<FnStreamGetCtx> = Internal::cuda(c"cuStreamGetCtx");
static CTX_PUSH: Internal<FnCtxPush> = Internal::cuda(c"cuCtxPushCurrent_v2");
static CTX_POP: Internal<FnCtxPop> = Internal::cuda(c"cuCtxPopCurrent_v2");

/// The device work on `stream` runs on: with one visible device, device 0;
/// for the default streams, the current context's; otherwise the stream's
/// own (`cuStreamGetDevice`, or its context's device). `None` when the
/// driver cannot tell.
fn stream_device(stream: Handle) -> Option<i32> {
    if DEVICE_COUNT.load(Ordering::Relaxed) == 1 {
        return Some(0);
    }
    if matches!(stream as usize, 0 | CU_STREAM_LEGACY | CU_STREAM_PER_THREAD) {
        return target_device();
    }
    if let Some(f) = STREAM_GET_DEVICE.get() {
        let mut device: CUdevice = -1;
        // SAFETY: the caller's stream; device is a valid out-pointer.
        if unsafe { f(stream, &mut device) } == SUCCESS {
            return Some(device);
        }
    }
    let get_ctx = STREAM_GET_CTX.get()?;
    let push = CTX_PUSH.get()?;
    let pop = CTX_POP.get()?;
    let mut ctx: Handle = null_mut();
    // SAFETY: the caller's stream; ctx is a valid out-pointer.
    if unsafe { get_ctx(stream, &mut ctx) } != SUCCESS || ctx.is_null() {
        return None;
    }
    // SAFETY: pushes the stream's live context, asks its device, pops it
    // again: the thread's context stack is as it was.
    unsafe {
        if push(ctx) != SUCCESS {
            return None;
        }
        let device = current_device();
        let mut popped: Handle = null_mut();
        let _ = pop(&mut popped);
        device
    }
}

/// The pool `cuMemAllocAsync` uses on `ordinal` (`cuDeviceGetMemPool`).
fn current_pool(ordinal: i32) -> Option<u64> {
    let f = DEVICE_GET_MEM_POOL.get()?;
    let mut pool: Handle = null_mut();
    // SAFETY: pool is a valid out-pointer.
    (unsafe { f(&mut pool, ordinal) } == SUCCESS && !pool.is_null()).then(|| {
        let pool = pool as usize as u64;
        pools::global().learn_device(pool, ordinal);
        pool
    })
}

/// The device of `pool`: as learned, else by matching every device's
/// default pool.
fn pool_device(pool: u64) -> Option<i32> {
    if let Some(ordinal) = pools::global().device_of(pool) {
        return Some(ordinal);
    }
    let f = DEVICE_GET_DEFAULT_MEM_POOL.get()?;
    let count = DEVICE_COUNT.load(Ordering::Relaxed).max(1);
    (0..count).find(|&d| {
        let mut p: Handle = null_mut();
        // SAFETY: p is a valid out-pointer.
        let found = unsafe { f(&mut p, d) } == SUCCESS && p as usize as u64 == pool;
        if found {
            pools::global().learn_device(pool, d);
        }
        found
    })
}

/// The real driver, as the pool ledgers need it.
pub(super) struct CudaPools;

impl PoolDriver for CudaPools {
    fn reserved(&self, pool: u64) -> Option<u64> {
        let f = MEM_POOL_GET_ATTRIBUTE.get()?;
        let mut bytes: u64 = 0;
        // SAFETY: RESERVED_MEM_CURRENT is a cuuint64_t written to `bytes`.
        let rc = unsafe {
            f(
                pool as usize as Handle,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&raw mut bytes).cast(),
            )
        };
        (rc == SUCCESS).then_some(bytes)
    }

    fn undo(&self, ptr: u64, pool: u64, keep: u64) {
        if let Some(free) = cuMemFree_v2::real() {
            // SAFETY: ptr was just allocated from the pool and not handed out.
            let _ = unsafe { free(ptr) };
        }
        if let Some(trim) = cuMemPoolTrimTo::real() {
            // SAFETY: trims the live pool the allocation came from.
            let _ = unsafe { trim(pool as usize as Handle, keep as usize) };
        }
    }
}

/// Refuses a stream-ordered allocation whose device cannot be told (one line).
fn unknown_device(what: &str) -> CUresult {
    static UNKNOWN: Once = Once::new();
    log::once(&UNKNOWN, Level::Warn, || {
        format!("{what}: the device of the stream or pool cannot be told; refused")
    });
    OUT_OF_MEMORY
}

/// A stream-ordered allocation from the pool `place` finds, on its
/// device; `call` makes it.
fn pooled_alloc(
    hook: Hook,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    place: impl FnOnce() -> Option<(i32, u64)>,
    call: impl Fn() -> CUresult,
) -> CUresult {
    if dptr.is_null() {
        return call();
    }
    enforced(hook, &call, |driver, rt| {
        let Some((ordinal, pool)) = place() else {
            return unknown_device(hook.symbol());
        };
        let Some(device) = rt.device(ordinal) else {
            return driver.call(&call);
        };
        let Some(limit) = device.memory_limit else {
            return driver.call(&call);
        };
        let request = pools::Request {
            pool,
            device,
            limit,
            bytes: bytes as u64,
        };
        pools::global().allocate(rt, &CudaPools, &request, || {
            match driver.call(&call) {
                // SAFETY: dptr is non-null (checked first); written on success.
                SUCCESS => Ok(unsafe { dptr.read_unaligned() }),
                rc => Err(rc),
            }
        })
    })
}

/// `cuMemAllocAsync` in either default-stream variant: from the current
/// pool of the stream's device; what the pool holds is charged to that
/// device.
fn alloc_async(
    hook: Hook,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: Handle,
    call: impl Fn() -> CUresult,
) -> CUresult {
    let place = || {
        let ordinal = stream_device(stream)?;
        Some((ordinal, current_pool(ordinal)?))
    };
    pooled_alloc(hook, dptr, bytes, place, call)
}

intercept! {
    /// `cuMemAllocAsync`: stream-ordered allocation from the current pool
    /// of the stream's device.
    MemAllocAsync => fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: Handle)
        -> CUresult;
    /// `cuMemAllocAsync_ptsz`: as `cuMemAllocAsync`, per-thread default stream.
    MemAllocAsyncPtsz => fn cuMemAllocAsync_ptsz(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        stream: Handle,
    ) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(dptr, bytesize, stream) };
        alloc_async(hook, dptr, bytesize, stream, call)
    }
}

/// `cuMemAllocFromPoolAsync` in either default-stream variant: what
/// `pool` holds is charged to the pool's device.
fn alloc_from_pool(
    hook: Hook,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Handle,
    call: impl Fn() -> CUresult,
) -> CUresult {
    let key = pool as usize as u64;
    pooled_alloc(hook, dptr, bytes, || Some((pool_device(key)?, key)), call)
}

intercept! {
    /// `cuMemAllocFromPoolAsync`: stream-ordered allocation from `pool`.
    MemAllocFromPoolAsync => fn cuMemAllocFromPoolAsync(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        pool: Handle,
        stream: Handle,
    ) -> CUresult;
    /// `cuMemAllocFromPoolAsync_ptsz`: as `cuMemAllocFromPoolAsync`,
    /// per-thread default stream.
    MemAllocFromPoolAsyncPtsz => fn cuMemAllocFromPoolAsync_ptsz(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        pool: Handle,
        stream: Handle,
    ) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(dptr, bytesize, pool, stream) };
        alloc_from_pool(hook, dptr, bytesize, pool, call)
    }
}

intercept! {
    /// `cuMemFreeAsync`: the block goes back to its pool, whose ledger
    /// follows what the pool still holds.
    MemFreeAsync => fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult;
    /// `cuMemFreeAsync_ptsz`: as `cuMemFreeAsync`, per-thread default stream.
    MemFreeAsyncPtsz => fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) -> CUresult;
    |real, hook| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(dptr, stream) };
        tracked_free(hook, Space::Pointer, dptr, call)
    }
}

intercept! {
    /// `cuMemPoolCreate`: learns the pool's device.
    MemPoolCreate => fn cuMemPoolCreate(pool: *mut Handle, props: *const CuMemPoolProps)
        -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(pool, props) };
        if rc == SUCCESS && !pool.is_null() && !props.is_null() {
            let _ = contained("cuMemPoolCreate", || {
                // SAFETY: props is non-null and the caller's valid
                // CUmemPoolProps; pool was written on success.
                let (location, handle) = unsafe {
                    (
                        std::ptr::addr_of!((*props).location).read_unaligned(),
                        pool.read_unaligned(),
                    )
                };
                if location.kind == CU_MEM_LOCATION_TYPE_DEVICE {
                    pools::global().learn_device(handle as usize as u64, location.id);
                }
            });
        }
        rc
    }
}

/// After a pool was destroyed or trimmed: its ledger follows the driver.
fn pools_changed(what: &str) {
    let _ = contained(what, || {
        let rt = rt();
        if rt.enforcing() {
            pools::global().reconcile_all(rt, &CudaPools, None);
        }
    });
}

intercept! {
    /// `cuMemPoolDestroy`: what the pool held beyond its live blocks is
    /// given back.
    MemPoolDestroy => fn cuMemPoolDestroy(pool: Handle) -> CUresult;
    |real| {
        // SAFETY: the caller's argument, unchanged.
        let rc = unsafe { real(pool) };
        if rc == SUCCESS {
            pools_changed("cuMemPoolDestroy");
        }
        rc
    }
}

intercept! {
    /// `cuMemPoolTrimTo`: what the pool gave back is given back.
    MemPoolTrimTo => fn cuMemPoolTrimTo(pool: Handle, keep: usize) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(pool, keep) };
        if rc == SUCCESS {
            pools_changed("cuMemPoolTrimTo");
        }
        rc
    }
}
