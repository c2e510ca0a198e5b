//! The seam between the interception layer and the configuration,
//! accounting and allocation-table modules: everything the rest of the
//! library needs from `config`, `accounting` and `alloc_table`, in the
//! shape it needs it.

use tessera_model::vgpu::{DeviceLimit, LimitsSource, LogLevel, ResolvedLimits};

use crate::{accounting, alloc_table, config};

/// The limits of this container, resolved once.
pub type Limits = ResolvedLimits;
/// The container-wide usage counters.
pub type Region = accounting::SharedRegion;

/// Device slots of a shared region (every process opens it with the same
/// count, whatever its own `CUDA_VISIBLE_DEVICES`).
pub const REGION_SLOTS: usize = accounting::MAX_DEVICES;

/// Loads the limits once: `config::load()`, or — if it fails — the
/// fail-closed limits (no GPU memory on any device) and the one-line reason
/// to log. A broken limits file never means "no limit".
pub fn load_config() -> (Limits, Option<String>) {
    let (limits, error) = config::load_or_fail_closed();
    (limits, error.map(|e| e.to_string()))
}

/// Whether the limits limit nothing (neither the file nor any HAMi-core
/// name is present): every call passes through.
pub fn limits_nothing(limits: &Limits) -> bool {
    limits.source == LimitsSource::Unlimited
}

/// The configured log level, in HAMi-core's numbering (1 errors … 4 debug).
pub fn log_level(limits: &Limits) -> u8 {
    match limits.log_level {
        LogLevel::Error => 1,
        LogLevel::Warn => 2,
        LogLevel::Info => 3,
        LogLevel::Debug => 4,
    }
}

/// Whether memory beyond the physical device may be served from host
/// memory: the node oversubscribes (`memory_scaling > 1`) and the limits
/// allow the fallback.
pub fn oversubscribe(limits: &Limits) -> bool {
    limits.oversubscribe && limits.memory_scaling > 1.0
}

/// Whether any device may have an SM limit that limits something (1..=99).
pub fn any_sm_limit(limits: &Limits) -> bool {
    limits
        .per_device
        .iter()
        .chain(std::iter::once(&limits.unlisted))
        .any(|d| d.sm_limit_percent.is_some_and(|p| (1..100).contains(&p)))
}

/// The limit of the device at CUDA `ordinal` with `uuid`.
pub fn limit_for(limits: &Limits, ordinal: usize, uuid: Option<&str>) -> DeviceLimit {
    limits.limit_for(ordinal, uuid.unwrap_or(""))
}

/// Whether the limits are the fail-closed ones (nothing can be charged, so
/// there is no region to open).
pub fn is_fail_closed(limits: &Limits) -> bool {
    matches!(limits.source, LimitsSource::FailClosed { .. })
}

/// Opens the container's shared region named by the limits.
pub fn open_region(limits: &Limits) -> Result<Region, String> {
    Region::open(&limits.accounting_path, REGION_SLOTS).map_err(|e| e.to_string())
}

/// The region's counter for a device: by uuid (the same GPU shares one
/// counter in every process, however `CUDA_VISIBLE_DEVICES` orders it),
/// else by ordinal.
pub fn region_slot(region: &Region, uuid: Option<&str>, ordinal: usize) -> usize {
    uuid.and_then(|u| region.device_index(u).ok())
        .unwrap_or(ordinal)
}

/// Charges `bytes` to `slot` if that keeps it within `limit`.
#[inline]
pub fn try_charge(region: &Region, slot: usize, bytes: u64, limit: u64) -> bool {
    region.try_charge(slot, bytes, limit)
}

/// Charges `bytes` to `slot` whatever the limit (memory the driver holds already).
pub fn force_charge(region: &Region, slot: usize, bytes: u64) {
    region.force_charge(slot, bytes);
}

/// Returns `bytes` to `slot`.
#[inline]
pub fn uncharge(region: &Region, slot: usize, bytes: u64) {
    region.uncharge(slot, bytes);
}

/// Bytes in use in `slot`, container-wide.
#[inline]
pub fn used(region: &Region, slot: usize) -> u64 {
    region.used(slot)
}

/// Releases what dead processes left charged; how much was reclaimed.
pub fn reclaim_dead(region: &Region) -> u64 {
    region.reclaim_dead()
}

