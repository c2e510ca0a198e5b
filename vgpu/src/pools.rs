//! Stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`):
//! what a pool *holds* is charged, not what the program has allocated.
//!
//! A pool keeps the memory of freed blocks to serve later allocations, and
//! gives it back to the device only down to its release threshold, at a
//! synchronisation or `cuMemPoolTrimTo` — PyTorch's `cudaMallocAsync`
//! backend sets the threshold to `UINT64_MAX`, so the pool never gives
//! anything back. Counting allocations would let such a pool hold far more
//! than the slice. So each pool has a ledger: `charged` (what the region
//! holds for the pool) follows the driver's own figure for the pool,
//! `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, read after every allocation and
//! free on the pool; `outstanding` is what the program holds of it.
//!
//! - An allocation that the pool's free memory (`charged − outstanding`)
//!   can serve needs no new charge; otherwise the missing part is charged
//!   first (refused past the limit, after every known pool was reconciled:
//!   a synchronisation may have shrunk them), the driver is called, and the
//!   ledger follows the pool's new reserve. If the pool grew by more than
//!   was charged (its granularity) and that took the container past its
//!   limit, the block is freed again, the pool trimmed, and the allocation
//!   refused.
//! - A free reconciles too (the driver keeps the memory until its next
//!   synchronisation; the ledger keeps counting it until then).
//! - Where the driver cannot report a pool's reserve (a destroyed pool),
//!   the ledger counts the pool's live allocations.
//!
//! One process-local mutex serialises the pool paths, held across their
//! driver calls so the reserve read belongs to the call just made; the
//! other allocation APIs never take it.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::backend::{self, Kind, Tracked};
use crate::log::{self, Level};
use crate::memory::{CuResult, OUT_OF_MEMORY, SUCCESS};
use crate::runtime::{DeviceInfo, Runtime};

#[derive(Debug, Clone, Copy)]
struct Ledger {
    slot: usize,
    /// Bytes the region holds for the pool.
    charged: u64,
    /// Bytes of the pool's live allocations.
    outstanding: u64,
    /// The steps the pool grows in, as seen so far: a growth is charged
    /// rounded up to it *before* the driver call, so the container never
    /// holds more than its limit even for a moment.
    granule: u64,
}

/// The smallest step a pool grows in (the VMM granularity).
const MIN_GRANULE: u64 = 2 << 20;

/// Pointer-like keys, hashed as the allocation table hashes them.
type Hasher = BuildHasherDefault<crate::alloc_table::PtrHasher>;

#[derive(Debug, Default)]
struct Inner {
    ledgers: HashMap<u64, Ledger, Hasher>,
    /// Pool → CUDA ordinal, as learned from `cuMemPoolCreate` and the
    /// driver's answers.
    devices: HashMap<u64, i32, Hasher>,
}

/// The process's pools.
#[derive(Debug, Default)]
pub struct Pools {
    inner: Mutex<Inner>,
    /// Set once a pool was used: the refusal and `cuMemGetInfo` paths look
    /// at pools only then, without taking the lock.
    used: AtomicBool,
}

/// A stream-ordered allocation about to be made.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The pool it comes from.
    pub pool: u64,
    /// The device of the pool.
    pub device: &'a DeviceInfo,
    /// The device's memory limit.
    pub limit: u64,
    /// Bytes asked.
    pub bytes: u64,
}

/// What the pool paths need of the driver besides the call itself.
pub trait PoolDriver {
    /// `RESERVED_MEM_CURRENT` of `pool`; `None` when the driver cannot
    /// tell (the pool is gone, or the attribute is unknown).
    fn reserved(&self, pool: u64) -> Option<u64>;
    /// Frees `ptr` on `stream` and trims `pool` to `keep` bytes (undoing an
    /// allocation that took the container past its limit).
    fn undo(&self, ptr: u64, pool: u64, keep: u64);
}

/// Brings `l` in line with the pool's reserve; returns the bytes given back.
fn reconcile(rt: &Runtime, drv: &dyn PoolDriver, pool: u64, l: &mut Ledger) -> u64 {
    let target = drv.reserved(pool).unwrap_or(l.outstanding);
    let given_back = l.charged.saturating_sub(target);
    if target > l.charged {
        rt.force_charge(l.slot, target - l.charged);
    } else if given_back > 0 {
        rt.uncharge(l.slot, given_back);
    }
    l.charged = target;
    given_back
}

