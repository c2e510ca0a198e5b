//! The wrappers whose accounting follows an object's life rather than one
//! call: VMM handles and mappings (`crate::vmm`), stream-ordered pools
//! (`crate::pools`), and contexts (`crate::contexts`). The decisions are in
//! those modules; this one reads and writes the caller's pointers, finds
//! the device a stream or pool belongs to, and calls the real functions.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::contexts;
use crate::log::{self, Level, Once};
use crate::memory::{OUT_OF_MEMORY, SUCCESS};
use crate::pools::{self, PoolDriver};
use crate::runtime;
use crate::vmm;

type FnMemMap = unsafe extern "C" fn(CUdeviceptr, usize, usize, u64, u64) -> CUresult;
type FnMemRange = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
type FnMemRetainAllocationHandle = unsafe extern "C" fn(*mut u64, *mut c_void) -> CUresult;
type FnMemImport = unsafe extern "C" fn(*mut u64, *mut c_void, c_int) -> CUresult;
type FnMemExport = unsafe extern "C" fn(*mut c_void, u64, c_int, u64) -> CUresult;
type FnMemPoolCreate = unsafe extern "C" fn(*mut Handle, *const CuMemPoolProps) -> CUresult;
type FnMemPoolTrimTo = unsafe extern "C" fn(Handle, usize) -> CUresult;
type FnMemPoolGetAttribute = unsafe extern "C" fn(Handle, c_int, *mut c_void) -> CUresult;
type FnDeviceGetMemPool = unsafe extern "C" fn(*mut Handle, CUdevice) -> CUresult;
type FnStreamGetDevice = unsafe extern "C" fn(Handle, *mut CUdevice) -> CUresult;
type FnStreamGetCtx = unsafe extern "C" fn(Handle, *mut Handle) -> CUresult;
type FnCtxPush = unsafe extern "C" fn(Handle) -> CUresult;
type FnCtxPop = unsafe extern "C" fn(*mut Handle) -> CUresult;
type FnCtxCreateV2 = unsafe extern "C" fn(*mut Handle, c_uint, CUdevice) -> CUresult;
type FnCtxCreateV3 =
    unsafe extern "C" fn(*mut Handle, *mut c_void, c_int, c_uint, CUdevice) -> CUresult;
type FnCtxCreateV4 = unsafe extern "C" fn(*mut Handle, *mut c_void, c_uint, CUdevice) -> CUresult;
type FnPrimaryRetain = unsafe extern "C" fn(*mut Handle, CUdevice) -> CUresult;
type FnPrimaryOp = unsafe extern "C" fn(CUdevice) -> CUresult;
type FnPrimaryGetState = unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult;
type FnCtxSetLimit = unsafe extern "C" fn(c_int, usize) -> CUresult;
type FnNvmlComputeProcs =
    unsafe extern "C" fn(Handle, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;

/// `CUmemPoolProps` (88 bytes; only the location is read).
#[repr(C)]
pub struct CuMemPoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    location: CuMemLocation,
    rest: [u8; 72],
}

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;
const CU_LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
const CU_STREAM_LEGACY: usize = 1;
const CU_STREAM_PER_THREAD: usize = 2;

static MEM_POOL_GET_ATTRIBUTE: Internal = Internal::cuda(c"cuMemPoolGetAttribute");
static DEVICE_GET_MEM_POOL: Internal = Internal::cuda(c"cuDeviceGetMemPool");
static DEVICE_GET_DEFAULT_MEM_POOL: Internal = Internal::cuda(c"cuDeviceGetDefaultMemPool");
static STREAM_GET_DEVICE: Internal = Internal::cuda(c"cuStreamGetDevice");
static STREAM_GET_CTX: Internal = Internal::cuda(c"cuStreamGetCtx");
static CTX_PUSH: Internal = Internal::cuda(c"cuCtxPushCurrent_v2");
static CTX_POP: Internal = Internal::cuda(c"cuCtxPopCurrent_v2");
static PRIMARY_GET_STATE: Internal = Internal::cuda(c"cuDevicePrimaryCtxGetState");
static NVML_COMPUTE_PROCS: OwnNvml = OwnNvml::new(c"nvmlDeviceGetComputeRunningProcesses_v3");
static NVML_HANDLE_BY_UUID: OwnNvml = OwnNvml::new(c"nvmlDeviceGetHandleByUUID");
static NVML_INIT: OwnNvml = OwnNvml::new(c"nvmlInit_v2");

