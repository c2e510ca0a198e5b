//! The exported driver entry points.
//!
//! Each function is `extern "C"` with the exact signature of `cuda.h`
//! (CUDA 12.x), runs its body through [`entry`] (a panic becomes
//! `CUDA_ERROR_UNKNOWN`, never an unwind into C), and never calls another
//! export: a program's own symbol of the same name could stand in for the
//! callee. Shared behaviour lives in private functions.
//!
//! The functions are `unsafe` because they take raw pointers; their safety
//! contract is the one `cuda.h` states for each parameter, which is why they
//! carry no `# Safety` sections of their own.
#![allow(
    clippy::missing_safety_doc,
    reason = "the contract of every export is the CUDA driver API's, documented in cuda.h"
)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::driver::{self, Driver, Res};
use crate::ffi::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CuResult};
use crate::handle::{Handle, Kind};

pub mod context;
pub mod device;
pub mod init;
pub mod launch;
pub mod memory;
pub mod procaddr;

/// Runs one call's body: `Ok` is `CUDA_SUCCESS`, `Err` its code, a panic
/// `CUDA_ERROR_UNKNOWN`.
#[inline(always)]
fn entry(body: impl FnOnce() -> Res<()>) -> CuResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// [`entry`] for a body that needs the driver: `CUDA_ERROR_NOT_INITIALIZED`
/// until `cuInit` has succeeded.
#[inline(always)]
fn with_driver(body: impl FnOnce(&'static Driver) -> Res<()>) -> CuResult {
    entry(|| body(driver::get()?))
}

/// [`with_driver`] for a body about one handle of `kind`: `invalid` (before
/// the driver is asked for) when `raw` is not such a handle of this library's.
#[inline(always)]
fn with_handle<T>(
    raw: *mut T,
    kind: Kind,
    invalid: CuResult,
    body: impl FnOnce(&'static Driver, Handle) -> Res<()>,
) -> CuResult {
    entry(|| {
        let handle = Handle::of(raw, kind).ok_or(invalid)?;
        body(driver::get()?, handle)
    })
}
