//! The memory limit: charge first, call the driver, give the charge back if
//! the driver fails; on free, take the record out of the allocation table,
//! free, and give the charge back (or put the record back if the free
//! failed).
//!
//! Every function here takes the driver call as a closure, so the order of
//! operations is the same for every allocation API and is tested without a
//! driver. The closures are made in `ffi`, which owns the raw calls.

use crate::backend::{self, Kind, Space, Tracked};
use crate::log::{self, Level};
use crate::runtime::Runtime;

/// `CUresult`.
pub type CuResult = i32;
/// `CUDA_SUCCESS`.
pub const SUCCESS: CuResult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: CuResult = 2;

/// The pitch the driver is expected to round rows of `cuMemAllocPitch` to;
/// the charge made before the call assumes it and is corrected after.
pub const EXPECTED_PITCH_ALIGNMENT: u64 = 512;

fn code(result: Result<u64, CuResult>) -> CuResult {
    match result {
        Ok(_) => SUCCESS,
        Err(rc) => rc,
    }
}

fn denied(what: &str, bytes: u64, ordinal: i32, limit: u64, rt: &Runtime, slot: usize) -> CuResult {
    log::log(Level::Debug, || {
        format!(
            "{what}: {bytes} bytes on device {ordinal} refused: {} of {limit} bytes in use",
            rt.used(slot)
        )
    });
    OUT_OF_MEMORY
}

/// An allocation of `bytes` on CUDA device `ordinal` (`None`: unknown, e.g.
/// no current context; the driver decides alone). `driver` performs it and
/// returns the new handle.
/// `owner` is the context the allocation belongs to (0: none known).
pub fn allocate(
    rt: &Runtime,
    what: &str,
    ordinal: Option<i32>,
    bytes: u64,
    kind: Kind,
    owner: u64,
    driver: impl FnOnce() -> Result<u64, CuResult>,
) -> CuResult {
    allocate_or_fall_back(
        rt,
        what,
        ordinal,
        (bytes, kind, owner),
        driver,
        None::<fn() -> _>,
    )
}

/// [`allocate`] for `cuMemAlloc_v2`: when the device is physically full
/// (the driver says out of memory) but the slice has room, and the
/// configuration allows oversubscription, `managed` serves the allocation
/// from managed (host-backed) memory, counted to the slice all the same.
pub fn allocate_device(
    rt: &Runtime,
    ordinal: Option<i32>,
    bytes: u64,
    owner: u64,
    driver: impl FnOnce() -> Result<u64, CuResult>,
    managed: impl FnOnce() -> Result<u64, CuResult>,
) -> CuResult {
    let fallback = rt.oversubscribe().then_some(managed);
    allocate_or_fall_back(
        rt,
        "cuMemAlloc",
        ordinal,
        (bytes, Kind::Device, owner),
        driver,
        fallback,
    )
}

fn allocate_or_fall_back(
    rt: &Runtime,
    what: &str,
    ordinal: Option<i32>,
    (bytes, kind, owner): (u64, Kind, u64),
    driver: impl FnOnce() -> Result<u64, CuResult>,
    fallback: Option<impl FnOnce() -> Result<u64, CuResult>>,
) -> CuResult {
    let Some((ordinal, device)) = ordinal.and_then(|o| Some((o, rt.device(o)?))) else {
        return code(driver());
    };
    let Some(limit) = device.memory_limit else {
        return code(driver());
    };
    if !rt.try_charge(device, bytes, limit) {
        return denied(what, bytes, ordinal, limit, rt, device.slot);
    }
    let (result, kind) = match driver() {
        Err(OUT_OF_MEMORY) if fallback.is_some() => match fallback.map(|f| f()) {
            Some(Ok(handle)) => (Ok(handle), Kind::HostFallback),
            _ => (Err(OUT_OF_MEMORY), kind),
        },
        other => (other, kind),
    };
    match result {
        Ok(handle) => {
            record(
                rt,
                handle,
                Tracked {
                    slot: device.slot,
                    bytes,
                    kind,
                    owner,
                },
            );
            SUCCESS
        }
        Err(rc) => {
            rt.uncharge(device.slot, bytes);
            rc
        }
    }
}

