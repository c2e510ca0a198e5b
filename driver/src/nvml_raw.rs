//! Raw NVML calls that `nvml-wrapper`'s safe API does not cover (or covers wrongly):
//! versioned GPU-instance profile info, possible placements, GPU- and
//! compute-instance create/destroy/list, MIG device handles, and event sets
//! (the safe `EventSet` borrows `Nvml`, which a driver holding both cannot
//! express, and its event data drops the MIG instance ids).
//!
//! This is the only module of the crate with `unsafe`. Every function here takes a
//! safe [`Device`] (whose handle NVML gave out and which borrows the live [`Nvml`]),
//! and the GPU-/compute-instance handles NVML hands back never leave this module,
//! so no caller can pass a dangling handle into the library. Function pointers are
//! looked up through the [`NvmlLib`] table without its panicking wrappers: a
//! library that lacks a symbol gives an error, not a panic.

use std::ffi::{CStr, c_char, c_uint};
use std::mem;
use std::ptr;

use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_v3_t, nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t,
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstanceProfileInfo_v3_t,
    nvmlMemory_t, nvmlReturn_t,
};

/// `NVML_SUCCESS`.
pub(crate) const SUCCESS: nvmlReturn_t = 0;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub(crate) const ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub(crate) const ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
/// `NVML_ERROR_TIMEOUT`.
pub(crate) const ERROR_TIMEOUT: nvmlReturn_t = 10;
/// `NVML_ERROR_GPU_IS_LOST`.
pub(crate) const ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
/// `nvmlEventTypeXidCriticalError`.
pub(crate) const EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 0x8;
/// `NVML_VALUE_NOT_AVAILABLE` as `unsigned int`: no MIG instance id.
pub(crate) const VALUE_NOT_AVAILABLE_UINT: u32 = u32::MAX;
/// `NVML_ERROR_NOT_FOUND`.
pub(crate) const ERROR_NOT_FOUND: nvmlReturn_t = 6;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub(crate) const ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
/// `NVML_ERROR_IN_USE`.
pub(crate) const ERROR_IN_USE: nvmlReturn_t = 19;
/// `NVML_ERROR_INSUFFICIENT_RESOURCES`.
pub(crate) const ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.
pub(crate) const ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;

/// Highest profile enum index tried before giving up, in case a library never
/// answers `INVALID_ARGUMENT` (NVML 12.x defines 0..=0x11).
const MAX_PROFILE_ENUM: u32 = 64;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_PROFILE_SHARED: c_uint = 0;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;

/// A failed raw NVML call: the function, NVML's return code (absent when the
/// symbol itself is missing) and NVML's error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawError {
    /// NVML function name.
    pub call: &'static str,
    /// Return code, `None` when the library lacks the function.
    pub code: Option<nvmlReturn_t>,
    /// `nvmlErrorString` text, or why the symbol could not be loaded.
    pub reason: String,
}

/// Result of a raw call.
pub(crate) type RawResult<T> = Result<T, RawError>;

/// `NVML_STRUCT_VERSION(name, n)`: `sizeof(struct) | (n << 24)`.
fn struct_version<T>(n: u32) -> c_uint {
    // Struct sizes are a few hundred bytes, far below 2^24.
    (mem::size_of::<T>() as u32) | (n << 24)
}

/// Text of a NUL-terminated C char buffer (up to the first NUL, lossily as UTF-8).
pub(crate) fn c_chars_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Looks up a function pointer in the table, as an error when it is missing.
macro_rules! sym {
    ($lib:expr, $name:ident) => {
        $lib.$name.as_ref().map_err(|e| RawError {
            call: stringify!($name),
            code: None,
            reason: format!("symbol missing from the NVML library: {e}"),
        })?
    };
}

/// Turns a return code into a result, with NVML's own error text.
fn check(lib: &NvmlLib, call: &'static str, code: nvmlReturn_t) -> RawResult<()> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(RawError {
            call,
            code: Some(code),
            reason: error_string(lib, code),
        })
    }
}

