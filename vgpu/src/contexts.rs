//! Contexts: what they hold, and what goes when they go.
//!
//! The driver frees a context's memory when the context is destroyed
//! (`cuCtxDestroy`), when the last reference to a primary context is
//! released (`cuDevicePrimaryCtxRelease`), and when a primary context is
//! reset (`cuDevicePrimaryCtxReset`, which is `cudaDeviceReset()`): every
//! allocation made in it, its arrays, its malloc heap and its own memory.
//! Each record of the allocation table names the context that was current
//! when it was made (its *owner*); a teardown takes out every record the
//! context owned and gives their charge back, so the next legal allocation
//! is not refused and `cuMemGetInfo` tells the truth.
//!
//! Two reservations do not go through an allocation call and are charged
//! here: the malloc heap (`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, n)`,
//! charged before the driver takes it, refused past the limit), and the
//! context's own memory, which the driver takes at creation and which
//! `nvidia-smi` shows against the process: measured as what NVML reports
//! for this process beyond what the library has charged for it, and
//! charged (past the limit if need be: it is already held) to the context.

use crate::backend::{self, Kind, Space, Tracked};
use crate::log::{self, Level};
use crate::memory::{CuResult, OUT_OF_MEMORY, SUCCESS};
use crate::runtime::{DeviceInfo, Runtime};

/// Gives back the charge of every record `ctx` owned (stream-ordered
/// allocations belong to their pool, not to a context); with `keep_own`,
/// the context's own memory stays charged (a reset context lives on).
/// Returns the bytes given back.
pub fn context_gone(rt: &Runtime, ctx: u64, keep_own: bool) -> u64 {
    if ctx == 0 {
        return 0;
    }
    let gone = backend::untrack_where(|t| {
        t.owner == ctx && t.kind != Kind::Async && !(keep_own && t.kind == Kind::Context)
    });
    let mut bytes = 0u64;
    for t in gone {
        rt.uncharge(t.slot, t.bytes);
        bytes = bytes.saturating_add(t.bytes);
    }
    if bytes > 0 {
        log::log(Level::Debug, || {
            format!("context {ctx:#x} gone: {bytes} bytes given back")
        });
    }
    bytes
}

/// `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, bytes)` on `ctx` (current, on
/// `device`): the growth over the heap already charged is charged before
/// the driver call (refused past the limit); a smaller heap gives back.
pub fn set_heap(
    rt: &Runtime,
    device: &DeviceInfo,
    limit: u64,
    ctx: u64,
    bytes: u64,
    driver: impl FnOnce() -> CuResult,
) -> CuResult {
    let old = backend::untrack(Space::Heap, ctx);
    let old_bytes = old.map_or(0, |t| t.bytes);
    if bytes > old_bytes && !rt.try_charge(device, bytes - old_bytes, limit) {
        if let Some(old) = old {
            backend::track(ctx, old);
        }
        return OUT_OF_MEMORY;
    }
    let rc = driver();
    let kept = if rc == SUCCESS {
        if bytes < old_bytes {
            rt.uncharge(device.slot, old_bytes - bytes);
        }
        bytes
    } else {
        if bytes > old_bytes {
            rt.uncharge(device.slot, bytes - old_bytes);
        }
        old_bytes
    };
    if kept > 0 {
        backend::track(
            ctx,
            Tracked {
                slot: device.slot,
                bytes: kept,
                kind: Kind::Heap,
                owner: ctx,
            },
        );
    }
    rc
}

/// Which of NVML's processes on a device is this one, and what it holds.
///
/// NVML lists processes by their pid in the host's pid namespace; a process
/// in a container's own namespace knows only its pid there. So: the pid
/// found before (`known`), else this process's own pid (`getpid`, right
/// outside containers), else the one process that appeared in NVML's list
/// since `before` (taken just before this process made its first context).
/// `None` when it cannot be told (two appeared at once): better not to
/// charge than to charge another process's memory.
pub fn own_entry(
    listed: &[(u32, u64)],
    known: Option<u32>,
    getpid: u32,
    before: Option<&[u32]>,
) -> Option<(u32, u64)> {
    let by_pid = |pid: u32| listed.iter().copied().find(|&(p, _)| p == pid);
    if let Some(pid) = known {
        return by_pid(pid);
    }
    if let Some(found) = by_pid(getpid) {
        return Some(found);
    }
    let before = before?;
    let mut new = listed.iter().filter(|(p, _)| !before.contains(p));
    match (new.next(), new.next()) {
        (Some(&only), None) => Some(only),
        _ => None,
    }
}

