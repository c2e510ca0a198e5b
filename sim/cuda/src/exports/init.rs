//! Initialisation, versions, error descriptions, and the simulator's own query.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use crate::clock;
use crate::config;
use crate::driver;
use crate::ffi::*;
use crate::out;
use crate::publish;

use super::entry;

/// `cuInit`: reads the node (or the default configuration) and the
/// environment once; `CUDA_ERROR_NO_DEVICE` when no device is visible or a
/// node named by `TESSERA_SIM_ROOT` cannot be read (one line on stderr
/// says why). `Flags` must be 0.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    entry(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        publish::start(driver::init()?);
        Ok(())
    })
}

/// `cuDriverGetVersion`: the node's CUDA driver version (12080 without a
/// node); needs no `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(driver_version: *mut c_int) -> CuResult {
    entry(|| {
        let version = match driver::get() {
            Ok(d) => d.config.driver_version,
            Err(_) => config::driver_version(),
        };
        // SAFETY: cuda.h contract: `driverVersion` is null or valid for one write.
        unsafe { out::write(driver_version, version) }
    })
}

fn describe(
    error: CuResult,
    p_str: *mut *const c_char,
    text: fn(CuResult) -> Option<&'static std::ffi::CStr>,
) -> CuResult {
    entry(|| match text(error) {
        Some(s) => {
            // SAFETY: cuda.h contract: `pStr` is null or valid for one write.
            unsafe { out::write(p_str, s.as_ptr()) }
        }
        None => {
            // SAFETY: as above; the driver stores NULL for an unknown code.
            let _ = unsafe { out::write(p_str, std::ptr::null()) };
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// `cuGetErrorString`: a static description; `INVALID_VALUE` (and NULL)
/// for an unknown code. Needs no `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CuResult, p_str: *mut *const c_char) -> CuResult {
    describe(error, p_str, error_string)
}

/// `cuGetErrorName`: the enum name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CuResult, p_str: *mut *const c_char) -> CuResult {
    describe(error, p_str, error_name)
}

/// Not part of CUDA: the device time this process's work on device `dev`
/// has used so far (never biased, unlike what it publishes for NVML), and
/// the `CLOCK_MONOTONIC` time it was read at, both in ns. What `tessera-cuda-probe launch` reports as the busy fraction.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraSimCudaGetBusyNs(
    dev: CuDevice,
    busy_ns: *mut c_ulonglong,
    now_ns: *mut c_ulonglong,
) -> CuResult {
    entry(|| {
        let d = driver::get()?.device(dev)?;
        let now = clock::monotonic_ns();
        let busy = d.timeline.completed_ns(now);
        // SAFETY: both pointers are null or valid for one write (our contract).
        unsafe {
            out::write(busy_ns, busy)?;
            if !now_ns.is_null() {
                out::write(now_ns, now)?;
            }
        }
        Ok(())
    })
}
