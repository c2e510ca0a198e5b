//! Virtual memory management (`cuMemCreate` & co.): physical allocations
//! counted by handle, for as long as the driver really keeps them.
//!
//! The driver frees a physical allocation when its last handle reference
//! *and* its last mapping are gone. Programs drop them in every order: the
//! CUDA samples `cuMemRelease` right after `cuMemMap` (the mapping keeps the
//! memory), NCCL retains the handle of a mapping
//! (`cuMemRetainAllocationHandle`) and releases it again, importers of a
//! shareable handle take a reference of their own. The ledger follows
//! exactly that: references (create, retain, same-process import) and
//! mappings (map; unmap and address free take the mappings that start in
//! their range), and gives the charge back only when both reach zero.
//!
//! Every change is recorded after the driver call succeeded (the driver,
//! not the library, decides what is valid). Charging a new allocation
//! happens before `cuMemCreate`; the ledger only holds what was charged. A
//! handle imported from another process is memory that process charged: it
//! is tracked with 0 bytes so its mappings are known.
//!
//! One mutex guards the ledger, and the calls that change mappings or
//! references hold it *across* their driver call ([`VmmLedger::locked`]):
//! otherwise a range unmapped by one thread and reserved and mapped again
//! by another could be recorded in the wrong order, and one thread's unmap
//! would take the other's mapping (giving back memory the driver holds).
//! VMM calls are few (set-up and teardown of pools, not per tensor).

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::{Mutex, PoisonError};

/// What to give back: `(slot, bytes)` of a physical allocation that is gone.
pub type Freed = (usize, u64);

#[derive(Debug, Clone, Copy)]
struct Physical {
    slot: usize,
    bytes: u64,
    refs: u32,
    maps: u32,
}

/// Pointer-like keys, hashed as the allocation table hashes them.
type Hasher = BuildHasherDefault<crate::alloc_table::PtrHasher>;

#[derive(Debug, Default)]
struct Inner {
    handles: HashMap<u64, Physical, Hasher>,
    /// Mapping start → (size, handle).
    mappings: BTreeMap<u64, (u64, u64)>,
    /// Handles of a same-process import → the allocation's own handle.
    aliases: HashMap<u64, u64, Hasher>,
    /// What this process exported: the shareable object's identity (device
    /// and inode of the file descriptor) → the allocation's handle.
    exports: HashMap<(u64, u64), u64, Hasher>,
}

/// The process's VMM allocations.
#[derive(Debug, Default)]
pub struct VmmLedger {
    inner: Mutex<Inner>,
}

impl Inner {
    fn settle(&mut self, handle: u64) -> Option<Freed> {
        let p = *self.handles.get(&handle)?;
        if p.refs == 0 && p.maps == 0 {
            self.handles.remove(&handle);
            self.exports.retain(|_, h| *h != handle);
            (p.bytes > 0).then_some((p.slot, p.bytes))
        } else {
            None
        }
    }

    /// The allocation's own handle for `handle` (itself, or what an import
    /// aliased).
    fn resolve(&self, handle: u64) -> u64 {
        self.aliases.get(&handle).copied().unwrap_or(handle)
    }
}

