//! `cuGetProcAddress` as the CUDA runtime uses it, against the built cdylib
//! loaded in this process.

mod common;

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong, c_void};

use libloading::Library;

type GetProcV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, c_ulonglong, *mut c_int) -> c_uint;
type GetProcV1 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, c_ulonglong) -> c_uint;
type ErrorName = unsafe extern "C" fn(c_uint, *mut *const c_char) -> c_uint;

const SUCCESS: c_uint = 0;
const INVALID_VALUE: c_uint = 1;
const NOT_FOUND: c_uint = 500;

struct Driver {
    lib: Library,
}

impl Driver {
    fn load() -> Option<Driver> {
        common::require(&[common::Need::Built("libtessera_sim_cuda.so")]).ok()?;
        let path = common::cuda_library();
        // SAFETY: loading runs the library's (Rust runtime) initialisers only.
        let lib = unsafe { Library::new(&path) }.expect("dlopen the CUDA stand-in");
        Some(Driver { lib })
    }

    fn dlsym(&self, name: &str) -> *mut c_void {
        // SAFETY: only looks a symbol up.
        let sym = unsafe { self.lib.get::<*mut c_void>(name.as_bytes()) }
            .unwrap_or_else(|e| panic!("dlsym {name}: {e}"));
        // SAFETY: the address of an exported function.
        unsafe { sym.into_raw().into_raw() }
    }

    fn get_v2(
        &self,
        name: &str,
        version: c_int,
        flags: c_ulonglong,
    ) -> (c_uint, *mut c_void, c_int) {
        // SAFETY: the export's cuda.h signature.
        let f: GetProcV2 = unsafe { std::mem::transmute(self.dlsym("cuGetProcAddress_v2")) };
        let name = CString::new(name).expect("a name without NUL");
        let (mut pfn, mut status) = (std::ptr::dangling_mut::<c_void>(), -1);
        // SAFETY: live out-pointers and a C string.
        let rc = unsafe { f(name.as_ptr(), &mut pfn, version, flags, &mut status) };
        (rc, pfn, status)
    }

    fn get_v1(&self, name: &str, version: c_int) -> (c_uint, *mut c_void) {
        // SAFETY: the export's cuda.h signature.
        let f: GetProcV1 = unsafe { std::mem::transmute(self.dlsym("cuGetProcAddress")) };
        let name = CString::new(name).expect("a name without NUL");
        let mut pfn = std::ptr::dangling_mut::<c_void>();
        // SAFETY: live out-pointer and a C string.
        let rc = unsafe { f(name.as_ptr(), &mut pfn, version, 0) };
        (rc, pfn)
    }
}