/// An NVML function from the library's own handle on `libnvidia-ml.so.1`
/// (loaded if the program has not: measuring a context needs NVML whether
/// or not the program uses it), initialised once.
struct OwnNvml {
    name: &'static std::ffi::CStr,
    ptr: std::sync::atomic::AtomicPtr<c_void>,
}

impl OwnNvml {
    const fn new(name: &'static std::ffi::CStr) -> OwnNvml {
        OwnNvml {
            name,
            ptr: std::sync::atomic::AtomicPtr::new(null_mut()),
        }
    }

    fn get(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let lib = library(&NVML_OWN, c"libnvidia-ml.so.1", true);
        if lib.is_null() {
            return null_mut();
        }
        let p = lookup_real(lib, self.name);
        self.ptr.store(p, Ordering::Release);
        p
    }
}

/// Casts an `Internal`'s pointer to its signature, or `None` when absent.
macro_rules! internal {
    ($sym:ident as $ty:ty) => {{
        let p = $sym.get();
        if p.is_null() {
            None
        } else {
            // SAFETY: p is the driver (or NVML) function of that name, whose
            // C signature is this type.
            Some(unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
        }
    }};
}

/// Primary contexts as the library saw them retained, per CUDA ordinal.
static PRIMARY: [AtomicU64; runtime::MAX_DEVICES] =
    [const { AtomicU64::new(0) }; runtime::MAX_DEVICES];

// ---------------------------------------------------------------------------
// Streams and pools

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
    if let Some(f) = internal!(STREAM_GET_DEVICE as FnStreamGetDevice) {
        let mut device: CUdevice = -1;
        // SAFETY: the caller's stream; device is a valid out-pointer.
        if unsafe { f(stream, &mut device) } == SUCCESS {
            return Some(device);
        }
    }
    let get_ctx = internal!(STREAM_GET_CTX as FnStreamGetCtx)?;
    let push = internal!(CTX_PUSH as FnCtxPush)?;
    let pop = internal!(CTX_POP as FnCtxPop)?;
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
    let f = internal!(DEVICE_GET_MEM_POOL as FnDeviceGetMemPool)?;
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
    let f = internal!(DEVICE_GET_DEFAULT_MEM_POOL as FnDeviceGetMemPool)?;
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
        let f = internal!(MEM_POOL_GET_ATTRIBUTE as FnMemPoolGetAttribute)?;
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
        if let Some(free) = real!(MemFreeV2 as FnMemFreeV2) {
            // SAFETY: ptr was just allocated from the pool and not handed out.
            let _ = unsafe { free(ptr) };
        }
        if let Some(trim) = real!(MemPoolTrimTo as FnMemPoolTrimTo) {
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

/// A stream-ordered allocation from `pool` on `ordinal`; `call` makes it.
fn pooled_alloc(
    hook: Hook,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    place: impl FnOnce() -> Option<(i32, u64)>,
    call: impl Fn() -> CUresult,
) -> CUresult {
    protect(
        hook,
        |driver| {
            let rt = runtime::global();
            if !rt.enforcing() {
                return driver.call(&call);
            }
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
                    // SAFETY: dptr is non-null (checked by the caller); written on success.
                    SUCCESS => Ok(unsafe { dptr.read_unaligned() }),
                    rc => Err(rc),
                }
            })
        },
        &call,
    )
}

macro_rules! alloc_async {
    ($name:ident, $hook:ident) => {
        /// Stream-ordered allocation from the current pool of the stream's
        /// device: what the pool holds is charged to that device.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            stream: Handle,
        ) -> CUresult {
            let Some(real) = real!($hook as FnMemAllocAsync) else {
                return missing(Hook::$hook);
            };
            // SAFETY: the caller's arguments, unchanged.
            let call = || unsafe { real(dptr, bytesize, stream) };
            if dptr.is_null() {
                return call();
            }
            pooled_alloc(
                Hook::$hook,
                dptr,
                bytesize,
                || {
                    let ordinal = stream_device(stream)?;
                    Some((ordinal, current_pool(ordinal)?))
                },
                call,
            )
        }
    };
}

