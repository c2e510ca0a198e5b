//! Finding the real functions: glibc's own `dlsym` and `dlopen` (past this
//! library), the driver and NVML libraries as the program loaded them, the
//! cached real pointer of every hook, and the functions the library calls
//! itself without intercepting them ([`Internal`]).

use std::ffi::{CStr, c_char, c_void};
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use super::intercept::is_wrapper;
use super::types::RTLD_NEXT;
use crate::names::{HOOK_COUNT, Hook};

/// The type of `dlsym`.
pub(super) type FnDlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` (the naked `dlsym` jumps through it).
pub(super) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// Stands in for `dlsym` if glibc's cannot be found (never on glibc).
pub(super) unsafe extern "C" fn no_dlsym(
    _handle: *mut c_void,
    _symbol: *const c_char,
) -> *mut c_void {
    null_mut()
}

/// glibc's own `name` (a function this library also exports): the
/// definition after this library, by symbol version (2.34, where the dl*
/// functions moved into libc, else 2.2.5); `missing` if neither exists.
pub(super) fn glibc_next(name: &CStr, missing: *mut c_void) -> *mut c_void {
    [c"GLIBC_2.34", c"GLIBC_2.2.5"]
        .iter()
        // SAFETY: dlvsym is given valid NUL-terminated strings; RTLD_NEXT
        // asks for the definition after this library (libc's).
        .map(|version| unsafe { libc::dlvsym(RTLD_NEXT, name.as_ptr(), version.as_ptr()) })
        .find(|p| !p.is_null())
        .unwrap_or(missing)
}

/// glibc's `dlsym`, found once.
pub(super) fn real_dlsym() -> FnDlsym {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        p = glibc_next(c"dlsym", no_dlsym as *mut c_void);
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is glibc's dlsym (or no_dlsym), both with dlsym's signature.
    unsafe { std::mem::transmute::<*mut c_void, FnDlsym>(p) }
}

/// `libcuda.so.1` as loaded by the program (never loaded by us).
pub(super) static CUDA_LIB: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
/// `libnvidia-ml.so.1` as loaded by the program.
pub(super) static NVML_LIB: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
/// `libnvidia-ml.so.1` as loaded by the library itself (the SM limiter,
/// context measurement).
static NVML_OWN: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn library(cache: &AtomicPtr<c_void>, name: &CStr, load: bool) -> *mut c_void {
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    // SAFETY: dlopen with a NUL-terminated name; RTLD_NOLOAD only returns
    // a library already in the process (and takes a reference we never drop).
    let mut handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() && load {
        // SAFETY: as above; loading the library runs its initializers, which
        // is what the program itself would do when it loads it.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
    }
    if !handle.is_null() {
        cache.store(handle, Ordering::Release);
    }
    handle
}

fn cuda_library() -> *mut c_void {
    library(&CUDA_LIB, c"libcuda.so.1", false)
}

fn nvml_library() -> *mut c_void {
    library(&NVML_LIB, c"libnvidia-ml.so.1", false)
}

/// `libnvidia-ml.so.1` for the library's own use, loaded if the program
/// has not (null if it cannot be).
pub(super) fn own_nvml_library() -> *mut c_void {
    library(&NVML_OWN, c"libnvidia-ml.so.1", true)
}

/// Looks `name` up in `lib`, then after this library; never returns one
/// of our own wrappers.
pub(super) fn lookup_real(lib: *mut c_void, name: &CStr) -> *mut c_void {
    let dlsym = real_dlsym();
    let mut p = null_mut();
    if !lib.is_null() {
        // SAFETY: lib is a handle from dlopen; name is NUL-terminated.
        p = unsafe { dlsym(lib, name.as_ptr()) };
    }
    if p.is_null() || is_wrapper(p) {
        // SAFETY: RTLD_NEXT from this library: the definition after ours.
        p = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) };
    }
    if is_wrapper(p) { null_mut() } else { p }
}

// ---------------------------------------------------------------------------
// The real pointers of the hooks

static REAL: [AtomicPtr<c_void>; HOOK_COUNT] = [const { AtomicPtr::new(null_mut()) }; HOOK_COUNT];

fn symbol_cstr(hook: Hook) -> &'static CStr {
    CStr::from_bytes_with_nul(hook.symbol_nul().as_bytes()).unwrap_or(c"")
}

/// The real function of `hook` (null if the library lacks it). Typed
/// access goes through the entry point's declaration (`<name>::real()`).
pub(crate) fn resolve(hook: Hook) -> *mut c_void {
    let slot = &REAL[hook as usize];
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let lib = if hook.is_nvml() {
        nvml_library()
    } else {
        cuda_library()
    };
    seed(hook, lookup_real(lib, symbol_cstr(hook)));
    slot.load(Ordering::Acquire)
}

/// Records `p` as the real function of `hook`, unless one is known already
/// or `p` is one of ours.
pub(super) fn seed(hook: Hook, p: *mut c_void) {
    if !p.is_null() && !is_wrapper(p) {
        let _ = REAL[hook as usize].compare_exchange(
            null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

// ---------------------------------------------------------------------------
// Functions the library calls itself

/// Where an [`Internal`] function is looked up.
enum Source {
    /// `libcuda.so.1` as the program loaded it.
    Cuda,
    /// `libnvidia-ml.so.1` as the program loaded it.
    Nvml,
    /// The library's own handle on `libnvidia-ml.so.1` (loaded if the
    /// program has not: measuring needs NVML whether or not the program
    /// uses it).
    OwnNvml,
}

/// A driver or NVML function the library calls but does not intercept,
/// typed once, where it is declared: `F` is its C signature.
pub(super) struct Internal<F> {
    name: &'static CStr,
    source: Source,
    ptr: AtomicPtr<c_void>,
    signature: PhantomData<F>,
}

impl<F: Copy> Internal<F> {
    const fn new(name: &'static CStr, source: Source) -> Internal<F> {
        Internal {
            name,
            source,
            ptr: AtomicPtr::new(null_mut()),
            signature: PhantomData,
        }
    }

    /// `name` in the driver library; `F` must be its C signature.
    pub(super) const fn cuda(name: &'static CStr) -> Internal<F> {
        Internal::new(name, Source::Cuda)
    }

    /// `name` in the program's NVML; `F` must be its C signature.
    pub(super) const fn nvml(name: &'static CStr) -> Internal<F> {
        Internal::new(name, Source::Nvml)
    }

    /// `name` in the library's own NVML; `F` must be its C signature.
    pub(super) const fn own_nvml(name: &'static CStr) -> Internal<F> {
        Internal::new(name, Source::OwnNvml)
    }

    fn pointer(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let lib = match self.source {
            Source::Cuda => cuda_library(),
            Source::Nvml => nvml_library(),
            Source::OwnNvml => {
                let lib = own_nvml_library();
                if lib.is_null() {
                    return null_mut();
                }
                lib
            }
        };
        let p = lookup_real(lib, self.name);
        if !p.is_null() {
            self.ptr.store(p, Ordering::Release);
        }
        p
    }

    /// The function, or `None` when the library lacks it.
    pub(super) fn get(&self) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let p = self.pointer();
        // SAFETY: p is the function named `name` in its library, whose C
        // signature is `F` (the declaration's promise); same size, checked
        // above.
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}
