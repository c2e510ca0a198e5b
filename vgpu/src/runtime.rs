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
//! container: the region's own index for that uuid
//! (`SharedRegion::device_index`), or the ordinal when the driver gives no
//! uuid.
//!
//! # When something is wrong
//!
//! - No configuration at all (no file, no HAMi-core variable): nothing is
//!   enforced ([`Mode::PassThrough`]).
//! - A limits file that exists but cannot be read or parsed, or a HAMi-core
//!   value that is not a limit: the library fails *closed*, as `config`
//!   decides (`load_or_fail_closed`): every device gets a 0-byte memory
//!   limit, so allocations fail with `CUDA_ERROR_OUT_OF_MEMORY`, and one
//!   error line names the file and the field. Passing through would hand
//!   the whole GPU to a container meant to get a slice; the operator, not
//!   the workload, wrote the file, and launches and queries still work.
//! - The shared region cannot be opened (missing, unsafe directory, not
//!   this layout): the library fails closed too — every allocation on a
//!   limited device is refused, `cuMemGetInfo` reports nothing free, and one
//!   error line names the file and the cause. Counting each process alone
//!   would hand every process the whole slice.

use std::sync::OnceLock;

use crate::backend::{self, Limits, Region};
use crate::log::{self, Level, Once};

/// CUDA ordinals the library tracks, a process's view: more than a
/// container's limits can name (`contract::vgpu::MAX_DEVICES`), so that a
/// process seeing more GPUs than its limits name (HAMi's env mode on a large
/// node, a device-cgroup mistake) still gets no memory on the devices the
/// limits leave out, instead of passing through unlimited. Past this, calls
/// pass through.
pub const MAX_ORDINALS: usize = 64;

/// What the library knows of the driver beyond the intercepted calls;
/// `ffi` provides the real one, tests a fake.
pub trait Platform: Sync {
    /// `cuDeviceGetUuid` of `ordinal`, as `GPU-xxxxxxxx-xxxx-…`.
    fn device_uuid(&self, ordinal: i32) -> Option<String>;

    /// What a refused charge may still get back from this process's pools
    /// (they give memory back at synchronisations the library does not
    /// see): brings their ledgers in line with the driver and returns the
    /// bytes given back. None by default (no pools).
    fn reconcile_pools(&self, _rt: &Runtime) -> u64 {
        0
    }
}

/// How the library treats this process's calls.
#[derive(Debug)]
pub enum Mode {
    /// Limits in force: as configured, or fail-closed ones.
    Enforce(Limits),
    /// Nothing is configured: every call passes through.
    PassThrough,
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

/// Usage counters: the container-wide shared region, or none (closed:
/// nothing can be charged).
enum Accounting {
    Shared(Region),
    Closed,
}

/// The process-wide state.
pub struct Runtime {
    mode: Mode,
    platform: &'static dyn Platform,
    accounting: OnceLock<Accounting>,
    devices: [OnceLock<DeviceInfo>; MAX_ORDINALS],
}

static GLOBAL: OnceLock<Runtime> = OnceLock::new();

static CONFIG_FAILED: Once = Once::new();
static REGION_FAILED: Once = Once::new();
static LIMITS_IN_FORCE: Once = Once::new();

/// The process's runtime over `platform` (the real driver: the
/// interception layer passes it), loading the configuration on first use.
/// The first call's platform is the one kept.
pub fn global(platform: &'static dyn Platform) -> &'static Runtime {
    GLOBAL.get_or_init(|| Runtime::new(load_mode(), platform))
}

/// The runtime if it was loaded already (NVML calls in a process that never
/// touched CUDA load it themselves through [`global`]).
pub fn loaded() -> Option<&'static Runtime> {
    GLOBAL.get()
}

fn load_mode() -> Mode {
    let (limits, error) = backend::load_config();
    log::set_level(backend::log_level(&limits));
    if let Some(reason) = error {
        log::once(&CONFIG_FAILED, Level::Error, || {
            format!("{reason}; failing closed: no GPU memory is granted")
        });
    }
    if backend::limits_nothing(&limits) {
        Mode::PassThrough
    } else {
        Mode::Enforce(limits)
    }
}

impl Runtime {
    /// A runtime in `mode` over `platform` (tests build their own).
    pub fn new(mode: Mode, platform: &'static dyn Platform) -> Runtime {
        Runtime {
            mode,
            platform,
            accounting: OnceLock::new(),
            devices: [const { OnceLock::new() }; MAX_ORDINALS],
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
        let index = usize::try_from(ordinal)
            .ok()
            .filter(|&i| i < MAX_ORDINALS)?;
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
                let limit = backend::limit_for(limits, index, uuid.as_deref());
                let slot = match self.accounting() {
                    Accounting::Shared(region) => {
                        backend::region_slot(region, uuid.as_deref(), index)
                    }
                    Accounting::Closed => index,
                };
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
        }
    }

