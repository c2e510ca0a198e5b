//! The library's state in one process: the limits (loaded once, at first
//! use), the container-wide accounting, and what it knows about each CUDA
//! device (uuid, limits, accounting slot), cached per ordinal.
//!
//! # Devices and slots
//!
//! A CUDA ordinal is per process: `CUDA_VISIBLE_DEVICES=1,0` makes ordinal 0
//! the second GPU. Limits are therefore looked up by uuid
//! (`cuDeviceGetUuid`, cached per ordinal) through
//! `ResolvedLimits::limit_for(ordinal, uuid)`, and usage is counted in the
//! shared region under a **slot** that is the same in every process of the
//! container: the device's position in the limits file when the file names
//! it by uuid, else the ordinal (HAMi's environment names limits by ordinal,
//! and so does HAMi-core).
//!
//! # When something is wrong
//!
//! - No configuration, or an unreadable one: nothing is enforced; one line
//!   on stderr says so ([`Mode::PassThrough`]).
//! - The authoritative file (`/usr/local/tessera/vgpu.json`) exists but is
//!   malformed: the library fails *closed* ([`Mode::Closed`]): every device
//!   gets a 0-byte memory limit, so allocations fail with
//!   `CUDA_ERROR_OUT_OF_MEMORY` and one error line names the file. Passing
//!   through would hand the whole GPU to a container that was meant to get a
//!   slice, and the operator, not the workload, wrote the file.
//! - The shared region cannot be opened: usage is counted per process
//!   (the limit still holds for each process, not across them); one line.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{self, ConfigFailure, Limits, Region};
use crate::log::{self, Level, Once};

/// CUDA ordinals the library tracks; a device past this is passed through.
pub const MAX_DEVICES: usize = 64;

/// What the library knows of the driver beyond the intercepted calls;
/// `ffi` provides the real one, tests a fake.
pub trait Platform: Sync {
    /// `cuDeviceGetUuid` of `ordinal`, as `GPU-xxxxxxxx-xxxx-…`.
    fn device_uuid(&self, ordinal: i32) -> Option<String>;
}

/// How the library treats this process's calls.
#[derive(Debug)]
pub enum Mode {
    /// Limits in force, as configured.
    Enforce(Limits),
    /// Nothing is enforced (no configuration, or it could not be read).
    PassThrough,
    /// The authoritative file is malformed: every device has a 0-byte limit.
    Closed,
}

/// One CUDA device as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal in this process.
    pub ordinal: i32,
    /// `GPU-…` uuid, when the driver told it.
    pub uuid: Option<String>,
    /// Index of the device's counter in the shared region.
    pub slot: usize,
    /// Memory limit in bytes; `None`: unlimited.
    pub memory_limit: Option<u64>,
    /// SM limit in percent, only when it limits something (1..=99).
    pub sm_limit: Option<u32>,
}

/// Usage counters: the container-wide shared region, or this process's own.
enum Accounting {
    Shared(Region),
    Local(Vec<AtomicU64>),
}

/// The process-wide state.
pub struct Runtime {
    mode: Mode,
    platform: &'static dyn Platform,
    accounting: OnceLock<Accounting>,
    devices: [OnceLock<DeviceInfo>; MAX_DEVICES],
}

static GLOBAL: OnceLock<Runtime> = OnceLock::new();

static CONFIG_FAILED: Once = Once::new();
static REGION_FAILED: Once = Once::new();
static LIMITS_IN_FORCE: Once = Once::new();

/// The process's runtime, loading the configuration on first use.
pub fn global() -> &'static Runtime {
    GLOBAL.get_or_init(|| Runtime::new(load_mode(), crate::ffi::platform()))
}

/// The runtime if it was loaded already (NVML calls in a process that never
/// touched CUDA load it themselves through [`global`]).
pub fn loaded() -> Option<&'static Runtime> {
    GLOBAL.get()
}

