//! Tessera's domain model.
//!
//! Pure data and rules, no I/O and no `unsafe`: the GPU inventory as the driver
//! reports it, the MIG profile catalogue and placement engine, the CDI spec
//! types with their naming and versioning rules, and the pure step that turns
//! discovered node facts into CDI container edits.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod alloc;
pub mod cdi;
pub mod contract;
pub mod driver_files;
pub mod edits;
pub mod facts;
pub mod gpu;
pub mod mig;
pub mod proc;
pub mod sched;
pub mod vgpu;
pub mod vgpu_region;