impl Pools {
    /// No pools.
    pub const fn new() -> Pools {
        Pools {
            inner: Mutex::new(Inner {
                ledgers: HashMap::with_hasher(BuildHasherDefault::new()),
                devices: HashMap::with_hasher(BuildHasherDefault::new()),
            }),
            used: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `pool` lives on CUDA device `ordinal`.
    pub fn learn_device(&self, pool: u64, ordinal: i32) {
        self.lock().devices.insert(pool, ordinal);
    }

    /// The CUDA device of `pool`, if known.
    pub fn device_of(&self, pool: u64) -> Option<i32> {
        self.lock().devices.get(&pool).copied()
    }

    /// An allocation as `request` describes it; `driver` makes it and
    /// returns the pointer.
    pub fn allocate(
        &self,
        rt: &Runtime,
        drv: &dyn PoolDriver,
        request: &Request<'_>,
        driver: impl FnOnce() -> Result<u64, CuResult>,
    ) -> CuResult {
        let Request {
            pool,
            device,
            limit,
            bytes,
        } = *request;
        self.used.store(true, Ordering::Relaxed);
        let mut inner = self.lock();
        let mut l = inner.ledgers.get(&pool).copied().unwrap_or(Ledger {
            slot: device.slot,
            charged: 0,
            outstanding: 0,
            granule: MIN_GRANULE,
        });
        let need_of = |l: &Ledger| {
            let missing = bytes.saturating_sub(l.charged.saturating_sub(l.outstanding));
            missing
                .checked_next_multiple_of(l.granule)
                .unwrap_or(u64::MAX)
        };
        let mut need = need_of(&l);
        if need > 0 && !rt.try_charge(device, need, limit) {
            // The pools may have given memory back at a synchronisation.
            reconcile_locked(rt, drv, &mut inner, None);
            l = inner.ledgers.get(&pool).copied().unwrap_or(l);
            need = need_of(&l);
            if need > 0 && !rt.try_charge(device, need, limit) {
                log::log(Level::Debug, || {
                    format!(
                        "stream-ordered allocation of {bytes} bytes on device {} refused: {} of {limit} bytes in use",
                        device.ordinal,
                        rt.used(device.slot)
                    )
                });
                return OUT_OF_MEMORY;
            }
        }
        let reserve_before = l.charged;
        l.charged += need;
        let result = driver();
        let rc = match result {
            Ok(ptr) => {
                l.outstanding += bytes;
                if let Some(now) = drv.reserved(pool) {
                    // Learn a coarser step if the pool grew past the charge.
                    let grown = now.saturating_sub(reserve_before);
                    if grown > need {
                        l.granule = l.granule.max(grown.next_power_of_two());
                    }
                }
                reconcile(rt, drv, pool, &mut l);
                if rt.used(device.slot) > limit {
                    // The pool grew by more than was charged (its granule)
                    // and the container is past its limit: undo.
                    l.outstanding -= bytes;
                    drv.undo(ptr, pool, l.outstanding);
                    reconcile(rt, drv, pool, &mut l);
                    OUT_OF_MEMORY
                } else {
                    let stale = backend::track(
                        ptr,
                        Tracked {
                            slot: device.slot,
                            bytes,
                            kind: Kind::Async,
                            owner: pool,
                        },
                    );
                    if let Some(stale) = stale {
                        forget_stale(rt, &mut inner, stale);
                    }
                    SUCCESS
                }
            }
            Err(rc) => {
                reconcile(rt, drv, pool, &mut l);
                rc
            }
        };
        inner.ledgers.insert(pool, l);
        rc
    }

    /// A free of the stream-ordered allocation `tracked` (already taken out
    /// of the table) at `ptr`; `driver` frees it. A failed free puts the
    /// record back.
    pub fn release(
        &self,
        rt: &Runtime,
        drv: &dyn PoolDriver,
        ptr: u64,
        tracked: Tracked,
        driver: impl FnOnce() -> CuResult,
    ) -> CuResult {
        let mut inner = self.lock();
        let rc = driver();
        if rc != SUCCESS {
            backend::track(ptr, tracked);
            return rc;
        }
        let pool = tracked.owner;
        if let Some(mut l) = inner.ledgers.get(&pool).copied() {
            l.outstanding = l.outstanding.saturating_sub(tracked.bytes);
            reconcile(rt, drv, pool, &mut l);
            inner.ledgers.insert(pool, l);
        }
        rc
    }

    /// Brings every pool's ledger in line with the driver (after a trim, a
    /// destroyed pool, a reset device); with `slot`, only that device's.
    /// Returns the bytes given back.
    pub fn reconcile_all(&self, rt: &Runtime, drv: &dyn PoolDriver, slot: Option<usize>) -> u64 {
        let mut inner = self.lock();
        reconcile_locked(rt, drv, &mut inner, slot)
    }

    /// [`Pools::reconcile_all`] for a refused charge elsewhere: skipped
    /// (0) when a pool path holds the lock (it reconciles by itself).
    pub fn reconcile_if_idle(&self, rt: &Runtime, drv: &dyn PoolDriver) -> u64 {
        match self.inner.try_lock() {
            Ok(mut inner) => reconcile_locked(rt, drv, &mut inner, None),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                reconcile_locked(rt, drv, &mut p.into_inner(), None)
            }
            Err(std::sync::TryLockError::WouldBlock) => 0,
        }
    }

    /// The device of slot `slot` was reset: its stream-ordered allocations
    /// are gone. Drops their records, then reconciles its pools.
    pub fn device_reset(&self, rt: &Runtime, drv: &dyn PoolDriver, slot: usize) {
        let gone = backend::untrack_where(|t| t.kind == Kind::Async && t.slot == slot);
        {
            let mut inner = self.lock();
            for t in gone {
                if let Some(l) = inner.ledgers.get_mut(&t.owner) {
                    l.outstanding = l.outstanding.saturating_sub(t.bytes);
                }
            }
        }
        self.reconcile_all(rt, drv, Some(slot));
    }

    /// Whether a pool was ever used (`cuMemGetInfo` and refusals reconcile
    /// only then). Takes no lock.
    pub fn any(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }
}

fn reconcile_locked(
    rt: &Runtime,
    drv: &dyn PoolDriver,
    inner: &mut Inner,
    slot: Option<usize>,
) -> u64 {
    let mut given_back = 0u64;
    let pools: Vec<u64> = inner.ledgers.keys().copied().collect();
    for p in pools {
        if let Some(mut l) = inner.ledgers.get(&p).copied()
            && slot.is_none_or(|s| s == l.slot)
        {
            given_back = given_back.saturating_add(reconcile(rt, drv, p, &mut l));
            if l.charged == 0 && l.outstanding == 0 && drv.reserved(p).is_none() {
                inner.ledgers.remove(&p);
                inner.devices.remove(&p);
            } else {
                inner.ledgers.insert(p, l);
            }
        }
    }
    given_back
}

/// A record replaced by a new one of the same pointer: the old allocation
/// was freed some way the library did not see.
fn forget_stale(rt: &Runtime, inner: &mut Inner, stale: Tracked) {
    if stale.kind == Kind::Async {
        if let Some(l) = inner.ledgers.get_mut(&stale.owner) {
            l.outstanding = l.outstanding.saturating_sub(stale.bytes);
        }
    } else {
        rt.uncharge(stale.slot, stale.bytes);
    }
}

/// The process's pools.
pub fn global() -> &'static Pools {
    static POOLS: Pools = Pools::new();
    &POOLS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tests::{Limited, limited};
    use std::cell::Cell;
    use std::collections::HashMap as Map;
    use std::sync::Mutex as M;
    use tessera_model::vgpu::MIB;

