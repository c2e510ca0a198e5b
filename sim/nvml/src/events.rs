//! The library's event sets (`nvmlEventSet_t`): which GPUs each one is
//! registered on, for which event types, and how far into the node's event
//! log (`tessera_sim::health`) it has delivered.
//!
//! A set sees only events recorded after the registration that covers them:
//! a registration remembers the log's newest sequence number when it was
//! made. Sets live in this process until `nvmlEventSetFree`; their handles
//! carry only an id ([`crate::handle::Handle::EventSet`]).
//!
//! Lock order: this table's lock is taken before the library's (the node
//! state's), never the other way round.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tessera_sim::health::{Event, EventKind};

use crate::ffi::{ERROR_INVALID_ARGUMENT, ERROR_UNKNOWN, EVENT_TYPE_XID_CRITICAL_ERROR};
use crate::node::Res;

/// One `nvmlDeviceRegisterEvents` call on a set.
#[derive(Debug, Clone, Copy)]
pub struct Registration {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// `nvmlEventType*` bits.
    pub types: u64,
    /// The log's newest sequence number when registered: older events are not delivered.
    pub since: u64,
}

/// One event set.
#[derive(Debug, Default)]
pub struct EventSet {
    /// Its registrations, in the order made.
    pub registrations: Vec<Registration>,
    /// Sequence number of the newest event looked at.
    pub cursor: u64,
}

impl EventSet {
    /// Whether a registration of the set covers `event`: an XID when the
    /// GPU was registered for XIDs, a loss when it was registered at all
    /// (NVML reports that as the wait's `GPU_IS_LOST`); never a restore.
    pub fn covers(&self, event: &Event) -> bool {
        self.registrations.iter().any(|r| {
            r.gpu == event.gpu
                && r.since < event.seq
                && match event.kind {
                    EventKind::Xid { .. } => r.types & EVENT_TYPE_XID_CRITICAL_ERROR != 0,
                    EventKind::Lost => true,
                    EventKind::Restored => false,
                }
        })
    }
}

#[derive(Default)]
struct Sets {
    last_id: u32,
    sets: BTreeMap<u32, EventSet>,
}

static SETS: Mutex<Sets> = Mutex::new(Sets {
    last_id: 0,
    sets: BTreeMap::new(),
});

fn sets() -> MutexGuard<'static, Sets> {
    SETS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new, empty set that has looked at the log up to `cursor`; its id.
pub fn create(cursor: u64) -> Res<u32> {
    let mut sets = sets();
    let id = sets.last_id.checked_add(1).ok_or(ERROR_UNKNOWN)?;
    sets.last_id = id;
    sets.sets.insert(
        id,
        EventSet {
            registrations: Vec::new(),
            cursor,
        },
    );
    Ok(id)
}

/// Runs `f` on set `id` under the table's lock; `INVALID_ARGUMENT` for a
/// set that does not exist (never made, or freed).
pub fn with_set<T>(id: u32, f: impl FnOnce(&mut EventSet) -> Res<T>) -> Res<T> {
    let mut sets = sets();
    let set = sets.sets.get_mut(&id).ok_or(ERROR_INVALID_ARGUMENT)?;
    f(set)
}

/// Forgets set `id`; `INVALID_ARGUMENT` when there is no such set.
pub fn free(id: u32) -> Res<()> {
    sets()
        .sets
        .remove(&id)
        .map(|_| ())
        .ok_or(ERROR_INVALID_ARGUMENT)
}