fn load_mode() -> Mode {
    match backend::load_config() {
        Ok(limits) => {
            log::set_level(backend::log_level(&limits));
            Mode::Enforce(limits)
        }
        Err(ConfigFailure::Malformed(reason)) => {
            log::once(&CONFIG_FAILED, Level::Error, || {
                format!("{reason}; failing closed: every allocation is refused")
            });
            Mode::Closed
        }
        Err(ConfigFailure::Unavailable(reason)) => {
            log::once(&CONFIG_FAILED, Level::Warn, || {
                format!("{reason}; no limits are enforced")
            });
            Mode::PassThrough
        }
    }
}

impl Runtime {
    /// A runtime in `mode` over `platform` (tests build their own).
    pub fn new(mode: Mode, platform: &'static dyn Platform) -> Runtime {
        Runtime {
            mode,
            platform,
            accounting: OnceLock::new(),
            devices: [const { OnceLock::new() }; MAX_DEVICES],
        }
    }

    /// The mode in force.
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// Whether any device may have a limit (false: every call passes through).
    pub fn enforcing(&self) -> bool {
        !matches!(self.mode, Mode::PassThrough)
    }

    /// Whether some device may have an SM limit (the launch limiter is on).
    pub fn any_sm_limit(&self) -> bool {
        match &self.mode {
            Mode::Enforce(limits) => backend::any_sm_limit(limits),
            _ => false,
        }
    }

    /// Whether `cuMemAlloc_v2` may fall back to managed (host-backed) memory
    /// when the device is physically full but the slice has room.
    pub fn oversubscribe(&self) -> bool {
        match &self.mode {
            Mode::Enforce(limits) => backend::oversubscribe(limits),
            _ => false,
        }
    }

    /// The device at CUDA `ordinal` (cached after the first call).
    pub fn device(&self, ordinal: i32) -> Option<&DeviceInfo> {
        let index = usize::try_from(ordinal).ok().filter(|&i| i < MAX_DEVICES)?;
        Some(self.devices[index].get_or_init(|| {
            let uuid = self.platform.device_uuid(ordinal);
            let info = self.describe(ordinal, uuid);
            if info.memory_limit.is_some() || info.sm_limit.is_some() {
                log::once(&LIMITS_IN_FORCE, Level::Info, || {
                    format!("limits in force, first device: {info:?}")
                });
            }
            info
        }))
    }

    /// The device with `uuid`, seen from NVML (which has no CUDA ordinal;
    /// `nvml_index` stands in for it when the limits name no uuids).
    pub fn device_by_uuid(&self, uuid: &str, nvml_index: i32) -> DeviceInfo {
        self.describe(nvml_index, Some(uuid.to_owned()))
    }

    fn describe(&self, ordinal: i32, uuid: Option<String>) -> DeviceInfo {
        let index = usize::try_from(ordinal).unwrap_or(0);
        match &self.mode {
            Mode::Enforce(limits) => {
                let (limit, slot) = backend::limit_for(limits, index, uuid.as_deref());
                DeviceInfo {
                    ordinal,
                    uuid,
                    slot,
                    memory_limit: limit.memory_limit_bytes,
                    sm_limit: limit.sm_limit_percent.filter(|p| (1..100).contains(p)),
                }
            }
            Mode::PassThrough => DeviceInfo {
                ordinal,
                uuid,
                slot: index,
                memory_limit: None,
                sm_limit: None,
            },
            Mode::Closed => DeviceInfo {
                ordinal,
                uuid,
                slot: index,
                memory_limit: Some(0),
                sm_limit: None,
            },
        }
    }

    fn accounting(&self) -> &Accounting {
        self.accounting.get_or_init(|| {
            let slots = match &self.mode {
                Mode::Enforce(limits) => backend::region_slots(limits),
                _ => backend::MIN_REGION_SLOTS,
            };
            let local = || Accounting::Local((0..slots).map(|_| AtomicU64::new(0)).collect());
            let Mode::Enforce(limits) = &self.mode else {
                return local();
            };
            match backend::open_region(limits, slots) {
                Some(Ok(region)) => Accounting::Shared(region),
                Some(Err(reason)) => {
                    log::once(&REGION_FAILED, Level::Warn, || {
                        format!("{reason}; counting this process's memory only")
                    });
                    local()
                }
                None => local(),
            }
        })
    }

