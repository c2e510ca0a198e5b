//! The library's process-wide state: the `nvmlInit` reference count and the
//! node state it serves.
//!
//! The state file is shared with other processes (the device plugin, the CLI,
//! tests), so the cached copy is checked against the file's
//! [`StateStamp`] (one `stat`) on every call and re-read when it changed: a
//! GPU instance another process made is visible to the next call here.
//! Changes go through [`StateStore::update`], which holds the node's
//! exclusive file lock while it reads, changes and rewrites the file.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tessera_sim::SimError;
use tessera_sim::state::{NodeState, StateStamp, StateStore};

use crate::ffi::{
    ERROR_DRIVER_NOT_LOADED, ERROR_IN_USE, ERROR_INSUFFICIENT_RESOURCES, ERROR_INVALID_ARGUMENT,
    ERROR_NO_PERMISSION, ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED, ERROR_UNINITIALIZED, ERROR_UNKNOWN,
    NvmlReturn, SUCCESS,
};
use crate::root;

/// Result of an internal step: the NVML code to return on failure.
pub type Res<T> = Result<T, NvmlReturn>;

pub use tessera_sim::libroot::DEBUG_ENV;

struct Library {
    /// Outstanding `nvmlInit*` calls not yet matched by `nvmlShutdown`.
    refs: u32,
    /// The node served while `refs > 0`.
    node: Option<Node>,
}

struct Node {
    store: StateStore,
    stamp: Option<StateStamp>,
    state: NodeState,
    debug: bool,
}

static LIBRARY: Mutex<Library> = Mutex::new(Library {
    refs: 0,
    node: None,
});

fn library() -> MutexGuard<'static, Library> {
    // A panic while the lock was held (caught at the C boundary) leaves the
    // state consistent: the cache is replaced whole or not at all.
    LIBRARY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `nvmlInit*`: the first call finds the node and reads its state; later
/// calls only count. On failure writes one line to stderr naming what was
/// looked for.
pub fn init() -> NvmlReturn {
    let mut lib = library();
    if lib.refs > 0 {
        lib.refs += 1;
        return SUCCESS;
    }
    match Node::open() {
        Ok(node) => {
            if node.debug {
                eprintln!(
                    "tessera-sim-nvml: serving the simulated node at {} ({} GPU(s))",
                    node.store.root().display(),
                    node.state.gpus.len()
                );
            }
            lib.node = Some(node);
            lib.refs = 1;
            SUCCESS
        }
        Err((code, message)) => {
            eprintln!("tessera-sim-nvml: {message}");
            code
        }
    }
}

/// `nvmlShutdown`: drops one reference; the last one forgets the node.
/// `UNINITIALIZED` when there is no reference left to drop.
pub fn shutdown() -> NvmlReturn {
    let mut lib = library();
    if lib.refs == 0 {
        return ERROR_UNINITIALIZED;
    }
    lib.refs -= 1;
    if lib.refs == 0 {
        lib.node = None;
    }
    SUCCESS
}

/// Runs `f` on the current node state; `UNINITIALIZED` before `nvmlInit`.
pub fn read<T>(f: impl FnOnce(&NodeState) -> Res<T>) -> Res<T> {
    let mut lib = library();
    let node = lib.live()?;
    node.refresh()?;
    f(&node.state)
}

/// Runs `f` on the current node state and the node's root directory (where
/// the CUDA stand-in publishes utilization); `UNINITIALIZED` before `nvmlInit`.
pub fn read_with_root<T>(f: impl FnOnce(&NodeState, &std::path::Path) -> Res<T>) -> Res<T> {
    let mut lib = library();
    let node = lib.live()?;
    node.refresh()?;
    f(&node.state, node.store.root())
}

/// Runs `f` on the node state under the node's exclusive lock and writes the
/// result back; nothing is written when `f` fails.
pub fn update<T>(f: impl FnOnce(&mut NodeState) -> Res<T>) -> Res<T> {
    let mut lib = library();
    let node = lib.live()?;
    let mut refused = None;
    let result = node.store.update(|state| {
        f(state).map_err(|code| {
            refused = Some(code);
            // Only aborts the update; the NVML code travels in `refused`.
            SimError::InvalidArgument(String::new())
        })
    });
    // Whatever happened, the cache must not outlive the file it came from.
    let refreshed = node.refresh();
    match (result, refused) {
        (_, Some(code)) => Err(code),
        (Err(e), None) => Err(node.report(&e)),
        (Ok(value), None) => refreshed.map(|()| value),
    }
}

/// The NVML code for a simulated-driver or state-file error.
pub fn sim_code(error: &SimError) -> NvmlReturn {
    match error {
        SimError::InvalidArgument(_) => ERROR_INVALID_ARGUMENT,
        SimError::InsufficientResources(_) => ERROR_INSUFFICIENT_RESOURCES,
        SimError::NotFound(_) => ERROR_NOT_FOUND,
        SimError::InUse(_) => ERROR_IN_USE,
        SimError::NotSupported(_) => ERROR_NOT_SUPPORTED,
        SimError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            ERROR_NO_PERMISSION
        }
        SimError::NoNode { .. } => ERROR_DRIVER_NOT_LOADED,
        _ => ERROR_UNKNOWN,
    }
}

impl Library {
    fn live(&mut self) -> Res<&mut Node> {
        match (self.refs, self.node.as_mut()) {
            (1.., Some(node)) => Ok(node),
            _ => Err(ERROR_UNINITIALIZED),
        }
    }
}

impl Node {
    fn open() -> Result<Node, (NvmlReturn, String)> {
        let debug = std::env::var_os(DEBUG_ENV).is_some_and(|v| !v.is_empty());
        let root = root::discover().map_err(|m| (ERROR_DRIVER_NOT_LOADED, m))?;
        let fail = |e: SimError| (sim_code(&e), e.to_string());
        let store = StateStore::open(&root).map_err(fail)?;
        let stamp = store.stamp().ok();
        let state = store.read().map_err(fail)?;
        // A real driver knows its GPUs; a node naming a model the simulator
        // cannot play is a broken node, refused at init like a missing driver.
        for gpu in &state.gpus {
            tessera_sim::mig::model_spec(&gpu.model).map_err(|e| {
                (
                    ERROR_DRIVER_NOT_LOADED,
                    format!("{}: gpu {}: {e}", store.state_path().display(), gpu.index),
                )
            })?;
        }
        Ok(Node {
            store,
            stamp,
            state,
            debug,
        })
    }

    /// Re-reads the state file when its stamp changed since the last read.
    fn refresh(&mut self) -> Res<()> {
        let stamp = self.store.stamp().map_err(|e| self.report(&e))?;
        if self.stamp == Some(stamp) {
            return Ok(());
        }
        // Stamp first: a change racing the read is caught by the next call.
        self.state = self.store.read().map_err(|e| self.report(&e))?;
        self.stamp = Some(stamp);
        Ok(())
    }

    fn report(&self, error: &SimError) -> NvmlReturn {
        if self.debug {
            eprintln!("tessera-sim-nvml: {error}");
        }
        sim_code(error)
    }
}
