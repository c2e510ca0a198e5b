//! Memory: linear, managed, host, virtual memory management, stream-ordered
//! pools, arrays. What is charged to the device is listed in
//! [`crate::registry`].

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::Ordering;

use crate::driver::{self, Driver, Res};
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::out;
use crate::registry::{AllocKind, GRANULARITY, Registry};

use super::context::make_in_current;
use super::{entry, with_driver, with_handle};

/// The calling thread's live current context.
fn current(driver: &Driver) -> Res<Handle> {
    driver.registry().live_context(driver::current_context())
}

/// `(free, total)` bytes of the current context's device, for this process.
fn mem_info() -> Res<(u64, u64)> {
    let driver = driver::get()?;
    let device = driver.device_at(driver::current_device()?)?;
    let total = device.spec.total_bytes;
    let used = device.used.load(Ordering::Acquire);
    Ok((total.saturating_sub(used), total))
}

/// `cuMemGetInfo_v2`: the current device's capacity and what this process
/// left of it (other processes' use is not subtracted).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    entry(|| {
        let (f, t) = mem_info()?;
        // SAFETY: cuda.h contract: both are null or valid for one write.
        unsafe {
            out::write(free, f as usize)?;
            out::write(total, t as usize)
        }
    })
}

/// `cuMemGetInfo` (CUDA 2.0 ABI: `unsigned int *`): capped at `UINT_MAX`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CuResult {
    entry(|| {
        let (f, t) = mem_info()?;
        let cap = |v: u64| c_uint::try_from(v).unwrap_or(c_uint::MAX);
        // SAFETY: cuda.h contract: both are null or valid for one write.
        unsafe {
            out::write(free, cap(f))?;
            out::write(total, cap(t))
        }
    })
}

/// Allocates in the current context and stores the pointer.
fn alloc_current(dptr: *mut CuDevicePtr, bytes: u64, kind: AllocKind) -> Res<()> {
    let alloc = |driver: &Driver, registry: &mut Registry, ctx: Handle| {
        registry.alloc(driver, ctx.device, bytes, kind, Some(ctx))
    };
    // SAFETY: cuda.h contract: `dptr` is null or valid for one write.
    unsafe { make_in_current(dptr, alloc) }
}

/// `cuMemAlloc_v2`: charged to the current device; `OUT_OF_MEMORY` past its capacity.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytesize: usize) -> CuResult {
    entry(|| alloc_current(dptr, bytesize as u64, AllocKind::Linear))
}

/// `cuMemFree_v2`: any linear, pitched, managed or stream-ordered allocation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CuDevicePtr) -> CuResult {
    with_driver(|driver| driver.registry().free(driver, dptr))
}

/// `cuMemAllocPitch_v2`: rows padded to 512 bytes; `ElementSizeBytes` must
/// be 4, 8 or 16.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    p_pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CuResult {
    entry(|| {
        if !matches!(element_size_bytes, 4 | 8 | 16) || width_in_bytes == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if p_pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pitch = (width_in_bytes as u64)
            .checked_next_multiple_of(512)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = pitch
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        alloc_current(dptr, bytes, AllocKind::Pitch)?;
        // SAFETY: cuda.h contract: `pPitch` is valid for one write (non-null).
        unsafe { out::write(p_pitch, pitch as usize) }
    })
}

/// `cuMemAllocManaged`: host-backed in the simulator (a lazily committed
/// host mapping), so it is usable from the host and does not take device
/// capacity. `flags` is `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    flags: c_uint,
) -> CuResult {
    entry(|| {
        if !matches!(flags, MEM_ATTACH_GLOBAL | MEM_ATTACH_HOST) || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        alloc_current(dptr, bytesize as u64, AllocKind::Managed { len: bytesize })
    })
}

/// `cuMemAllocHost_v2`: real host memory (zeroed, lazily committed), not device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CuResult {
    entry(|| {
        if pp.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        current(driver)?;
        let ptr = driver.registry().alloc_host(bytesize as u64)?;
        // SAFETY: cuda.h contract: `pp` is valid for one write (non-null).
        unsafe { out::write(pp, ptr as *mut c_void) }
    })
}

/// `cuMemFreeHost`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    with_driver(|driver| driver.registry().free_host(p as usize))
}

// ----- virtual memory management -------------------------------------------