/// Whether the library has measured `ctx`'s own memory already.
pub fn measured(ctx: u64) -> bool {
    backend::lookup(Space::Context, ctx).is_some()
}

/// A context `ctx` was made on `device`: `held` is what the driver holds
/// for this process on the device (NVML), `charged` what the library has
/// charged for this process there. The difference is the context's own
/// memory: charged to it, whatever the limit (it is already taken).
pub fn context_made(rt: &Runtime, device: &DeviceInfo, ctx: u64, held: u64, charged: u64) {
    let own = held.saturating_sub(charged);
    backend::track(
        ctx,
        Tracked {
            slot: device.slot,
            bytes: own,
            kind: Kind::Context,
            owner: ctx,
        },
    );
    if own > 0 {
        rt.force_charge(device.slot, own);
        log::log(Level::Info, || {
            format!(
                "context {ctx:#x} on device {} holds {own} bytes of its own; charged to the slice",
                device.ordinal
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Kind as K;
    use crate::memory;
    use crate::runtime::tests::limited;

    #[test]
    fn this_process_is_found_in_nvml_by_pid_or_by_what_appeared() {
        let listed = [(4100, 300), (4200, 500)];
        assert_eq!(
            own_entry(&listed, None, 4200, None),
            Some((4200, 500)),
            "by own pid"
        );
        assert_eq!(
            own_entry(&listed, Some(4100), 7, None),
            Some((4100, 300)),
            "known"
        );
        // In a container: pid 7 here, NVML lists host pids.
        assert_eq!(own_entry(&listed, None, 7, None), None, "nothing to go by");
        assert_eq!(
            own_entry(&listed, None, 7, Some(&[4100])),
            Some((4200, 500)),
            "the one that appeared with our context"
        );
        assert_eq!(
            own_entry(&listed, None, 7, Some(&[])),
            None,
            "two appeared: unknown"
        );
        assert_eq!(
            own_entry(&listed, Some(9), 7, Some(&[])),
            None,
            "known but gone"
        );
    }

    #[test]
    fn a_destroyed_context_takes_its_allocations_heap_and_own_memory() {
        let rt = limited(1000);
        let dev = rt.device(0).expect("device").clone();
        let (ctx, other) = (0xc7c1, 0xc7c2);
        context_made(&rt, &dev, ctx, 150, 0);
        assert_eq!(rt.used(dev.slot), 150);
        assert!(measured(ctx));
        assert_eq!(
            memory::allocate(&rt, "t", Some(0), 300, K::Device, ctx, || Ok(0xa1)),
            SUCCESS
        );
        assert_eq!(
            memory::allocate(&rt, "t", Some(0), 100, K::Device, other, || Ok(0xa2)),
            SUCCESS
        );
        assert_eq!(set_heap(&rt, &dev, 1000, ctx, 200, || SUCCESS), SUCCESS);
        assert_eq!(rt.used(dev.slot), 750);
        assert_eq!(
            set_heap(&rt, &dev, 1000, ctx, 500, || SUCCESS),
            OUT_OF_MEMORY,
            "750 + 300 > 1000"
        );
        assert_eq!(set_heap(&rt, &dev, 1000, ctx, 50, || SUCCESS), SUCCESS);
        assert_eq!(rt.used(dev.slot), 600);
        assert_eq!(context_gone(&rt, ctx, true), 350, "reset: own memory stays");
        assert_eq!(rt.used(dev.slot), 250);
        assert_eq!(context_gone(&rt, ctx, false), 150);
        assert_eq!(
            rt.used(dev.slot),
            100,
            "the other context's allocation stays"
        );
        assert_eq!(context_gone(&rt, other, false), 100);
        assert_eq!(rt.used(dev.slot), 0);
    }
}