/// NVML's text for a return code (`nvmlErrorString`), or a generic one.
fn error_string(lib: &NvmlLib, code: nvmlReturn_t) -> String {
    if let Ok(f) = lib.nvmlErrorString.as_ref() {
        // SAFETY: nvmlErrorString takes any return code and returns either NULL or a
        // pointer to a static NUL-terminated string owned by the library, which stays
        // loaded while `lib` is borrowed.
        let text = unsafe { f(code) };
        if !text.is_null() {
            // SAFETY: non-NULL, NUL-terminated and static (see above).
            let s = unsafe { CStr::from_ptr(text) };
            return format!("{} (NVML error {code})", s.to_string_lossy());
        }
    }
    format!("NVML error {code}")
}

/// The handle of a safe `Device`.
fn handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: the handle is only passed to NVML functions of the same library while
    // `device` (and so the `Nvml` it borrows) is alive; it is never freed by us.
    unsafe { device.handle() }
}

/// GPU-instance profile info as read from the versioned (or legacy) struct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawGiProfile {
    /// Device profile id.
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// Most instances.
    pub instance_count: u32,
    /// SMs.
    pub multiprocessor_count: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Name as NVML reports it (`MIG 1g.10gb`), empty with the legacy struct.
    pub name: String,
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` for one enum index: `Ok(None)` when the
/// GPU does not support the profile (`NOT_SUPPORTED`), `INVALID_ARGUMENT` as an
/// error (the end of the enumeration). Tries the v3 struct, then v2 on a version
/// mismatch, then the unversioned call when the library lacks the `V` function.
pub(crate) fn gi_profile_info(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_enum: u32,
) -> RawResult<Option<RawGiProfile>> {
    let lib = nvml.lib();
    let dev = handle(device);
    let skip_unsupported = |r: RawResult<RawGiProfile>| match r {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.code == Some(ERROR_NOT_SUPPORTED) => Ok(None),
        Err(e) => Err(e),
    };
    let Ok(f) = lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref() else {
        let f = sym!(lib, nvmlDeviceGetGpuInstanceProfileInfo);
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: `dev` is a live device handle; `info` is a valid, writable struct of
        // the type the function expects.
        let code = unsafe { f(dev, profile_enum, &mut info) };
        return skip_unsupported(check(lib, "nvmlDeviceGetGpuInstanceProfileInfo", code).map(
            |()| RawGiProfile {
                id: info.id,
                slice_count: info.sliceCount,
                instance_count: info.instanceCount,
                multiprocessor_count: info.multiprocessorCount,
                memory_mib: info.memorySizeMB,
                name: String::new(),
            },
        ));
    };

    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut v3: nvmlGpuInstanceProfileInfo_v3_t = unsafe { mem::zeroed() };
    v3.version = struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3);
    // SAFETY: `dev` is live; the function reads `version` first and writes at most
    // the struct of that version, which is exactly the v3 struct we pass (the
    // declared v2 pointer type is the C API's generic one).
    let code = unsafe { f(dev, profile_enum, (&raw mut v3).cast()) };
    if code != ERROR_ARGUMENT_VERSION_MISMATCH {
        return skip_unsupported(
            check(lib, "nvmlDeviceGetGpuInstanceProfileInfoV", code).map(|()| RawGiProfile {
                id: v3.id,
                slice_count: v3.sliceCount,
                instance_count: v3.instanceCount,
                multiprocessor_count: v3.multiprocessorCount,
                memory_mib: v3.memorySizeMB,
                name: c_chars_to_string(&v3.name),
            }),
        );
    }
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut v2: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
    v2.version = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
    // SAFETY: `dev` is live and `v2` is a valid, writable v2 struct tagged as v2.
    let code = unsafe { f(dev, profile_enum, &mut v2) };
    skip_unsupported(
        check(lib, "nvmlDeviceGetGpuInstanceProfileInfoV", code).map(|()| RawGiProfile {
            id: v2.id,
            slice_count: v2.sliceCount,
            instance_count: v2.instanceCount,
            multiprocessor_count: v2.multiprocessorCount,
            memory_mib: v2.memorySizeMB,
            name: c_chars_to_string(&v2.name),
        }),
    )
}

/// Every supported GPU-instance profile with the enum index it was queried with:
/// enum 0 upward until `INVALID_ARGUMENT`, skipping `NOT_SUPPORTED`.
pub(crate) fn gi_profiles(nvml: &Nvml, device: &Device<'_>) -> RawResult<Vec<(u32, RawGiProfile)>> {
    let mut out = Vec::new();
    for profile_enum in 0..MAX_PROFILE_ENUM {
        match gi_profile_info(nvml, device, profile_enum) {
            Ok(Some(p)) => out.push((profile_enum, p)),
            Ok(None) => {}
            Err(e) if e.code == Some(ERROR_INVALID_ARGUMENT) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: count with a NULL array, then fill.
pub(crate) fn possible_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> RawResult<Vec<(u32, u32)>> {
    const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
    let lib = nvml.lib();
    let dev = handle(device);
    let f = sym!(lib, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    let mut count: c_uint = 0;
    // SAFETY: `dev` is live; a NULL array asks only for the count, written to `count`.
    let code = unsafe { f(dev, profile_id, ptr::null_mut(), &mut count) };
    if code != ERROR_INSUFFICIENT_SIZE {
        check(lib, CALL, code)?;
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    let mut filled = count;
    // SAFETY: `buf` holds `count` writable placements and `filled` tells NVML so; NVML
    // writes at most that many and the number written back to `filled`.
    let code = unsafe { f(dev, profile_id, buf.as_mut_ptr(), &mut filled) };
    check(lib, CALL, code)?;
    buf.truncate(filled.min(count) as usize);
    Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
}

/// What `nvmlGpuInstanceGetInfo` says about a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawGiInfo {
    /// GI id.
    pub id: u32,
    /// Device profile id.
    pub profile_id: u32,
    /// Placement start.
    pub start: u32,
    /// Placement size.
    pub size: u32,
}

fn gi_info(lib: &NvmlLib, gi: nvmlGpuInstance_t) -> RawResult<RawGiInfo> {
    let f = sym!(lib, nvmlGpuInstanceGetInfo);
    // SAFETY: all-zero (NULL device pointer included) is a valid value of this C struct.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `gi` is a GPU-instance handle NVML just returned for a live device;
    // `info` is a valid, writable struct.
    let code = unsafe { f(gi, &mut info) };
    check(lib, "nvmlGpuInstanceGetInfo", code)?;
    Ok(RawGiInfo {
        id: info.id,
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
    })
}

fn gi_by_id(lib: &NvmlLib, dev: nvmlDevice_t, gi_id: u32) -> RawResult<nvmlGpuInstance_t> {
    let f = sym!(lib, nvmlDeviceGetGpuInstanceById);
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `dev` is a live device handle; `gi` is a writable handle slot.
    let code = unsafe { f(dev, gi_id, &mut gi) };
    check(lib, "nvmlDeviceGetGpuInstanceById", code)?;
    Ok(gi)
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`, then `nvmlGpuInstanceGetInfo` on the new GI.
pub(crate) fn create_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> RawResult<RawGiInfo> {
    let lib = nvml.lib();
    let dev = handle(device);
    let f = sym!(lib, nvmlDeviceCreateGpuInstanceWithPlacement);
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `dev` is live; `placement` is a valid struct NVML only reads; `gi` is a
    // writable handle slot.
    let code = unsafe { f(dev, profile_id, &placement, &mut gi) };
    check(lib, "nvmlDeviceCreateGpuInstanceWithPlacement", code)?;
    gi_info(lib, gi)
}