/// The device a `CUmemLocation` names (`None`: a host location).
fn location_device(driver: &Driver, location: CuMemLocation) -> Res<Option<u32>> {
    match location.kind {
        MEM_LOCATION_TYPE_DEVICE => {
            driver
                .device(location.id)
                .map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
            Ok(Some(location.id as u32))
        }
        MEM_LOCATION_TYPE_HOST
        | MEM_LOCATION_TYPE_HOST_NUMA
        | MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(None),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemCreate`: physical memory, charged when on a device. `size` must
/// be a multiple of the 2 MiB granularity.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CuMemHandle,
    size: usize,
    prop: *const CuMemAllocationProp,
    flags: c_ulonglong,
) -> CuResult {
    with_driver(|driver| {
        // SAFETY: cuda.h contract: `prop` is null or a valid CUmemAllocationProp.
        let prop = unsafe { out::read(prop) }?;
        let size = size as u64;
        if handle.is_null()
            || flags != 0
            || prop.kind != MEM_ALLOCATION_TYPE_PINNED
            || size == 0
            || !size.is_multiple_of(GRANULARITY)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = location_device(driver, prop.location)?;
        let h = driver.registry().create_physical(driver, device, size)?;
        // SAFETY: cuda.h contract: `handle` is valid for one write (non-null).
        unsafe { out::write(handle, h) }
    })
}

/// `cuMemRelease`: the memory is freed once no mapping uses it.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: CuMemHandle) -> CuResult {
    with_driver(|driver| driver.registry().release_physical(driver, handle))
}

/// `cuMemRetainAllocationHandle`: the handle of the memory mapped at
/// `addr`, with one more reference (released with `cuMemRelease`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CuMemHandle,
    addr: *mut c_void,
) -> CuResult {
    entry(|| {
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = driver::get()?.registry().retain_physical(addr as u64)?;
        // SAFETY: cuda.h contract: `handle` is valid for one write (non-null).
        unsafe { out::write(handle, h) }
    })
}

/// `cuMemExportToShareableHandle`: `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`
/// only; the descriptor (a memfd) names the allocation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CuMemHandle,
    handle_type: c_int,
    flags: c_ulonglong,
) -> CuResult {
    entry(|| {
        if shareable.is_null() || flags != 0 || handle_type != MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let data = driver::get()?.registry().export_physical(handle)?;
        // SAFETY: memfd_create with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"tessera-sim-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: writes the 20 bytes of `data` to the memfd just made.
        let written = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0) };
        if written != data.len() as isize {
            // SAFETY: closes the memfd just made.
            unsafe { libc::close(fd) };
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: cuda.h contract: for this handle type, an int out-parameter.
        unsafe { out::write(shareable.cast::<c_int>(), fd) }
    })
}

/// `cuMemImportFromShareableHandle`: a descriptor from
/// `cuMemExportToShareableHandle` (of this process or another).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CuMemHandle,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> CuResult {
    entry(|| {
        if handle.is_null() || handle_type != MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let fd = os_handle as usize as c_int;
        let mut data = [0u8; 20];
        // SAFETY: reads at most 20 bytes into a live local buffer.
        let got = unsafe { libc::pread(fd, data.as_mut_ptr().cast(), data.len(), 0) };
        if got != data.len() as isize {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let driver = driver::get()?;
        let h = driver.registry().import_physical(driver, &data)?;
        // SAFETY: cuda.h contract: `handle` is valid for one write (non-null).
        unsafe { out::write(handle, h) }
    })
}

/// `cuMemAddressReserve`: `size` a multiple of 2 MiB; `alignment` 0 (2 MiB)
/// or a power of two; the `addr` hint is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CuDevicePtr,
    size: usize,
    alignment: usize,
    _addr: CuDevicePtr,
    flags: c_ulonglong,
) -> CuResult {
    entry(|| {
        let size = size as u64;
        let align = match alignment as u64 {
            0 => GRANULARITY,
            a if a.is_power_of_two() => a.max(GRANULARITY),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        if ptr.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let va = driver::get()?.registry().reserve(size, align)?;
        // SAFETY: cuda.h contract: `ptr` is valid for one write (non-null).
        unsafe { out::write(ptr, va) }
    })
}

/// `cuMemAddressFree`: a whole reservation (mappings still in it are dropped).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CuDevicePtr, size: usize) -> CuResult {
    with_driver(|driver| driver.registry().free_reservation(driver, ptr, size as u64))
}

/// `cuMemMap`: maps physical memory into a reservation; `offset` + `size`
/// within the allocation, no overlap with another mapping, `flags` 0.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CuDevicePtr,
    size: usize,
    offset: usize,
    handle: CuMemHandle,
    flags: c_ulonglong,
) -> CuResult {
    entry(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        driver::get()?
            .registry()
            .map(ptr, size as u64, offset as u64, handle)
    })
}

/// `cuMemUnmap`: every mapping that starts in the range.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CuDevicePtr, size: usize) -> CuResult {
    with_driver(|driver| driver.registry().unmap(driver, ptr, size as u64))
}

/// `cuMemSetAccess`: checks the range is mapped and the descriptors name
/// devices; access itself is not modelled.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CuDevicePtr,
    size: usize,
    desc: *const CuMemAccessDesc,
    count: usize,
) -> CuResult {
    with_driver(|driver| {
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: cuda.h contract: `desc` points to `count` descriptors.
            let d = unsafe { out::read(desc.add(i)) }?;
            location_device(driver, d.location)?;
        }
        if driver.registry().mapped(ptr, size as u64) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// `cuMemGetAllocationGranularity`: 2 MiB, minimum and recommended.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CuMemAllocationProp,
    option: c_int,
) -> CuResult {
    with_driver(|driver| {
        // SAFETY: cuda.h contract: `prop` is null or a valid CUmemAllocationProp.
        let prop = unsafe { out::read(prop) }?;
        location_device(driver, prop.location)?;
        if !matches!(
            option,
            MEM_ALLOC_GRANULARITY_MINIMUM | MEM_ALLOC_GRANULARITY_RECOMMENDED
        ) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: cuda.h contract: `granularity` is null or valid for one write.
        unsafe { out::write(granularity, GRANULARITY as usize) }
    })
}

// ----- stream-ordered allocation ----------------------------------------------

fn alloc_async(dptr: *mut CuDevicePtr, bytes: usize, pool: Handle, stream: CuStream) -> Res<()> {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let driver = driver::get()?;
    driver::stream_device(stream)?;
    let ptr = {
        let mut registry = driver.registry();
        if !registry.pool_exists(pool) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        registry.alloc(
            driver,
            pool.device,
            bytes as u64,
            AllocKind::Async {
                pool: (pool.device, pool.serial),
            },
            None,
        )?
    };
    // SAFETY: cuda.h contract: `dptr` is valid for one write (non-null).
    unsafe { out::write(dptr, ptr) }
}

/// `cuMemAllocAsync`: from the current pool of the stream's device
/// (`cuDeviceSetMemPool`; the default pool unless set).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    h_stream: CuStream,
) -> CuResult {
    with_driver(|driver| {
        let device = driver::stream_device(h_stream)?;
        let pool = driver.registry().current_pool(device)?;
        alloc_async(dptr, bytesize, pool, h_stream)
    })
}

/// `cuMemAllocFromPoolAsync`: from `pool` (its `maxSize`, if set, is enforced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuMemoryPool,
    h_stream: CuStream,
) -> CuResult {
    entry(|| {
        let pool = Handle::of(pool, Kind::Pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        alloc_async(dptr, bytesize, pool, h_stream)
    })
}

/// `cuMemFreeAsync`: the block goes back to its pool at once (the pool
/// keeps the memory until trimmed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CuDevicePtr, h_stream: CuStream) -> CuResult {
    with_driver(|driver| {
        driver::stream_device(h_stream)?;
        driver.registry().free(driver, dptr)
    })
}

/// `cuMemPoolCreate`: a pool on a device location.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CuMemoryPool,
    pool_props: *const CuMemPoolProps,
) -> CuResult {
    with_driver(|driver| {
        // SAFETY: cuda.h contract: `poolProps` is null or a valid CUmemPoolProps.
        let props = unsafe { out::read(pool_props) }?;
        if pool.is_null() || props.alloc_type != MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = location_device(driver, props.location)?.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let h = driver.registry().create_pool(device, props.max_size as u64);
        // SAFETY: cuda.h contract: `pool` is valid for one write (non-null).
        unsafe { out::write(pool, h.ptr()) }
    })
}

/// `cuMemPoolSetAttribute`: the release threshold is kept; the reuse
/// policies are accepted and not modelled; the others are read-only
/// (the high-water marks may be reset to the current values with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CuMemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    with_handle(
        pool,
        Kind::Pool,
        CUDA_ERROR_INVALID_VALUE,
        |driver, pool| {
            match attr {
                MEMPOOL_ATTR_RELEASE_THRESHOLD => {
                    // SAFETY: cuda.h contract: this attribute's value is a cuuint64_t.
                    let bytes = unsafe { out::read(value.cast::<u64>()) }?;
                    driver.registry().set_pool_threshold(pool, bytes)
                }
                1..=3 | MEMPOOL_ATTR_RESERVED_MEM_HIGH | MEMPOOL_ATTR_USED_MEM_HIGH => {
                    driver.registry().pool_stats(pool).map(|_| ())
                }
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            }
        },
    )
}

/// `cuMemPoolGetAttribute`: threshold, reserved and used bytes (current and high).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CuMemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    with_handle(
        pool,
        Kind::Pool,
        CUDA_ERROR_INVALID_VALUE,
        |driver, pool| {
            let stats = driver.registry().pool_stats(pool)?;
            let number = match attr {
                MEMPOOL_ATTR_RELEASE_THRESHOLD => stats.threshold,
                MEMPOOL_ATTR_RESERVED_MEM_CURRENT => stats.reserved,
                MEMPOOL_ATTR_RESERVED_MEM_HIGH => stats.reserved_high,
                MEMPOOL_ATTR_USED_MEM_CURRENT => stats.used,
                MEMPOOL_ATTR_USED_MEM_HIGH => stats.used_high,
                1..=3 => {
                    // SAFETY: cuda.h contract: the reuse attributes are ints.
                    return unsafe { out::write(value.cast::<c_int>(), 1) };
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            };
            // SAFETY: cuda.h contract: these attributes' values are cuuint64_t.
            unsafe { out::write(value.cast::<u64>(), number) }
        },
    )
}

/// `cuMemPoolTrimTo`: gives back what the pool holds beyond its live
/// allocations and `minBytesToKeep`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CuMemoryPool, min_bytes_to_keep: usize) -> CuResult {
    with_handle(
        pool,
        Kind::Pool,
        CUDA_ERROR_INVALID_VALUE,
        |driver, pool| {
            driver
                .registry()
                .trim_pool_to(driver, pool, min_bytes_to_keep as u64)
        },
    )
}

/// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` uses on the device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CuMemoryPool, dev: CuDevice) -> CuResult {
    with_driver(|driver| {
        driver.device(dev)?;
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = driver.registry().current_pool(dev as u32)?;
        // SAFETY: cuda.h contract: `pool` is valid for one write (non-null).
        unsafe { out::write(pool, h.ptr()) }
    })
}

/// `cuDeviceSetMemPool`: a pool of that device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CuDevice, pool: CuMemoryPool) -> CuResult {
    with_driver(|driver| {
        driver.device(dev)?;
        let pool = Handle::of(pool, Kind::Pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        driver.registry().set_current_pool(dev as u32, pool)
    })
}

/// `cuMemPoolDestroy`: not a default pool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CuMemoryPool) -> CuResult {
    with_handle(
        pool,
        Kind::Pool,
        CUDA_ERROR_INVALID_VALUE,
        |driver, pool| driver.registry().destroy_pool(driver, pool),
    )
}