#[test]
fn versioned_names_map_to_the_exports_the_real_driver_returns() {
    let Some(d) = Driver::load() else {
        return;
    };
    // (base name, CUDA version asked, export expected)
    let cases = [
        ("cuMemAlloc", 12080, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3020, "cuMemAlloc_v2"),
        ("cuMemFree", 12080, "cuMemFree_v2"),
        ("cuMemGetInfo", 12080, "cuMemGetInfo_v2"),
        ("cuMemGetInfo", 3000, "cuMemGetInfo"),
        ("cuDeviceTotalMem", 12080, "cuDeviceTotalMem_v2"),
        ("cuDeviceTotalMem", 2000, "cuDeviceTotalMem"),
        ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
        ("cuCtxCreate", 11040, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12080, "cuCtxCreate_v4"),
        ("cuCtxDestroy", 12080, "cuCtxDestroy_v2"),
        ("cuCtxPushCurrent", 12080, "cuCtxPushCurrent_v2"),
        ("cuCtxPopCurrent", 12080, "cuCtxPopCurrent_v2"),
        ("cuStreamDestroy", 12080, "cuStreamDestroy_v2"),
        ("cuMemAllocPitch", 12080, "cuMemAllocPitch_v2"),
        ("cuMemAllocHost", 12080, "cuMemAllocHost_v2"),
        ("cuArrayCreate", 12080, "cuArrayCreate_v2"),
        ("cuArray3DCreate", 12080, "cuArray3DCreate_v2"),
        ("cuDeviceGetUuid", 11030, "cuDeviceGetUuid"),
        ("cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"),
        (
            "cuDevicePrimaryCtxRelease",
            10020,
            "cuDevicePrimaryCtxRelease",
        ),
        (
            "cuDevicePrimaryCtxRelease",
            12080,
            "cuDevicePrimaryCtxRelease_v2",
        ),
        ("cuGraphAddKernelNode", 11080, "cuGraphAddKernelNode"),
        ("cuGraphAddKernelNode", 12000, "cuGraphAddKernelNode_v2"),
        ("cuGraphInstantiate", 11080, "cuGraphInstantiate_v2"),
        ("cuGraphInstantiate", 12080, "cuGraphInstantiateWithFlags"),
        ("cuGetProcAddress", 11080, "cuGetProcAddress"),
        ("cuGetProcAddress", 12080, "cuGetProcAddress_v2"),
        ("cuLaunchKernel", 12080, "cuLaunchKernel"),
        ("cuLaunchKernelEx", 12080, "cuLaunchKernelEx"),
        ("cuMemAllocAsync", 12080, "cuMemAllocAsync"),
        ("cuMemCreate", 12080, "cuMemCreate"),
    ];
    for (base, version, export) in cases {
        let (rc, pfn, status) = d.get_v2(base, version, 0);
        assert_eq!((rc, status), (SUCCESS, 0), "{base}@{version}");
        assert_eq!(pfn, d.dlsym(export), "{base}@{version} should be {export}");
        let (rc, pfn1) = d.get_v1(base, version);
        assert_eq!(rc, SUCCESS, "v1 {base}@{version}");
        assert_eq!(pfn1, pfn, "v1 and v2 agree on {base}@{version}");
    }
}

#[test]
fn every_table_entry_resolves_to_its_own_export() {
    let Some(d) = Driver::load() else {
        return;
    };
    for (base, versions) in tessera_sim_cuda::PROC_ADDRESS_TABLE {
        for (i, (version, export, _)) in versions.iter().enumerate() {
            // At the version, and just before the next one.
            let last = versions.get(i + 1).map_or(12080, |next| next.0 - 10);
            for v in [*version, last] {
                let (rc, pfn, status) = d.get_v2(base, v, 0);
                assert_eq!((rc, status), (SUCCESS, 0), "{base}@{v}");
                assert_eq!(pfn, d.dlsym(export), "{base}@{v} → {export}");
            }
        }
        // The per-thread-default-stream flavour answers the same.
        let (_, default, _) = d.get_v2(base, 12080, 0);
        let (rc, ptds, _) = d.get_v2(base, 12080, 2);
        assert_eq!(
            (rc, ptds),
            (SUCCESS, default),
            "{base} with PER_THREAD_DEFAULT_STREAM"
        );
    }
}

#[test]
fn misses_follow_each_abi() {
    let Some(d) = Driver::load() else {
        return;
    };
    // v2: success, NULL, and the reason.
    assert_eq!(
        d.get_v2("cuNoSuchFunction", 12080, 0),
        (SUCCESS, std::ptr::null_mut(), 1)
    );
    assert_eq!(
        d.get_v2("cuMemAlloc_v2", 12080, 0),
        (SUCCESS, std::ptr::null_mut(), 1),
        "base names only"
    );
    assert_eq!(
        d.get_v2("cuMemAlloc", 3010, 0),
        (SUCCESS, std::ptr::null_mut(), 2)
    );
    // v1: CUDA_ERROR_NOT_FOUND.
    assert_eq!(
        d.get_v1("cuNoSuchFunction", 12080),
        (NOT_FOUND, std::ptr::null_mut())
    );
    assert_eq!(
        d.get_v1("cuLaunchKernelEx", 11050),
        (NOT_FOUND, std::ptr::null_mut())
    );
    // A version above the driver's, unknown flags: invalid.
    assert_eq!(d.get_v2("cuMemAlloc", 13000, 0).0, INVALID_VALUE);
    assert_eq!(d.get_v2("cuMemAlloc", 12080, 4).0, INVALID_VALUE);
    // Without a status pointer.
    // SAFETY: the export's cuda.h signature.
    let f: GetProcV2 = unsafe { std::mem::transmute(d.dlsym("cuGetProcAddress_v2")) };
    let mut pfn = std::ptr::null_mut();
    // SAFETY: NULL status is allowed; NULL symbol must be refused.
    unsafe {
        assert_eq!(
            f(c"cuInit".as_ptr(), &mut pfn, 12080, 0, std::ptr::null_mut()),
            SUCCESS
        );
        assert_eq!(pfn, d.dlsym("cuInit"));
        assert_eq!(
            f(std::ptr::null(), &mut pfn, 12080, 0, std::ptr::null_mut()),
            INVALID_VALUE
        );
        assert_eq!(
            f(
                c"cuInit".as_ptr(),
                std::ptr::null_mut(),
                12080,
                0,
                std::ptr::null_mut()
            ),
            INVALID_VALUE
        );
    }
}