    fn accounting(&self) -> &Accounting {
        self.accounting.get_or_init(|| {
            let Mode::Enforce(limits) = &self.mode else {
                return Accounting::Closed;
            };
            if backend::is_fail_closed(limits) {
                return Accounting::Closed;
            }
            match backend::open_region(limits) {
                Ok(region) => Accounting::Shared(region),
                Err(reason) => {
                    log::once(&REGION_FAILED, Level::Error, || {
                        format!("{reason}; failing closed: no GPU memory is granted")
                    });
                    Accounting::Closed
                }
            }
        })
    }

    /// Charges `bytes` to `device`'s slot if that keeps it within `limit`.
    /// A failed charge first reclaims what dead processes left in the
    /// shared region and what this process's pools gave back, then tries
    /// once more.
    pub fn try_charge(&self, device: &DeviceInfo, bytes: u64, limit: u64) -> bool {
        match self.accounting() {
            Accounting::Shared(region) => {
                backend::try_charge(region, device.slot, bytes, limit) || {
                    let dead = backend::reclaim_dead(region);
                    let pooled = self.platform.reconcile_pools(self);
                    (dead > 0 || pooled > 0)
                        && backend::try_charge(region, device.slot, bytes, limit)
                }
            }
            Accounting::Closed => false,
        }
    }

    /// Charges `bytes` the driver already holds (a context's own memory, a
    /// pool that grew past what was asked) whatever the limit.
    pub fn force_charge(&self, slot: usize, bytes: u64) {
        if let Accounting::Shared(region) = self.accounting() {
            backend::force_charge(region, slot, bytes);
        }
    }

    /// Whether usage is counted in a shared region (false: closed).
    pub fn accounting_open(&self) -> bool {
        matches!(self.accounting(), Accounting::Shared(_))
    }

    /// Returns `bytes` charged earlier to `slot`.
    pub fn uncharge(&self, slot: usize, bytes: u64) {
        match self.accounting() {
            Accounting::Shared(region) => backend::uncharge(region, slot, bytes),
            Accounting::Closed => {}
        }
    }

    /// Bytes in use in `slot`, container-wide; `u64::MAX` when closed
    /// (nothing is free).
    pub fn used(&self, slot: usize) -> u64 {
        match self.accounting() {
            Accounting::Shared(region) => backend::used(region, slot),
            Accounting::Closed => u64::MAX,
        }
    }

    /// Bytes this process has charged in `slot` (0 when closed).
    pub fn process_used(&self, slot: usize) -> u64 {
        match self.accounting() {
            Accounting::Shared(region) => region.process_used(slot),
            Accounting::Closed => 0,
        }
    }

    /// What the node monitor last published for `slot` (nothing, stamp 0,
    /// when the region is not shared).
    pub fn published(&self, slot: usize) -> tessera_model::vgpu_region::Published {
        match self.accounting() {
            Accounting::Shared(region) => backend::published(region, slot),
            Accounting::Closed => tessera_model::vgpu_region::Published::default(),
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
            Accounting::Closed => vec![std::process::id()],
        }
    }
}

/// A CUDA uuid (`CUuuid`, 16 bytes) in NVML's spelling,
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(40);
    out.push_str("GPU-");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tessera_model::vgpu::DeviceLimit;