// ----- arrays -------------------------------------------------------------------

fn create_array(out_handle: *mut CuArray, bytes: Option<u64>, kind: Kind) -> Res<()> {
    let bytes = bytes.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let create = |driver: &Driver, registry: &mut Registry, ctx| {
        Ok(registry.create_array(driver, ctx, bytes, kind)?.ptr())
    };
    // SAFETY: cuda.h contract: the handle pointer is null or valid for one write.
    unsafe { make_in_current(out_handle, create) }
}

/// Bytes of a `width × height × depth` array (0 = 1 in the extents past width).
fn extent_bytes(width: u64, height: u64, depth: u64, element: u64) -> Option<u64> {
    if width == 0 {
        return None;
    }
    width
        .checked_mul(height.max(1))?
        .checked_mul(depth.max(1))?
        .checked_mul(element)
}

/// `cuArrayCreate_v2`: charged width × height × channels × format size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    p_handle: *mut CuArray,
    p_allocate_array: *const CuArrayDescriptor,
) -> CuResult {
    entry(|| {
        // SAFETY: cuda.h contract: the descriptor is null or valid.
        let d = unsafe { out::read(p_allocate_array) }?;
        let bytes = array_element_bytes(d.format, d.num_channels)
            .and_then(|e| extent_bytes(d.width as u64, d.height as u64, 1, e));
        create_array(p_handle, bytes, Kind::Array)
    })
}

