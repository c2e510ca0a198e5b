//! The vGPU accounting region's file layout: byte offsets, sizes, magic and
//! version — the one definition the vGPU library (which maps the file with
//! `#[repr(C)]` atomics and checks at compile time that they match these
//! numbers) and the device plugin's node monitor (which maps it too, and
//! cannot link the library) both build on. Pure constants and arithmetic.
//!
//! ```text
//! offset  size          what
//! 0       64            header: magic "TSSRVGPU", layout version, sizes
//! 64      16 × 64       device entries (below)
//! 1088    1024 × 192    process slots: pid, start time, pid namespace, used bytes per device
//! ```
//!
//! All values are little-endian and naturally aligned; every field is
//! accessed as an atomic of its size.
//!
//! # A device entry (64 bytes)
//!
//! ```text
//! 0   u64  uuid hash ([`uuid_hash`]; 0 while the entry is free)
//! 8   u64  bytes in use by the whole container (the library's counter)
//! 16  u32  published SM utilization of the allocation on this device, per mille of the device
//! 20  u32  published count of the allocation's processes NVML reports on this device
//! 24  u64  when published: CLOCK_MONOTONIC, ms (0: never)
//! 32  u64  published device memory of those processes as NVML reports it, bytes
//! 40  —    zero (reserved)
//! ```
//!
//! The first two fields are the library's. The other four are the node
//! monitor's (the device plugin): NVML reports host pids, so a library in a
//! container with its own pid namespace cannot find its own processes in
//! NVML's samples; the monitor, on the host, maps those pids to allocations
//! and publishes each allocation's figures here, every monitor period
//! ([`PUBLISH_PERIOD_MS`]). The library uses the published figure when none of
//! its own pids appear in NVML's samples and the stamp is fresh (at most
//! [`FRESH_MS`] old, see [`is_fresh`]).
//!
//! Order: the monitor stores the figures first and the stamp last (release);
//! a reader loads the stamp first (acquire) and then the figures. A reader
//! racing a publication may pair a stamp with the next period's figures —
//! both fresh, so harmless.
//!
//! **Clock.** The stamp is `CLOCK_MONOTONIC` in milliseconds, which the host
//! and every container share unless a container has its own time namespace
//! (Kubernetes makes none). In one that does, the stamp looks stale or from
//! the future, and the library then falls back to the whole device's
//! utilization: it over-throttles, never over-uses.
//!
//! **Version.** Adding these fields did not change [`LAYOUT_VERSION`] (2):
//! they live in what was zero padding, which every version-2 file holds as
//! zeros until a monitor writes it. A file no monitor writes (an older node)
//! therefore reads as "nothing published" (stamp 0), and a library that
//! predates the fields ignores them.

use crate::contract::vgpu::MAX_DEVICES as CONTRACT_MAX_DEVICES;

/// First 8 bytes of a region file ("TSSRVGPU", little-endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSSRVGPU");
/// The layout version of this module.
pub const LAYOUT_VERSION: u32 = 2;
/// Devices one region accounts for.
pub const MAX_DEVICES: usize = CONTRACT_MAX_DEVICES;
/// Processes one region can register at once.
pub const MAX_PROCESSES: usize = 1024;
/// Longest device UUID body (after `GPU-`/`MIG-`) [`uuid_hash`] accepts.
pub const MAX_UUID_BYTES: usize = 64;

/// Size of the header.
pub const HEADER_SIZE: usize = 64;
/// Offset of the header's `magic` (u64).
pub const HEADER_MAGIC: usize = 0;
/// Offset of the header's `version` (u32).
pub const HEADER_VERSION: usize = 8;
/// Offset of the header's `header_size` (u32).
pub const HEADER_HEADER_SIZE: usize = 12;
/// Offset of the header's `layout_size` (u64): the file's size.
pub const HEADER_LAYOUT_SIZE: usize = 16;
/// Offset of the header's `max_devices` (u32).
pub const HEADER_MAX_DEVICES: usize = 24;
/// Offset of the header's `max_processes` (u32).
pub const HEADER_MAX_PROCESSES: usize = 28;
/// Offset of the header's `device_count` (u32).
pub const HEADER_DEVICE_COUNT: usize = 32;

/// Offset of the first device entry.
pub const DEVICES: usize = HEADER_SIZE;
/// Stride of the device entries.
pub const DEVICE_SIZE: usize = 64;
/// Offset of `uuid_hash` (u64) in a device entry.
pub const DEVICE_UUID_HASH: usize = 0;
/// Offset of `used` (u64, the container's total bytes) in a device entry.
pub const DEVICE_USED: usize = 8;
/// Offset of the published SM utilization (u32, per mille) in a device entry.
pub const DEVICE_SM_PERMILLE: usize = 16;
/// Offset of the published process count (u32) in a device entry.
pub const DEVICE_PROCESSES: usize = 20;
/// Offset of the publication stamp (u64, CLOCK_MONOTONIC ms; 0: never).
pub const DEVICE_PUBLISHED_MS: usize = 24;
/// Offset of the published NVML memory (u64, bytes) in a device entry.
pub const DEVICE_NVML_USED: usize = 32;