#[test]
fn error_names_and_strings_are_the_drivers() {
    let Some(d) = Driver::load() else {
        return;
    };
    // SAFETY: the exports' cuda.h signatures.
    let (name, string): (ErrorName, ErrorName) = unsafe {
        (
            std::mem::transmute::<*mut c_void, ErrorName>(d.dlsym("cuGetErrorName")),
            std::mem::transmute::<*mut c_void, ErrorName>(d.dlsym("cuGetErrorString")),
        )
    };
    let text = |f: ErrorName, code| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: writes a static string pointer to a local.
        let rc = unsafe { f(code, &mut p) };
        (
            rc,
            (!p.is_null()).then(|| {
                // SAFETY: a static NUL-terminated string.
                unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
            }),
        )
    };
    for (code, expected) in [
        (0, "CUDA_SUCCESS"),
        (1, "CUDA_ERROR_INVALID_VALUE"),
        (2, "CUDA_ERROR_OUT_OF_MEMORY"),
        (3, "CUDA_ERROR_NOT_INITIALIZED"),
        (100, "CUDA_ERROR_NO_DEVICE"),
        (101, "CUDA_ERROR_INVALID_DEVICE"),
        (201, "CUDA_ERROR_INVALID_CONTEXT"),
        (400, "CUDA_ERROR_INVALID_HANDLE"),
        (500, "CUDA_ERROR_NOT_FOUND"),
        (801, "CUDA_ERROR_NOT_SUPPORTED"),
        (999, "CUDA_ERROR_UNKNOWN"),
    ] {
        assert_eq!(text(name, code), (SUCCESS, Some(expected.to_string())));
    }
    assert_eq!(
        text(string, 2),
        (SUCCESS, Some("out of memory".to_string()))
    );
    assert_eq!(text(name, 12345), (INVALID_VALUE, None));
}

#[test]
fn calls_before_init_are_not_initialized() {
    let Some(d) = Driver::load() else {
        return;
    };
    // Another test in this process may have initialised the shared copy:
    // only check the calls that never need cuInit, and that a fresh copy
    // (a different file, so different globals) refuses the rest.
    let path = common::cuda_library();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("libcuda-fresh.so");
    std::fs::copy(path, &copy).unwrap();
    // SAFETY: as in Driver::load.
    let fresh = unsafe { Library::new(&copy) }.unwrap();
    // SAFETY: cuda.h signatures.
    unsafe {
        let count = fresh
            .get::<unsafe extern "C" fn(*mut c_int) -> c_uint>(b"cuDeviceGetCount")
            .unwrap();
        let mut n = -1;
        assert_eq!(count(&mut n), 3, "CUDA_ERROR_NOT_INITIALIZED");
        let version = fresh
            .get::<unsafe extern "C" fn(*mut c_int) -> c_uint>(b"cuDriverGetVersion")
            .unwrap();
        let mut v = 0;
        assert_eq!(version(&mut v), SUCCESS);
        assert_eq!(v, 12080);
    }
    drop(d);
}
