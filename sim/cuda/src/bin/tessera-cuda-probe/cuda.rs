//! Loading `libcuda.so.1` as the CUDA runtime does, and the entry points
//! the probe calls. The declarations are the probe's own, written from
//! `cuda.h` independently of the stand-in's, so that a layout mistake on
//! either side shows.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::fmt;

/// `CUresult`.
pub type CuResult = c_uint;
/// `CUDA_SUCCESS`.
pub const SUCCESS: CuResult = 0;
/// `CUdeviceptr`.
pub type DevPtr = c_ulonglong;
/// Any opaque handle (`CUcontext`, `CUstream`, …).
pub type Handle = *mut c_void;

/// How entry points are found.
#[derive(Debug, Clone, Copy)]
pub enum Route {
    /// Through `cuGetProcAddress`, asking for this CUDA version (`None`:
    /// the driver's version).
    ProcAddress(Option<c_int>),
    /// With `dlsym` on the library handle, by exported (versioned) name.
    Dlsym,
}

/// A failed step: what was called and what it returned.
#[derive(Debug)]
pub struct Failure {
    /// The call.
    pub call: String,
    /// Its `CUresult`, if it got that far.
    pub code: Option<CuResult>,
    /// The result's name, from `cuGetErrorName`.
    pub name: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(f, "{}: {} ({code})", self.call, self.name),
            None => write!(f, "{}: {}", self.call, self.name),
        }
    }
}

impl std::error::Error for Failure {}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub requested_handle_types: c_int,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: c_int,
}

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// A block of memory the probe allocated, by the call that frees it.
pub enum Block {
    /// `cuMemFree_v2` (linear, pitched and managed memory).
    Linear(DevPtr),
    /// `cuMemFreeHost`.
    Host(*mut c_void),
    /// A VMM mapping (`cuMemUnmap`, `cuMemAddressFree`) of the memory behind `handle`.
    Vmm {
        va: DevPtr,
        size: usize,
        handle: c_ulonglong,
    },
    /// `cuMemFreeAsync`.
    Async(DevPtr),
    /// `cuArrayDestroy`.
    Array(Handle),
    /// `cuMipmappedArrayDestroy`.
    Mipmap(Handle),
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

impl ArrayDescriptor {
    /// A `width × height` array of one-channel floats.
    pub fn floats(width: usize, height: usize) -> ArrayDescriptor {
        ArrayDescriptor {
            width,
            height,
            format: FORMAT_FLOAT,
            num_channels: 1,
        }
    }
}

impl Array3dDescriptor {
    /// A `width × height × depth` array of one-channel floats (no flags).
    pub fn floats(width: usize, height: usize, depth: usize) -> Array3dDescriptor {
        Array3dDescriptor {
            width,
            height,
            depth,
            format: FORMAT_FLOAT,
            num_channels: 1,
            flags: 0,
        }
    }
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: Handle,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: Handle,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: Handle,
    pub ctx: Handle,
}

/// `CU_AD_FORMAT_FLOAT`.
pub const FORMAT_FLOAT: c_uint = 0x20;

type GetProc = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_int,
    c_ulonglong,
    *mut c_int,
) -> CuResult;
type GetProcV1 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, c_ulonglong) -> CuResult;

macro_rules! api {
    ($($field:ident : $base:literal / $export:literal : fn($($arg:ty),*);)*) => {
        /// The driver entry points the probe uses.
        #[allow(dead_code, reason = "each command uses a different part")]
        pub struct Api {
            $(
                #[doc = concat!("`", $export, "`")]
                pub $field: unsafe extern "C" fn($($arg),*) -> CuResult,
            )*
            /// `tesseraSimCudaGetBusyNs` (the simulator only; found with dlsym).
            pub busy_ns: Option<unsafe extern "C" fn(c_int, *mut c_ulonglong, *mut c_ulonglong) -> CuResult>,
            /// Where the library was loaded from.
            pub library: String,
        }

        impl Api {
            fn resolve(loader: &Loader) -> Result<Api, Failure> {
                Ok(Api {
                    $(
                        // SAFETY: the loader returns the address of the
                        // driver function with this name, whose C
                        // signature (cuda.h, for the version asked) is the
                        // field's type.
                        $field: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(loader.find($base, $export)?) },
                    )*
                    busy_ns: loader.dlsym("tesseraSimCudaGetBusyNs").map(|p| {
                        // SAFETY: the simulator exports this symbol with this signature.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, *mut c_ulonglong, *mut c_ulonglong) -> CuResult>(p) }
                    }),
                    library: loader.library(),
                })
            }
        }
    };
}