/// `cuArray3DCreate_v2`: charged width × height × depth × channels × format size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    p_handle: *mut CuArray,
    p_allocate_array: *const CuArray3dDescriptor,
) -> CuResult {
    entry(|| {
        // SAFETY: cuda.h contract: the descriptor is null or valid.
        let d = unsafe { out::read(p_allocate_array) }?;
        let bytes = array_element_bytes(d.format, d.num_channels)
            .and_then(|e| extent_bytes(d.width as u64, d.height as u64, d.depth as u64, e));
        create_array(p_handle, bytes, Kind::Array)
    })
}

/// Bytes of a mipmapped array: the levels summed, each halving every
/// extent (not the layer count of a layered array), down to 1.
fn mipmap_bytes(d: &CuArray3dDescriptor, levels: u32) -> Option<u64> {
    let element = array_element_bytes(d.format, d.num_channels)?;
    if levels == 0 || levels > 32 {
        return None;
    }
    let layered = d.flags & ARRAY3D_LAYERED != 0;
    let shrink = |extent: usize, level: u32| {
        if extent == 0 {
            0
        } else {
            ((extent as u64) >> level).max(1)
        }
    };
    (0..levels).try_fold(0u64, |sum, level| {
        let depth = if layered {
            d.depth as u64
        } else {
            shrink(d.depth, level)
        };
        let level_bytes = extent_bytes(
            shrink(d.width, level),
            shrink(d.height, level),
            depth,
            element,
        )?;
        sum.checked_add(level_bytes)
    })
}