/// `nvmlDeviceGetGpuInstances` for one profile id; `capacity` is the profile's
/// instance count (the array size NVML requires).
pub(crate) fn gpu_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    capacity: u32,
) -> RawResult<Vec<RawGiInfo>> {
    let lib = nvml.lib();
    let dev = handle(device);
    let f = sym!(lib, nvmlDeviceGetGpuInstances);
    let capacity = capacity.max(1);
    let mut buf: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); capacity as usize];
    let mut count: c_uint = capacity;
    // SAFETY: `dev` is live; `buf` has room for `capacity` handles, the profile's
    // instance count, which is the most NVML writes; `count` receives how many.
    let code = unsafe { f(dev, profile_id, buf.as_mut_ptr(), &mut count) };
    check(lib, "nvmlDeviceGetGpuInstances", code)?;
    buf.truncate(count.min(capacity) as usize);
    buf.into_iter().map(|gi| gi_info(lib, gi)).collect()
}

/// `nvmlGpuInstanceGetInfo` of the GI with this id.
pub(crate) fn gpu_instance_by_id(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
) -> RawResult<RawGiInfo> {
    let lib = nvml.lib();
    let gi = gi_by_id(lib, handle(device), gi_id)?;
    gi_info(lib, gi)
}

/// `nvmlGpuInstanceDestroy` of the GI with this id.
pub(crate) fn destroy_gpu_instance(nvml: &Nvml, device: &Device<'_>, gi_id: u32) -> RawResult<()> {
    let lib = nvml.lib();
    let gi = gi_by_id(lib, handle(device), gi_id)?;
    let f = sym!(lib, nvmlGpuInstanceDestroy);
    // SAFETY: `gi` is the handle NVML just returned for this id; it is not used after.
    let code = unsafe { f(gi) };
    check(lib, "nvmlGpuInstanceDestroy", code)
}