api! {
    init: "cuInit" / "cuInit": fn(c_uint);
    driver_get_version: "cuDriverGetVersion" / "cuDriverGetVersion": fn(*mut c_int);
    get_error_name: "cuGetErrorName" / "cuGetErrorName": fn(CuResult, *mut *const c_char);
    device_get_count: "cuDeviceGetCount" / "cuDeviceGetCount": fn(*mut c_int);
    device_get: "cuDeviceGet" / "cuDeviceGet": fn(*mut c_int, c_int);
    device_get_name: "cuDeviceGetName" / "cuDeviceGetName": fn(*mut c_char, c_int, c_int);
    device_get_uuid: "cuDeviceGetUuid" / "cuDeviceGetUuid_v2": fn(*mut [u8; 16], c_int);
    device_total_mem: "cuDeviceTotalMem" / "cuDeviceTotalMem_v2": fn(*mut usize, c_int);
    device_get_attribute: "cuDeviceGetAttribute" / "cuDeviceGetAttribute": fn(*mut c_int, c_int, c_int);
    device_get_pci_bus_id: "cuDeviceGetPCIBusId" / "cuDeviceGetPCIBusId": fn(*mut c_char, c_int, c_int);
    primary_ctx_retain: "cuDevicePrimaryCtxRetain" / "cuDevicePrimaryCtxRetain": fn(*mut Handle, c_int);
    primary_ctx_release: "cuDevicePrimaryCtxRelease" / "cuDevicePrimaryCtxRelease_v2": fn(c_int);
    primary_ctx_reset: "cuDevicePrimaryCtxReset" / "cuDevicePrimaryCtxReset_v2": fn(c_int);
    ctx_create: "cuCtxCreate" / "cuCtxCreate_v2": fn(*mut Handle, c_uint, c_int);
    ctx_destroy: "cuCtxDestroy" / "cuCtxDestroy_v2": fn(Handle);
    ctx_push_current: "cuCtxPushCurrent" / "cuCtxPushCurrent_v2": fn(Handle);
    ctx_pop_current: "cuCtxPopCurrent" / "cuCtxPopCurrent_v2": fn(*mut Handle);
    ctx_set_limit: "cuCtxSetLimit" / "cuCtxSetLimit": fn(c_int, usize);
    ctx_set_current: "cuCtxSetCurrent" / "cuCtxSetCurrent": fn(Handle);
    ctx_synchronize: "cuCtxSynchronize" / "cuCtxSynchronize": fn();
    stream_create: "cuStreamCreate" / "cuStreamCreate": fn(*mut Handle, c_uint);
    stream_destroy: "cuStreamDestroy" / "cuStreamDestroy_v2": fn(Handle);
    stream_synchronize: "cuStreamSynchronize" / "cuStreamSynchronize": fn(Handle);
    module_load_data: "cuModuleLoadData" / "cuModuleLoadData": fn(*mut Handle, *const c_void);
    module_unload: "cuModuleUnload" / "cuModuleUnload": fn(Handle);
    module_get_function: "cuModuleGetFunction" / "cuModuleGetFunction": fn(*mut Handle, Handle, *const c_char);
    mem_get_info: "cuMemGetInfo" / "cuMemGetInfo_v2": fn(*mut usize, *mut usize);
    mem_alloc: "cuMemAlloc" / "cuMemAlloc_v2": fn(*mut DevPtr, usize);
    mem_free: "cuMemFree" / "cuMemFree_v2": fn(DevPtr);
    mem_alloc_pitch: "cuMemAllocPitch" / "cuMemAllocPitch_v2": fn(*mut DevPtr, *mut usize, usize, usize, c_uint);
    mem_alloc_managed: "cuMemAllocManaged" / "cuMemAllocManaged": fn(*mut DevPtr, usize, c_uint);
    mem_alloc_host: "cuMemAllocHost" / "cuMemAllocHost_v2": fn(*mut *mut c_void, usize);
    mem_free_host: "cuMemFreeHost" / "cuMemFreeHost": fn(*mut c_void);
    mem_create: "cuMemCreate" / "cuMemCreate": fn(*mut c_ulonglong, usize, *const MemAllocationProp, c_ulonglong);
    mem_release: "cuMemRelease" / "cuMemRelease": fn(c_ulonglong);
    mem_address_reserve: "cuMemAddressReserve" / "cuMemAddressReserve": fn(*mut DevPtr, usize, usize, DevPtr, c_ulonglong);
    mem_address_free: "cuMemAddressFree" / "cuMemAddressFree": fn(DevPtr, usize);
    mem_map: "cuMemMap" / "cuMemMap": fn(DevPtr, usize, usize, c_ulonglong, c_ulonglong);
    mem_unmap: "cuMemUnmap" / "cuMemUnmap": fn(DevPtr, usize);
    mem_retain_allocation_handle: "cuMemRetainAllocationHandle" / "cuMemRetainAllocationHandle": fn(*mut c_ulonglong, *mut c_void);
    mem_export_to_shareable_handle: "cuMemExportToShareableHandle" / "cuMemExportToShareableHandle": fn(*mut c_void, c_ulonglong, c_int, c_ulonglong);
    mem_import_from_shareable_handle: "cuMemImportFromShareableHandle" / "cuMemImportFromShareableHandle": fn(*mut c_ulonglong, *mut c_void, c_int);
    mem_set_access: "cuMemSetAccess" / "cuMemSetAccess": fn(DevPtr, usize, *const MemAccessDesc, usize);
    mem_get_allocation_granularity: "cuMemGetAllocationGranularity" / "cuMemGetAllocationGranularity": fn(*mut usize, *const MemAllocationProp, c_int);
    mem_alloc_async: "cuMemAllocAsync" / "cuMemAllocAsync": fn(*mut DevPtr, usize, Handle);
    mem_free_async: "cuMemFreeAsync" / "cuMemFreeAsync": fn(DevPtr, Handle);
    mem_pool_create: "cuMemPoolCreate" / "cuMemPoolCreate": fn(*mut Handle, *const MemPoolProps);
    mem_pool_destroy: "cuMemPoolDestroy" / "cuMemPoolDestroy": fn(Handle);
    mem_pool_set_attribute: "cuMemPoolSetAttribute" / "cuMemPoolSetAttribute": fn(Handle, c_int, *mut c_void);
    mem_pool_get_attribute: "cuMemPoolGetAttribute" / "cuMemPoolGetAttribute": fn(Handle, c_int, *mut c_void);
    mem_pool_trim_to: "cuMemPoolTrimTo" / "cuMemPoolTrimTo": fn(Handle, usize);
    device_get_mem_pool: "cuDeviceGetMemPool" / "cuDeviceGetMemPool": fn(*mut Handle, c_int);
    mem_alloc_from_pool_async: "cuMemAllocFromPoolAsync" / "cuMemAllocFromPoolAsync": fn(*mut DevPtr, usize, Handle, Handle);
    array_create: "cuArrayCreate" / "cuArrayCreate_v2": fn(*mut Handle, *const ArrayDescriptor);
    array_destroy: "cuArrayDestroy" / "cuArrayDestroy": fn(Handle);
    array3d_create: "cuArray3DCreate" / "cuArray3DCreate_v2": fn(*mut Handle, *const Array3dDescriptor);
    mipmapped_array_create: "cuMipmappedArrayCreate" / "cuMipmappedArrayCreate": fn(*mut Handle, *const Array3dDescriptor, c_uint);
    mipmapped_array_destroy: "cuMipmappedArrayDestroy" / "cuMipmappedArrayDestroy": fn(Handle);
    launch_kernel: "cuLaunchKernel" / "cuLaunchKernel": fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void);
    launch_kernel_ex: "cuLaunchKernelEx" / "cuLaunchKernelEx": fn(*const LaunchConfig, Handle, *mut *mut c_void, *mut *mut c_void);
    launch_cooperative_kernel: "cuLaunchCooperativeKernel" / "cuLaunchCooperativeKernel": fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void);
    graph_create: "cuGraphCreate" / "cuGraphCreate": fn(*mut Handle, c_uint);
    graph_add_kernel_node: "cuGraphAddKernelNode" / "cuGraphAddKernelNode_v2": fn(*mut Handle, Handle, *const Handle, usize, *const KernelNodeParams);
    graph_instantiate: "cuGraphInstantiateWithFlags" / "cuGraphInstantiateWithFlags": fn(*mut Handle, Handle, c_ulonglong);
    graph_launch: "cuGraphLaunch" / "cuGraphLaunch": fn(Handle, Handle);
    graph_exec_destroy: "cuGraphExecDestroy" / "cuGraphExecDestroy": fn(Handle);
    graph_destroy: "cuGraphDestroy" / "cuGraphDestroy": fn(Handle);
}