/// `cuMemAllocPitch`: the size is `pitch × height` with the pitch the
/// driver picks. The charge made before the call assumes rows rounded to
/// [`EXPECTED_PITCH_ALIGNMENT`]; after the call it is corrected to the
/// real size, and if the real size does not fit, the allocation is freed
/// (`free`) and refused.
pub fn allocate_pitch(
    rt: &Runtime,
    ordinal: Option<i32>,
    owner: u64,
    width: u64,
    height: u64,
    driver: impl FnOnce() -> Result<(u64, u64), CuResult>,
    free: impl FnOnce(u64),
) -> CuResult {
    let Some((ordinal, device)) = ordinal.and_then(|o| Some((o, rt.device(o)?))) else {
        return code(driver().map(|(ptr, _)| ptr));
    };
    let Some(limit) = device.memory_limit else {
        return code(driver().map(|(ptr, _)| ptr));
    };
    let expected = width
        .div_ceil(EXPECTED_PITCH_ALIGNMENT)
        .saturating_mul(EXPECTED_PITCH_ALIGNMENT)
        .saturating_mul(height);
    if !rt.try_charge(device, expected, limit) {
        return denied("cuMemAllocPitch", expected, ordinal, limit, rt, device.slot);
    }
    let (ptr, pitch) = match driver() {
        Ok(ok) => ok,
        Err(rc) => {
            rt.uncharge(device.slot, expected);
            return rc;
        }
    };
    let actual = pitch.saturating_mul(height);
    if actual > expected {
        if !rt.try_charge(device, actual - expected, limit) {
            free(ptr);
            rt.uncharge(device.slot, expected);
            return denied("cuMemAllocPitch", actual, ordinal, limit, rt, device.slot);
        }
    } else {
        rt.uncharge(device.slot, expected - actual);
    }
    record(
        rt,
        ptr,
        Tracked {
            slot: device.slot,
            bytes: actual,
            kind: Kind::Device,
            owner,
        },
    );
    SUCCESS
}

/// Records a new allocation; a stale record of the same handle (freed
/// behind the library's back) gives its charge back.
fn record(rt: &Runtime, handle: u64, tracked: Tracked) {
    if let Some(stale) = backend::track(handle, tracked) {
        rt.uncharge(stale.slot, stale.bytes);
    }
}

/// A free of `handle` in `space`: the charge is given back once the driver
/// freed it. O(1): one table removal. A stream-ordered allocation (freed
/// with `cuMemFree` or `cuMemFreeAsync`) goes back to its pool, whose
/// ledger `pooled` updates (it is handed the driver call to make).
pub fn release<D: FnOnce() -> CuResult>(
    rt: &Runtime,
    space: Space,
    handle: u64,
    driver: D,
    pooled: impl FnOnce(Tracked, D) -> CuResult,
) -> CuResult {
    if !rt.enforcing() {
        return driver();
    }
    let tracked = backend::untrack(space, handle);
    if let Some(t) = tracked
        && t.kind == Kind::Async
    {
        return pooled(t, driver);
    }
    let rc = driver();
    if let Some(tracked) = tracked {
        if rc == SUCCESS {
            rt.uncharge(tracked.slot, tracked.bytes);
        } else {
            // Still allocated: keep counting it.
            record(rt, handle, tracked);
        }
    }
    rc
}

