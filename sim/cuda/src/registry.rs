//! Live objects of the process and the rules for making and freeing them.
//!
//! Memory accounting: every allocation that takes device memory charges its
//! device's counter (`Device::used`) here, under the registry lock, and is
//! refused with `CUDA_ERROR_OUT_OF_MEMORY` past the device's capacity.
//! What counts: `cuMemAlloc`, `cuMemAllocPitch` (pitch × height), arrays
//! and mipmapped arrays (element size × extent, levels summed), and:
//!
//! - **Stream-ordered pools** reserve device memory in 2 MiB steps and keep
//!   it: `cuMemFreeAsync` returns a block to its pool, which serves later
//!   allocations from it; a pool gives memory back to the device only down
//!   to its release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, default
//!   0), at the next synchronisation of its device (`cuStreamSynchronize`,
//!   `cuCtxSynchronize`) or at `cuMemPoolTrimTo`. What a pool holds is its
//!   `RESERVED_MEM_CURRENT`.
//! - **VMM** (`cuMemCreate` on a device location): the memory lives while a
//!   handle reference (create, `cuMemRetainAllocationHandle`, a same-process
//!   `cuMemImportFromShareableHandle`) or a mapping remains; `cuMemRelease`
//!   drops a reference, `cuMemUnmap`/`cuMemAddressFree` mappings. An import
//!   from another process holds memory that process charged.
//! - **Contexts**: each live context takes `context_bytes` of its own
//!   (`TESSERA_SIM_CUDA_CONTEXT_MIB`), and its malloc heap
//!   (`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`).
//!
//! What does not count: managed memory (host-backed in the simulator),
//! `cuMemAllocHost`, `cuMemCreate` on a host location. Counters are per
//! process: two processes each see the whole device.
//!
//! Destroying a context (or releasing a primary context to zero) frees what
//! it owns: its allocations, arrays, streams, modules, heap and own memory.
//! `cuDevicePrimaryCtxReset` frees what the primary context owns and every
//! stream-ordered allocation and pool reserve of the device.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use crate::driver::{Driver, Res};
use crate::fasthash::IntMap;
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::va::{self, VaSpace};

/// What kind of allocation a device pointer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocKind {
    /// `cuMemAlloc`.
    Linear,
    /// `cuMemAllocPitch`.
    Pitch,
    /// `cuMemAllocManaged`: real host memory, `len` bytes mapped.
    Managed {
        /// Length of the host mapping.
        len: usize,
    },
    /// `cuMemAllocAsync`/`cuMemAllocFromPoolAsync`, from pool `(device, serial)`.
    Async {
        /// The pool.
        pool: (u32, u32),
    },
}

#[derive(Debug, Clone, Copy)]
struct Allocation {
    device: u32,
    /// Bytes charged to the device (0 for managed memory).
    charged: u64,
    /// Bytes of address space taken, and their alignment.
    va_bytes: u64,
    va_align: u64,
    kind: AllocKind,
    /// The owning context, for the context-bound kinds.
    ctx: Option<Handle>,
}

#[derive(Debug, Clone, Copy)]
struct Owned {
    device: u32,
    charged: u64,
    ctx: Handle,
}

#[derive(Debug, Clone, Copy)]
struct Physical {
    device: Option<u32>,
    bytes: u64,
    charged: u64,
    /// Handle references: create, retain, same-process import.
    refs: u32,
    maps: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Pool {
    max_size: u64,
    /// Bytes of live allocations from the pool.
    used: u64,
    /// Bytes the pool holds of its device (charged), ≥ `used`.
    reserved: u64,
    reserved_high: u64,
    used_high: u64,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    threshold: u64,
}

/// A pool's attributes, as `cuMemPoolGetAttribute` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// `RELEASE_THRESHOLD`.
    pub threshold: u64,
    /// `RESERVED_MEM_CURRENT`.
    pub reserved: u64,
    /// `RESERVED_MEM_HIGH`.
    pub reserved_high: u64,
    /// `USED_MEM_CURRENT`.
    pub used: u64,
    /// `USED_MEM_HIGH`.
    pub used_high: u64,
}