struct Loader {
    handle: *mut c_void,
    route: Route,
    driver_version: c_int,
    get_proc: Option<GetProc>,
    get_proc_v1: Option<GetProcV1>,
}

impl Loader {
    fn dlsym(&self, name: &str) -> Option<*mut c_void> {
        let name = CString::new(name).ok()?;
        // SAFETY: `handle` is a live handle from dlopen; `name` is a C string.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    fn find(&self, base: &str, export: &str) -> Result<*mut c_void, Failure> {
        let missing = |how: String| Failure {
            call: how,
            code: None,
            name: "entry point not found".into(),
        };
        match self.route {
            Route::Dlsym => self
                .dlsym(export)
                .ok_or_else(|| missing(format!("dlsym(\"{export}\")"))),
            Route::ProcAddress(version) => {
                let version = version.unwrap_or(self.driver_version);
                let name = CString::new(base).map_err(|_| missing(base.to_string()))?;
                let mut pfn = std::ptr::null_mut();
                let mut status: c_int = -1;
                let call = format!("cuGetProcAddress(\"{base}\", {version})");
                let code = match (self.get_proc, self.get_proc_v1) {
                    // SAFETY: cuda.h signatures of the two exports; every
                    // pointer is a live local.
                    (Some(v2), _) => unsafe {
                        v2(name.as_ptr(), &mut pfn, version, 0, &mut status)
                    },
                    // SAFETY: as above.
                    (None, Some(v1)) => unsafe { v1(name.as_ptr(), &mut pfn, version, 0) },
                    (None, None) => return Err(missing("dlsym(\"cuGetProcAddress\")".into())),
                };
                if code != SUCCESS {
                    return Err(Failure {
                        call,
                        code: Some(code),
                        name: "cuGetProcAddress failed".into(),
                    });
                }
                if pfn.is_null() {
                    return Err(missing(format!("{call} (status {status})")));
                }
                Ok(pfn)
            }
        }
    }

