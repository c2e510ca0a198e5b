//! An interposer — any object earlier in the process's lookup order that
//! exports a function named like a driver export, as an `LD_PRELOAD`
//! library does — must not change what `cuGetProcAddress` returns: the
//! stand-in answers from its own table with its own definitions (it is
//! linked with `-Bsymbolic-functions`). This test binary is that
//! interposer: it defines `cuMemAlloc_v2` and exports it (build.rs links
//! integration tests with `--export-dynamic`).

mod common;

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// The interposing definition.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemAlloc_v2(_dptr: *mut c_ulonglong, _bytesize: usize) -> c_uint {
    999
}

type GetProcV2 = unsafe extern "C" fn(
    *const std::ffi::c_char,
    *mut *mut c_void,
    c_int,
    c_ulonglong,
    *mut c_int,
) -> c_uint;

#[test]
fn an_exported_namesake_does_not_capture_get_proc_address() {
    let ours = cuMemAlloc_v2 as *const c_void;
    // SAFETY: looks a symbol up in the global scope.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()) };
    let Ok(()) = common::require(&[
        common::Need::condition(
            global.cast_const() == ours,
            "a test binary that exports its symbols (--export-dynamic)",
            "build it with this crate's build.rs link arguments",
        ),
        common::Need::Built("libtessera_sim_cuda.so"),
    ]) else {
        return;
    };
    let path = common::cuda_library();
    // SAFETY: loading runs only the Rust runtime's initialisers.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the CUDA stand-in");
    // SAFETY: lookups of exported functions, called with cuda.h's signature.
    unsafe {
        let own: *mut c_void = *lib.get::<*mut c_void>(b"cuMemAlloc_v2").unwrap();
        let get: GetProcV2 = *lib.get::<GetProcV2>(b"cuGetProcAddress_v2").unwrap();
        let mut pfn = std::ptr::null_mut();
        let mut status = -1;
        assert_eq!(
            get(c"cuMemAlloc".as_ptr(), &mut pfn, 12080, 0, &mut status),
            0
        );
        assert_eq!(status, 0);
        assert_ne!(
            pfn.cast_const(),
            ours,
            "cuGetProcAddress returned the interposer"
        );
        assert_eq!(
            pfn, own,
            "cuGetProcAddress returned the library's own definition"
        );
    }
}