alloc_async!(cuMemAllocAsync, MemAllocAsync);
alloc_async!(cuMemAllocAsync_ptsz, MemAllocAsyncPtsz);

macro_rules! alloc_from_pool {
    ($name:ident, $hook:ident) => {
        /// Stream-ordered allocation from `pool`: what the pool holds is
        /// charged to the pool's device.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: Handle,
            stream: Handle,
        ) -> CUresult {
            let Some(real) = real!($hook as FnMemAllocFromPoolAsync) else {
                return missing(Hook::$hook);
            };
            // SAFETY: the caller's arguments, unchanged.
            let call = || unsafe { real(dptr, bytesize, pool, stream) };
            if dptr.is_null() {
                return call();
            }
            let key = pool as usize as u64;
            pooled_alloc(
                Hook::$hook,
                dptr,
                bytesize,
                || Some((pool_device(key)?, key)),
                call,
            )
        }
    };
}

alloc_from_pool!(cuMemAllocFromPoolAsync, MemAllocFromPoolAsync);
alloc_from_pool!(cuMemAllocFromPoolAsync_ptsz, MemAllocFromPoolAsyncPtsz);

macro_rules! free_async {
    ($name:ident, $hook:ident) => {
        /// Stream-ordered free: the block goes back to its pool, whose
        /// ledger follows what the pool still holds.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: CUdeviceptr, stream: Handle) -> CUresult {
            let Some(real) = real!($hook as FnMemFreeAsync) else {
                return missing(Hook::$hook);
            };
            // SAFETY: the caller's arguments, unchanged.
            tracked_free(Hook::$hook, Space::Pointer, dptr, || unsafe {
                real(dptr, stream)
            })
        }
    };
}

free_async!(cuMemFreeAsync, MemFreeAsync);
free_async!(cuMemFreeAsync_ptsz, MemFreeAsyncPtsz);

/// `cuMemPoolCreate`: learns the pool's device.
///
/// # Safety
/// As the driver's `cuMemPoolCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Handle,
    props: *const CuMemPoolProps,
) -> CUresult {
    let Some(real) = real!(MemPoolCreate as FnMemPoolCreate) else {
        return missing(Hook::MemPoolCreate);
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(pool, props) };
    if rc == SUCCESS && !pool.is_null() && !props.is_null() {
        let _ = contained("cuMemPoolCreate", || {
            // SAFETY: props is non-null and the caller's valid CUmemPoolProps;
            // pool was written on success.
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

/// After a pool was destroyed or trimmed: its ledger follows the driver.
fn pools_changed(what: &str) {
    let _ = contained(what, || {
        let rt = runtime::global();
        if rt.enforcing() {
            pools::global().reconcile_all(rt, &CudaPools, None);
        }
    });
}

/// `cuMemPoolDestroy`: what the pool held beyond its live blocks is given back.
///
/// # Safety
/// As the driver's `cuMemPoolDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    let Some(real) = real!(MemPoolDestroy as FnDestroy) else {
        return missing(Hook::MemPoolDestroy);
    };
    // SAFETY: the caller's argument, unchanged.
    let rc = unsafe { real(pool) };
    if rc == SUCCESS {
        pools_changed("cuMemPoolDestroy");
    }
    rc
}

/// `cuMemPoolTrimTo`: what the pool gave back is given back.
///
/// # Safety
/// As the driver's `cuMemPoolTrimTo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Handle, keep: usize) -> CUresult {
    let Some(real) = real!(MemPoolTrimTo as FnMemPoolTrimTo) else {
        return missing(Hook::MemPoolTrimTo);
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(pool, keep) };
    if rc == SUCCESS {
        pools_changed("cuMemPoolTrimTo");
    }
    rc
}

// ---------------------------------------------------------------------------
// VMM

/// `cuMemCreate`: charged to the device the location names (host locations
/// are not counted) before the driver call; the memory then lives as long
/// as a handle reference or a mapping does.
///
/// # Safety
/// As the driver's `cuMemCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const CuMemAllocationProp,
    flags: u64,
) -> CUresult {
    let Some(real) = real!(MemCreate as FnMemCreate) else {
        return missing(Hook::MemCreate);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(handle, size, prop, flags) };
    if handle.is_null() || prop.is_null() {
        return call();
    }
    // SAFETY: prop is non-null and points to the caller's CUmemAllocationProp.
    let location = unsafe { std::ptr::addr_of!((*prop).location).read_unaligned() };
    if location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return call();
    }
    protect(
        Hook::MemCreate,
        |driver| {
            let rt = runtime::global();
            let Some(device) = rt.device(location.id).filter(|_| rt.enforcing()) else {
                return driver.call(call);
            };
            let Some(limit) = device.memory_limit else {
                return driver.call(call);
            };
            if !rt.try_charge(device, size as u64, limit) {
                return OUT_OF_MEMORY;
            }
            let rc = driver.call(call);
            if rc == SUCCESS {
                // SAFETY: handle is non-null; written on success.
                let h = unsafe { handle.read_unaligned() };
                if let Some((slot, bytes)) = vmm::global().created(h, device.slot, size as u64) {
                    rt.uncharge(slot, bytes);
                }
            } else {
                rt.uncharge(device.slot, size as u64);
            }
            rc
        },
        call,
    )
}