/// The registry of live objects.
#[derive(Debug)]
pub struct Registry {
    serial: u32,
    primary_refs: Vec<u32>,
    contexts: HashMap<u32, u32>,
    streams: HashMap<u32, Handle>,
    modules: HashMap<u32, Handle>,
    allocations: IntMap<u64, Allocation>,
    host: HashMap<usize, usize>,
    arrays: HashMap<u32, Owned>,
    mipmaps: HashMap<u32, Owned>,
    physical: HashMap<u32, Physical>,
    /// Handles made by a same-process import: alias serial → the physical
    /// allocation's serial (a new handle value, as the real driver gives).
    aliases: HashMap<u32, u32>,
    reservations: BTreeMap<u64, (u64, u64)>,
    mappings: BTreeMap<u64, (u64, u32)>,
    pools: HashMap<(u32, u32), Pool>,
    /// Per device: the pool `cuMemAllocAsync` uses (`cuDeviceSetMemPool`).
    current_pools: Vec<(u32, u32)>,
    /// Malloc heap bytes per context (`cuCtxSetLimit`).
    heaps: HashMap<u64, u64>,
    graphs: HashMap<u32, Vec<u64>>,
    execs: HashMap<u32, u64>,
    va: Option<VaSpace>,
}

/// Maps `len` bytes of zeroed, lazily committed host memory.
fn map_host(len: usize) -> Res<usize> {
    // SAFETY: a fresh anonymous private mapping; no existing memory is
    // touched. MAP_NORESERVE: pages are committed only when written.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(ptr as usize)
    }
}

fn unmap_host(ptr: usize, len: usize) {
    // SAFETY: (ptr, len) is a mapping made by map_host and removed from the
    // registry before this call, so it is unmapped exactly once; the caller
    // gave up the memory by freeing it.
    unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
}

/// The registry of the process's one driver, made at its first use.
static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