/// A compute-instance profile of a GI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawCiProfile {
    /// Enum index queried.
    pub enum_index: u32,
    /// CI profile id (what create/list take).
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// Most instances.
    pub instance_count: u32,
}

fn ci_profile_info(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    profile_enum: u32,
) -> RawResult<Option<RawCiProfile>> {
    const CALL: &str = "nvmlGpuInstanceGetComputeInstanceProfileInfoV";
    let f = sym!(lib, nvmlGpuInstanceGetComputeInstanceProfileInfoV);
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut v3: nvmlComputeInstanceProfileInfo_v3_t = unsafe { mem::zeroed() };
    v3.version = struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3);
    // SAFETY: `gi` is a live GI handle; NVML reads `version` and writes at most the
    // v3 struct we pass (the declared v2 pointer type is the generic one).
    let mut code = unsafe {
        f(
            gi,
            profile_enum,
            CI_ENGINE_PROFILE_SHARED,
            (&raw mut v3).cast(),
        )
    };
    let mut profile = RawCiProfile {
        enum_index: profile_enum,
        id: v3.id,
        slice_count: v3.sliceCount,
        instance_count: v3.instanceCount,
    };
    if code == ERROR_ARGUMENT_VERSION_MISMATCH {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut v2: nvmlComputeInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        v2.version = struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2);
        // SAFETY: `gi` is live and `v2` is a valid, writable v2 struct tagged as v2.
        code = unsafe { f(gi, profile_enum, CI_ENGINE_PROFILE_SHARED, &mut v2) };
        profile = RawCiProfile {
            enum_index: profile_enum,
            id: v2.id,
            slice_count: v2.sliceCount,
            instance_count: v2.instanceCount,
        };
    }
    match check(lib, CALL, code) {
        Ok(()) => Ok(Some(profile)),
        Err(e) if e.code == Some(ERROR_NOT_SUPPORTED) => Ok(None),
        Err(e) => Err(e),
    }
}