/// Gives back what the VMM ledger says is gone.
fn give_back(freed: impl IntoIterator<Item = vmm::Freed>) {
    let rt = runtime::global();
    for (slot, bytes) in freed {
        rt.uncharge(slot, bytes);
    }
}

/// `cuMemRelease`: one handle reference less; the charge goes with the last
/// reference and mapping.
///
/// # Safety
/// As the driver's `cuMemRelease`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    let Some(real) = real!(MemRelease as FnMemRelease) else {
        return missing(Hook::MemRelease);
    };
    // SAFETY: the caller's argument, unchanged.
    let call = || unsafe { real(handle) };
    let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
        if rc == SUCCESS {
            let _ = contained("cuMemRelease", || give_back(ledger.released(handle)));
        }
    });
    rc
}

/// `cuMemMap`: the mapping keeps the physical memory alive.
///
/// # Safety
/// As the driver's `cuMemMap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    let Some(real) = real!(MemMap as FnMemMap) else {
        return missing(Hook::MemMap);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(ptr, size, offset, handle, flags) };
    let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
        if rc == SUCCESS {
            let _ = contained("cuMemMap", || ledger.mapped(ptr, size as u64, handle));
        }
    });
    rc
}

macro_rules! unmapping {
    ($name:ident, $hook:ident) => {
        /// Mappings that start in the range are gone; physical memory whose
        /// last reference and mapping went is given back.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(ptr: CUdeviceptr, size: usize) -> CUresult {
            let Some(real) = real!($hook as FnMemRange) else {
                return missing(Hook::$hook);
            };
            // SAFETY: the caller's arguments, unchanged.
            let call = || unsafe { real(ptr, size) };
            let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
                if rc == SUCCESS {
                    let _ = contained(Hook::$hook.symbol(), || {
                        give_back(ledger.unmapped(ptr, size as u64))
                    });
                }
            });
            rc
        }
    };
}

unmapping!(cuMemUnmap, MemUnmap);
unmapping!(cuMemAddressFree, MemAddressFree);

/// `cuMemRetainAllocationHandle`: one more reference to the mapped memory.
///
/// # Safety
/// As the driver's `cuMemRetainAllocationHandle`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    let Some(real) = real!(MemRetainAllocationHandle as FnMemRetainAllocationHandle) else {
        return missing(Hook::MemRetainAllocationHandle);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(handle, addr) };
    let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
        if rc == SUCCESS && !handle.is_null() {
            let _ = contained("cuMemRetainAllocationHandle", || {
                // SAFETY: handle is non-null; written on success.
                ledger.referenced(unsafe { handle.read_unaligned() }, 0);
            });
        }
    });
    rc
}

