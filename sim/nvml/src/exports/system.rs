//! Library lifetime and system queries.

use std::ffi::{c_char, c_int, c_uint};

use crate::ffi::*;
use crate::node;
use crate::out;

use super::{answer, entry};

// Exports never call each other: a program's own symbol of the same name
// could stand in for the callee. They share private functions instead.

fn init() -> NvmlReturn {
    entry(|| match node::init() {
        SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// `nvmlInit_v2`: finds the node and loads its state; reference-counted.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    init()
}

/// `nvmlInit` (the NVML 1 name): same as [`nvmlInit_v2`].
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    init()
}

/// `nvmlInitWithFlags`: same as [`nvmlInit_v2`]; the flags (`NO_GPUS`,
/// `NO_ATTACH`, `FORCE_INIT`) change nothing for a simulated node, which
/// never fails for want of GPUs and has nothing to attach.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    init()
}

/// `nvmlShutdown`: drops one init reference; `UNINITIALIZED` when none is left.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    entry(|| match node::shutdown() {
        SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// `nvmlErrorString`: a static description of `result` (needs no init).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    std::panic::catch_unwind(|| error_string(result))
        .unwrap_or(c"Unknown Error")
        .as_ptr()
}

fn error_string(result: NvmlReturn) -> &'static std::ffi::CStr {
    match result {
        SUCCESS => c"Success",
        ERROR_UNINITIALIZED => c"Uninitialized",
        ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ERROR_NOT_SUPPORTED => c"Not Supported",
        ERROR_NO_PERMISSION => c"Insufficient Permissions",
        ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        ERROR_NOT_FOUND => c"Not Found",
        ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        ERROR_TIMEOUT => c"Timeout",
        ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        ERROR_GPU_IS_LOST => c"GPU is lost",
        ERROR_RESET_REQUIRED => c"GPU requires restart",
        ERROR_OPERATING_SYSTEM => c"The operating system has blocked the request.",
        ERROR_LIB_RM_VERSION_MISMATCH => c"RM has detected an NVML/RM version mismatch.",
        ERROR_IN_USE => c"In use by another client",
        ERROR_MEMORY => c"Insufficient Memory",
        ERROR_NO_DATA => c"No data",
        ERROR_VGPU_ECC_NOT_SUPPORTED => {
            c"The requested vgpu operation is not available on target device, because ECC is enabled"
        }
        ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
        ERROR_FREQ_NOT_SUPPORTED => c"Frequency not supported",
        ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        ERROR_DEPRECATED => c"Deprecated",
        ERROR_NOT_READY => c"Not ready",
        ERROR_GPU_NOT_FOUND => c"GPU not found",
        ERROR_INVALID_STATE => c"Invalid state",
        ERROR_RESET_TYPE_NOT_SUPPORTED => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}

/// `nvmlSystemGetDriverVersion`: the node's driver version, e.g. `570.133.20`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    entry(|| {
        let text = node::read(|s| Ok(s.driver_version.clone()))?;
        // SAFETY: NVML contract: `version` is null or holds `length` bytes.
        unsafe { out::write_str(version, length, &text) }
    })
}

/// `nvmlSystemGetNVMLVersion`: `<CUDA major>.<driver version>`, e.g.
/// `12.570.133.20`, the shape real NVML reports.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    entry(|| {
        let text = node::read(|s| {
            Ok(format!(
                "{}.{}",
                s.cuda_driver_version / 1000,
                s.driver_version
            ))
        })?;
        // SAFETY: NVML contract: `version` is null or holds `length` bytes.
        unsafe { out::write_str(version, length, &text) }
    })
}

/// # Safety
/// `out_version` is null or valid for writing one int.
unsafe fn write_cuda_version(out_version: *mut c_int) -> NvmlReturn {
    // SAFETY: NVML contract: the pointer is null or valid for one int.
    unsafe { answer(out_version, |s| Ok(s.cuda_driver_version)) }
}

/// `nvmlSystemGetCudaDriverVersion`: the node's CUDA driver version (`12080` = 12.8).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cuda_driver_version: *mut c_int,
) -> NvmlReturn {
    // SAFETY: the caller's contract is the helper's.
    unsafe { write_cuda_version(cuda_driver_version) }
}

/// `nvmlSystemGetCudaDriverVersion_v2`: same as the unversioned call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cuda_driver_version: *mut c_int,
) -> NvmlReturn {
    // SAFETY: the caller's contract is the helper's.
    unsafe { write_cuda_version(cuda_driver_version) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_has_its_own_text() {
        let codes = (0..=30).chain([999]);
        let texts: std::collections::HashSet<_> = codes.map(error_string).collect();
        assert_eq!(texts.len(), 32);
        assert_eq!(error_string(12345), c"Unknown Error");
    }
}