    #[test]
    fn uuids_are_spelled_as_nvml_spells_them() {
        let bytes = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-12345678-9abc-def0-0123-456789abcdef"
        );
    }

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

    /// Limits by uuid, with the shared region at `region` (a path whose
    /// directory does not exist makes the runtime count per process).
    pub fn limits_by_uuid(devices: &[(&str, Option<u64>, Option<u32>)], region: &str) -> Limits {
        let mut limits = Limits::fail_closed("test");
        limits.source = tessera_model::vgpu::LimitsSource::File;
        limits.per_device = devices
            .iter()
            .map(|&(uuid, memory, sm)| DeviceLimit {
                uuid: Some(uuid.to_owned()),
                memory_limit_bytes: memory,
                sm_limit_percent: sm,
            })
            .collect();
        limits.accounting_path = region.into();
        limits
    }

    /// A region path whose directory does not exist: the runtime fails closed.
    pub const NO_REGION: &str = "/nonexistent/tessera-vgpu-test/vgpu.accounting";

    /// An empty region file in a private directory, removed on drop.
    pub struct TestRegion {
        _dir: tempfile::TempDir,
        /// The region file.
        pub path: String,
    }

    /// A fresh [`TestRegion`].
    pub fn test_region() -> TestRegion {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vgpu.accounting");
        crate::accounting::create_file(&path).expect("region file");
        TestRegion {
            path: path.to_str().expect("utf-8 path").to_owned(),
            _dir: dir,
        }
    }

    /// A driver with one device, `GPU-0`.
    pub static ONE: FakePlatform = FakePlatform(&["GPU-0"]);

    /// A runtime enforcing limits on [`ONE`], with its region (removed on
    /// drop).
    pub struct Limited {
        rt: Runtime,
        _region: TestRegion,
    }

    impl std::ops::Deref for Limited {
        type Target = Runtime;
        fn deref(&self) -> &Runtime {
            &self.rt
        }
    }

    /// [`ONE`]'s device with a memory limit of `bytes`.
    pub fn limited(bytes: u64) -> Limited {
        limited_with(bytes, |_| {})
    }

    /// [`limited`], with `adjust` applied to the limits first.
    pub fn limited_with(bytes: u64, adjust: impl FnOnce(&mut Limits)) -> Limited {
        let region = test_region();
        let mut limits = limits_by_uuid(&[("GPU-0", Some(bytes), None)], &region.path);
        adjust(&mut limits);
        Limited {
            rt: Runtime::new(Mode::Enforce(limits), &ONE),
            _region: region,
        }
    }

    #[test]
    fn pass_through_limits_nothing() {
        let rt = Runtime::new(Mode::PassThrough, &TWO);
        let dev = rt.device(0).expect("device 0");
        assert_eq!(dev.memory_limit, None);
        assert!(!rt.enforcing());
        assert_eq!(rt.device(-1), None);
        assert_eq!(rt.device(MAX_ORDINALS as i32), None);
    }

    #[test]
    fn fail_closed_limits_refuse_every_byte() {
        let rt = Runtime::new(Mode::Enforce(Limits::fail_closed("broken")), &TWO);
        let dev = rt.device(1).expect("device 1").clone();
        assert_eq!(dev.memory_limit, Some(0));
        assert!(!rt.try_charge(&dev, 1, 0));
    }

    #[test]
    fn limits_follow_the_uuid_not_the_ordinal() {
        // CUDA_VISIBLE_DEVICES=1,0: ordinal 0 is GPU-b.
        let limits = limits_by_uuid(
            &[
                ("GPU-a", Some(1 << 30), None),
                ("GPU-b", Some(2 << 30), Some(30)),
            ],
            NO_REGION,
        );
        let rt = Runtime::new(Mode::Enforce(limits), &TWO);
        let first = rt.device(0).expect("device 0");
        assert_eq!(first.uuid.as_deref(), Some("GPU-b"));
        assert_eq!(first.memory_limit, Some(2 << 30));
        assert_eq!(first.sm_limit, Some(30));
        assert_eq!(rt.device(1).expect("device 1").memory_limit, Some(1 << 30));
        assert!(rt.any_sm_limit());
    }

    #[test]
    fn an_unlisted_device_gets_no_memory() {
        let limits = limits_by_uuid(&[("GPU-a", Some(1 << 30), None)], NO_REGION);
        let rt = Runtime::new(Mode::Enforce(limits), &TWO);
        assert_eq!(rt.device(0).expect("device 0").memory_limit, Some(0));
        assert!(!rt.any_sm_limit());
    }

    #[test]
    fn without_a_region_nothing_is_granted() {
        let limits = limits_by_uuid(&[("GPU-b", Some(1000), None)], NO_REGION);
        let rt = Runtime::new(Mode::Enforce(limits), &TWO);
        let dev = rt.device(0).expect("device 0").clone();
        assert!(!rt.try_charge(&dev, 1, 1000), "fails closed");
        assert!(!rt.accounting_open());
        assert_eq!(rt.used(dev.slot), u64::MAX, "nothing is free");
    }

    #[test]
    fn the_region_holds_the_limit_and_returns_usage() {
        let region = test_region();
        let limits = limits_by_uuid(&[("GPU-b", Some(1000), None)], &region.path);
        let rt = Runtime::new(Mode::Enforce(limits), &TWO);
        let dev = rt.device(0).expect("device 0").clone();
        assert!(rt.try_charge(&dev, 600, 1000));
        assert!(!rt.try_charge(&dev, 600, 1000));
        assert_eq!(rt.used(dev.slot), 600);
        rt.uncharge(dev.slot, 600);
        rt.uncharge(dev.slot, 600);
        assert_eq!(rt.used(dev.slot), 0, "uncharging never underflows");
    }

    #[test]
    fn two_runtimes_on_one_region_share_one_budget_by_uuid() {
        let region = test_region();
        let path = region.path.as_str();
        static OTHER_ORDER: FakePlatform = FakePlatform(&["GPU-a", "GPU-b"]);
        let limits = || {
            limits_by_uuid(
                &[("GPU-a", Some(1000), None), ("GPU-b", Some(1000), None)],
                path,
            )
        };
        let one = Runtime::new(Mode::Enforce(limits()), &TWO);
        let two = Runtime::new(Mode::Enforce(limits()), &OTHER_ORDER);
        let a_in_one = one.device(1).expect("GPU-a in one").clone();
        let a_in_two = two.device(0).expect("GPU-a in two").clone();
        assert_eq!(a_in_one.slot, a_in_two.slot, "same GPU, same counter");
        assert!(one.try_charge(&a_in_one, 700, 1000));
        assert_eq!(two.used(a_in_two.slot), 700);
        assert!(
            !two.try_charge(&a_in_two, 400, 1000),
            "the other process's use counts"
        );
        one.uncharge(a_in_one.slot, 700);
        assert!(two.try_charge(&a_in_two, 400, 1000));
        drop((one, two));
    }
}