fn ci_profiles_of(lib: &NvmlLib, gi: nvmlGpuInstance_t) -> RawResult<Vec<RawCiProfile>> {
    let mut out = Vec::new();
    for profile_enum in 0..MAX_PROFILE_ENUM {
        match ci_profile_info(lib, gi, profile_enum) {
            Ok(Some(p)) => out.push(p),
            Ok(None) => {}
            Err(e) if e.code == Some(ERROR_INVALID_ARGUMENT) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Compute-instance profiles supported inside the GI with this id.
pub(crate) fn ci_profiles(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
) -> RawResult<Vec<RawCiProfile>> {
    let lib = nvml.lib();
    let gi = gi_by_id(lib, handle(device), gi_id)?;
    ci_profiles_of(lib, gi)
}

/// What `nvmlComputeInstanceGetInfo_v2` says about a compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawCiInfo {
    /// CI id.
    pub id: u32,
    /// CI profile id.
    pub profile_id: u32,
}

fn ci_info(lib: &NvmlLib, ci: nvmlComputeInstance_t) -> RawResult<RawCiInfo> {
    let f = sym!(lib, nvmlComputeInstanceGetInfo_v2);
    // SAFETY: all-zero (NULL handles included) is a valid value of this C struct.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `ci` is a compute-instance handle NVML just returned; `info` is writable.
    let code = unsafe { f(ci, &mut info) };
    check(lib, "nvmlComputeInstanceGetInfo_v2", code)?;
    Ok(RawCiInfo {
        id: info.id,
        profile_id: info.profileId,
    })
}

/// Every compute instance inside the GI with this id, over all its CI profiles.
pub(crate) fn compute_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
) -> RawResult<Vec<RawCiInfo>> {
    let lib = nvml.lib();
    let gi = gi_by_id(lib, handle(device), gi_id)?;
    let f = sym!(lib, nvmlGpuInstanceGetComputeInstances);
    let mut out: Vec<RawCiInfo> = Vec::new();
    let mut seen_ids = Vec::new();
    for profile in ci_profiles_of(lib, gi)? {
        if seen_ids.contains(&profile.id) {
            continue;
        }
        seen_ids.push(profile.id);
        let capacity = profile.instance_count.max(1);
        let mut buf: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); capacity as usize];
        let mut count: c_uint = capacity;
        // SAFETY: `gi` is live; `buf` has room for the profile's instance count, the
        // most NVML writes; `count` receives how many it wrote.
        let code = unsafe { f(gi, profile.id, buf.as_mut_ptr(), &mut count) };
        check(lib, "nvmlGpuInstanceGetComputeInstances", code)?;
        buf.truncate(count.min(capacity) as usize);
        for ci in buf {
            out.push(ci_info(lib, ci)?);
        }
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

/// `nvmlGpuInstanceCreateComputeInstance` of a CI profile id in the GI with this id.
pub(crate) fn create_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    ci_profile_id: u32,
) -> RawResult<RawCiInfo> {
    let lib = nvml.lib();
    let gi = gi_by_id(lib, handle(device), gi_id)?;
    let f = sym!(lib, nvmlGpuInstanceCreateComputeInstance);
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `gi` is a live GI handle; `ci` is a writable handle slot.
    let code = unsafe { f(gi, ci_profile_id, &mut ci) };
    check(lib, "nvmlGpuInstanceCreateComputeInstance", code)?;
    ci_info(lib, ci)
}

/// `nvmlComputeInstanceDestroy` of the CI with this id in the GI with this id.
pub(crate) fn destroy_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    ci_id: u32,
) -> RawResult<()> {
    let lib = nvml.lib();
    let gi = gi_by_id(lib, handle(device), gi_id)?;
    let by_id = sym!(lib, nvmlGpuInstanceGetComputeInstanceById);
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `gi` is a live GI handle; `ci` is a writable handle slot.
    let code = unsafe { by_id(gi, ci_id, &mut ci) };
    check(lib, "nvmlGpuInstanceGetComputeInstanceById", code)?;
    let f = sym!(lib, nvmlComputeInstanceDestroy);
    // SAFETY: `ci` is the handle NVML just returned for this id; it is not used after.
    let code = unsafe { f(ci) };
    check(lib, "nvmlComputeInstanceDestroy", code)
}

/// One MIG device slot as the raw calls report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawMigDevice {
    /// Slot index under the parent.
    pub index: u32,
    /// `MIG-…` uuid.
    pub uuid: String,
    /// GI id.
    pub gpu_instance_id: u32,
    /// CI id.
    pub compute_instance_id: u32,
    /// Total memory in bytes.
    pub memory_bytes: u64,
}

