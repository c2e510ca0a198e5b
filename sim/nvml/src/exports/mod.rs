//! The exported NVML entry points.
//!
//! Each function is `extern "C"` with the exact signature of `nvml.h`, runs
//! its body through [`entry`] (a panic becomes `NVML_ERROR_UNKNOWN`, never an
//! unwind into C), takes what it needs from the node state under the
//! library's lock, and writes results to the caller's memory only after the
//! lock is released.
//!
//! The functions are `unsafe` because they take raw pointers; their safety
//! contract is the one `nvml.h` states for each parameter, which is why they
//! carry no `# Safety` sections of their own.
#![allow(
    clippy::missing_safety_doc,
    reason = "the contract of every export is NVML's, documented in nvml.h"
)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use tessera_sim::state::NodeState;

use crate::ffi::{ERROR_UNKNOWN, NvmlReturn, SUCCESS};
use crate::node::{self, Res};
use crate::out;

pub mod device;
pub mod event;
pub mod info;
pub mod mig;
pub mod process;
pub mod system;
pub mod unsupported;

/// Runs one call's body: `Ok` is `NVML_SUCCESS`, `Err` its code, a panic
/// `NVML_ERROR_UNKNOWN`.
fn entry(body: impl FnOnce() -> Res<()>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => ERROR_UNKNOWN,
    }
}

/// Runs a query call's body: reads one value from the node state under the
/// library's lock, then, the lock released, writes it through `result`.
///
/// # Safety
/// `result` is null or valid for one write of a `T`.
unsafe fn answer<T>(result: *mut T, query: impl FnOnce(&NodeState) -> Res<T>) -> NvmlReturn {
    entry(|| {
        let value = node::read(query)?;
        // SAFETY: the caller's contract.
        unsafe { out::write(result, value) }
    })
}
