//! The region file's layout (`#[repr(C)]`, atomics only), and its byte
//! offsets for tools that read it (metrics, tests). All values are
//! little-endian.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

use super::{MAX_DEVICES, MAX_PROCESSES};

#[repr(C, align(64))]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    pub(super) version: AtomicU32,
    pub(super) header_size: AtomicU32,
    pub(super) layout_size: AtomicU64,
    pub(super) max_devices: AtomicU32,
    pub(super) max_processes: AtomicU32,
    /// Highest device count any process opened the region with.
    pub(super) device_count: AtomicU32,
}

#[repr(C, align(64))]
pub(super) struct Device {
    /// Hash of the device's UUID (never 0 once claimed), 0 while free.
    pub(super) uuid_hash: AtomicU64,
    /// Bytes in use by the whole container.
    pub(super) used: AtomicU64,
}

#[repr(C, align(64))]
pub(super) struct Slot {
    /// The owner's pid in its own pid namespace (informational: liveness is
    /// the slot lock, never this number).
    pub(super) pid: AtomicU32,
    pub(super) _reserved: AtomicU32,
    /// `/proc/<pid>/stat` field 22 of the owner; 0 when unknown (informational).
    pub(super) start_time: AtomicU64,
    /// Inode of the owner's `/proc/self/ns/pid`; 0 when unknown (informational).
    pub(super) pid_ns: AtomicU64,
    pub(super) _reserved2: AtomicU64,
    pub(super) used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
pub(super) struct Layout {
    pub(super) header: Header,
    pub(super) devices: [Device; MAX_DEVICES],
    pub(super) slots: [Slot; MAX_PROCESSES],
}

/// Size of the whole file.
pub const SIZE: usize = size_of::<Layout>();
/// Offset of the header's `version` (u32).
pub const VERSION: usize = offset_of!(Header, version);
/// Offset of the header's `layout_size` (u64).
pub const LAYOUT_SIZE: usize = offset_of!(Header, layout_size);
/// Offset of the first device entry.
pub const DEVICES: usize = offset_of!(Layout, devices);
/// Stride of the device entries.
pub const DEVICE_SIZE: usize = size_of::<Device>();
/// Offset of `uuid_hash` (u64) in a device entry.
pub const DEVICE_UUID_HASH: usize = offset_of!(Device, uuid_hash);
/// Offset of `used` (u64, the container's total) in a device entry.
pub const DEVICE_USED: usize = offset_of!(Device, used);
/// Offset of the first process slot.
pub const SLOTS: usize = offset_of!(Layout, slots);
/// Size of one process slot; the slot's lock is on its first byte.
pub const SLOT_SIZE: usize = size_of::<Slot>();
/// Offset of `pid` (u32) in a slot.
pub const SLOT_PID: usize = offset_of!(Slot, pid);
/// Offset of `start_time` (u64) in a slot.
pub const SLOT_START_TIME: usize = offset_of!(Slot, start_time);
/// Offset of `pid_ns` (u64) in a slot.
pub const SLOT_PID_NS: usize = offset_of!(Slot, pid_ns);
/// Offset of `used` (u64 × [`MAX_DEVICES`]) in a slot.
pub const SLOT_USED: usize = offset_of!(Slot, used);

const _: () = assert!(SIZE == 64 + 16 * 64 + 1024 * 192);
const _: () = assert!(SLOTS + MAX_PROCESSES * SLOT_SIZE == SIZE);
const _: () = assert!(SLOT_USED + MAX_DEVICES * 8 <= SLOT_SIZE);
const _: () = assert!(DEVICES + MAX_DEVICES * DEVICE_SIZE == SLOTS);