impl Driver {
    /// The registry, locked.
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        let registry = REGISTRY.get_or_init(|| Mutex::new(Registry::new(self.devices.len())));
        // A panic while it was held (caught at the C boundary) leaves the
        // registry consistent: each change is applied whole or not at all.
        registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Registry {
    /// An empty registry for `devices` devices, with their default pools.
    pub fn new(devices: usize) -> Registry {
        let pools = (0..devices as u32)
            .map(|d| ((d, 0), Pool::default()))
            .collect();
        Registry {
            serial: 0,
            primary_refs: vec![0; devices],
            contexts: HashMap::new(),
            streams: HashMap::new(),
            modules: HashMap::new(),
            allocations: IntMap::default(),
            host: HashMap::new(),
            arrays: HashMap::new(),
            mipmaps: HashMap::new(),
            physical: HashMap::new(),
            aliases: HashMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            pools,
            current_pools: (0..devices as u32).map(|d| (d, 0)).collect(),
            heaps: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            va: None,
        }
    }

    fn next_serial(&mut self) -> u32 {
        self.serial = self.serial.wrapping_add(1).max(1);
        self.serial
    }

    fn va(&mut self) -> &mut VaSpace {
        self.va.get_or_insert_with(VaSpace::reserve)
    }

    // ----- contexts -------------------------------------------------------

    /// Whether `ctx` names a live context.
    pub fn context_live(&self, ctx: Handle) -> bool {
        ctx.kind == Kind::Context
            && if ctx.serial == 0 {
                self.primary_refs
                    .get(ctx.device as usize)
                    .is_some_and(|&r| r > 0)
            } else {
                self.contexts.get(&ctx.serial) == Some(&ctx.device)
            }
    }

    /// The live context `ctx`, or `INVALID_CONTEXT`.
    pub fn live_context(&self, ctx: Option<Handle>) -> Res<Handle> {
        ctx.filter(|h| self.context_live(*h))
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// `cuDevicePrimaryCtxRetain`: the first reference makes the context,
    /// which takes its own memory (`OUT_OF_MEMORY` when the device has none).
    pub fn retain_primary(&mut self, driver: &Driver, device: u32) -> Res<Handle> {
        if let Some(refs) = self.primary_refs.get_mut(device as usize) {
            if *refs == 0 {
                charge(driver, device, driver.config.context_bytes)?;
                driver.count_context(device, true);
            }
            *refs = refs.saturating_add(1);
        }
        Ok(Handle::new(Kind::Context, device, 0))
    }

    /// `cuDevicePrimaryCtxRelease`: the last release frees what the
    /// primary context owns; `INVALID_CONTEXT` when it is not retained.
    pub fn release_primary(&mut self, driver: &Driver, device: u32) -> Res<()> {
        let refs = self
            .primary_refs
            .get_mut(device as usize)
            .filter(|r| **r > 0)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        *refs -= 1;
        if *refs == 0 {
            self.free_owned(driver, Handle::new(Kind::Context, device, 0));
            uncharge(driver, device, driver.config.context_bytes);
            driver.count_context(device, false);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxReset`: frees everything the primary context owns,
    /// and every stream-ordered allocation and pool reserve of the device;
    /// the context (if retained) starts afresh.
    pub fn reset_primary(&mut self, driver: &Driver, device: u32) -> Res<()> {
        if device as usize >= self.primary_refs.len() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        self.free_owned(driver, Handle::new(Kind::Context, device, 0));
        let pooled: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| matches!(a.kind, AllocKind::Async { pool } if pool.0 == device))
            .map(|(p, _)| *p)
            .collect();
        for ptr in pooled {
            let _ = self.free(driver, ptr);
        }
        let keys: Vec<(u32, u32)> = self
            .pools
            .keys()
            .filter(|k| k.0 == device)
            .copied()
            .collect();
        for key in keys {
            self.trim_pool(driver, key, 0);
            if key.1 == 0 {
                if let Some(p) = self.pools.get_mut(&key) {
                    *p = Pool::default();
                }
            } else {
                self.pools.remove(&key);
            }
        }
        if let Some(current) = self.current_pools.get_mut(device as usize) {
            *current = (device, 0);
        }
        Ok(())
    }

    /// `cuCtxCreate`: the context takes its own memory.
    pub fn create_context(&mut self, driver: &Driver, device: u32) -> Res<Handle> {
        charge(driver, device, driver.config.context_bytes)?;
        let serial = self.next_serial();
        self.contexts.insert(serial, device);
        driver.count_context(device, true);
        Ok(Handle::new(Kind::Context, device, serial))
    }

    /// `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`: the heap is device memory
    /// of the context, taken at once.
    pub fn set_heap(&mut self, driver: &Driver, ctx: Handle, bytes: u64) -> Res<()> {
        let old = self.heaps.get(&ctx.value()).copied().unwrap_or(0);
        if bytes > old {
            charge(driver, ctx.device, bytes - old)?;
        } else {
            uncharge(driver, ctx.device, old - bytes);
        }
        self.heaps.insert(ctx.value(), bytes);
        Ok(())
    }

    /// The malloc heap of `ctx`.
    pub fn heap(&self, ctx: Handle) -> u64 {
        self.heaps.get(&ctx.value()).copied().unwrap_or(0)
    }

    /// The context `stream` belongs to.
    pub fn stream_context(&self, stream: Handle) -> Res<Handle> {
        self.streams
            .get(&stream.serial)
            .copied()
            .filter(|c| self.context_live(*c))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuCtxDestroy`: a primary context cannot be destroyed this way.
    pub fn destroy_context(&mut self, driver: &Driver, ctx: Handle) -> Res<()> {
        if ctx.serial == 0 || self.contexts.get(&ctx.serial) != Some(&ctx.device) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        self.contexts.remove(&ctx.serial);
        self.free_owned(driver, ctx);
        uncharge(driver, ctx.device, driver.config.context_bytes);
        driver.count_context(ctx.device, false);
        Ok(())
    }

    fn free_owned(&mut self, driver: &Driver, ctx: Handle) {
        let pointers: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.ctx == Some(ctx))
            .map(|(p, _)| *p)
            .collect();
        for ptr in pointers {
            let _ = self.free(driver, ptr);
        }
        for table in [&mut self.arrays, &mut self.mipmaps] {
            table.retain(|_, owned| {
                if owned.ctx == ctx {
                    uncharge(driver, owned.device, owned.charged);
                    false
                } else {
                    true
                }
            });
        }
        self.streams.retain(|_, owner| *owner != ctx);
        self.modules.retain(|_, owner| *owner != ctx);
        if let Some(heap) = self.heaps.remove(&ctx.value()) {
            uncharge(driver, ctx.device, heap);
        }
    }

    // ----- streams, modules -----------------------------------------------

    /// `cuStreamCreate` in `ctx`.
    pub fn create_stream(&mut self, ctx: Handle) -> Handle {
        let serial = self.next_serial();
        self.streams.insert(serial, ctx);
        Handle::new(Kind::Stream, ctx.device, serial)
    }

    /// `cuStreamDestroy`.
    pub fn destroy_stream(&mut self, stream: Handle) -> Res<()> {
        match self.streams.remove(&stream.serial) {
            Some(ctx) if ctx.device == stream.device => Ok(()),
            Some(ctx) => {
                self.streams.insert(stream.serial, ctx);
                Err(CUDA_ERROR_INVALID_HANDLE)
            }
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuModuleLoadData` in `ctx`.
    pub fn load_module(&mut self, ctx: Handle) -> Handle {
        let serial = self.next_serial();
        self.modules.insert(serial, ctx);
        Handle::new(Kind::Module, ctx.device, serial)
    }

    /// `cuModuleUnload`.
    pub fn unload_module(&mut self, module: Handle) -> Res<()> {
        self.modules
            .remove(&module.serial)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuModuleGetFunction`: a new function handle of a loaded module.
    pub fn function(&mut self, module: Handle) -> Res<Handle> {
        if !self.modules.contains_key(&module.serial) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let serial = self.next_serial();
        Ok(Handle::new(Kind::Function, module.device, serial))
    }

    // ----- linear memory --------------------------------------------------

    /// Allocates `bytes` of device memory of `kind` on `device`, owned by
    /// `ctx`; charges the device unless the kind is managed.
    pub fn alloc(
        &mut self,
        driver: &Driver,
        device: u32,
        bytes: u64,
        kind: AllocKind,
        ctx: Option<Handle>,
    ) -> Res<u64> {
        if bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if let AllocKind::Managed { len } = kind {
            let ptr = map_host(len)? as u64;
            self.allocations.insert(
                ptr,
                Allocation {
                    device,
                    charged: 0,
                    va_bytes: 0,
                    va_align: 0,
                    kind,
                    ctx,
                },
            );
            return Ok(ptr);
        }
        // A pool serves from what it holds and grows in granules; the
        // device is charged for the growth, the allocation for nothing.
        let mut charged = bytes;
        let mut grown = 0;
        if let AllocKind::Async { pool } = kind {
            let p = self.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let used = p.used.saturating_add(bytes);
            if p.max_size != 0 && used > p.max_size {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            if used > p.reserved {
                grown = (used - p.reserved)
                    .checked_next_multiple_of(GRANULARITY)
                    .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            }
            charged = 0;
        }
        charge(driver, device, charged + grown)?;
        let align = VaSpace::default_align(bytes);
        let Some(ptr) = self.va().alloc(bytes, align) else {
            uncharge(driver, device, charged + grown);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        if let AllocKind::Async { pool } = kind
            && let Some(p) = self.pools.get_mut(&pool)
        {
            p.used += bytes;
            p.reserved += grown;
            p.used_high = p.used_high.max(p.used);
            p.reserved_high = p.reserved_high.max(p.reserved);
        }
        self.allocations.insert(
            ptr,
            Allocation {
                device,
                charged: if matches!(kind, AllocKind::Async { .. }) {
                    bytes
                } else {
                    charged
                },
                va_bytes: bytes,
                va_align: align,
                kind,
                ctx,
            },
        );
        Ok(ptr)
    }

    /// Frees the allocation starting at `ptr`; `INVALID_VALUE` for any other address.
    pub fn free(&mut self, driver: &Driver, ptr: u64) -> Res<()> {
        let a = self
            .allocations
            .remove(&ptr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match a.kind {
            AllocKind::Managed { len } => unmap_host(ptr as usize, len),
            AllocKind::Async { pool } => {
                // Back to the pool, which keeps the memory.
                self.va().free(ptr, a.va_bytes, a.va_align);
                match self.pools.get_mut(&pool) {
                    Some(p) => p.used = p.used.saturating_sub(a.charged),
                    // A destroyed pool's memory goes once its last block does.
                    None => uncharge(driver, a.device, a.charged),
                }
            }
            _ => {
                uncharge(driver, a.device, a.charged);
                self.va().free(ptr, a.va_bytes, a.va_align);
            }
        }
        Ok(())
    }

    /// `cuMemAllocHost`: real, zeroed host memory.
    pub fn alloc_host(&mut self, bytes: u64) -> Res<usize> {
        let len = usize::try_from(bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        if len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = map_host(len)?;
        self.host.insert(ptr, len);
        Ok(ptr)
    }

    /// `cuMemFreeHost`.
    pub fn free_host(&mut self, ptr: usize) -> Res<()> {
        let len = self.host.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        unmap_host(ptr, len);
        Ok(())
    }

    // ----- arrays -----------------------------------------------------------

    /// A (mipmapped) array of `bytes` on `ctx`'s device.
    pub fn create_array(
        &mut self,
        driver: &Driver,
        ctx: Handle,
        bytes: u64,
        kind: Kind,
    ) -> Res<Handle> {
        charge(driver, ctx.device, bytes)?;
        let serial = self.next_serial();
        let owned = Owned {
            device: ctx.device,
            charged: bytes,
            ctx,
        };
        match kind {
            Kind::MipmappedArray => self.mipmaps.insert(serial, owned),
            _ => self.arrays.insert(serial, owned),
        };
        Ok(Handle::new(kind, ctx.device, serial))
    }

    /// `cuArrayDestroy`/`cuMipmappedArrayDestroy`.
    pub fn destroy_array(&mut self, driver: &Driver, array: Handle) -> Res<()> {
        let table = match array.kind {
            Kind::MipmappedArray => &mut self.mipmaps,
            _ => &mut self.arrays,
        };
        let owned = table
            .remove(&array.serial)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        uncharge(driver, owned.device, owned.charged);
        Ok(())
    }

    // ----- virtual memory management ---------------------------------------

    /// `cuMemCreate`: physical memory on `device` (charged) or on the host
    /// (`None`, not charged).
    pub fn create_physical(
        &mut self,
        driver: &Driver,
        device: Option<u32>,
        bytes: u64,
    ) -> Res<u64> {
        let charged = match device {
            Some(d) => {
                charge(driver, d, bytes)?;
                bytes
            }
            None => 0,
        };
        Ok(self.new_physical(device, bytes, charged))
    }

    /// Registers physical memory with one reference and no mapping; its handle.
    fn new_physical(&mut self, device: Option<u32>, bytes: u64, charged: u64) -> u64 {
        let serial = self.next_serial();
        self.physical.insert(
            serial,
            Physical {
                device,
                bytes,
                charged,
                refs: 1,
                maps: 0,
            },
        );
        Handle::new(Kind::MemHandle, device.unwrap_or(0), serial).value()
    }

    fn settle_physical(&mut self, driver: &Driver, serial: u32) {
        if let Some(p) = self.physical.get(&serial).copied()
            && p.refs == 0
            && p.maps == 0
        {
            self.physical.remove(&serial);
            if let Some(d) = p.device {
                uncharge(driver, d, p.charged);
            }
        }
    }

    /// The physical allocation `handle` names (through an import's alias).
    fn physical_serial(&self, handle: u64, err: CuResult) -> Res<u32> {
        let serial = Handle::decode(handle)
            .filter(|h| h.kind == Kind::MemHandle)
            .map(|h| h.serial)
            .ok_or(err)?;
        Ok(self.aliases.get(&serial).copied().unwrap_or(serial))
    }

    /// `cuMemRelease`: drops one handle reference; the memory goes once no
    /// reference and no mapping is left.
    pub fn release_physical(&mut self, driver: &Driver, handle: u64) -> Res<()> {
        if let Some(alias) = Handle::decode(handle).filter(|h| h.kind == Kind::MemHandle)
            && let Some(target) = self.aliases.remove(&alias.serial)
        {
            if let Some(p) = self.physical.get_mut(&target) {
                p.refs = p.refs.saturating_sub(1);
            }
            self.settle_physical(driver, target);
            return Ok(());
        }
        let serial = self.physical_serial(handle, CUDA_ERROR_INVALID_VALUE)?;
        let p = self
            .physical
            .get_mut(&serial)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs -= 1;
        self.settle_physical(driver, serial);
        Ok(())
    }

    /// `cuMemRetainAllocationHandle`: the handle of the memory mapped at
    /// `ptr`, with one more reference.
    pub fn retain_physical(&mut self, ptr: u64) -> Res<u64> {
        let serial = self
            .mappings
            .range(..=ptr)
            .next_back()
            .filter(|(start, (size, _))| ptr < *start + size)
            .map(|(_, (_, serial))| *serial)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let p = self
            .physical
            .get_mut(&serial)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs = p.refs.saturating_add(1);
        Ok(Handle::new(Kind::MemHandle, p.device.unwrap_or(0), serial).value())
    }

    /// What `cuMemExportToShareableHandle` writes for `handle`: pid, serial,
    /// device (u32::MAX: host) and size, little-endian.
    pub fn export_physical(&self, handle: u64) -> Res<[u8; 20]> {
        let serial = self.physical_serial(handle, CUDA_ERROR_INVALID_VALUE)?;
        let p = self
            .physical
            .get(&serial)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut out = [0u8; 20];
        out[..4].copy_from_slice(&std::process::id().to_le_bytes());
        out[4..8].copy_from_slice(&serial.to_le_bytes());
        out[8..12].copy_from_slice(&p.device.unwrap_or(u32::MAX).to_le_bytes());
        out[12..].copy_from_slice(&p.bytes.to_le_bytes());
        Ok(out)
    }

    /// `cuMemImportFromShareableHandle` of what [`Registry::export_physical`]
    /// wrote: in the exporting process, a new handle on the same memory (one
    /// more reference); elsewhere, a handle on memory that process holds (and
    /// charged), so nothing is charged here.
    pub fn import_physical(&mut self, driver: &Driver, data: &[u8; 20]) -> Res<u64> {
        let word =
            |at: usize| u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
        let (pid, serial, device) = (word(0), word(4), word(8));
        let mut size = [0u8; 8];
        size.copy_from_slice(&data[12..]);
        let bytes = u64::from_le_bytes(size);
        if pid == std::process::id() {
            let p = self
                .physical
                .get_mut(&serial)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            p.refs = p.refs.saturating_add(1);
            let device = p.device.unwrap_or(0);
            let alias = self.next_serial();
            self.aliases.insert(alias, serial);
            return Ok(Handle::new(Kind::MemHandle, device, alias).value());
        }
        let device = (device != u32::MAX).then_some(device);
        if let Some(d) = device {
            driver.device_at(d)?;
        }
        Ok(self.new_physical(device, bytes, 0))
    }

    /// `cuMemAddressReserve`.
    pub fn reserve(&mut self, bytes: u64, align: u64) -> Res<u64> {
        let ptr = self
            .va()
            .alloc(bytes, align)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.reservations.insert(ptr, (bytes, align));
        Ok(ptr)
    }

    /// `cuMemAddressFree`: the whole reservation, unmapping what is still mapped in it.
    pub fn free_reservation(&mut self, driver: &Driver, ptr: u64, bytes: u64) -> Res<()> {
        match self.reservations.get(&ptr) {
            Some(&(size, _)) if size == bytes => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        let inside: Vec<u64> = self
            .mappings
            .range(ptr..ptr + bytes)
            .map(|(start, _)| *start)
            .collect();
        for start in inside {
            self.unmap_one(driver, start);
        }
        if let Some((size, align)) = self.reservations.remove(&ptr) {
            self.va().free(ptr, size, align);
        }
        Ok(())
    }

    /// `cuMemMap`: `bytes` of the physical allocation at `ptr`, which must
    /// lie in a reservation and overlap no mapping.
    pub fn map(&mut self, ptr: u64, bytes: u64, offset: u64, handle: u64) -> Res<()> {
        let serial = self.physical_serial(handle, CUDA_ERROR_INVALID_HANDLE)?;
        let p = self
            .physical
            .get(&serial)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let end = ptr.checked_add(bytes).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if bytes == 0 || offset.checked_add(bytes).is_none_or(|e| e > p.bytes) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let in_reservation = self
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(start, (size, _))| end <= start + size);
        let overlaps = self
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(start, (size, _))| start + size > ptr);
        if !in_reservation || overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.mappings.insert(ptr, (bytes, serial));
        if let Some(p) = self.physical.get_mut(&serial) {
            p.maps += 1;
        }
        Ok(())
    }

    fn unmap_one(&mut self, driver: &Driver, start: u64) {
        if let Some((_, serial)) = self.mappings.remove(&start) {
            if let Some(p) = self.physical.get_mut(&serial) {
                p.maps = p.maps.saturating_sub(1);
            }
            self.settle_physical(driver, serial);
        }
    }

    /// `cuMemUnmap`: every mapping starting in `[ptr, ptr + bytes)`.
    pub fn unmap(&mut self, driver: &Driver, ptr: u64, bytes: u64) -> Res<()> {
        let end = ptr.checked_add(bytes).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let inside: Vec<u64> = self
            .mappings
            .range(ptr..end)
            .map(|(start, _)| *start)
            .collect();
        if inside.is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for start in inside {
            self.unmap_one(driver, start);
        }
        Ok(())
    }

    /// Whether `[ptr, ptr + bytes)` is covered by mappings (`cuMemSetAccess`).
    pub fn mapped(&self, ptr: u64, bytes: u64) -> bool {
        let mut at = ptr;
        let end = ptr.saturating_add(bytes);
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((start, (size, _))) if start + size > at => at = start + size,
                _ => return false,
            }
        }
        bytes > 0
    }

    // ----- pools --------------------------------------------------------------

    /// `cuMemPoolCreate` on `device`.
    pub fn create_pool(&mut self, device: u32, max_size: u64) -> Handle {
        let serial = self.next_serial();
        self.pools.insert(
            (device, serial),
            Pool {
                max_size,
                ..Pool::default()
            },
        );
        Handle::new(Kind::Pool, device, serial)
    }

    /// `cuMemPoolDestroy`; a default pool cannot be destroyed. What the pool
    /// holds beyond its live allocations goes at once; allocations still out
    /// stay valid (and charged) until freed.
    pub fn destroy_pool(&mut self, driver: &Driver, pool: Handle) -> Res<()> {
        if pool.serial == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let key = (pool.device, pool.serial);
        let p = self.pools.remove(&key).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        uncharge(driver, pool.device, p.reserved.saturating_sub(p.used));
        if let Some(current) = self.current_pools.get_mut(pool.device as usize)
            && *current == key
        {
            *current = (pool.device, 0);
        }
        Ok(())
    }

    /// Gives back what `pool` holds beyond its live allocations and
    /// `keep` bytes (whole granules).
    fn trim_pool(&mut self, driver: &Driver, pool: (u32, u32), keep: u64) {
        if let Some(p) = self.pools.get_mut(&pool) {
            let floor = p
                .used
                .max(keep.min(p.reserved))
                .checked_next_multiple_of(GRANULARITY)
                .unwrap_or(p.reserved)
                .min(p.reserved);
            if floor < p.reserved {
                uncharge(driver, pool.0, p.reserved - floor);
                p.reserved = floor;
            }
        }
    }

    /// `cuMemPoolTrimTo`.
    pub fn trim_pool_to(&mut self, driver: &Driver, pool: Handle, keep: u64) -> Res<()> {
        let key = (pool.device, pool.serial);
        if !self.pools.contains_key(&key) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.trim_pool(driver, key, keep);
        Ok(())
    }

    /// A synchronisation of `device`: its pools give back what they hold
    /// beyond their release threshold.
    pub fn sync_pools(&mut self, driver: &Driver, device: u32) {
        let keys: Vec<((u32, u32), u64)> = self
            .pools
            .iter()
            .filter(|(k, _)| k.0 == device)
            .map(|(k, p)| (*k, p.threshold))
            .collect();
        for (key, threshold) in keys {
            self.trim_pool(driver, key, threshold);
        }
    }

    /// `cuMemPoolSetAttribute(RELEASE_THRESHOLD)`.
    pub fn set_pool_threshold(&mut self, pool: Handle, bytes: u64) -> Res<()> {
        let p = self
            .pools
            .get_mut(&(pool.device, pool.serial))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.threshold = bytes;
        Ok(())
    }

    /// `cuMemPoolGetAttribute`'s numbers.
    pub fn pool_stats(&self, pool: Handle) -> Res<PoolStats> {
        let p = self
            .pools
            .get(&(pool.device, pool.serial))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok(PoolStats {
            threshold: p.threshold,
            reserved: p.reserved,
            reserved_high: p.reserved_high,
            used: p.used,
            used_high: p.used_high,
        })
    }

    /// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` uses on `device`.
    pub fn current_pool(&self, device: u32) -> Res<Handle> {
        self.current_pools
            .get(device as usize)
            .map(|&(d, serial)| Handle::new(Kind::Pool, d, serial))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// `cuDeviceSetMemPool`: `pool` must be on `device`.
    pub fn set_current_pool(&mut self, device: u32, pool: Handle) -> Res<()> {
        if pool.device != device || !self.pool_exists(pool) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let current = self
            .current_pools
            .get_mut(device as usize)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        *current = (device, pool.serial);
        Ok(())
    }

    /// Whether `pool` exists.
    pub fn pool_exists(&self, pool: Handle) -> bool {
        self.pools.contains_key(&(pool.device, pool.serial))
    }

    // ----- graphs --------------------------------------------------------------

    /// `cuGraphCreate`.
    pub fn create_graph(&mut self) -> Handle {
        let serial = self.next_serial();
        self.graphs.insert(serial, Vec::new());
        Handle::new(Kind::Graph, 0, serial)
    }

    /// A kernel node of `blocks` thread blocks in `graph`.
    pub fn add_kernel_node(&mut self, graph: Handle, blocks: u64) -> Res<Handle> {
        let serial = self.next_serial();
        let nodes = self
            .graphs
            .get_mut(&graph.serial)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        nodes.push(blocks);
        Ok(Handle::new(Kind::GraphNode, 0, serial))
    }

    /// `cuGraphInstantiate*`: a snapshot of the graph's work.
    pub fn instantiate(&mut self, graph: Handle) -> Res<Handle> {
        let blocks = self
            .graphs
            .get(&graph.serial)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(*b));
        let serial = self.next_serial();
        self.execs.insert(serial, blocks);
        Ok(Handle::new(Kind::GraphExec, 0, serial))
    }

    /// Thread blocks one launch of `exec` runs.
    pub fn exec_blocks(&self, exec: Handle) -> Res<u64> {
        self.execs
            .get(&exec.serial)
            .copied()
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuGraphExecDestroy`.
    pub fn destroy_exec(&mut self, exec: Handle) -> Res<()> {
        self.execs
            .remove(&exec.serial)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuGraphDestroy`.
    pub fn destroy_graph(&mut self, graph: Handle) -> Res<()> {
        self.graphs
            .remove(&graph.serial)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Charges `bytes` to `device`; `OUT_OF_MEMORY` past its capacity. Called
/// with the registry locked, which makes it the counter's only writer.
fn charge(driver: &Driver, device: u32, bytes: u64) -> Res<()> {
    let d = driver.device_at(device)?;
    let used = d.used.load(std::sync::atomic::Ordering::Acquire);
    match used.checked_add(bytes) {
        Some(total) if total <= d.spec.total_bytes => {
            d.used.store(total, std::sync::atomic::Ordering::Release);
            if driver.config.publish_on_memory && bytes > 0 {
                crate::publish::publish_now();
            }
            Ok(())
        }
        _ => Err(CUDA_ERROR_OUT_OF_MEMORY),
    }
}

fn uncharge(driver: &Driver, device: u32, bytes: u64) {
    if let Some(d) = driver.devices.get(device as usize) {
        let _ = d.used.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |u| Some(u.saturating_sub(bytes)),
        );
        if driver.config.publish_on_memory && bytes > 0 {
            crate::publish::publish_now();
        }
    }
}

/// The VMM granularity (minimum and recommended): 2 MiB.
pub const GRANULARITY: u64 = va::LARGE_ALIGN;
