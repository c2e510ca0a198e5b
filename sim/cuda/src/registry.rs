//! Live objects of the process and the rules for making and freeing them.
//!
//! Memory accounting: every allocation that takes device memory charges its
//! device's counter (`Device::used`) here, under the registry lock, and is
//! refused with `CUDA_ERROR_OUT_OF_MEMORY` past the device's capacity.
//! What counts: `cuMemAlloc`, `cuMemAllocPitch` (pitch × height),
//! `cuMemAllocAsync`/`cuMemAllocFromPoolAsync` (freed at `cuMemFreeAsync`:
//! pools keep nothing cached), `cuMemCreate` on a device location (freed
//! when released and unmapped), arrays and mipmapped arrays (element size ×
//! extent, levels summed). What does not: managed memory (host-backed in
//! the simulator), `cuMemAllocHost`, `cuMemCreate` on a host location.
//! Counters are per process: two processes each see the whole device.
//!
//! Destroying a context (or releasing a primary context to zero) frees what
//! it owns: its allocations, arrays, streams and modules.

use std::collections::{BTreeMap, HashMap};

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
    released: bool,
    maps: u32,
}

#[derive(Debug, Clone, Copy)]
struct Pool {
    max_size: u64,
    used: u64,
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
    reservations: BTreeMap<u64, (u64, u64)>,
    mappings: BTreeMap<u64, (u64, u32)>,
    pools: HashMap<(u32, u32), Pool>,
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

impl Registry {
    /// An empty registry for `devices` devices, with their default pools.
    pub fn new(devices: usize) -> Registry {
        let pools = (0..devices as u32)
            .map(|d| {
                (
                    (d, 0),
                    Pool {
                        max_size: 0,
                        used: 0,
                    },
                )
            })
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
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            pools,
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

    /// `cuDevicePrimaryCtxRetain`.
    pub fn retain_primary(&mut self, driver: &Driver, device: u32) -> Handle {
        if let Some(refs) = self.primary_refs.get_mut(device as usize) {
            *refs = refs.saturating_add(1);
            if *refs == 1 {
                driver.count_context(device, true);
            }
        }
        Handle::new(Kind::Context, device, 0)
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
            driver.count_context(device, false);
        }
        Ok(())
    }

    /// `cuCtxCreate`.
    pub fn create_context(&mut self, driver: &Driver, device: u32) -> Handle {
        let serial = self.next_serial();
        self.contexts.insert(serial, device);
        driver.count_context(device, true);
        Handle::new(Kind::Context, device, serial)
    }

    /// `cuCtxDestroy`: a primary context cannot be destroyed this way.
    pub fn destroy_context(&mut self, driver: &Driver, ctx: Handle) -> Res<()> {
        if ctx.serial == 0 || self.contexts.get(&ctx.serial) != Some(&ctx.device) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        self.contexts.remove(&ctx.serial);
        self.free_owned(driver, ctx);
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
        if let AllocKind::Async { pool } = kind {
            let p = self.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if p.max_size != 0 && p.used.saturating_add(bytes) > p.max_size {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        charge(driver, device, bytes)?;
        let align = VaSpace::default_align(bytes);
        let Some(ptr) = self.va().alloc(bytes, align) else {
            uncharge(driver, device, bytes);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        if let AllocKind::Async { pool } = kind
            && let Some(p) = self.pools.get_mut(&pool)
        {
            p.used += bytes;
        }
        self.allocations.insert(
            ptr,
            Allocation {
                device,
                charged: bytes,
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
            kind => {
                uncharge(driver, a.device, a.charged);
                self.va().free(ptr, a.va_bytes, a.va_align);
                if let AllocKind::Async { pool } = kind
                    && let Some(p) = self.pools.get_mut(&pool)
                {
                    p.used = p.used.saturating_sub(a.charged);
                }
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
        let serial = self.next_serial();
        self.physical.insert(
            serial,
            Physical {
                device,
                bytes,
                charged,
                released: false,
                maps: 0,
            },
        );
        Ok(Handle::new(Kind::MemHandle, device.unwrap_or(0), serial).value())
    }

    fn settle_physical(&mut self, driver: &Driver, serial: u32) {
        if let Some(p) = self.physical.get(&serial).copied()
            && p.released
            && p.maps == 0
        {
            self.physical.remove(&serial);
            if let Some(d) = p.device {
                uncharge(driver, d, p.charged);
            }
        }
    }

    /// `cuMemRelease`: the memory goes once it is also unmapped everywhere.
    pub fn release_physical(&mut self, driver: &Driver, handle: u64) -> Res<()> {
        let serial = Handle::decode(handle)
            .filter(|h| h.kind == Kind::MemHandle)
            .map(|h| h.serial)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let p = self
            .physical
            .get_mut(&serial)
            .filter(|p| !p.released)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.released = true;
        self.settle_physical(driver, serial);
        Ok(())
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
        let serial = Handle::decode(handle)
            .filter(|h| h.kind == Kind::MemHandle)
            .map(|h| h.serial)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let p = self
            .physical
            .get(&serial)
            .filter(|p| !p.released)
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
        self.pools
            .insert((device, serial), Pool { max_size, used: 0 });
        Handle::new(Kind::Pool, device, serial)
    }

    /// `cuMemPoolDestroy`; a default pool cannot be destroyed. Allocations
    /// still out stay valid until freed.
    pub fn destroy_pool(&mut self, pool: Handle) -> Res<()> {
        if pool.serial == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.pools
            .remove(&(pool.device, pool.serial))
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
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
    }
}

/// The VMM granularity (minimum and recommended): 2 MiB.
pub const GRANULARITY: u64 = va::LARGE_ALIGN;
