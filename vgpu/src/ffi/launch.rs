//! Kernel and graph launches: on an SM-limited device a launch waits for
//! its tokens (`crate::limiter`); otherwise, once the limiter is known to
//! be off, each launch is one atomic load and a tail call into the driver.

use std::ffi::{c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use super::driver::{rt, target_device};
use super::guard::contained;
use super::intercept::missing;
use super::nvml::nvml_source;
use super::resolve::resolve;
use super::types::{CUresult, Handle, LaunchConfig};
use crate::limiter::{self, UtilSource};
use crate::names::{HOOK_COUNT, Hook};
use crate::runtime::Runtime;

/// Per launch hook: the real function once it is known *and* the limiter
/// is off for good, else null. The launch hot path is one load of this and
/// a tail call.
static FAST_LAUNCH: [AtomicPtr<c_void>; HOOK_COUNT] =
    [const { AtomicPtr::new(null_mut()) }; HOOK_COUNT];

/// The slow path of a launch: resolves the real function and makes the
/// launch wait for its tokens when the device is limited; opens the fast
/// path once the limiter is off. Returns the real function (or null).
#[cold]
#[inline(never)]
fn launch_slow(hook: Hook, blocks: u64) -> *mut c_void {
    let real = resolve(hook);
    let _ = contained(hook.symbol(), || {
        limiter::admit(target_device(), blocks, &HOST);
    });
    if limiter::off() && !real.is_null() {
        FAST_LAUNCH[hook as usize].store(real, Ordering::Release);
    }
    real
}

/// Declares a launch entry point; `blocks` is what the launch costs.
macro_rules! launch {
    (
        $(#[$doc:meta])*
        $hook:ident => fn $name:ident($($arg:ident: $ty:ty),* $(,)?),
        blocks = $blocks:expr
    ) => {
        intercept! {
            $(#[$doc])*
            /// Waits for its tokens on an SM-limited device; one atomic load
            /// and a tail call otherwise.
            $hook => fn $name($($arg: $ty),*) -> CUresult;
            raw {
                /// The launch while the limiter is on or undecided.
                #[cold]
                #[inline(never)]
                unsafe extern "C" fn slow($($arg: $ty),*) -> CUresult {
                    let blocks: u64 = $blocks;
                    // SAFETY: launch_slow returns null or the real function
                    // of this hook.
                    match unsafe { $name::typed(launch_slow($name::HOOK, blocks)) } {
                        // SAFETY: the caller's arguments, unchanged.
                        Some(real) => unsafe { real($($arg),*) },
                        None => missing($name::HOOK),
                    }
                }
                let fast = FAST_LAUNCH[$name::HOOK as usize].load(Ordering::Relaxed);
                // SAFETY: FAST_LAUNCH holds null or the real function of
                // this hook (stored by launch_slow).
                if let Some(real) = unsafe { $name::typed(fast) } {
                    // SAFETY: the caller's arguments, unchanged.
                    return unsafe { real($($arg),*) };
                }
                // SAFETY: the caller's arguments, unchanged.
                unsafe { slow($($arg),*) }
            }
        }
    };
}

fn grid(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x)
        .saturating_mul(u64::from(y))
        .saturating_mul(u64::from(z))
}

fn grid_of(config: *const LaunchConfig) -> u64 {
    if config.is_null() {
        return 1;
    }
    // SAFETY: config is non-null and points to the caller's CUlaunchConfig.
    let c = unsafe { config.read_unaligned() };
    grid(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z)
}

launch! {
    /// `cuLaunchKernel`.
    LaunchKernel => fn cuLaunchKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
    ),
    blocks = grid(gx, gy, gz)
}

launch! {
    /// `cuLaunchKernel_ptsz`.
    LaunchKernelPtsz => fn cuLaunchKernel_ptsz(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
    ),
    blocks = grid(gx, gy, gz)
}

launch! {
    /// `cuLaunchKernelEx`.
    LaunchKernelEx => fn cuLaunchKernelEx(
        config: *const LaunchConfig, f: Handle, params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ),
    blocks = grid_of(config)
}

launch! {
    /// `cuLaunchKernelEx_ptsz`.
    LaunchKernelExPtsz => fn cuLaunchKernelEx_ptsz(
        config: *const LaunchConfig, f: Handle, params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ),
    blocks = grid_of(config)
}

launch! {
    /// `cuLaunchCooperativeKernel`.
    LaunchCooperativeKernel => fn cuLaunchCooperativeKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void,
    ),
    blocks = grid(gx, gy, gz)
}

launch! {
    /// `cuLaunchCooperativeKernel_ptsz`.
    LaunchCooperativeKernelPtsz => fn cuLaunchCooperativeKernel_ptsz(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void,
    ),
    blocks = grid(gx, gy, gz)
}

launch! {
    /// `cuGraphLaunch`.
    GraphLaunch => fn cuGraphLaunch(exec: Handle, stream: Handle),
    blocks = limiter::GRAPH_LAUNCH_BLOCKS
}

launch! {
    /// `cuGraphLaunch_ptsz`.
    GraphLaunchPtsz => fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle),
    blocks = limiter::GRAPH_LAUNCH_BLOCKS
}

/// Registers the after-fork handler of the SM limiter (once).
fn register_fork_handler() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    extern "C" fn child() {
        limiter::after_fork_in_child();
    }
    // SAFETY: the handler only stores to an atomic, which is safe in the
    // child of a fork.
    let _ = unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// What the SM limiter gets from this layer: the runtime over the real
/// driver, NVML, and the fork handler.
struct LimiterHost;

impl limiter::Host for LimiterHost {
    fn runtime(&self) -> &'static Runtime {
        rt()
    }

    fn open_source(&self) -> Result<Box<dyn UtilSource>, String> {
        nvml_source()
    }

    fn register_fork_handler(&self) {
        register_fork_handler();
    }
}

static HOST: LimiterHost = LimiterHost;