/// `nvmlDeviceGetMaxMigDeviceCount`, then `nvmlDeviceGetMigDeviceHandleByIndex` for
/// each slot (skipping empty ones, `NOT_FOUND`), with uuid, GI/CI ids and memory.
pub(crate) fn mig_devices(nvml: &Nvml, device: &Device<'_>) -> RawResult<Vec<RawMigDevice>> {
    let lib = nvml.lib();
    let dev = handle(device);
    let max_count = sym!(lib, nvmlDeviceGetMaxMigDeviceCount);
    let by_index = sym!(lib, nvmlDeviceGetMigDeviceHandleByIndex);
    let uuid_of = sym!(lib, nvmlDeviceGetUUID);
    let gi_id_of = sym!(lib, nvmlDeviceGetGpuInstanceId);
    let ci_id_of = sym!(lib, nvmlDeviceGetComputeInstanceId);
    let memory_of = sym!(lib, nvmlDeviceGetMemoryInfo);

    let mut max: c_uint = 0;
    // SAFETY: `dev` is a live device handle; `max` is writable.
    let code = unsafe { max_count(dev, &mut max) };
    check(lib, "nvmlDeviceGetMaxMigDeviceCount", code)?;

    let mut out = Vec::new();
    for index in 0..max {
        let mut mig: nvmlDevice_t = ptr::null_mut();
        // SAFETY: `dev` is live; `mig` is a writable handle slot.
        let code = unsafe { by_index(dev, index, &mut mig) };
        if code == ERROR_NOT_FOUND {
            continue;
        }
        check(lib, "nvmlDeviceGetMigDeviceHandleByIndex", code)?;

        let mut uuid: [c_char; UUID_BUFFER] = [0; UUID_BUFFER];
        // SAFETY: `mig` is the MIG handle NVML just returned; `uuid` is a writable
        // buffer of the length passed.
        let code = unsafe { uuid_of(mig, uuid.as_mut_ptr(), UUID_BUFFER as c_uint) };
        check(lib, "nvmlDeviceGetUUID", code)?;

        let mut gi_id: c_uint = 0;
        // SAFETY: `mig` is a live MIG handle; `gi_id` is writable.
        let code = unsafe { gi_id_of(mig, &mut gi_id) };
        check(lib, "nvmlDeviceGetGpuInstanceId", code)?;

        let mut ci_id: c_uint = 0;
        // SAFETY: `mig` is a live MIG handle; `ci_id` is writable.
        let code = unsafe { ci_id_of(mig, &mut ci_id) };
        check(lib, "nvmlDeviceGetComputeInstanceId", code)?;

        let mut memory = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: `mig` is a live MIG handle; `memory` is a writable struct.
        let code = unsafe { memory_of(mig, &mut memory) };
        check(lib, "nvmlDeviceGetMemoryInfo", code)?;

        out.push(RawMigDevice {
            index,
            uuid: c_chars_to_string(&uuid),
            gpu_instance_id: gi_id,
            compute_instance_id: ci_id,
            memory_bytes: memory.total,
        });
    }
    Ok(out)
}

/// Total memory of a device in bytes through the unversioned `nvmlDeviceGetMemoryInfo`
/// (fallback for libraries without `nvmlDeviceGetMemoryInfo_v2`).
pub(crate) fn memory_total_v1(nvml: &Nvml, device: &Device<'_>) -> RawResult<u64> {
    let lib = nvml.lib();
    let f = sym!(lib, nvmlDeviceGetMemoryInfo);
    let mut memory = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: the device handle is live; `memory` is a writable struct.
    let code = unsafe { f(handle(device), &mut memory) };
    check(lib, "nvmlDeviceGetMemoryInfo", code)?;
    Ok(memory.total)
}

/// A device's handle as a plain number, to match the device of an event
/// ([`RawEvent::device`]) without keeping raw handles around.
pub(crate) fn device_key(device: &Device<'_>) -> usize {
    handle(device).addr()
}

/// An NVML event set, made by [`event_set_create`]; give it back with
/// [`event_set_free`] before the `Nvml` it came from shuts down.
#[derive(Debug)]
pub(crate) struct RawEventSet {
    set: nvmlEventSet_t,
}

// SAFETY: an event set is an opaque token the NVML library owns; NVML is
// thread-safe, and this module only passes the token to NVML calls (never
// dereferences it), so it may move to and be used from another thread.
unsafe impl Send for RawEventSet {}

/// One event as `nvmlEventSetWait_v2` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawEvent {
    /// [`device_key`] of the GPU the event happened on.
    pub device: usize,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// The XID, for an XID event.
    pub data: u64,
    /// GPU-instance id, or [`VALUE_NOT_AVAILABLE_UINT`].
    pub gpu_instance_id: u32,
    /// Compute-instance id, or [`VALUE_NOT_AVAILABLE_UINT`].
    pub compute_instance_id: u32,
}

