//! Events: XID critical errors injected with `tessera-sim inject-xid`,
//! delivered through event sets as real NVML delivers them.
//!
//! Only `nvmlEventTypeXidCriticalError` is supported (what
//! `nvmlDeviceGetSupportedEventTypes` reports); registering any other bit is
//! `NOT_SUPPORTED`, and so is registering a MIG device handle (NVML reports
//! MIG instances' XIDs through the parent GPU, with the GI/CI ids in the
//! event data). A wait polls the node's state file (one `stat` every
//! [`POLL`]) and delivers events in the order they were recorded. A GPU
//! marked lost after its registration makes one wait return
//! `GPU_IS_LOST` (the loss itself is no event; every call naming the GPU
//! then fails the same way).

use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use tessera_sim::health::EventKind;

use crate::events::{self, EventSet, Registration};
use crate::ffi::*;
use crate::lookup;
use crate::node::{self, Res};
use crate::out;

use super::{answer, entry};

/// How often a waiting call looks at the state file again.
const POLL: Duration = Duration::from_millis(10);

/// What a look at the event log found for a set.
enum Next {
    /// An XID to deliver.
    Xid(NvmlEventData),
    /// A registered GPU was lost.
    Lost,
    /// Nothing new.
    Nothing,
}

/// Advances `set` over the log to the next event it covers.
fn next(set: &mut EventSet) -> Res<Next> {
    node::read(|s| {
        for event in s.health.events_after(set.cursor) {
            set.cursor = event.seq;
            if !set.covers(event) {
                continue;
            }
            return match event.kind {
                EventKind::Xid { xid, instance } => {
                    let (gi, ci) =
                        instance.unwrap_or((VALUE_NOT_AVAILABLE_UINT, VALUE_NOT_AVAILABLE_UINT));
                    Ok(Next::Xid(NvmlEventData {
                        device: lookup::gpu_handle(event.gpu)?,
                        event_type: EVENT_TYPE_XID_CRITICAL_ERROR,
                        event_data: xid,
                        gpu_instance_id: gi,
                        compute_instance_id: ci,
                    }))
                }
                EventKind::Lost => Ok(Next::Lost),
                EventKind::Restored => continue,
            };
        }
        Ok(Next::Nothing)
    })
}

/// Waits up to `timeout_ms` for the next event of `set`.
fn wait(set: NvmlEventSet, timeout_ms: c_uint) -> Res<NvmlEventData> {
    let id = lookup::event_set_id(set)?;
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        match events::with_set(id, next)? {
            Next::Xid(data) => return Ok(data),
            Next::Lost => return Err(ERROR_GPU_IS_LOST),
            Next::Nothing => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ERROR_TIMEOUT);
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

/// `nvmlEventSetCreate`: an empty set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut NvmlEventSet) -> NvmlReturn {
    entry(|| {
        if set.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let cursor = node::read(|s| Ok(s.health.last_seq))?;
        let handle = lookup::event_set_handle(events::create(cursor)?)?;
        // SAFETY: NVML contract: `set` is valid for one write (non-null).
        unsafe { out::write(set, handle) }
    })
}

/// `nvmlDeviceRegisterEvents`: adds a GPU's events of `eventTypes` to the
/// set, from now on. `INVALID_ARGUMENT` for no type at all or a bad handle,
/// `NOT_SUPPORTED` for a type other than XIDs or a MIG device handle,
/// `GPU_IS_LOST` for a lost GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: NvmlDevice,
    event_types: c_ulonglong,
    set: NvmlEventSet,
) -> NvmlReturn {
    entry(|| {
        let id = lookup::event_set_id(set)?;
        events::with_set(id, |set| {
            let (gpu, since) = node::read(|s| {
                let gpu = lookup::physical_gpu(s, device)?;
                Ok((gpu.index, s.health.last_seq))
            })?;
            if event_types == 0 {
                return Err(ERROR_INVALID_ARGUMENT);
            }
            if event_types & !EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
                return Err(ERROR_NOT_SUPPORTED);
            }
            set.registrations.push(Registration {
                gpu,
                types: event_types,
                since,
            });
            Ok(())
        })
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: `nvmlEventTypeXidCriticalError` on
/// every GPU; `NOT_SUPPORTED` for a MIG device handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: NvmlDevice,
    event_types: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: NVML contract: `event_types` is null or valid for one write.
    unsafe {
        answer(event_types, |s| {
            lookup::physical_gpu(s, device)?;
            Ok(EVENT_TYPE_XID_CRITICAL_ERROR)
        })
    }
}

/// Waits for the set's next event and writes it through `data` in the
/// caller's struct version; `INVALID_ARGUMENT` for a null `data`.
///
/// # Safety
/// `data` is null or valid for one write of a `T`.
unsafe fn wait_into<T>(
    set: NvmlEventSet,
    data: *mut T,
    timeout_ms: c_uint,
    version: impl FnOnce(NvmlEventData) -> T,
) -> NvmlReturn {
    entry(|| {
        if data.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let event = wait(set, timeout_ms)?;
        // SAFETY: the caller's contract; `data` is non-null.
        unsafe { out::write(data, version(event)) }
    })
}

/// `nvmlEventSetWait_v2`: the set's next event, waiting up to `timeoutms`;
/// `TIMEOUT` when none came, `GPU_IS_LOST` once for each registered GPU
/// that was lost. `gpuInstanceId`/`computeInstanceId` name the MIG instance
/// an XID is attributed to, `0xFFFFFFFF` otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: NvmlEventSet,
    data: *mut NvmlEventData,
    timeoutms: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `data` is null or valid for one write.
    unsafe { wait_into(set, data, timeoutms, |event| event) }
}

/// `nvmlEventSetWait` (before MIG): as `_v2`, filling the older, shorter
/// `nvmlEventData_t` without instance ids.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: NvmlEventSet,
    data: *mut NvmlEventDataV1,
    timeoutms: c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `data` is null or valid for one write.
    unsafe {
        wait_into(set, data, timeoutms, |event| NvmlEventDataV1 {
            device: event.device,
            event_type: event.event_type,
            event_data: event.event_data,
        })
    }
}

/// `nvmlEventSetFree`: forgets the set; `INVALID_ARGUMENT` for one that does
/// not exist.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: NvmlEventSet) -> NvmlReturn {
    entry(|| {
        let id = lookup::event_set_id(set)?;
        node::read(|_| Ok(()))?;
        events::free(id)
    })
}