/// The identity (device, inode) of the file a descriptor names.
fn file_identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: a zeroed stat is a valid out-buffer; fstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on the caller's descriptor with a live buffer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// `cuMemExportToShareableHandle`: remembers which allocation a POSIX file
/// descriptor names, so that importing it again in this process counts as
/// one more reference to the same memory.
///
/// # Safety
/// As the driver's `cuMemExportToShareableHandle`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    kind: c_int,
    flags: u64,
) -> CUresult {
    let Some(real) = real!(MemExportToShareableHandle as FnMemExport) else {
        return missing(Hook::MemExportToShareableHandle);
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(shareable, handle, kind, flags) };
    if rc == SUCCESS && kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && !shareable.is_null() {
        let _ = contained("cuMemExportToShareableHandle", || {
            // SAFETY: for this handle type the driver wrote an int there.
            let fd = unsafe { shareable.cast::<c_int>().read_unaligned() };
            if let Some(object) = file_identity(fd) {
                vmm::global().exported(handle, object);
            }
        });
    }
    rc
}

/// `cuMemImportFromShareableHandle`: a descriptor this process exported is
/// one more reference to its allocation (under a new handle); another
/// process's is tracked (that process charged it).
///
/// # Safety
/// As the driver's `cuMemImportFromShareableHandle`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: c_int,
) -> CUresult {
    let Some(real) = real!(MemImportFromShareableHandle as FnMemImport) else {
        return missing(Hook::MemImportFromShareableHandle);
    };
    let object = (kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        .then(|| file_identity(os_handle as usize as c_int))
        .flatten();
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(handle, os_handle, kind) };
    let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
        if rc == SUCCESS && !handle.is_null() {
            let _ = contained("cuMemImportFromShareableHandle", || {
                // SAFETY: handle is non-null; written on success.
                let h = unsafe { handle.read_unaligned() };
                if !object.is_some_and(|o| ledger.imported(h, o)) {
                    ledger.referenced(h, 0);
                }
            });
        }
    });
    rc
}

// ---------------------------------------------------------------------------
// Contexts

/// NVML's processes on the device with `uuid`: `(pid, used bytes)`.
fn nvml_processes(uuid: &str) -> Option<Vec<(u32, u64)>> {
    let by_uuid = internal!(NVML_HANDLE_BY_UUID as FnNvmlGetHandleByUuid)?;
    let procs = internal!(NVML_COMPUTE_PROCS as FnNvmlComputeProcs)?;
    let name = std::ffi::CString::new(uuid).ok()?;
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if let Some(init) = internal!(NVML_INIT as FnNvmlInit) {
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
static NVML_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Snapshots taken without finding it; the library stops trying at a few.
static NVML_TRIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The limited device at `ordinal` and its uuid, if context memory is to
/// be measured there.
fn measured_device(ordinal: CUdevice) -> Option<(&'static runtime::DeviceInfo, String)> {
    let rt = runtime::global();
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
        let rt = runtime::global();
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

macro_rules! ctx_create {
    ($name:ident, $hook:ident, $ty:ty, ($($arg:ident : $argty:ty),*), $dev:ident) => {
        /// Creates a context; its own memory is measured and charged.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(pctx: *mut Handle, $($arg: $argty),*) -> CUresult {
            let Some(real) = real!($hook as $ty) else {
                return missing(Hook::$hook);
            };
            let before = before_context($dev);
            // SAFETY: the caller's arguments, unchanged.
            let rc = unsafe { real(pctx, $($arg),*) };
            if rc == SUCCESS && !pctx.is_null() {
                // SAFETY: pctx is non-null; written on success.
                context_made($dev, unsafe { pctx.read_unaligned() }, before);
            }
            rc
        }
    };
}

ctx_create!(cuCtxCreate_v2, CtxCreateV2, FnCtxCreateV2, (flags: c_uint, dev: CUdevice), dev);
ctx_create!(
    cuCtxCreate_v3,
    CtxCreateV3,
    FnCtxCreateV3,
    (params: *mut c_void, count: c_int, flags: c_uint, dev: CUdevice),
    dev
);
ctx_create!(
    cuCtxCreate_v4,
    CtxCreateV4,
    FnCtxCreateV4,
    (params: *mut c_void, flags: c_uint, dev: CUdevice),
    dev
);

/// `cuCtxDestroy_v2`: everything the context held is given back.
///
/// # Safety
/// As the driver's `cuCtxDestroy_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    let Some(real) = real!(CtxDestroyV2 as FnDestroy) else {
        return missing(Hook::CtxDestroyV2);
    };
    // SAFETY: the caller's argument, unchanged.
    let rc = unsafe { real(ctx) };
    if rc == SUCCESS {
        let _ = contained("cuCtxDestroy_v2", || {
            contexts::context_gone(runtime::global(), ctx as usize as u64, false);
        });
    }
    rc
}

