//! Panic containment: no panic leaves an exported function. Before the
//! driver was called, the call is passed through; after, the driver's
//! result is returned. One line on stderr says it happened.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use super::driver::rt;
use super::types::CUresult;
use crate::log::{self, Level, Once};
use crate::names::Hook;
use crate::runtime::Runtime;

/// Makes the panic hook of this library's own copy of `std` quiet about
/// panics in this crate (the library prints its own one line instead) and
/// leaves every other panic to the hook that was there.
fn install_quiet_panic_hook() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.load(Ordering::Relaxed) || INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let ours = info
            .location()
            .is_some_and(|l| l.file().contains("vgpu/src/"));
        if !ours {
            previous(info);
        }
    }));
}

/// Runs `f` with panics caught (and silenced); `None` if it panicked.
pub(super) fn contained<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    static PANICKED: Once = Once::new();
    install_quiet_panic_hook();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            log::once(&PANICKED, Level::Error, || {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                format!("internal error in {what} ({message}); the call was passed through")
            });
            None
        }
    }
}

/// Records whether (and with what result) the driver was called.
pub(super) struct Driver(Cell<Option<CUresult>>);

impl Driver {
    /// Makes the driver call `f`, and remembers its result.
    pub(super) fn call(&self, f: impl FnOnce() -> CUresult) -> CUresult {
        let rc = f();
        self.0.set(Some(rc));
        rc
    }
}

/// Runs `body`; on a panic, returns the driver's result if the driver was
/// called, else passes the call through.
pub(super) fn protect(
    hook: Hook,
    body: impl FnOnce(&Driver) -> CUresult,
    passthrough: impl FnOnce() -> CUresult,
) -> CUresult {
    let driver = Driver(Cell::new(None));
    match contained(hook.symbol(), || body(&driver)) {
        Some(rc) => rc,
        None => driver.0.get().unwrap_or_else(passthrough),
    }
}

/// [`protect`] for a call the runtime may charge: without limits in
/// force, the driver makes `call` alone; with them, `body` decides, given
/// the runtime. A panic before the driver was called passes `call` through.
#[inline]
pub(super) fn enforced(
    hook: Hook,
    call: &impl Fn() -> CUresult,
    body: impl FnOnce(&Driver, &'static Runtime) -> CUresult,
) -> CUresult {
    protect(
        hook,
        |driver| {
            let rt = rt();
            if !rt.enforcing() {
                return driver.call(call);
            }
            body(driver, rt)
        },
        call,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_before_the_driver_call_passes_the_call_through() {
        let rc = protect(Hook::MemAllocV2, |_| panic!("before"), || 42);
        assert_eq!(rc, 42);
    }

    #[test]
    fn a_panic_after_the_driver_call_returns_the_drivers_result() {
        let passed_through = Cell::new(false);
        let rc = protect(
            Hook::MemAllocV2,
            |driver| {
                driver.call(|| 7);
                panic!("after")
            },
            || {
                passed_through.set(true);
                42
            },
        );
        assert_eq!(rc, 7);
        assert!(!passed_through.get(), "the driver is never called twice");
    }
}