impl VmmLedger {
    /// An empty ledger.
    pub const fn new() -> VmmLedger {
        VmmLedger {
            inner: Mutex::new(Inner {
                handles: HashMap::with_hasher(BuildHasherDefault::new()),
                mappings: BTreeMap::new(),
                aliases: HashMap::with_hasher(BuildHasherDefault::new()),
                exports: HashMap::with_hasher(BuildHasherDefault::new()),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `driver` (a call that changes mappings or references) with the
    /// ledger locked, then `record` with its result on a ledger view: the
    /// driver's order and the ledger's are the same.
    pub fn locked<R, T>(
        &self,
        driver: impl FnOnce() -> R,
        record: impl FnOnce(&R, &Locked<'_>) -> T,
    ) -> (R, T) {
        let guard = Locked {
            inner: std::cell::RefCell::new(self.lock()),
        };
        let result = driver();
        let recorded = record(&result, &guard);
        (result, recorded)
    }

    /// `cuMemCreate` succeeded: `bytes` charged to `slot`, one reference.
    /// Returns what a stale record of the same handle held (the driver
    /// reused a handle the library saw die some other way).
    pub fn created(&self, handle: u64, slot: usize, bytes: u64) -> Option<Freed> {
        let stale = self.lock().handles.insert(
            handle,
            Physical {
                slot,
                bytes,
                refs: 1,
                maps: 0,
            },
        );
        stale.filter(|p| p.bytes > 0).map(|p| (p.slot, p.bytes))
    }

    /// One more reference (`cuMemRetainAllocationHandle`, or an import
    /// that named an allocation of this process). An unknown handle is
    /// memory charged elsewhere (another process's export): tracked, 0 bytes.
    pub fn referenced(&self, handle: u64, slot: usize) {
        referenced(&mut self.lock(), handle, slot);
    }

    /// `cuMemRelease` succeeded.
    pub fn released(&self, handle: u64) -> Option<Freed> {
        released(&mut self.lock(), handle)
    }

    /// `cuMemMap` succeeded: `[va, va + size)` maps `handle`.
    pub fn mapped(&self, va: u64, size: u64, handle: u64) {
        mapped(&mut self.lock(), va, size, handle);
    }

    /// `cuMemUnmap` or `cuMemAddressFree` succeeded on `[va, va + size)`:
    /// every mapping that starts in it is gone.
    pub fn unmapped(&self, va: u64, size: u64) -> Vec<Freed> {
        unmapped(&mut self.lock(), va, size)
    }

    /// `handle` was exported as the shareable object `object` (device,
    /// inode of the file descriptor).
    pub fn exported(&self, handle: u64, object: (u64, u64)) {
        let mut inner = self.lock();
        let own = inner.resolve(handle);
        if inner.handles.contains_key(&own) {
            inner.exports.insert(object, own);
        }
    }

    /// Whether `handle` is an allocation of this process the ledger knows.
    pub fn knows(&self, handle: u64) -> bool {
        self.lock().handles.contains_key(&handle)
    }

    /// Bytes held per slot (reports and tests).
    pub fn held(&self) -> Vec<(usize, u64)> {
        let mut out: Vec<(usize, u64)> = Vec::new();
        for p in self.lock().handles.values() {
            match out.iter_mut().find(|(s, _)| *s == p.slot) {
                Some((_, b)) => *b += p.bytes,
                None => out.push((p.slot, p.bytes)),
            }
        }
        out.retain(|(_, b)| *b > 0);
        out.sort_unstable();
        out
    }
}

/// The ledger while [`VmmLedger::locked`] holds it.
pub struct Locked<'a> {
    inner: std::cell::RefCell<std::sync::MutexGuard<'a, Inner>>,
}

impl Locked<'_> {
    /// A same-process import gave `handle` for the allocation exported as
    /// `object` (device, inode): one more reference to it. `false` when the
    /// object is not one of this process's exports.
    pub fn imported(&self, handle: u64, object: (u64, u64)) -> bool {
        let mut inner = self.inner.borrow_mut();
        let Some(&own) = inner.exports.get(&object) else {
            return false;
        };
        inner.aliases.insert(handle, own);
        referenced(&mut inner, own, 0);
        true
    }

    /// As [`VmmLedger::referenced`].
    pub fn referenced(&self, handle: u64, slot: usize) {
        referenced(&mut self.inner.borrow_mut(), handle, slot);
    }

    /// As [`VmmLedger::released`].
    pub fn released(&self, handle: u64) -> Option<Freed> {
        released(&mut self.inner.borrow_mut(), handle)
    }

    /// As [`VmmLedger::mapped`].
    pub fn mapped(&self, va: u64, size: u64, handle: u64) {
        mapped(&mut self.inner.borrow_mut(), va, size, handle);
    }

    /// As [`VmmLedger::unmapped`].
    pub fn unmapped(&self, va: u64, size: u64) -> Vec<Freed> {
        unmapped(&mut self.inner.borrow_mut(), va, size)
    }
}

fn referenced(inner: &mut Inner, handle: u64, slot: usize) {
    let handle = inner.resolve(handle);
    inner
        .handles
        .entry(handle)
        .and_modify(|p| p.refs = p.refs.saturating_add(1))
        .or_insert(Physical {
            slot,
            bytes: 0,
            refs: 1,
            maps: 0,
        });
}

fn released(inner: &mut Inner, handle: u64) -> Option<Freed> {
    let handle = match inner.aliases.remove(&handle) {
        Some(own) => own,
        None => handle,
    };
    let p = inner.handles.get_mut(&handle)?;
    p.refs = p.refs.saturating_sub(1);
    inner.settle(handle)
}

fn mapped(inner: &mut Inner, va: u64, size: u64, handle: u64) {
    let handle = inner.resolve(handle);
    if let Some(p) = inner.handles.get_mut(&handle) {
        p.maps = p.maps.saturating_add(1);
        inner.mappings.insert(va, (size, handle));
    }
}

fn unmapped(inner: &mut Inner, va: u64, size: u64) -> Vec<Freed> {
    let end = va.saturating_add(size);
    let starts: Vec<u64> = inner.mappings.range(va..end).map(|(s, _)| *s).collect();
    let mut freed = Vec::new();
    for start in starts {
        if let Some((_, handle)) = inner.mappings.remove(&start) {
            if let Some(p) = inner.handles.get_mut(&handle) {
                p.maps = p.maps.saturating_sub(1);
            }
            freed.extend(inner.settle(handle));
        }
    }
    freed
}

/// The process's ledger.
pub fn global() -> &'static VmmLedger {
    static LEDGER: VmmLedger = VmmLedger::new();
    &LEDGER
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn release_before_unmap_keeps_the_memory_until_the_unmap() {
        let l = VmmLedger::new();
        assert_eq!(l.created(0x10, 0, GIB), None);
        l.mapped(0x7000_0000, GIB, 0x10);
        assert_eq!(l.released(0x10), None, "the mapping keeps it");
        assert_eq!(l.held(), vec![(0, GIB)]);
        assert_eq!(l.unmapped(0x7000_0000, GIB), vec![(0, GIB)]);
        assert!(l.held().is_empty());
    }

    #[test]
    fn a_retained_handle_keeps_the_memory_after_unmap_and_release() {
        let l = VmmLedger::new();
        l.created(0x20, 1, GIB);
        l.mapped(0x8000_0000, GIB, 0x20);
        l.referenced(0x20, 1); // cuMemRetainAllocationHandle
        assert_eq!(l.released(0x20), None);
        assert!(l.unmapped(0x8000_0000, GIB).is_empty(), "retained");
        assert_eq!(l.released(0x20), Some((1, GIB)));
    }

    #[test]
    fn address_free_takes_every_mapping_in_its_range() {
        let l = VmmLedger::new();
        l.created(0x30, 0, 2 << 20);
        l.created(0x31, 0, 2 << 20);
        l.mapped(0x1000_0000, 2 << 20, 0x30);
        l.mapped(0x1020_0000, 2 << 20, 0x31);
        l.released(0x30);
        l.released(0x31);
        let mut freed = l.unmapped(0x1000_0000, 4 << 20);
        freed.sort_unstable();
        assert_eq!(freed, vec![(0, 2 << 20), (0, 2 << 20)]);
        assert!(l.unmapped(0x1000_0000, 4 << 20).is_empty(), "once only");
    }

    #[test]
    fn a_same_process_import_is_the_same_memory_under_another_handle() {
        let l = VmmLedger::new();
        l.created(0x50, 0, GIB);
        l.exported(0x50, (7, 42));
        let ((), known) = l.locked(|| (), |_, ledger| ledger.imported(0x51, (7, 42)));
        assert!(known);
        assert_eq!(l.released(0x50), None, "the import holds it");
        l.mapped(0x3000_0000, GIB, 0x51);
        assert_eq!(l.released(0x51), None, "mapped");
        assert_eq!(l.unmapped(0x3000_0000, GIB), vec![(0, GIB)]);
        let ((), known) = l.locked(|| (), |_, ledger| ledger.imported(0x52, (7, 42)));
        assert!(!known, "the export went with the memory");
    }

    #[test]
    fn a_foreign_import_is_tracked_but_never_given_back() {
        let l = VmmLedger::new();
        l.referenced(0x40, 0);
        l.mapped(0x2000_0000, GIB, 0x40);
        assert_eq!(l.released(0x40), None);
        assert!(l.unmapped(0x2000_0000, GIB).is_empty(), "0 bytes here");
        assert!(!l.knows(0x40));
        assert_eq!(l.released(0x99), None, "unknown handle");
    }
}