/// What the node monitor last published for `slot` (see
/// `tessera_model::vgpu_region`).
pub fn published(region: &Region, slot: usize) -> tessera_model::vgpu_region::Published {
    region.published(slot)
}

/// Pids of the container's processes registered in the region, read from
/// the mapping (no file I/O; the SM limiter asks once per sampling period).
pub fn live_pids(region: &Region) -> Vec<u32> {
    region.registered_pids()
}

/// What an allocation-table entry is (each kind is freed by its own calls,
/// and kinds with separate handle spaces never match each other's frees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
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
    /// A context's malloc heap (`cuCtxSetLimit`), keyed by the context.
    Heap,
    /// A context's own memory (its driver state), keyed by the context.
    Context,
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
    /// Contexts, for their malloc heaps.
    Heap,
    /// Contexts, for their own memory.
    Context,
}

impl Kind {
    /// The handle space of this kind.
    pub fn space(self) -> Space {
        match self {
            Kind::Device | Kind::Managed | Kind::HostFallback | Kind::Async => Space::Pointer,
            Kind::Vmm => Space::Vmm,
            Kind::Array => Space::Array,
            Kind::Mipmap => Space::Mipmap,
            Kind::Heap => Space::Heap,
            Kind::Context => Space::Context,
        }
    }

    fn to_table(self) -> u8 {
        self as u8
    }

    fn from_table(kind: u8) -> Kind {
        [
            Kind::Device,
            Kind::Managed,
            Kind::HostFallback,
            Kind::Async,
            Kind::Vmm,
            Kind::Array,
            Kind::Mipmap,
            Kind::Heap,
            Kind::Context,
        ]
        .get(usize::from(kind))
        .copied()
        .unwrap_or(Kind::Device)
    }
}

fn key(space: Space, handle: u64) -> u64 {
    let tag: u64 = match space {
        Space::Pointer => 0,
        Space::Vmm => 1,
        Space::Array => 2,
        Space::Mipmap => 3,
        Space::Heap => 4,
        Space::Context => 5,
    };
    handle ^ (tag << 61)
}

/// A live allocation: where it was charged, how much, what it is, and
/// what its life is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// Slot charged.
    pub slot: usize,
    /// Bytes charged.
    pub bytes: u64,
    /// What it is.
    pub kind: Kind,
    /// The context it belongs to (context-bound kinds), or the pool
    /// (stream-ordered allocations); 0 when unknown.
    pub owner: u64,
}

/// Records a charged allocation under its handle; returns the record it
/// replaces (the same handle, freed through a path the library never saw,
/// e.g. a destroyed context): the caller gives that charge back.
#[inline]
pub fn track(handle: u64, tracked: Tracked) -> Option<Tracked> {
    alloc_table::global()
        .insert_entry(
            key(tracked.kind.space(), handle),
            alloc_table::Entry {
                device: u32::try_from(tracked.slot).unwrap_or(u32::MAX),
                bytes: tracked.bytes,
                kind: tracked.kind.to_table(),
                owner: tracked.owner,
            },
        )
        .map(from_entry)
}

fn from_entry(e: alloc_table::Entry) -> Tracked {
    Tracked {
        slot: e.device as usize,
        bytes: e.bytes,
        kind: Kind::from_table(e.kind),
        owner: e.owner,
    }
}

/// Takes out every record `pred` selects: what a destroyed context or a
/// reset device took with it.
pub fn untrack_where(mut pred: impl FnMut(&Tracked) -> bool) -> Vec<Tracked> {
    alloc_table::global()
        .drain(|_, e| pred(&from_entry(*e)))
        .into_iter()
        .map(|(_, e)| from_entry(e))
        .collect()
}

/// The record of `handle` in `space`, left in the table.
pub fn lookup(space: Space, handle: u64) -> Option<Tracked> {
    alloc_table::global()
        .get(key(space, handle))
        .map(from_entry)
}

/// Takes the record of `handle` in `space` out of the table, if any.
#[inline]
pub fn untrack(space: Space, handle: u64) -> Option<Tracked> {
    alloc_table::global()
        .remove(key(space, handle))
        .map(from_entry)
}