    /// Charges `bytes` to `device`'s slot if that keeps it within `limit`.
    /// A failed charge first reclaims what dead processes left in the
    /// shared region, then tries once more.
    pub fn try_charge(&self, device: &DeviceInfo, bytes: u64, limit: u64) -> bool {
        match self.accounting() {
            Accounting::Shared(region) => {
                backend::try_charge(region, device.slot, bytes, limit)
                    || (backend::reclaim_dead(region) > 0
                        && backend::try_charge(region, device.slot, bytes, limit))
            }
            Accounting::Local(counters) => counters.get(device.slot).is_some_and(|used| {
                used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    u.checked_add(bytes).filter(|total| *total <= limit)
                })
                .is_ok()
            }),
        }
    }

    /// Returns `bytes` charged earlier to `slot`.
    pub fn uncharge(&self, slot: usize, bytes: u64) {
        match self.accounting() {
            Accounting::Shared(region) => backend::uncharge(region, slot, bytes),
            Accounting::Local(counters) => {
                if let Some(used) = counters.get(slot) {
                    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                        Some(u.saturating_sub(bytes))
                    });
                }
            }
        }
    }

    /// Bytes in use in `slot`, container-wide when the region is shared.
    pub fn used(&self, slot: usize) -> u64 {
        match self.accounting() {
            Accounting::Shared(region) => backend::used(region, slot),
            Accounting::Local(counters) => counters
                .get(slot)
                .map_or(0, |used| used.load(Ordering::Acquire)),
        }
    }

    /// Pids of this container's processes known to the shared region (this
    /// process's own pid when the region is not shared).
    pub fn container_pids(&self) -> Vec<u32> {
        match self.accounting() {
            Accounting::Shared(region) => {
                let mut pids = backend::live_pids(region);
                if !pids.contains(&std::process::id()) {
                    pids.push(std::process::id());
                }
                pids
            }
            Accounting::Local(_) => vec![std::process::id()],
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A driver with fixed uuids per ordinal.
    pub struct FakePlatform(pub &'static [&'static str]);

    impl Platform for FakePlatform {
        fn device_uuid(&self, ordinal: i32) -> Option<String> {
            usize::try_from(ordinal)
                .ok()
                .and_then(|i| self.0.get(i))
                .map(|u| (*u).to_owned())
        }
    }

    static TWO: FakePlatform = FakePlatform(&["GPU-b", "GPU-a"]);

    #[test]
    fn pass_through_limits_nothing() {
        let rt = Runtime::new(Mode::PassThrough, &TWO);
        let dev = rt.device(0).expect("device 0");
        assert_eq!(dev.memory_limit, None);
        assert!(!rt.enforcing());
        assert_eq!(rt.device(-1), None);
        assert_eq!(rt.device(MAX_DEVICES as i32), None);
    }

    #[test]
    fn closed_mode_refuses_every_byte() {
        let rt = Runtime::new(Mode::Closed, &TWO);
        let dev = rt.device(1).expect("device 1").clone();
        assert_eq!(dev.memory_limit, Some(0));
        assert!(!rt.try_charge(&dev, 1, 0));
        assert!(rt.try_charge(&dev, 0, 0));
    }

    #[test]
    fn local_accounting_holds_the_limit_and_returns_usage() {
        let rt = Runtime::new(Mode::Closed, &TWO);
        let dev = rt.device(0).expect("device 0").clone();
        assert!(rt.try_charge(&dev, 600, 1000));
        assert!(!rt.try_charge(&dev, 600, 1000));
        assert_eq!(rt.used(dev.slot), 600);
        rt.uncharge(dev.slot, 600);
        rt.uncharge(dev.slot, 600);
        assert_eq!(rt.used(dev.slot), 0, "uncharging never underflows");
    }
}