/// `cuMipmappedArrayCreate`: charged the sum of its levels.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    p_handle: *mut CuMipmappedArray,
    p_mipmapped_array_desc: *const CuArray3dDescriptor,
    num_mipmap_levels: c_uint,
) -> CuResult {
    entry(|| {
        // SAFETY: cuda.h contract: the descriptor is null or valid.
        let d = unsafe { out::read(p_mipmapped_array_desc) }?;
        create_array(
            p_handle,
            mipmap_bytes(&d, num_mipmap_levels),
            Kind::MipmappedArray,
        )
    })
}

fn destroy_array(handle: *mut Opaque, kind: Kind) -> CuResult {
    with_handle(handle, kind, CUDA_ERROR_INVALID_HANDLE, |driver, h| {
        driver.registry().destroy_array(driver, h)
    })
}

/// `cuArrayDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(h_array: CuArray) -> CuResult {
    destroy_array(h_array, Kind::Array)
}

/// `cuMipmappedArrayDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h_mipmapped_array: CuMipmappedArray) -> CuResult {
    destroy_array(h_mipmapped_array, Kind::MipmappedArray)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mipmap_levels_are_summed() {
        let d = CuArray3dDescriptor {
            width: 1024,
            height: 512,
            depth: 0,
            format: 0x20,
            num_channels: 1,
            flags: 0,
        };
        // 1024×512 + 512×256 + 256×128, 4 bytes each.
        assert_eq!(
            mipmap_bytes(&d, 3),
            Some(4 * (1024 * 512 + 512 * 256 + 256 * 128))
        );
        assert_eq!(mipmap_bytes(&d, 0), None);
        let layered = CuArray3dDescriptor {
            depth: 6,
            flags: ARRAY3D_LAYERED,
            ..d
        };
        assert_eq!(
            mipmap_bytes(&layered, 2),
            Some(4 * 6 * (1024 * 512 + 512 * 256))
        );
        // Extents stop at 1.
        let tiny = CuArray3dDescriptor {
            width: 2,
            height: 0,
            ..d
        };
        assert_eq!(mipmap_bytes(&tiny, 4), Some(4 * (2 + 1 + 1 + 1)));
    }
}