/// Offset of the first process slot.
pub const SLOTS: usize = DEVICES + MAX_DEVICES * DEVICE_SIZE;
/// Size of one process slot; the slot's lock is on its first byte.
pub const SLOT_SIZE: usize = 192;
/// Offset of `pid` (u32) in a slot.
pub const SLOT_PID: usize = 0;
/// Offset of `start_time` (u64) in a slot.
pub const SLOT_START_TIME: usize = 8;
/// Offset of `pid_ns` (u64) in a slot.
pub const SLOT_PID_NS: usize = 16;
/// Offset of `used` (u64 × [`MAX_DEVICES`]) in a slot.
pub const SLOT_USED: usize = 32;

/// Size of the whole file.
pub const SIZE: usize = SLOTS + MAX_PROCESSES * SLOT_SIZE;

/// How often the node monitor publishes, milliseconds.
pub const PUBLISH_PERIOD_MS: u64 = 150;
/// How old a published figure may be and still be used, milliseconds.
pub const FRESH_MS: u64 = 1000;

const _: () = assert!(SIZE == 64 + 16 * 64 + 1024 * 192);
const _: () = assert!(DEVICE_NVML_USED + 8 <= DEVICE_SIZE);
const _: () = assert!(SLOT_USED + MAX_DEVICES * 8 <= SLOT_SIZE);
const _: () = assert!(PUBLISH_PERIOD_MS * 3 <= FRESH_MS);

/// Offset of device entry `index` (no bound check: callers compare with
/// [`MAX_DEVICES`]).
pub const fn device_offset(index: usize) -> usize {
    DEVICES + index * DEVICE_SIZE
}

/// The 64-bit key a device UUID is stored under: FNV-1a of its lowercase
/// body (without the `GPU-`/`MIG-` prefix, any case), never 0. `None` for an
/// empty body or one longer than [`MAX_UUID_BYTES`].
pub fn uuid_hash(uuid: &str) -> Option<u64> {
    let body = match uuid.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-") => &uuid[4..],
        _ => uuid,
    };
    if body.is_empty() || body.len() > MAX_UUID_BYTES {
        return None;
    }
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for b in body.bytes() {
        hash ^= u64::from(b.to_ascii_lowercase());
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Some(hash.max(1))
}

/// What the node monitor published for one device of an allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// SM utilization of the allocation's processes, per mille of the device.
    pub sm_permille: u32,
    /// How many of the allocation's processes NVML reported on the device.
    pub processes: u32,
    /// When published: CLOCK_MONOTONIC, ms; 0: never.
    pub at_ms: u64,
    /// Device memory of those processes as NVML reports it, bytes.
    pub nvml_used: u64,
}

impl Published {
    /// The utilization in percent of the device.
    pub fn sm_percent(&self) -> f64 {
        f64::from(self.sm_permille) / 10.0
    }

    /// Whether this figure may be used at `now_ms` (see [`is_fresh`]).
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        is_fresh(self.at_ms, now_ms)
    }
}

/// Whether a figure stamped `at_ms` may be used at `now_ms` (both
/// CLOCK_MONOTONIC ms): published (non-zero), at most [`FRESH_MS`] old, and
/// not from the future by more than that (another clock: a time namespace).
pub fn is_fresh(at_ms: u64, now_ms: u64) -> bool {
    at_ms != 0 && now_ms.abs_diff(at_ms) <= FRESH_MS
}

/// Per mille of the device from a percentage (clamped to `0..=u32::MAX`;
/// sums of per-process samples may pass 100 % for a while and are kept).
pub fn permille_of_percent(percent: f64) -> u32 {
    let v = (percent * 10.0).round();
    if v.is_nan() || v <= 0.0 {
        0
    } else if v >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        v as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_the_documented_ones() {
        assert_eq!(SLOTS, 1088);
        assert_eq!(SIZE, 197_696);
        assert_eq!(device_offset(1), 128);
        assert_eq!(MAGIC.to_le_bytes(), *b"TSSRVGPU");
    }

    #[test]
    fn uuid_hashes_ignore_prefix_and_case() {
        assert_eq!(uuid_hash("GPU-ABCdef"), uuid_hash("mig-abcDEF"));
        assert_ne!(uuid_hash("GPU-abc"), uuid_hash("GPU-abd"));
        assert_eq!(uuid_hash("GPU-"), None);
        assert_eq!(uuid_hash(&"a".repeat(65)), None);
        assert!(uuid_hash("GPU-x").is_some_and(|h| h != 0));
    }

    #[test]
    fn freshness() {
        assert!(!is_fresh(0, 5), "never published");
        assert!(is_fresh(10_000, 10_000));
        assert!(is_fresh(10_000, 11_000));
        assert!(!is_fresh(10_000, 11_001), "too old");
        assert!(!is_fresh(20_000, 10_000), "another clock");
        let p = Published {
            sm_permille: 305,
            at_ms: 7,
            ..Published::default()
        };
        assert!((p.sm_percent() - 30.5).abs() < 1e-9);
        assert!(p.is_fresh(500));
    }

    #[test]
    fn permille_conversion_rounds_and_clamps() {
        assert_eq!(permille_of_percent(30.04), 300);
        assert_eq!(permille_of_percent(-1.0), 0);
        assert_eq!(permille_of_percent(f64::NAN), 0);
        assert_eq!(permille_of_percent(150.0), 1500);
        assert_eq!(permille_of_percent(1e12), u32::MAX);
    }
}
