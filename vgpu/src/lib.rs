//! `libtessera_vgpu.so`: the CUDA driver API and NVML interception that
//! enforces a container's vGPU slice (memory limit, SM share) inside the
//! workload, loaded into every process of the container through
//! `/etc/ld.so.preload`.
//!
//! # Routes into the library
//!
//! A program reaches the driver in one of three ways, and each one lands on
//! the same wrappers ([`names`] maps names to hooks, `ffi` holds them):
//!
//! 1. **Direct symbols.** A program linked to `libcuda.so.1` binds
//!    `cuMemAlloc_v2` & co. to the first definition in load order: the
//!    preloaded library's exports.
//! 2. **`cuGetProcAddress` / `_v2`.** Every CUDA ≥ 11.3 runtime resolves the
//!    driver this way. The exported `cuGetProcAddress[_v2]` calls the real
//!    one, then replaces the answer for intercepted functions (picked by
//!    base name, CUDA version and default-stream flag, or by exact
//!    versioned name) with the wrapper.
//! 3. **`dlsym` on a `dlopen`ed library.** The exported `dlsym` answers
//!    intercepted names with wrappers when the handle has the real symbol,
//!    and passes everything else to the real `dlsym`
//!    (`dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`) with the caller's
//!    return address intact (x86-64).
//!
//! The real functions are resolved once and cached in atomics; no call
//! looks anything up twice.
//!
//! # What is enforced
//!
//! - **Memory** ([`memory`]): every allocation API charges the container's
//!   budget for the device *before* calling the driver, and gives it back
//!   if the driver fails or when the driver has really freed it (an O(1)
//!   table lookup). Over the limit: `CUDA_ERROR_OUT_OF_MEMORY`, the driver
//!   never called. `cuMemGetInfo_v2`, `cuDeviceTotalMem_v2` and NVML's
//!   `nvmlDeviceGetMemoryInfo[_v2]` report the slice.
//! - **Lifetimes**: VMM memory counts while a handle reference or a mapping
//!   remains ([`vmm`]); a stream-ordered pool is charged for what it holds,
//!   not what is allocated from it ([`pools`]); a destroyed, released or
//!   reset context gives back what it held, and its own memory and malloc
//!   heap are counted ([`contexts`]).
//! - **One budget per container**: usage lives in a shared, crash-safe
//!   region the node side creates ([`accounting`]); slots are owned through
//!   locks the kernel drops at exit in any pid namespace; a failed charge
//!   reclaims what dead processes left and retries once. A region that cannot
//!   be opened fails closed.
//! - **Compute** ([`limiter`]): a token bucket per device, refilled at a
//!   rate set by a feedback controller from NVML's per-process SM
//!   utilization; kernel and graph launches wait for tokens.
//! - **Oversubscription**: with `memory_scaling > 1` and `oversubscribe`,
//!   `cuMemAlloc_v2` falls back to managed (host-backed) memory when the
//!   device is physically full but the slice is not.
//!
//! # Never break the workload
//!
//! Every exported function catches panics; an internal failure prints one
//! line (`tessera-vgpu: …`, per [`log`] level) and the call passes through.
//! The exceptions are a malformed authoritative limits file and a region
//! that cannot be opened, which fail closed (see [`runtime`]). Without an SM limit, `cuLaunchKernel` costs one
//! relaxed atomic load and a tail call.

pub mod accounting;
pub mod alloc_table;
pub mod arrays;
mod backend;
pub mod config;
pub mod contexts;
mod ffi;
pub mod limiter;
pub mod log;
pub mod memory;
pub mod names;
pub mod pools;
pub mod runtime;
pub mod vmm;