    fn library(&self) -> String {
        let Some(anchor) = self.dlsym("cuInit") else {
            return "?".into();
        };
        let mut info = libc::Dl_info {
            dli_fname: std::ptr::null(),
            dli_fbase: std::ptr::null_mut(),
            dli_sname: std::ptr::null(),
            dli_saddr: std::ptr::null_mut(),
        };
        // SAFETY: dladdr only reads the loader's tables into `info`.
        if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
            return "?".into();
        }
        // SAFETY: dli_fname points to the loader's NUL-terminated copy of
        // the path of an object that stays loaded.
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Loads `libcuda.so.1` from the loader's search path and resolves the entry points.
pub fn load(route: Route) -> Result<Api, Failure> {
    // SAFETY: dlopen runs the library's initialisers, which is what loading
    // a driver means; the name is a static C string.
    let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a C string valid until the next dl call.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated, copied out at once.
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(Failure {
            call: "dlopen(\"libcuda.so.1\")".into(),
            code: None,
            name: why,
        });
    }
    let mut loader = Loader {
        handle,
        route,
        driver_version: 12080,
        get_proc: None,
        get_proc_v1: None,
    };
    if let Some(p) = loader.dlsym("cuGetProcAddress_v2") {
        // SAFETY: cuGetProcAddress_v2 has this signature (cuda.h 12.x).
        loader.get_proc = Some(unsafe { std::mem::transmute::<*mut c_void, GetProc>(p) });
    } else if let Some(p) = loader.dlsym("cuGetProcAddress") {
        // SAFETY: cuGetProcAddress has this signature (cuda.h 11.3+).
        loader.get_proc_v1 = Some(unsafe { std::mem::transmute::<*mut c_void, GetProcV1>(p) });
    }
    if let Some(p) = loader.dlsym("cuDriverGetVersion") {
        // SAFETY: cuDriverGetVersion(int*) writes one int; it needs no cuInit.
        unsafe {
            let f =
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int) -> CuResult>(p);
            let mut v = 0;
            if f(&mut v) == SUCCESS && v > 0 {
                loader.driver_version = v;
            }
        }
    }
    Api::resolve(&loader)
}

