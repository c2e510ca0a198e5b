//! `dlsym` and `dlopen`, exported: intercepted names looked up on a
//! `dlopen`ed driver get our wrappers, every other lookup goes to glibc's
//! `dlsym` with the caller's return address intact (x86-64), and a library
//! loaded with `RTLD_DEEPBIND` while limits are in force is loaded without
//! it.

use std::ffi::{CStr, c_char, c_void};
use std::panic::catch_unwind;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

use super::intercept::{is_wrapper, wrapper};
use super::resolve::{CUDA_LIB, NVML_LIB, real_dlsym, seed};
use super::types::{RTLD_DEFAULT, RTLD_NEXT};
use crate::names::Hook;

// What only the x86-64 trampolines (not built into unit tests) use.
#[cfg(all(target_arch = "x86_64", not(test)))]
use {
    super::driver::rt,
    super::resolve::{REAL_DLSYM, glibc_next},
    crate::log::{self, Level, Once},
    std::ffi::c_int,
    std::sync::atomic::AtomicPtr,
};

/// What the exported `dlsym` answers itself: the wrapper of an intercepted
/// name the handle really has; null for everything else (the real `dlsym`
/// answers those). Also makes sure the real `dlsym` is known.
pub(super) extern "C" fn dlsym_lookup(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let dlsym = real_dlsym();
    if symbol.is_null() {
        return null_mut();
    }
    // SAFETY: symbol is the caller's NUL-terminated name (dlsym's contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let Some(hook) = Hook::by_symbol(name) else {
        return null_mut();
    };
    // A plain catch_unwind: nothing here can panic in practice, and the
    // dlsym path of every process should touch as little as possible.
    catch_unwind(|| {
        // SAFETY: the caller's handle and name, for the real dlsym.
        let found = unsafe { dlsym(handle, symbol) };
        if found.is_null() || is_wrapper(found) {
            return found;
        }
        seed(hook, found);
        if handle != RTLD_DEFAULT && handle != RTLD_NEXT {
            // The caller's handle has the real library: remember it.
            let cache = if hook.is_nvml() { &NVML_LIB } else { &CUDA_LIB };
            let _ = cache.compare_exchange(null_mut(), handle, Ordering::AcqRel, Ordering::Acquire);
        }
        wrapper(hook)
    })
    .unwrap_or(null_mut())
}

/// `dlsym`, exported: intercepted names get wrappers; every other lookup is
/// a tail jump to the real `dlsym`, so its caller-relative semantics
/// (`RTLD_NEXT`) hold.
///
/// # Safety
/// As glibc's `dlsym`.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // The stack is 16-byte aligned at the call: entry (8 mod 16) + two
    // pushes + 8.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {lookup}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        lookup = sym dlsym_lookup,
        real = sym REAL_DLSYM,
    )
}

/// glibc's `dlopen`, found once (null until then).
#[cfg(all(target_arch = "x86_64", not(test)))]
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

#[cfg(all(target_arch = "x86_64", not(test)))]
unsafe extern "C" fn no_dlopen(_file: *const c_char, _flags: c_int) -> *mut c_void {
    null_mut()
}

/// `RTLD_DEEPBIND`.
#[cfg(all(target_arch = "x86_64", not(test)))]
const RTLD_DEEPBIND: c_int = 0x8;

/// The flags the exported `dlopen` passes on: without `RTLD_DEEPBIND`
/// while limits are in force. A library loaded with it binds its own
/// dependencies first — libc's `dlsym` and libcuda's functions, past this
/// library — so a plugin loaded that way would reach the driver unseen.
/// Also makes sure the real `dlopen` is known.
#[cfg(all(target_arch = "x86_64", not(test)))]
extern "C" fn dlopen_flags(_file: *const c_char, flags: c_int) -> c_int {
    if REAL_DLOPEN.load(Ordering::Acquire).is_null() {
        let p = glibc_next(c"dlopen", no_dlopen as *mut c_void);
        REAL_DLOPEN.store(p, Ordering::Release);
    }
    if flags & RTLD_DEEPBIND == 0 {
        return flags;
    }
    let strip = catch_unwind(|| rt().enforcing()).unwrap_or(false);
    if !strip {
        return flags;
    }
    static DEEPBIND: Once = Once::new();
    log::once(&DEEPBIND, Level::Info, || {
        "a library was loaded with RTLD_DEEPBIND; loaded without it, so that its \
         driver calls are counted"
            .to_string()
    });
    flags & !RTLD_DEEPBIND
}

/// `dlopen`, exported: drops `RTLD_DEEPBIND` (see `dlopen_flags`), then a
/// tail jump to the real `dlopen` with the caller's return address intact
/// (glibc finds the caller's search path, `$ORIGIN` and RUNPATH, by it).
///
/// # Safety
/// As glibc's `dlopen`.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, flags: c_int) -> *mut c_void {
    // As in `dlsym`: the stack is 16-byte aligned at the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {flags}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "mov esi, eax",
        "jmp qword ptr [rip + {real}]",
        flags = sym dlopen_flags,
        real = sym REAL_DLOPEN,
    )
}

/// `dlsym`, exported (portable version: lookups by other libraries with
/// `RTLD_NEXT` resolve relative to this library).
///
/// # Safety
/// As glibc's `dlsym`.
#[cfg(all(not(target_arch = "x86_64"), not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let hooked = dlsym_lookup(handle, symbol);
    if !hooked.is_null() {
        return hooked;
    }
    // SAFETY: the caller's arguments, for the real dlsym.
    unsafe { real_dlsym()(handle, symbol) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::resolve::no_dlsym;

    #[test]
    fn the_real_dlsym_is_found_and_is_not_ours() {
        let f = real_dlsym();
        assert_ne!(f as *const (), no_dlsym as *const ());
        // SAFETY: a lookup of a libc symbol by the real dlsym.
        let p = unsafe { f(RTLD_DEFAULT, c"malloc".as_ptr()) };
        assert!(!p.is_null());
    }
}