/// The slice of device `ordinal` as `(free, total)`, if it has a memory
/// limit: total is the limit, free what the container has not used of it.
pub fn slice(rt: &Runtime, ordinal: i32) -> Option<(u64, u64)> {
    let device = rt.device(ordinal)?;
    let limit = device.memory_limit?;
    Some((limit.saturating_sub(rt.used(device.slot)), limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Mode;
    use crate::runtime::tests::{Limited, ONE, limited, limited_with};
    use std::cell::Cell;

    fn no_pool<D>(_: Tracked, _: D) -> CuResult {
        panic!("not a stream-ordered allocation")
    }

    /// Device 0 with a 0-byte limit: enough to pin the order of operations.
    fn closed() -> Limited {
        limited(0)
    }

    /// `cuMemAllocPitch` of 100-byte rows × 10 on device 0, the driver
    /// answering `driver`: the result, and what was freed again.
    fn pitch_100_by_10(
        rt: &Runtime,
        driver: Result<(u64, u64), CuResult>,
    ) -> (CuResult, Option<u64>) {
        let freed = Cell::new(None);
        let rc = allocate_pitch(rt, Some(0), 0, 100, 10, || driver, |p| freed.set(Some(p)));
        (rc, freed.get())
    }

    #[test]
    fn over_the_limit_the_driver_is_never_called() {
        let rt = closed();
        let called = Cell::new(false);
        let rc = allocate(&rt, "test", Some(0), 1, Kind::Device, 0, || {
            called.set(true);
            Ok(1)
        });
        assert_eq!(rc, OUT_OF_MEMORY);
        assert!(!called.get());
    }

    #[test]
    fn without_a_device_the_driver_decides() {
        let rt = closed();
        assert_eq!(
            allocate(&rt, "test", None, 1 << 40, Kind::Device, 0, || Err(201)),
            201
        );
        assert_eq!(
            allocate(&rt, "test", None, 1 << 40, Kind::Device, 0, || Ok(7)),
            SUCCESS
        );
    }

    #[test]
    fn a_failed_driver_call_gives_the_charge_back() {
        let rt = closed();
        let dev = rt.device(0).expect("device").clone();
        // Zero bytes fit a zero limit; the driver fails.
        assert_eq!(
            allocate(&rt, "test", Some(0), 0, Kind::Device, 0, || Err(1)),
            1
        );
        assert_eq!(rt.used(dev.slot), 0);
    }

    #[test]
    fn a_failed_free_keeps_the_record() {
        let rt = closed();
        let handle = 0xdead_0000;
        assert_eq!(
            allocate(&rt, "test", Some(0), 0, Kind::Array, 0, || Ok(handle)),
            SUCCESS
        );
        assert_eq!(release(&rt, Space::Array, handle, || 1, no_pool), 1);
        assert!(
            backend::untrack(Space::Array, handle).is_some(),
            "record put back"
        );
        assert!(
            backend::untrack(Space::Pointer, handle).is_none(),
            "spaces are separate"
        );
    }

    #[test]
    fn pitch_over_the_limit_is_refused_before_the_driver() {
        let rt = closed();
        assert_eq!(pitch_100_by_10(&rt, Ok((1, 512))), (OUT_OF_MEMORY, None));
    }

    #[test]
    fn the_slice_is_the_limit_minus_the_containers_use() {
        let rt = limited(1000);
        assert_eq!(slice(&rt, 0), Some((1000, 1000)));
        assert_eq!(
            allocate(&rt, "test", Some(0), 300, Kind::Managed, 0, || Ok(0x5100)),
            SUCCESS
        );
        assert_eq!(slice(&rt, 0), Some((700, 1000)));
        assert_eq!(
            release(&rt, Space::Pointer, 0x5100, || SUCCESS, no_pool),
            SUCCESS
        );
        assert_eq!(slice(&rt, 0), Some((1000, 1000)));
        let pass = Runtime::new(Mode::PassThrough, &ONE);
        assert_eq!(slice(&pass, 0), None);
    }

    #[test]
    fn pitch_is_charged_as_pitch_times_height() {
        let rt = limited(1 << 20);
        // 100-byte rows, the driver picks a 1024-byte pitch: 10 KiB charged.
        assert_eq!(pitch_100_by_10(&rt, Ok((0x7100, 1024))), (SUCCESS, None));
        assert_eq!(slice(&rt, 0), Some(((1 << 20) - 10240, 1 << 20)));
        assert_eq!(
            release(&rt, Space::Pointer, 0x7100, || SUCCESS, no_pool),
            SUCCESS
        );
        assert_eq!(slice(&rt, 0), Some((1 << 20, 1 << 20)));
    }

    #[test]
    fn a_pitch_that_does_not_fit_is_freed_and_refused() {
        let rt = limited(6000);
        // 5120 expected fits; the driver's 1024-byte pitch makes 10240: no.
        assert_eq!(
            pitch_100_by_10(&rt, Ok((0x7200, 1024))),
            (OUT_OF_MEMORY, Some(0x7200))
        );
        assert_eq!(slice(&rt, 0), Some((6000, 6000)));
    }

    #[test]
    fn without_oversubscription_a_full_device_is_out_of_memory() {
        let rt = limited(1000);
        let fallback = Cell::new(false);
        let rc = allocate_device(
            &rt,
            Some(0),
            100,
            0,
            || Err(OUT_OF_MEMORY),
            || {
                fallback.set(true);
                Ok(1)
            },
        );
        assert_eq!(rc, OUT_OF_MEMORY);
        assert!(!fallback.get());
        assert_eq!(slice(&rt, 0), Some((1000, 1000)));
    }

    #[test]
    fn with_oversubscription_a_full_device_falls_back_to_managed_memory() {
        let rt = limited_with(1000, |limits| {
            limits.oversubscribe = true;
            limits.memory_scaling = 2.0;
        });
        let rc = allocate_device(&rt, Some(0), 400, 0, || Err(OUT_OF_MEMORY), || Ok(0x9100));
        assert_eq!(rc, SUCCESS);
        assert_eq!(slice(&rt, 0), Some((600, 1000)), "counted to the slice");
        assert_eq!(
            backend::untrack(Space::Pointer, 0x9100).map(|t| t.kind),
            Some(Kind::HostFallback)
        );
    }
}