impl Api {
    /// `cuLaunchKernel`, or `cooperative` `cuLaunchCooperativeKernel`, of
    /// `f` on `stream`, with no shared memory or kernel parameters.
    ///
    /// # Safety
    /// `f` is a loaded function and `stream` a live stream (or null).
    pub unsafe fn launch(
        &self,
        cooperative: bool,
        f: Handle,
        [gx, gy, gz]: [c_uint; 3],
        [bx, by, bz]: [c_uint; 3],
        stream: Handle,
    ) -> CuResult {
        let none = std::ptr::null_mut();
        // SAFETY: the caller's contract; the geometry and NULL parameters
        // are passed by value.
        unsafe {
            if cooperative {
                (self.launch_cooperative_kernel)(f, gx, gy, gz, bx, by, bz, 0, stream, none)
            } else {
                (self.launch_kernel)(f, gx, gy, gz, bx, by, bz, 0, stream, none, none)
            }
        }
    }

    /// Retains device `dev`'s primary context and makes it current.
    pub fn retain_primary_current(&self, dev: c_int) -> Result<Handle, Failure> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: cuda.h contracts: a live out-pointer, then the context
        // just retained.
        unsafe {
            self.check(
                "cuDevicePrimaryCtxRetain",
                (self.primary_ctx_retain)(&mut ctx, dev),
            )?;
            self.check("cuCtxSetCurrent", (self.ctx_set_current)(ctx))?;
        }
        Ok(ctx)
    }

    /// The enum name of `code`.
    pub fn error_name(&self, code: CuResult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName's contract: writes a static string pointer.
        let rc = unsafe { (self.get_error_name)(code, &mut name) };
        if rc != SUCCESS || name.is_null() {
            return format!("CUresult {code}");
        }
        // SAFETY: a static NUL-terminated string owned by the driver.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `Ok` for `CUDA_SUCCESS`, else a [`Failure`] naming `call`.
    pub fn check(&self, call: &str, code: CuResult) -> Result<(), Failure> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(Failure {
                call: call.to_string(),
                code: Some(code),
                name: self.error_name(code),
            })
        }
    }
}
