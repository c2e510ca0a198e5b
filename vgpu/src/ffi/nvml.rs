//! NVML: `nvmlDeviceGetMemoryInfo[_v2]` report the slice (so `nvidia-smi`
//! in the container shows it), and NVML's per-process utilization is the
//! SM limiter's measurement ([`nvml_source`]).

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_uint, c_ulonglong};
use std::ptr::null_mut;

use super::driver::rt;
use super::guard::contained;
use super::resolve::{Internal, lookup_real, own_nvml_library};
use super::types::{
    Handle, NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND, NVML_SUCCESS, NvmlMemory, NvmlMemoryV2,
    NvmlProcessUtilizationSample, NvmlReturn,
};
use crate::limiter;

pub(super) type FnNvmlInit = unsafe extern "C" fn() -> NvmlReturn;
pub(super) type FnNvmlGetHandleByUuid =
    unsafe extern "C" fn(*const c_char, *mut Handle) -> NvmlReturn;
type FnNvmlGetUuid = unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> NvmlReturn;
type FnNvmlGetIndex = unsafe extern "C" fn(Handle, *mut c_uint) -> NvmlReturn;
type FnNvmlGetProcessUtilization = unsafe extern "C" fn(
    Handle,
    *mut NvmlProcessUtilizationSample,
    *mut c_uint,
    c_ulonglong,
) -> NvmlReturn;

static NVML_GET_UUID: Internal<FnNvmlGetUuid> = Internal::nvml(c"nvmlDeviceGetUUID");
static NVML_GET_INDEX: Internal<FnNvmlGetIndex> = Internal::nvml(c"nvmlDeviceGetIndex");

/// `(total, used)` of the slice of the NVML device, if it is limited.
fn nvml_slice(device: Handle) -> Option<(u64, u64)> {
    let rt = rt();
    if !rt.enforcing() {
        return None;
    }
    let get_uuid = NVML_GET_UUID.get()?;
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
    if let Some(get_index) = NVML_GET_INDEX.get() {
        // SAFETY: index is a valid out-pointer.
        let _ = unsafe { get_index(device, &mut index) };
    }
    let info = rt.device_by_uuid(&uuid, i32::try_from(index).unwrap_or(0));
    let limit = info.memory_limit?;
    // Closed accounting reports everything used (and nothing free), not
    // more than there is.
    Some((limit, rt.used(info.slot).min(limit)))
}

/// An NVML memory report of either version, as the slice tells it.
trait SliceReport {
    /// This report (as NVML filled it) with the slice's `total` and `used`.
    fn slice(self, total: u64, used: u64) -> Self;
}

impl SliceReport for NvmlMemory {
    fn slice(self, total: u64, used: u64) -> NvmlMemory {
        NvmlMemory {
            total,
            free: total.saturating_sub(used),
            used,
        }
    }
}

impl SliceReport for NvmlMemoryV2 {
    /// No memory is reserved in a slice.
    fn slice(self, total: u64, used: u64) -> NvmlMemoryV2 {
        NvmlMemoryV2 {
            version: self.version,
            total,
            reserved: 0,
            free: total.saturating_sub(used),
            used,
        }
    }
}

intercept! {
    /// `nvmlDeviceGetMemoryInfo`: the slice on a limited device (total =
    /// limit, used = the container's use, free = the rest), so `nvidia-smi`
    /// shows it.
    NvmlMemoryInfo => fn nvmlDeviceGetMemoryInfo(device: Handle, memory: *mut NvmlMemory)
        -> NvmlReturn, else NVML_ERROR_FUNCTION_NOT_FOUND;
    /// `nvmlDeviceGetMemoryInfo_v2`: as [`nvmlDeviceGetMemoryInfo()`], with no
    /// memory reserved.
    NvmlMemoryInfoV2 => fn nvmlDeviceGetMemoryInfo_v2(device: Handle, memory: *mut NvmlMemoryV2)
        -> NvmlReturn, else NVML_ERROR_FUNCTION_NOT_FOUND;
    |real, hook| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(device, memory) };
        if rc != NVML_SUCCESS || memory.is_null() {
            return rc;
        }
        if let Some(Some((total, used))) = contained(hook.symbol(), || nvml_slice(device)) {
            // SAFETY: memory is non-null and NVML just filled it (the
            // version the caller asked for, if versioned).
            unsafe { memory.write_unaligned(memory.read_unaligned().slice(total, used)) };
        }
        rc
    }
}

/// NVML as the SM limiter's measurement.
struct NvmlSource {
    get_handle: FnNvmlGetHandleByUuid,
    get_utilization: FnNvmlGetProcessUtilization,
    handles: HashMap<String, Handle>,
    last_seen: HashMap<String, u64>,
}

/// Opens NVML (loading `libnvidia-ml.so.1` if the program has not) for the
/// SM limiter.
pub(super) fn nvml_source() -> Result<Box<dyn limiter::UtilSource>, String> {
    let lib = own_nvml_library();
    if lib.is_null() {
        return Err("cannot load libnvidia-ml.so.1".into());
    }
    /// The function `name` of the library, whose C signature is `F`.
    fn sym<F: Copy>(lib: Handle, name: &CStr) -> Result<F, String> {
        const { assert!(size_of::<F>() == size_of::<Handle>()) };
        let p = lookup_real(lib, name);
        if p.is_null() {
            return Err(format!(
                "{} is not in libnvidia-ml.so.1",
                name.to_string_lossy()
            ));
        }
        // SAFETY: p is the NVML function of that name; each caller names
        // its C signature as `F` (same size, checked above).
        Ok(unsafe { std::mem::transmute_copy::<Handle, F>(&p) })
    }
    let init: FnNvmlInit = sym(lib, c"nvmlInit_v2")?;
    let get_handle: FnNvmlGetHandleByUuid = sym(lib, c"nvmlDeviceGetHandleByUUID")?;
    let get_utilization: FnNvmlGetProcessUtilization =
        sym(lib, c"nvmlDeviceGetProcessUtilization")?;
    // SAFETY: nvmlInit_v2 takes no arguments; NVML counts inits.
    let rc = unsafe { init() };
    if rc != NVML_SUCCESS {
        return Err(format!("nvmlInit_v2 failed ({rc})"));
    }
    Ok(Box::new(NvmlSource {
        get_handle,
        get_utilization,
        handles: HashMap::new(),
        last_seen: HashMap::new(),
    }))
}

impl limiter::UtilSource for NvmlSource {
    fn utilization(&mut self, uuid: &str, pids: &[u32]) -> Option<limiter::Sampled> {
        let device = match self.handles.get(uuid) {
            Some(&h) => h,
            None => {
                let name = CString::new(uuid).ok()?;
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
