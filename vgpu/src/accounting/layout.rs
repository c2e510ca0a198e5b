//! The region file's layout (`#[repr(C)]`, atomics only), and its byte
//! offsets for tools that read it (metrics, tests). All values are
//! little-endian.
//!
//! The numbers are defined once, in `tessera_model::vgpu_region` (the device
//! plugin maps the same file); the structs here are checked against them at
//! compile time, field by field.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

use tessera_model::vgpu_region as model;

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
    /// Published by the node monitor: the allocation's SM utilization on
    /// this device, per mille.
    pub(super) sm_permille: AtomicU32,
    /// Published by the node monitor: the allocation's processes NVML sees.
    pub(super) processes: AtomicU32,
    /// Published by the node monitor: CLOCK_MONOTONIC ms; 0: never.
    pub(super) published_ms: AtomicU64,
    /// Published by the node monitor: device bytes of those processes (NVML).
    pub(super) nvml_used: AtomicU64,
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
/// Offset of the published SM utilization (u32, per mille) in a device entry.
pub const DEVICE_SM_PERMILLE: usize = offset_of!(Device, sm_permille);
/// Offset of the publication stamp (u64, CLOCK_MONOTONIC ms) in a device entry.
pub const DEVICE_PUBLISHED_MS: usize = offset_of!(Device, published_ms);
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

// The structs are the model's layout, field by field.
const _: () = assert!(SIZE == model::SIZE);
const _: () = assert!(size_of::<Header>() == model::HEADER_SIZE);
const _: () = assert!(offset_of!(Header, magic) == model::HEADER_MAGIC);
const _: () = assert!(VERSION == model::HEADER_VERSION);
const _: () = assert!(offset_of!(Header, header_size) == model::HEADER_HEADER_SIZE);
const _: () = assert!(LAYOUT_SIZE == model::HEADER_LAYOUT_SIZE);
const _: () = assert!(offset_of!(Header, max_devices) == model::HEADER_MAX_DEVICES);
const _: () = assert!(offset_of!(Header, max_processes) == model::HEADER_MAX_PROCESSES);
const _: () = assert!(offset_of!(Header, device_count) == model::HEADER_DEVICE_COUNT);
const _: () = assert!(DEVICES == model::DEVICES);
const _: () = assert!(DEVICE_SIZE == model::DEVICE_SIZE);
const _: () = assert!(DEVICE_UUID_HASH == model::DEVICE_UUID_HASH);
const _: () = assert!(DEVICE_USED == model::DEVICE_USED);
const _: () = assert!(DEVICE_SM_PERMILLE == model::DEVICE_SM_PERMILLE);
const _: () = assert!(offset_of!(Device, processes) == model::DEVICE_PROCESSES);
const _: () = assert!(DEVICE_PUBLISHED_MS == model::DEVICE_PUBLISHED_MS);
const _: () = assert!(offset_of!(Device, nvml_used) == model::DEVICE_NVML_USED);
const _: () = assert!(SLOTS == model::SLOTS);
const _: () = assert!(SLOT_SIZE == model::SLOT_SIZE);
const _: () = assert!(SLOT_PID == model::SLOT_PID);
const _: () = assert!(SLOT_START_TIME == model::SLOT_START_TIME);
const _: () = assert!(SLOT_PID_NS == model::SLOT_PID_NS);
const _: () = assert!(SLOT_USED == model::SLOT_USED);
const _: () = assert!(SLOTS + MAX_PROCESSES * SLOT_SIZE == SIZE);
const _: () = assert!(SLOT_USED + MAX_DEVICES * 8 <= SLOT_SIZE);
const _: () = assert!(DEVICES + MAX_DEVICES * DEVICE_SIZE == SLOTS);
