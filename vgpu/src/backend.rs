//! The seam between the interception layer and the configuration,
//! accounting and allocation-table modules: everything the rest of the
//! library needs from `config`, `accounting` and `alloc_table`, in the
//! shape it needs it.

use crate::config::{self, DeviceLimit, ResolvedLimits};
use crate::{accounting, alloc_table};

/// The limits of this container, resolved once.
pub type Limits = ResolvedLimits;
/// The container-wide usage counters.
pub type Region = accounting::SharedRegion;

/// The fewest device slots a shared region has: every process of a
/// container must open it with the same count, whatever its own
/// `CUDA_VISIBLE_DEVICES`, so the count comes from the limits, never from
/// the driver.
pub const MIN_REGION_SLOTS: usize = 16;

/// Why the configuration could not be used.
#[derive(Debug)]
pub enum ConfigFailure {
    /// The authoritative file exists and is malformed (fail closed).
    Malformed(String),
    /// Anything else: no limits can be known (pass through).
    Unavailable(String),
}

/// `config::load()`, its error sorted into [`ConfigFailure`].
pub fn load_config() -> Result<Limits, ConfigFailure> {
    config::load().map_err(|e| match e {
        config::ConfigError::Malformed(_) => ConfigFailure::Malformed(e.to_string()),
        other => ConfigFailure::Unavailable(other.to_string()),
    })
}

/// The configured log level (HAMi-core's numbering).
pub fn log_level(limits: &Limits) -> u8 {
    limits.log_level
}

/// Whether memory beyond the physical device may be served from host memory.
pub fn oversubscribe(limits: &Limits) -> bool {
    limits.oversubscribe && limits.memory_scaling > 1.0
}

/// Whether any device may have an SM limit that limits something (1..=99).
pub fn any_sm_limit(limits: &Limits) -> bool {
    limits
        .devices
        .iter()
        .any(|d| d.sm_limit_percent.is_some_and(|p| (1..100).contains(&p)))
}

/// The limit of the device at `ordinal` with `uuid`, and its slot in the
/// shared region (its position in the limits when they name it by uuid,
/// else the ordinal).
pub fn limit_for(limits: &Limits, ordinal: usize, uuid: Option<&str>) -> (DeviceLimit, usize) {
    let limit = limits.limit_for(ordinal, uuid);
    let slot = uuid
        .and_then(|u| {
            limits
                .devices
                .iter()
                .position(|d| d.uuid.as_deref() == Some(u))
        })
        .unwrap_or(ordinal);
    (limit, slot)
}

/// Slots of the shared region for these limits.
pub fn region_slots(limits: &Limits) -> usize {
    limits.devices.len().max(MIN_REGION_SLOTS)
}

/// Opens the shared region, if the limits name one.
pub fn open_region(limits: &Limits, slots: usize) -> Option<Result<Region, String>> {
    let path = limits.accounting_path.as_ref()?;
    Some(
        Region::open(path, slots)
            .map_err(|e| format!("cannot open the shared accounting region {}: {e}", path.display())),
    )
}

/// Charges `bytes` to `slot` if that keeps it within `limit`.
pub fn try_charge(region: &Region, slot: usize, bytes: u64, limit: u64) -> bool {
    region.try_charge(slot, bytes, limit)
}

/// Returns `bytes` to `slot`.
pub fn uncharge(region: &Region, slot: usize, bytes: u64) {
    region.uncharge(slot, bytes);
}

/// Bytes in use in `slot`, container-wide.
pub fn used(region: &Region, slot: usize) -> u64 {
    region.used(slot)
}

/// Releases what dead processes left charged; how much was reclaimed.
pub fn reclaim_dead(region: &Region) -> u64 {
    region.reclaim_dead()
}

/// Pids of the processes registered in the region.
pub fn live_pids(_region: &Region) -> Vec<u32> {
    Vec::new()
}

/// What an allocation-table entry is (each kind is freed by its own calls,
/// and kinds with separate handle spaces never match each other's frees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cuMemAlloc*`, `cuMemAllocPitch*`: device memory.
    Device,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemAlloc_v2` served as managed memory (oversubscription).
    HostFallback,
    /// `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`.
    Async,
    /// `cuMemCreate` (a VMM handle, not a pointer).
    Vmm,
    /// `cuArrayCreate*`, `cuArray3DCreate*` (a `CUarray`).
    Array,
    /// `cuMipmappedArrayCreate` (a `CUmipmappedArray`).
    Mipmap,
}

/// The separate handle spaces: device pointers, VMM handles, arrays and
/// mipmapped arrays. A key is tagged with its space in the top bits, so a
/// VMM handle never collides with a device pointer of the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Device virtual addresses (every pointer-returning allocation).
    Pointer,
    /// `CUmemGenericAllocationHandle`.
    Vmm,
    /// `CUarray`.
    Array,
    /// `CUmipmappedArray`.
    Mipmap,
}

impl Kind {
    /// The handle space of this kind.
    pub fn space(self) -> Space {
        match self {
            Kind::Device | Kind::Managed | Kind::HostFallback | Kind::Async => Space::Pointer,
            Kind::Vmm => Space::Vmm,
            Kind::Array => Space::Array,
            Kind::Mipmap => Space::Mipmap,
        }
    }

    fn to_table(self) -> alloc_table::Kind {
        match self {
            Kind::Device => alloc_table::Kind::Device,
            Kind::Managed => alloc_table::Kind::Managed,
            Kind::HostFallback => alloc_table::Kind::HostFallback,
            Kind::Async => alloc_table::Kind::Async,
            Kind::Vmm => alloc_table::Kind::Vmm,
            Kind::Array => alloc_table::Kind::Array,
            Kind::Mipmap => alloc_table::Kind::Mipmap,
        }
    }

    fn from_table(kind: alloc_table::Kind) -> Kind {
        match kind {
            alloc_table::Kind::Device => Kind::Device,
            alloc_table::Kind::Managed => Kind::Managed,
            alloc_table::Kind::HostFallback => Kind::HostFallback,
            alloc_table::Kind::Async => Kind::Async,
            alloc_table::Kind::Vmm => Kind::Vmm,
            alloc_table::Kind::Array => Kind::Array,
            alloc_table::Kind::Mipmap => Kind::Mipmap,
        }
    }
}

fn key(space: Space, handle: u64) -> u64 {
    let tag: u64 = match space {
        Space::Pointer => 0,
        Space::Vmm => 1,
        Space::Array => 2,
        Space::Mipmap => 3,
    };
    handle ^ (tag << 61)
}

/// A live allocation: where it was charged, how much, what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// Slot charged.
    pub slot: usize,
    /// Bytes charged.
    pub bytes: u64,
    /// What it is.
    pub kind: Kind,
}

/// Records a charged allocation under its handle.
pub fn track(handle: u64, tracked: Tracked) {
    alloc_table::insert(
        key(tracked.kind.space(), handle),
        tracked.slot,
        tracked.bytes,
        tracked.kind.to_table(),
    );
}

/// Takes the record of `handle` in `space` out of the table, if any.
pub fn untrack(space: Space, handle: u64) -> Option<Tracked> {
    alloc_table::remove(key(space, handle)).map(|e| Tracked {
        slot: e.device,
        bytes: e.bytes,
        kind: Kind::from_table(e.kind),
    })
}