/// `nvmlEventSetCreate`.
pub(crate) fn event_set_create(nvml: &Nvml) -> RawResult<RawEventSet> {
    let lib = nvml.lib();
    let f = sym!(lib, nvmlEventSetCreate);
    let mut set: nvmlEventSet_t = ptr::null_mut();
    // SAFETY: `set` is a writable handle slot.
    let code = unsafe { f(&mut set) };
    check(lib, "nvmlEventSetCreate", code)?;
    Ok(RawEventSet { set })
}

/// `nvmlDeviceGetSupportedEventTypes`: the `nvmlEventType*` bits the GPU can report.
pub(crate) fn supported_event_types(nvml: &Nvml, device: &Device<'_>) -> RawResult<u64> {
    let lib = nvml.lib();
    let f = sym!(lib, nvmlDeviceGetSupportedEventTypes);
    let mut types: u64 = 0;
    // SAFETY: the device handle is live; `types` is writable.
    let code = unsafe { f(handle(device), &mut types) };
    check(lib, "nvmlDeviceGetSupportedEventTypes", code)?;
    Ok(types)
}

/// `nvmlDeviceRegisterEvents`: adds the GPU's events of `types` to `set`.
pub(crate) fn register_events(
    nvml: &Nvml,
    device: &Device<'_>,
    types: u64,
    set: &RawEventSet,
) -> RawResult<()> {
    let lib = nvml.lib();
    let f = sym!(lib, nvmlDeviceRegisterEvents);
    // SAFETY: the device handle is live and `set.set` is a set this library made
    // and has not freed (`event_set_free` consumes the `RawEventSet`).
    let code = unsafe { f(handle(device), types, set.set) };
    check(lib, "nvmlDeviceRegisterEvents", code)
}

/// `nvmlEventSetWait_v2` for up to `timeout_ms`: `Ok(None)` on `TIMEOUT`.
pub(crate) fn event_set_wait(
    nvml: &Nvml,
    set: &RawEventSet,
    timeout_ms: u32,
) -> RawResult<Option<RawEvent>> {
    let lib = nvml.lib();
    let f = sym!(lib, nvmlEventSetWait_v2);
    // SAFETY: all-zero (a NULL device handle included) is a valid value of this C struct.
    let mut data: nvmlEventData_t = unsafe { mem::zeroed() };
    // SAFETY: `set.set` is a live set of this library (see `register_events`);
    // `data` is a valid, writable struct of the type the function fills.
    let code = unsafe { f(set.set, &mut data, timeout_ms) };
    if code == ERROR_TIMEOUT {
        return Ok(None);
    }
    check(lib, "nvmlEventSetWait_v2", code)?;
    Ok(Some(RawEvent {
        device: data.device.addr(),
        event_type: data.eventType,
        data: data.eventData,
        gpu_instance_id: data.gpuInstanceId,
        compute_instance_id: data.computeInstanceId,
    }))
}

/// `nvmlEventSetFree`.
pub(crate) fn event_set_free(nvml: &Nvml, set: RawEventSet) -> RawResult<()> {
    let lib = nvml.lib();
    let f = sym!(lib, nvmlEventSetFree);
    // SAFETY: `set.set` is a live set of this library, consumed here so it is
    // never used again.
    let code = unsafe { f(set.set) };
    check(lib, "nvmlEventSetFree", code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_versions_follow_nvml_struct_version() {
        assert_eq!(
            struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3),
            (mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() as u32) | 0x0300_0000
        );
        assert_eq!(mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 152);
        assert_eq!(mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>(), 152);
    }

    #[test]
    fn c_chars_stop_at_nul() {
        let mut buf = [0 as c_char; 16];
        for (i, b) in b"MIG 1g.10gb".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(c_chars_to_string(&buf), "MIG 1g.10gb");
        assert_eq!(c_chars_to_string(&[0; 4]), "");
        assert_eq!(c_chars_to_string(&[b'a' as c_char; 3]), "aaa");
    }
}
