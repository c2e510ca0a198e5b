//! One GPU memory budget per container, shared by all its processes.
//!
//! The budget lives in a file in the accounting directory (`vgpu.accounting`
//! in `/var/run/tessera/`), mapped `MAP_SHARED` by every process that uses
//! CUDA. Its layout is fixed (`#[repr(C)]`, atomics only; [`layout`] gives the
//! offsets for tools):
//!
//! ```text
//! header      64 B         magic "TSSRVGPU", layout version 2, sizes
//! devices     16 × 64 B    per device: uuid hash, used bytes of the whole container;
//!                          the node monitor's published utilization, NVML memory, stamp
//! slots     1024 × 192 B   per process: pid, start time, pid namespace, used bytes per device
//! ```
//!
//! # No lock anyone can hold
//!
//! Nothing here waits for another process. Readers of the file (any process
//! that can open it) can take `flock`s and byte-range locks on it; a design
//! that waited on such a lock would let any reader stall or split the budget.
//!
//! - [`SharedRegion::try_charge`] is one compare-and-swap on the device total
//!   (the total never exceeds the limit, whatever the number of processes and
//!   threads), then an add to the process's own slot.
//! - [`SharedRegion::uncharge`] takes from the slot first, then the same
//!   amount from the total; both saturate, and a process never takes away
//!   more than it charged, so a double free cannot erase others' usage.
//! - **A slot belongs to whoever holds the open-file-description lock
//!   (`F_OFD_SETLK`, write lock) on the slot's first byte.** The kernel drops
//!   that lock when the process exits or `exec`s (the descriptor is
//!   close-on-exec), however it ends and in whatever pid namespace it ran: a
//!   container restart gets its dead processes' memory back, and pid reuse
//!   means nothing. Claiming a slot and testing an owner for life are the same
//!   non-blocking call: it succeeds only when no live process holds the slot.
//!   A process that holds a read lock on a slot's byte makes that slot look
//!   alive — which over-counts (refuses memory), never under-counts.
//! - Initialization is idempotent (constant header fields, the magic written
//!   last), and device UUIDs are claimed by one compare-and-swap of a 64-bit
//!   hash, so two processes starting at once need no lock either.
//! - After `fork` the child holds the parent's open file description (its
//!   descriptor and its mapping both reference it), and so the parent's slot
//!   lock: a `pthread_atfork` handler gives the child a description of its
//!   own (reopened through `/proc/self/fd`, mapped over the old mapping and
//!   `dup3`ed over the inherited number) so the parent's slot dies with the
//!   parent, and the first charge in the child claims a slot of its own.
//!
//! Order of updates, chosen so that a process dying between two steps leaves
//! the container over-counted (safe), never under-counted: charge adds to the
//! total before the slot; uncharge takes from the slot before the total.
//!
//! # Who makes the file
//!
//! The library never creates the file, and never replaces one: the node side
//! does (`tessera-hook` makes `accounting/vgpu.accounting`, mode 0666, in a
//! root-owned 0755 directory, so the workload can use it but not unlink or
//! replace it). An empty or zero-filled file is initialized by its first user.
//! A missing file, a directory that group or others may write, or a file that
//! is not this layout is an error, and the library then fails closed.
//!
//! Trust: the file is writable by the container's processes, by design (any
//! uid in the container shares the budget). A process that writes it directly
//! can corrupt its own container's accounting or truncate the file (which
//! makes the others fault); it cannot reach other containers.
//!
//! # Files, by subject
//!
//! [`layout`] (the file's layout and offsets), `error` ([`AccountingError`]),
//! `file` (opening and checking the file; [`create_file`] for the node side),
//! `region` ([`SharedRegion`]: mapping and initialization), `slots` (slot
//! ownership and its locks), `fork` (fork handling and process identity),
//! `devices` (device claims), `usage` (charges and reads).

mod devices;
mod error;
mod file;
mod fork;
pub mod layout;
mod region;
mod slots;
mod usage;

pub use error::AccountingError;
pub use file::create_file;
pub use region::SharedRegion;
pub use usage::monotonic_ms;

/// Devices one region accounts for: the contract's limit (16, HAMi-core's
/// too). Part of the file's layout: [`layout`] checks the size it makes.
pub const MAX_DEVICES: usize = tessera_model::vgpu_region::MAX_DEVICES;

/// Processes one region can register at once.
pub const MAX_PROCESSES: usize = tessera_model::vgpu_region::MAX_PROCESSES;

/// The layout version this library reads and writes.
pub const LAYOUT_VERSION: u32 = tessera_model::vgpu_region::LAYOUT_VERSION;

/// First 8 bytes of a region file ("TSSRVGPU", little-endian).
pub const MAGIC: u64 = tessera_model::vgpu_region::MAGIC;

/// Longest device UUID [`SharedRegion::device_index`] accepts (after its prefix).
pub const MAX_UUID_BYTES: usize = tessera_model::vgpu_region::MAX_UUID_BYTES;

const NO_SLOT: u32 = u32::MAX;

#[cfg(test)]
mod test_support {
    use std::path::PathBuf;

    /// A fresh, empty region file in a directory removed when the guard drops.
    pub(super) fn temp_path(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(name);
        super::create_file(&path).expect("create region file");
        (dir, path)
    }

    /// A region for `devices` devices opened on a fresh [`temp_path`].
    pub(super) fn temp_region(
        name: &str,
        devices: usize,
    ) -> (tempfile::TempDir, super::SharedRegion) {
        let (dir, path) = temp_path(name);
        let region = super::SharedRegion::open(&path, devices).expect("open");
        (dir, region)
    }
}