    /// A runtime whose device 0 is limited to `limit`, that device, and
    /// empty ledgers.
    fn ledgers(limit: u64) -> (Limited, DeviceInfo, Pools) {
        let rt = limited(limit);
        let dev = rt.device(0).expect("device").clone();
        (rt, dev, Pools::new())
    }

    /// A request for `bytes` from `pool` on `device`, up to its limit.
    fn request(device: &DeviceInfo, pool: u64, bytes: u64) -> Request<'_> {
        Request {
            pool,
            device,
            limit: device.memory_limit.expect("a limited device"),
            bytes,
        }
    }

    /// A pool that grows in 2 MiB granules and keeps everything (threshold
    /// UINT64_MAX) until trimmed.
    #[derive(Default)]
    struct KeepAll {
        reserved: M<Map<u64, u64>>,
        used: M<Map<u64, u64>>,
        undone: Cell<u32>,
    }

    impl KeepAll {
        fn alloc(&self, pool: u64, bytes: u64) {
            let mut used = self.used.lock().unwrap();
            let u = used.entry(pool).or_default();
            *u += bytes;
            let mut reserved = self.reserved.lock().unwrap();
            let r = reserved.entry(pool).or_default();
            if *u > *r {
                *r = (*u).next_multiple_of(2 * MIB);
            }
        }
        fn free(&self, pool: u64, bytes: u64) {
            *self.used.lock().unwrap().entry(pool).or_default() -= bytes;
        }
    }

    impl PoolDriver for KeepAll {
        fn reserved(&self, pool: u64) -> Option<u64> {
            self.reserved.lock().unwrap().get(&pool).copied()
        }
        fn undo(&self, _ptr: u64, pool: u64, keep: u64) {
            self.undone.set(self.undone.get() + 1);
            let used = self.used.lock().unwrap().get(&pool).copied().unwrap_or(0);
            let _ = used;
            self.reserved
                .lock()
                .unwrap()
                .insert(pool, keep.next_multiple_of(2 * MIB));
        }
    }

    #[test]
    fn memory_a_pool_keeps_stays_charged_and_serves_the_pool_again() {
        let (rt, dev, pools) = ledgers(100 * MIB);
        let drv = KeepAll::default();
        let alloc = |ptr: u64, mib: u64| {
            pools.allocate(&rt, &drv, &request(&dev, 7, mib * MIB), || {
                drv.alloc(7, mib * MIB);
                Ok(ptr)
            })
        };
        assert_eq!(alloc(0x1000, 60), SUCCESS);
        assert_eq!(rt.used(dev.slot), 60 * MIB);
        let t = backend::untrack(backend::Space::Pointer, 0x1000).expect("tracked");
        assert_eq!(
            pools.release(&rt, &drv, 0x1000, t, || {
                drv.free(7, 60 * MIB);
                SUCCESS
            }),
            SUCCESS
        );
        assert_eq!(rt.used(dev.slot), 60 * MIB, "the pool keeps what was freed");
        assert!(
            !rt.try_charge(&dev, 50 * MIB, 100 * MIB),
            "so others cannot have it"
        );
        assert_eq!(alloc(0x2000, 60), SUCCESS, "the pool serves it again");
        assert_eq!(rt.used(dev.slot), 60 * MIB);
        assert_eq!(alloc(0x3000, 50), OUT_OF_MEMORY, "60 + 50 > 100");
        assert_eq!(drv.undone.get(), 0, "refused before the driver");
        assert_eq!(alloc(0x4000, 39), SUCCESS, "granule-rounded 100 fits");
        assert_eq!(rt.used(dev.slot), 100 * MIB);
        let _ = backend::untrack(backend::Space::Pointer, 0x2000);
        let _ = backend::untrack(backend::Space::Pointer, 0x4000);
    }

    /// A pool that grows in 8 MiB steps (coarser than the 2 MiB the
    /// library assumes at first).
    #[derive(Default)]
    struct Coarse {
        reserved: M<u64>,
        used: M<u64>,
        undone: Cell<u32>,
    }

    impl Coarse {
        fn alloc(&self, bytes: u64) {
            let mut used = self.used.lock().unwrap();
            *used += bytes;
            let mut reserved = self.reserved.lock().unwrap();
            if *used > *reserved {
                *reserved = (*used).next_multiple_of(8 * MIB);
            }
        }
    }

    impl PoolDriver for Coarse {
        fn reserved(&self, _pool: u64) -> Option<u64> {
            Some(*self.reserved.lock().unwrap())
        }
        fn undo(&self, _ptr: u64, _pool: u64, keep: u64) {
            self.undone.set(self.undone.get() + 1);
            *self.used.lock().unwrap() = keep;
            *self.reserved.lock().unwrap() = keep.next_multiple_of(8 * MIB);
        }
    }

    #[test]
    fn a_growth_is_charged_in_whole_granules_before_the_driver() {
        let (rt, dev, pools) = ledgers(3 * MIB);
        let drv = KeepAll::default();
        let called = Cell::new(false);
        // 3 MiB takes two 2 MiB granules: 4 MiB do not fit a 3 MiB slice.
        let rc = pools.allocate(&rt, &drv, &request(&dev, 9, 3 * MIB), || {
            called.set(true);
            Ok(0x9000)
        });
        assert_eq!(rc, OUT_OF_MEMORY);
        assert!(!called.get(), "refused before the driver");
        assert_eq!(rt.used(dev.slot), 0);
    }

    #[test]
    fn a_pool_that_grows_past_the_limit_is_undone_and_its_step_learned() {
        let (rt, dev, pools) = ledgers(5 * MIB);
        let drv = Coarse::default();
        let alloc = |ptr: u64| {
            pools.allocate(&rt, &drv, &request(&dev, 4, MIB), || {
                drv.alloc(MIB);
                Ok(ptr)
            })
        };
        // 2 MiB charged, the pool takes 8: past the 5 MiB limit, undone.
        assert_eq!(alloc(0xa000), OUT_OF_MEMORY);
        assert_eq!(drv.undone.get(), 1);
        assert_eq!(rt.used(dev.slot), 0);
        assert!(backend::untrack(backend::Space::Pointer, 0xa000).is_none());
        // Next time 8 MiB are charged first: refused before the driver.
        assert_eq!(alloc(0xb000), OUT_OF_MEMORY);
        assert_eq!(drv.undone.get(), 1, "the driver was not called again");
    }
}
