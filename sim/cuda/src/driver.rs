//! The process-wide driver: what `cuInit` set up, the devices with their
//! memory counters and timelines, and the calling thread's context stack.
//! The registry of live objects sits above it, in `registry`, which reaches
//! it through [`Driver`] (`driver.registry()`).
//!
//! Hot paths (`cuLaunchKernel`, `cuMemGetInfo_v2`, `cuCtxGetCurrent`) touch
//! only atomics and thread-locals; everything that creates or destroys an
//! object goes through the registry's mutex.

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::config::{self, Config, DeviceSpec};
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::timeline::Timeline;

/// Result of an internal step: the `CUresult` to return on failure.
pub type Res<T> = Result<T, CuResult>;

/// One device as this process uses it.
#[derive(Debug)]
pub struct Device {
    /// What it is.
    pub spec: DeviceSpec,
    /// `cuDeviceGetName`, NUL-terminated.
    pub name: CString,
    /// `cuDeviceGetUuid_v2`: the device's own UUID (a MIG device's `MIG-…`).
    pub uuid: [u8; 16],
    /// `cuDeviceGetUuid`: the physical GPU's UUID.
    pub gpu_uuid: [u8; 16],
    /// Device bytes this process holds (managed and host memory excluded).
    pub used: AtomicU64,
    /// The device's work queue.
    pub timeline: Timeline,
    /// Live contexts on it (a retained primary context counts once): while
    /// any, this process is a GPU process of the device and publishes its
    /// utilization.
    pub contexts: AtomicU32,
}

/// The driver after a successful `cuInit`.
#[derive(Debug)]
pub struct Driver {
    /// Devices by ordinal.
    pub devices: Box<[Device]>,
    /// What `cuInit` read.
    pub config: Config,
}

static DRIVER: OnceLock<Result<Driver, CuResult>> = OnceLock::new();

/// `cuInit`: the first call reads the configuration; every call returns
/// the first one's outcome.
pub fn init() -> Res<&'static Driver> {
    DRIVER.get_or_init(start).as_ref().map_err(|code| *code)
}

fn start() -> Result<Driver, CuResult> {
    let config = config::load().map_err(|message| {
        eprintln!("tessera-sim-cuda: {message}");
        CUDA_ERROR_NO_DEVICE
    })?;
    if config.devices.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    if config.debug {
        let node = config
            .node_root
            .as_ref()
            .map_or("no node (default GPU)".to_string(), |r| {
                format!("the simulated node at {}", r.display())
            });
        eprintln!(
            "tessera-sim-cuda: serving {node}: {} device(s), {} ns per block",
            config.devices.len(),
            config.ns_per_block
        );
    }
    let devices: Box<[Device]> = config
        .devices
        .iter()
        .map(|spec| Device {
            name: CString::new(spec.name.replace('\0', " ")).unwrap_or_default(),
            uuid: config::uuid_bytes(&spec.uuid),
            gpu_uuid: config::uuid_bytes(&spec.gpu_uuid),
            spec: spec.clone(),
            used: AtomicU64::new(0),
            timeline: Timeline::for_device(&config, spec),
            contexts: AtomicU32::new(0),
        })
        .collect();
    Ok(Driver { devices, config })
}

/// The initialised driver; `NOT_INITIALIZED` before a successful `cuInit`.
#[inline]
pub fn get() -> Res<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(driver)) => Ok(driver),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The driver if `cuInit` succeeded, without an error code (exit hooks).
pub fn get_if_ready() -> Option<&'static Driver> {
    get().ok()
}

impl Driver {
    /// The device with ordinal `dev`; `INVALID_DEVICE` otherwise.
    #[inline]
    pub fn device(&self, dev: CuDevice) -> Res<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The device at `index` (already checked by the caller's decode).
    #[inline]
    pub fn device_at(&self, index: u32) -> Res<&Device> {
        self.devices
            .get(index as usize)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// A context on `device` came (`true`) or went (`false`).
    pub fn count_context(&self, device: u32, came: bool) {
        if let Some(d) = self.devices.get(device as usize) {
            if came {
                d.contexts.fetch_add(1, Ordering::AcqRel);
            } else {
                let _ = d
                    .contexts
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            }
        }
    }
}

thread_local! {
    /// The calling thread's current context (top of its stack), 0 if none.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
    /// The calling thread's context stack, bottom first.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context.
#[inline]
pub fn current_context() -> Option<Handle> {
    Handle::decode(CURRENT.with(Cell::get))
}

/// The device of the calling thread's current context; `INVALID_CONTEXT`
/// when there is none.
#[inline]
pub fn current_device() -> Res<u32> {
    current_context()
        .map(|h| h.device)
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// The device work on `stream` runs on: the stream's own, or for the
/// default streams (`NULL`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) the
/// current context's. Decodes only: a destroyed stream's handle still names
/// its device.
#[inline]
pub fn stream_device(stream: CuStream) -> Res<u32> {
    match stream.addr() {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => current_device(),
        _ => Handle::of(stream, Kind::Stream)
            .map(|h| h.device)
            .ok_or(CUDA_ERROR_INVALID_HANDLE),
    }
}

fn sync_current(stack: &[u64]) {
    CURRENT.with(|c| c.set(stack.last().copied().unwrap_or(0)));
}

/// `cuCtxSetCurrent`: replaces the top of the stack (pushes onto an empty
/// one); `None` pops.
pub fn set_current(ctx: Option<Handle>) {
    STACK.with(|s| {
        let mut stack = s.borrow_mut();
        match ctx {
            Some(h) => match stack.last_mut() {
                Some(top) => *top = h.value(),
                None => stack.push(h.value()),
            },
            None => {
                stack.pop();
            }
        }
        sync_current(&stack);
    });
}

/// `cuCtxPushCurrent`.
pub fn push_current(ctx: Handle) {
    STACK.with(|s| {
        let mut stack = s.borrow_mut();
        stack.push(ctx.value());
        sync_current(&stack);
    });
}

/// `cuCtxPopCurrent`: the popped context, if any.
pub fn pop_current() -> Option<Handle> {
    STACK.with(|s| {
        let mut stack = s.borrow_mut();
        let popped = stack.pop();
        sync_current(&stack);
        popped.and_then(Handle::decode)
    })
}

/// Removes every entry of `ctx` from the calling thread's stack (it was destroyed).
pub fn forget_context(ctx: Handle) {
    STACK.with(|s| {
        let mut stack = s.borrow_mut();
        stack.retain(|&v| v != ctx.value());
        sync_current(&stack);
    });
}