/// `cuDevicePrimaryCtxRetain`: remembers the device's primary context; a
/// new one has its own memory measured.
///
/// # Safety
/// As the driver's `cuDevicePrimaryCtxRetain`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    let Some(real) = real!(DevicePrimaryCtxRetain as FnPrimaryRetain) else {
        return missing(Hook::DevicePrimaryCtxRetain);
    };
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

/// Whether the driver says `dev`'s primary context is active; `None` when
/// it cannot tell.
fn primary_active(dev: CUdevice) -> Option<bool> {
    let f = internal!(PRIMARY_GET_STATE as FnPrimaryGetState)?;
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

macro_rules! primary_release {
    ($name:ident, $hook:ident) => {
        /// Releases the primary context; when the driver says it is gone
        /// (the last reference), everything it held is given back.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            let Some(real) = real!($hook as FnPrimaryOp) else {
                return missing(Hook::$hook);
            };
            // SAFETY: the caller's argument, unchanged.
            let rc = unsafe { real(dev) };
            if rc == SUCCESS {
                let _ = contained(Hook::$hook.symbol(), || {
                    if primary_active(dev) == Some(false) {
                        contexts::context_gone(runtime::global(), primary_of(dev), false);
                    }
                });
            }
            rc
        }
    };
}

primary_release!(cuDevicePrimaryCtxRelease, DevicePrimaryCtxRelease);
primary_release!(cuDevicePrimaryCtxRelease_v2, DevicePrimaryCtxReleaseV2);

macro_rules! primary_reset {
    ($name:ident, $hook:ident) => {
        /// Resets the primary context (`cudaDeviceReset`): every allocation
        /// it held and every stream-ordered allocation of the device is
        /// given back; its own memory too if the driver says it is gone.
        ///
        /// # Safety
        /// As the driver's function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            let Some(real) = real!($hook as FnPrimaryOp) else {
                return missing(Hook::$hook);
            };
            // SAFETY: the caller's argument, unchanged.
            let rc = unsafe { real(dev) };
            if rc == SUCCESS {
                let _ = contained(Hook::$hook.symbol(), || {
                    let rt = runtime::global();
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
    };
}

primary_reset!(cuDevicePrimaryCtxReset, DevicePrimaryCtxReset);
primary_reset!(cuDevicePrimaryCtxReset_v2, DevicePrimaryCtxResetV2);

/// `cuCtxSetLimit`: the malloc heap is device memory of the current
/// context, charged before the driver takes it.
///
/// # Safety
/// As the driver's `cuCtxSetLimit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    let Some(real) = real!(CtxSetLimit as FnCtxSetLimit) else {
        return missing(Hook::CtxSetLimit);
    };
    // SAFETY: the caller's arguments, unchanged.
    let call = || unsafe { real(limit, value) };
    if limit != CU_LIMIT_MALLOC_HEAP_SIZE {
        return call();
    }
    protect(
        Hook::CtxSetLimit,
        |driver| {
            let rt = runtime::global();
            let ctx = current_context();
            let device = current_device()
                .and_then(|o| rt.device(o))
                .filter(|_| rt.enforcing());
            match (device, ctx) {
                (Some(device), ctx) if ctx != 0 => match device.memory_limit {
                    Some(limit) => contexts::set_heap(rt, device, limit, ctx, value as u64, || {
                        driver.call(call)
                    }),
                    None => driver.call(call),
                },
                _ => driver.call(call),
            }
        },
        call,
    )
}

/// Sizes of this module's C structs, for the layout test.
#[cfg(test)]
pub(super) fn layouts() -> (usize, usize) {
    (
        std::mem::size_of::<CuMemPoolProps>(),
        std::mem::size_of::<NvmlProcessInfo>(),
    )
}
