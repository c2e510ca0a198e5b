//! The declaration of an intercepted entry point (`intercept!`) and the
//! table of exports built from the registry in `names`: what `dlsym` and
//! `cuGetProcAddress` hand out for a hook ([`wrapper`]).

use std::ffi::c_void;

use super::types::{CUDA_ERROR_NOT_FOUND, CUresult};
use crate::log::{self, Level, Once};
use crate::names::Hook;

/// Declares one intercepted entry point, once:
///
/// ```text
/// intercept! {
///     /// What the wrapper does.
///     MemFreeV2 => fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
///     |real| { mem_free(cuMemFree_v2::HOOK, dptr, || unsafe { real(dptr) }) }
/// }
/// ```
///
/// makes
///
/// - `mod cuMemFree_v2` with `Pfn`, the C type of the entry point
///   (`PFN_cuMemFree_v2` in `cudaTypedefs.h`), `HOOK`, `real()` (the real
///   function as `Option<Pfn>`: the only way to it, so a call with the wrong
///   signature does not compile) and `typed()` (a pointer known to be the
///   real function, as `Option<Pfn>`);
/// - the exported `#[no_mangle] unsafe extern "C" fn cuMemFree_v2`, whose
///   body runs with `real` bound to the real function — a missing one
///   answers `CUDA_ERROR_NOT_FOUND` (`, else <value>` picks another answer,
///   NVML's); `raw { … }` instead of `|real| { … }` leaves the lookup to
///   the body (the launches' fast path);
/// - `const _: cuMemFree_v2::Pfn = cuMemFree_v2;`: the export has exactly
///   the declared type.
///
/// Twins whose bodies are the same (the two ABIs of one call, its
/// per-thread default-stream variant) are declared together: each with its
/// own documentation and signature, then one `|real, hook| { … }` body,
/// with `hook` bound to the entry point's own hook.
///
/// The table of exports ([`wrapper`]) is built from the registry and
/// checks that each symbol's export was declared for its hook.
macro_rules! intercept {
    (
        @declare $(#[$doc:meta])*
        $hook:ident => fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;
        $body:block
    ) => {
        #[doc = concat!("`", stringify!($name), "`: its C type and its real function.")]
        pub(crate) mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[doc = concat!("`PFN_", stringify!($name), "`: the C type of the entry point.")]
            pub(crate) type Pfn = unsafe extern "C" fn($($ty),*) -> $ret;

            /// The hook of the entry point.
            pub(crate) const HOOK: $crate::names::Hook = $crate::names::Hook::$hook;

            /// The real function (`None` when the library lacks it).
            #[inline(always)]
            #[allow(dead_code)] // a `raw` body (a launch) finds its own
            pub(crate) fn real() -> Option<Pfn> {
                // SAFETY: `resolve` returns null or the real function of
                // HOOK, the library's symbol of this name, whose C signature
                // is the one declared here.
                unsafe { typed($crate::ffi::resolve::resolve(HOOK)) }
            }

            /// `p` as this entry point's type (`None` when null).
            ///
            /// # Safety
            /// `p` is null or the real function of [`HOOK`].
            #[inline(always)]
            pub(crate) unsafe fn typed(p: *mut std::ffi::c_void) -> Option<Pfn> {
                // SAFETY: `Option` of a function pointer has the size of a
                // pointer, null being `None`; the caller vouches that a
                // non-null `p` has this signature.
                unsafe { std::mem::transmute::<*mut std::ffi::c_void, Option<Pfn>>(p) }
            }
        }

        $(#[$doc])*
        ///
        /// # Safety
        #[doc = concat!("As the driver's `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        const _: $name::Pfn = $name;
    };
    (
        $(#[$doc:meta])*
        $hook:ident => fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        |$real:ident| $body:block
    ) => {
        intercept! {
            @declare $(#[$doc])* $hook => fn $name($($arg: $ty),*) -> $ret;
            {
                let Some($real) = $name::real() else {
                    return $crate::ffi::intercept::missing($name::HOOK);
                };
                $body
            }
        }
    };
    (
        $(#[$doc:meta])*
        $hook:ident => fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty, else $absent:expr;
        |$real:ident| $body:block
    ) => {
        intercept! {
            @declare $(#[$doc])* $hook => fn $name($($arg: $ty),*) -> $ret;
            {
                let Some($real) = $name::real() else {
                    let _ = $crate::ffi::intercept::missing($name::HOOK);
                    return $absent;
                };
                $body
            }
        }
    };
    (
        $(#[$doc:meta])*
        $hook:ident => fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        raw $body:block
    ) => {
        intercept! { @declare $(#[$doc])* $hook => fn $name($($arg: $ty),*) -> $ret; $body }
    };
    (
        $(
            $(#[$doc:meta])*
            $hook:ident => fn $name:ident $args:tt -> $ret:ty $(, else $absent:expr)?;
        )+
        |$real:ident, $bound:ident| $body:block
    ) => {
        $(
            intercept! {
                $(#[$doc])* $hook => fn $name $args -> $ret $(, else $absent)?;
                |$real| {
                    let $bound = $name::HOOK;
                    $body
                }
            }
        )+
    };
}

/// A function not found in the driver library (only possible if the
/// program calls a function its driver does not have): one line, and
/// `CUDA_ERROR_NOT_FOUND`.
pub(crate) fn missing(hook: Hook) -> CUresult {
    static MISSING: Once = Once::new();
    log::once(&MISSING, Level::Warn, || {
        format!("{} is not in the driver library", hook.symbol())
    });
    CUDA_ERROR_NOT_FOUND
}

/// The table of exports, from the registry's list: each hook's arm, and a
/// compile-time check that the export of its symbol was declared for it.
macro_rules! exports {
    ($($variant:ident => $symbol:ident,)*) => {
        /// The wrapper exported for `hook`: what `dlsym` and
        /// `cuGetProcAddress` answer in place of the real function.
        pub(super) fn wrapper(hook: Hook) -> *mut c_void {
            match hook {
                $(Hook::$variant => $symbol as *mut c_void,)*
            }
        }

        $(const _: () = assert!(
            matches!($symbol::HOOK, Hook::$variant),
            concat!(stringify!($symbol), " is declared for another hook"),
        );)*
    };
}

use super::alloc::*;
use super::arrays::*;
use super::contexts::*;
use super::free::*;
use super::info::*;
use super::launch::*;
use super::nvml::*;
use super::pools::*;
use super::procaddr::*;
use super::vmm::*;

crate::names::with_hooks!(exports);

/// Whether `p` is one of this library's exports (never taken for a real
/// function).
pub(super) fn is_wrapper(p: *mut c_void) -> bool {
    !p.is_null() && Hook::ALL.iter().any(|&h| wrapper(h) == p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;

    use super::super::dlsym::dlsym_lookup;
    use super::super::types::RTLD_DEFAULT;

    #[test]
    fn every_hook_has_its_own_wrapper() {
        let mut seen = std::collections::HashSet::new();
        for &hook in Hook::ALL {
            assert!(
                seen.insert(wrapper(hook) as usize),
                "{hook:?} shares a wrapper"
            );
            assert!(is_wrapper(wrapper(hook)));
        }
        assert!(!is_wrapper(null_mut()));
    }

    #[test]
    fn every_symbol_resolves_to_its_own_export() {
        for &hook in Hook::ALL {
            let found = Hook::by_symbol(hook.symbol().as_bytes());
            assert_eq!(found, Some(hook), "dlsym of {}", hook.symbol());
            assert_eq!(found.map(wrapper), Some(wrapper(hook)));
        }
    }

    #[test]
    fn every_driver_export_is_reachable_through_cu_get_proc_address() {
        let ptds = crate::names::PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        for &hook in Hook::ALL.iter().filter(|h| !h.is_nvml()) {
            let symbol = hook.symbol();
            let base = ["_v2", "_v3", "_v4", "_ptsz"]
                .iter()
                .find_map(|suffix| symbol.strip_suffix(suffix))
                .unwrap_or(symbol);
            let reached = [symbol, base].iter().any(|name| {
                [2000, 3020, 4000, 7000, 11000, 11040, 12000, 12050]
                    .iter()
                    .any(|&version| {
                        [0, ptds].iter().any(|&flags| {
                            Hook::by_proc(name.as_bytes(), version, flags).map(wrapper)
                                == Some(wrapper(hook))
                        })
                    })
            });
            assert!(reached, "{symbol} is never answered with its export");
        }
        for &hook in Hook::ALL.iter().filter(|h| h.is_nvml()) {
            assert_eq!(Hook::by_proc(hook.symbol().as_bytes(), 12000, 0), None);
        }
    }

    #[test]
    fn the_lookup_leaves_foreign_names_to_the_real_dlsym() {
        assert!(dlsym_lookup(RTLD_DEFAULT, c"malloc".as_ptr()).is_null());
        assert!(dlsym_lookup(RTLD_DEFAULT, std::ptr::null()).is_null());
        // No libcuda in this process: the real lookup finds nothing to wrap.
        let p = dlsym_lookup(RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr());
        assert!(p.is_null() || is_wrapper(p));
    }
}
