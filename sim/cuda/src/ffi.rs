//! The slice of the CUDA driver API's C ABI (`cuda.h`, CUDA 12.x) this
//! library implements: result codes, enum values, opaque handle types and
//! the `#[repr(C)]` structs it reads, written from the header's definitions
//! (cross-checked against bindgen output of the 12.8 header) and pinned by
//! the size and offset tests below. Field names are ours (snake case, the C
//! name in each doc line); order and C types are what matter.

use std::ffi::{c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

/// `CUresult`: a C enum, passed as a 32-bit integer.
pub type CuResult = c_uint;
/// `CUdevice`: a device ordinal.
pub type CuDevice = c_int;
/// `CUdeviceptr` (`CUdeviceptr_v2`): a 64-bit device address.
pub type CuDevicePtr = c_ulonglong;
/// `CUmemGenericAllocationHandle`.
pub type CuMemHandle = c_ulonglong;

macro_rules! results {
    ($($(#[$doc:meta])* $name:ident = $value:literal, $text:literal;)*) => {
        $($(#[$doc])* pub const $name: CuResult = $value;)*

        /// `cuGetErrorName`: the enum name of a result code.
        pub fn error_name(code: CuResult) -> Option<&'static std::ffi::CStr> {
            match code {
                $($value => Some(const {
                    // One NUL-terminated literal per code, checked at compile time.
                    match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(name) => name,
                        Err(_) => panic!("result name with an interior NUL"),
                    }
                }),)*
                _ => None,
            }
        }

        /// `cuGetErrorString`: a one-line description of a result code.
        pub fn error_string(code: CuResult) -> Option<&'static std::ffi::CStr> {
            match code {
                $($value => Some(const {
                    match std::ffi::CStr::from_bytes_with_nul(concat!($text, "\0").as_bytes()) {
                        Ok(text) => text,
                        Err(_) => panic!("result text with an interior NUL"),
                    }
                }),)*
                _ => None,
            }
        }
    };
}

// Names are the real enum names with their CUDA_ prefix kept, so that
// `cuGetErrorName` can print them as they are.
results! {
    /// The call succeeded.
    CUDA_SUCCESS = 0, "no error";
    /// A parameter is out of range.
    CUDA_ERROR_INVALID_VALUE = 1, "invalid argument";
    /// Not enough device (or host) memory.
    CUDA_ERROR_OUT_OF_MEMORY = 2, "out of memory";
    /// `cuInit` has not succeeded.
    CUDA_ERROR_NOT_INITIALIZED = 3, "initialization error";
    /// The driver is shutting down.
    CUDA_ERROR_DEINITIALIZED = 4, "driver shutting down";
    /// Profiler not initialized for this run.
    CUDA_ERROR_PROFILER_DISABLED = 5, "profiler disabled while using external profiling tool";
    /// Deprecated profiler code.
    CUDA_ERROR_PROFILER_NOT_INITIALIZED = 6, "profiler not initialized: call cudaProfilerInitialize()";
    /// Deprecated profiler code.
    CUDA_ERROR_PROFILER_ALREADY_STARTED = 7, "profiler already started";
    /// Deprecated profiler code.
    CUDA_ERROR_PROFILER_ALREADY_STOPPED = 8, "profiler already stopped";
    /// A stub library was loaded instead of the driver.
    CUDA_ERROR_STUB_LIBRARY = 34, "CUDA driver is a stub library";
    /// The device is unavailable.
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46, "CUDA-capable device(s) is/are busy or unavailable";
    /// No device is visible.
    CUDA_ERROR_NO_DEVICE = 100, "no CUDA-capable device is detected";
    /// The device ordinal is not valid.
    CUDA_ERROR_INVALID_DEVICE = 101, "invalid device ordinal";
    /// The device is not licensed.
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102, "device doesn't have valid Grid license";
    /// The kernel image is invalid.
    CUDA_ERROR_INVALID_IMAGE = 200, "device kernel image is invalid";
    /// No (or an invalid) context.
    CUDA_ERROR_INVALID_CONTEXT = 201, "invalid device context";
    /// Deprecated.
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202, "context already current";
    /// A map operation failed.
    CUDA_ERROR_MAP_FAILED = 205, "mapping of buffer object failed";
    /// An unmap operation failed.
    CUDA_ERROR_UNMAP_FAILED = 206, "unmapping of buffer object failed";
    /// The array is mapped.
    CUDA_ERROR_ARRAY_IS_MAPPED = 207, "array is mapped";
    /// The resource is already mapped.
    CUDA_ERROR_ALREADY_MAPPED = 208, "resource already mapped";
    /// No kernel image for the device.
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209, "no kernel image is available for execution on the device";
    /// The resource is already acquired.
    CUDA_ERROR_ALREADY_ACQUIRED = 210, "resource already acquired";
    /// The resource is not mapped.
    CUDA_ERROR_NOT_MAPPED = 211, "resource not mapped";
    /// Not mapped as an array.
    CUDA_ERROR_NOT_MAPPED_AS_ARRAY = 212, "resource not mapped as array";
    /// Not mapped as a pointer.
    CUDA_ERROR_NOT_MAPPED_AS_POINTER = 213, "resource not mapped as pointer";
    /// Uncorrectable ECC error.
    CUDA_ERROR_ECC_UNCORRECTABLE = 214, "uncorrectable ECC error encountered";
    /// Unsupported limit.
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215, "limit is not supported on this architecture";
    /// The context is in use by another thread.
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216, "exclusive-thread device already in use by a different thread";
    /// Peer access unsupported.
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217, "peer access is not supported between these two devices";
    /// Invalid PTX.
    CUDA_ERROR_INVALID_PTX = 218, "a PTX JIT compilation failed";
    /// Invalid graphics context.
    CUDA_ERROR_INVALID_GRAPHICS_CONTEXT = 219, "invalid OpenGL or DirectX context";
    /// Uncorrectable NVLink error.
    CUDA_ERROR_NVLINK_UNCORRECTABLE = 220, "uncorrectable NVLink error detected during the execution";
    /// JIT compiler not found.
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221, "PTX JIT compiler library not found";
    /// Unsupported PTX version.
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222, "the provided PTX was compiled with an unsupported toolchain.";
    /// JIT compilation disabled.
    CUDA_ERROR_JIT_COMPILATION_DISABLED = 223, "PTX JIT compilation was disabled";
    /// Unsupported execution affinity.
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224, "the provided execution affinity is not supported";
    /// Unsupported device-side synchronization.
    CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC = 225, "the provided PTX contains unsupported call to cudaDeviceSynchronize";
    /// A contained error.
    CUDA_ERROR_CONTAINED = 226, "an exception occurred on the device that is now contained";
    /// Invalid source.
    CUDA_ERROR_INVALID_SOURCE = 300, "device kernel image is invalid";
    /// File not found.
    CUDA_ERROR_FILE_NOT_FOUND = 301, "file not found";
    /// Shared-object symbol not found.
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302, "shared object symbol not found";
    /// Shared-object init failed.
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303, "shared object initialization failed";
    /// An OS call failed.
    CUDA_ERROR_OPERATING_SYSTEM = 304, "OS call failed or operation not supported on this OS";
    /// A handle is not valid.
    CUDA_ERROR_INVALID_HANDLE = 400, "invalid resource handle";
    /// Illegal state.
    CUDA_ERROR_ILLEGAL_STATE = 401, "the operation cannot be performed in the present state";
    /// Lossy query.
    CUDA_ERROR_LOSSY_QUERY = 402, "attempted introspection would be semantically lossy";
    /// A named symbol was not found.
    CUDA_ERROR_NOT_FOUND = 500, "named symbol not found";
    /// Work is still pending.
    CUDA_ERROR_NOT_READY = 600, "device not ready";
    /// Illegal address.
    CUDA_ERROR_ILLEGAL_ADDRESS = 700, "an illegal memory access was encountered";
    /// Too many resources requested for launch.
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701, "too many resources requested for launch";
    /// Launch timeout.
    CUDA_ERROR_LAUNCH_TIMEOUT = 702, "the launch timed out and was terminated";
    /// Incompatible texturing.
    CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING = 703, "launch uses incompatible texturing mode";
    /// Peer access already enabled.
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704, "peer access is already enabled";
    /// Peer access not enabled.
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705, "peer access has not been enabled";
    /// Primary context already active.
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708, "cannot set while device is active in this process";
    /// Context destroyed.
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709, "context is destroyed";
    /// Device-side assert.
    CUDA_ERROR_ASSERT = 710, "device-side assert triggered";
    /// Too many peers.
    CUDA_ERROR_TOO_MANY_PEERS = 711, "peer mapping resources exhausted";
    /// Host memory already registered.
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712, "part or all of the requested memory range is already mapped";
    /// Host memory not registered.
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713, "pointer does not correspond to a registered memory region";
    /// Hardware stack error.
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714, "hardware stack error";
    /// Illegal instruction.
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715, "an illegal instruction was encountered";
    /// Misaligned address.
    CUDA_ERROR_MISALIGNED_ADDRESS = 716, "misaligned address";
    /// Invalid address space.
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717, "operation not supported on global/shared address space";
    /// Invalid program counter.
    CUDA_ERROR_INVALID_PC = 718, "invalid program counter";
    /// Launch failed.
    CUDA_ERROR_LAUNCH_FAILED = 719, "unspecified launch failure";
    /// Cooperative launch grid too large.
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720, "too many blocks in cooperative launch";
    /// Tensor memory leak.
    CUDA_ERROR_TENSOR_MEMORY_LEAK = 721, "tensor memory not completely freed";
    /// Not permitted.
    CUDA_ERROR_NOT_PERMITTED = 800, "operation not permitted";
    /// Not supported.
    CUDA_ERROR_NOT_SUPPORTED = 801, "operation not supported";
    /// System not ready.
    CUDA_ERROR_SYSTEM_NOT_READY = 802, "system not yet initialized";
    /// Driver/kernel-module mismatch.
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803, "system has unsupported display driver / cuda driver combination";
    /// Forward compatibility not supported on the device.
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804, "forward compatibility was attempted on non supported HW";
    /// MPS connection failed.
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805, "MPS client failed to connect to the MPS control daemon or the MPS server";
    /// MPS RPC failure.
    CUDA_ERROR_MPS_RPC_FAILURE = 806, "the remote procedural call between the MPS server and the MPS client failed";
    /// MPS server not ready.
    CUDA_ERROR_MPS_SERVER_NOT_READY = 807, "MPS server is not ready to accept new MPS client requests";
    /// MPS clients exhausted.
    CUDA_ERROR_MPS_MAX_CLIENTS_REACHED = 808, "the hardware resources required to create MPS client have been exhausted";
    /// MPS connections exhausted.
    CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED = 809, "the hardware resources required to support device connections have been exhausted";
    /// MPS client terminated.
    CUDA_ERROR_MPS_CLIENT_TERMINATED = 810, "the MPS client has been terminated by the server";
    /// CDP not supported.
    CUDA_ERROR_CDP_NOT_SUPPORTED = 811, "the module is using CUDA Dynamic Parallelism, but the current configuration does not support it";
    /// CDP version mismatch.
    CUDA_ERROR_CDP_VERSION_MISMATCH = 812, "CUDA Dynamic Parallelism is not supported by this version of the CUDA driver";
    /// Stream capture unsupported.
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, "operation not permitted when stream is capturing";
    /// Stream capture invalidated.
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, "operation failed due to a previous error during capture";
    /// Stream capture merge.
    CUDA_ERROR_STREAM_CAPTURE_MERGE = 902, "operation would result in a merge of separate capture sequences";
    /// Stream capture unmatched.
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903, "capture was not ended in the same stream as it began";
    /// Stream capture unjoined.
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904, "capturing stream has unjoined work";
    /// Stream capture isolation.
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905, "dependency created on uncaptured work in another stream";
    /// Stream capture implicit.
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906, "operation would make the legacy stream depend on a capturing blocking stream";
    /// Captured event.
    CUDA_ERROR_CAPTURED_EVENT = 907, "operation not permitted on an event last recorded in a capturing stream";
    /// Capture on the wrong thread.
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908, "attempt to terminate a thread-local capture sequence from another thread";
    /// Timeout.
    CUDA_ERROR_TIMEOUT = 909, "wait operation timed out";
    /// Graph update failed.
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    /// External device error.
    CUDA_ERROR_EXTERNAL_DEVICE = 911, "an async error has occured in external entity outside of CUDA";
    /// Invalid cluster size.
    CUDA_ERROR_INVALID_CLUSTER_SIZE = 912, "a kernel launch error has occurred due to cluster misconfiguration";
    /// Function not loaded.
    CUDA_ERROR_FUNCTION_NOT_LOADED = 913, "the function handle is not loaded when calling an API that requires a loaded function";
    /// Invalid resource type.
    CUDA_ERROR_INVALID_RESOURCE_TYPE = 914, "one or more resources passed in are not valid resource types for the operation";
    /// Invalid resource configuration.
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915, "one or more resources are insufficient or non-applicable for the operation";
    /// Key rotation.
    CUDA_ERROR_KEY_ROTATION = 916, "an error happened during the key rotation sequence";
    /// Unknown error; also what a panic inside the library turns into.
    CUDA_ERROR_UNKNOWN = 999, "unknown error";
}

// `CUdriverProcAddressQueryResult`.
/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const PROC_ADDRESS_SUCCESS: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

// `CUdriverProcAddress_flags`.
/// `CU_GET_PROC_ADDRESS_DEFAULT`.
pub const GET_PROC_ADDRESS_DEFAULT: c_ulonglong = 0;
/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM`.
pub const GET_PROC_ADDRESS_LEGACY_STREAM: c_ulonglong = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: c_ulonglong = 2;

/// `CU_STREAM_LEGACY`: the legacy default stream, as a handle value.
pub const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the per-thread default stream, as a handle value.
pub const STREAM_PER_THREAD: usize = 0x2;

// `CUmemAttach_flags`.
/// `CU_MEM_ATTACH_GLOBAL`.
pub const MEM_ATTACH_GLOBAL: c_uint = 0x1;
/// `CU_MEM_ATTACH_HOST`.
pub const MEM_ATTACH_HOST: c_uint = 0x2;

// `CUmemPool_attribute`.
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (cuuint64_t).
pub const MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (cuuint64_t).
pub const MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` (cuuint64_t).
pub const MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (cuuint64_t).
pub const MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` (cuuint64_t).
pub const MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;

// `CUlimit`.
/// `CU_LIMIT_STACK_SIZE`.
pub const LIMIT_STACK_SIZE: c_int = 0;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
pub const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
pub const LIMIT_MALLOC_HEAP_SIZE: c_int = 2;

// `CUmemAllocationHandleType`.
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 0x1;

// `CUmemAllocationType`.
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const MEM_ALLOCATION_TYPE_PINNED: c_int = 0x1;

// `CUmemLocationType`.
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const MEM_LOCATION_TYPE_DEVICE: c_int = 0x1;
/// `CU_MEM_LOCATION_TYPE_HOST`.
pub const MEM_LOCATION_TYPE_HOST: c_int = 0x2;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA`.
pub const MEM_LOCATION_TYPE_HOST_NUMA: c_int = 0x3;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT`.
pub const MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_int = 0x4;

// `CUmemAllocationGranularity_flags`.
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const MEM_ALLOC_GRANULARITY_RECOMMENDED: c_int = 1;

/// `CUDA_ARRAY3D_LAYERED`: `Depth` counts layers, which mip levels do not shrink.
pub const ARRAY3D_LAYERED: c_uint = 0x01;

/// `CU_DEVICE_ATTRIBUTE_MAX` of the 12.8 header: attributes at or past it
/// are `CUDA_ERROR_INVALID_VALUE`.
pub const DEVICE_ATTRIBUTE_MAX: c_int = 144;

/// `CUdevice_attribute` values this library answers with more than a 0.
#[allow(
    missing_docs,
    reason = "each is the cuda.h name without CU_DEVICE_ATTRIBUTE_"
)]
pub mod attribute {
    use std::ffi::c_int;
    pub const MAX_THREADS_PER_BLOCK: c_int = 1;
    pub const MAX_BLOCK_DIM_X: c_int = 2;
    pub const MAX_BLOCK_DIM_Y: c_int = 3;
    pub const MAX_BLOCK_DIM_Z: c_int = 4;
    pub const MAX_GRID_DIM_X: c_int = 5;
    pub const MAX_GRID_DIM_Y: c_int = 6;
    pub const MAX_GRID_DIM_Z: c_int = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 8;
    pub const TOTAL_CONSTANT_MEMORY: c_int = 9;
    pub const WARP_SIZE: c_int = 10;
    pub const MAX_PITCH: c_int = 11;
    pub const MAX_REGISTERS_PER_BLOCK: c_int = 12;
    pub const CLOCK_RATE: c_int = 13;
    pub const TEXTURE_ALIGNMENT: c_int = 14;
    pub const GPU_OVERLAP: c_int = 15;
    pub const MULTIPROCESSOR_COUNT: c_int = 16;
    pub const CAN_MAP_HOST_MEMORY: c_int = 19;
    pub const CONCURRENT_KERNELS: c_int = 31;
    pub const ECC_ENABLED: c_int = 32;
    pub const PCI_BUS_ID: c_int = 33;
    pub const PCI_DEVICE_ID: c_int = 34;
    pub const MEMORY_CLOCK_RATE: c_int = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: c_int = 37;
    pub const L2_CACHE_SIZE: c_int = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;
    pub const ASYNC_ENGINE_COUNT: c_int = 40;
    pub const UNIFIED_ADDRESSING: c_int = 41;
    pub const PCI_DOMAIN_ID: c_int = 50;
    pub const TEXTURE_PITCH_ALIGNMENT: c_int = 51;
    pub const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
    pub const COMPUTE_CAPABILITY_MINOR: c_int = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: c_int = 78;
    pub const GLOBAL_L1_CACHE_SUPPORTED: c_int = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: c_int = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: c_int = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: c_int = 82;
    pub const MANAGED_MEMORY: c_int = 83;
    pub const MULTI_GPU_BOARD_GROUP_ID: c_int = 85;
    pub const CONCURRENT_MANAGED_ACCESS: c_int = 89;
    pub const COMPUTE_PREEMPTION_SUPPORTED: c_int = 90;
    pub const COOPERATIVE_LAUNCH: c_int = 95;
    pub const COOPERATIVE_MULTI_DEVICE_LAUNCH: c_int = 96;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: c_int = 106;
    pub const MEMORY_POOLS_SUPPORTED: c_int = 115;
    pub const CLUSTER_LAUNCH: c_int = 120;
}

/// Opaque target of every handle type (`CUctx_st`, `CUstream_st`, …); never
/// dereferenced: handles are tagged integers (see `crate::handle`).
#[repr(C)]
pub struct Opaque {
    _private: [u8; 0],
}
/// `CUcontext`.
pub type CuContext = *mut Opaque;
/// `CUstream`.
pub type CuStream = *mut Opaque;
/// `CUmodule`.
pub type CuModule = *mut Opaque;
/// `CUfunction`.
pub type CuFunction = *mut Opaque;
/// `CUarray`.
pub type CuArray = *mut Opaque;
/// `CUmipmappedArray`.
pub type CuMipmappedArray = *mut Opaque;
/// `CUmemoryPool`.
pub type CuMemoryPool = *mut Opaque;
/// `CUgraph`.
pub type CuGraph = *mut Opaque;
/// `CUgraphNode`.
pub type CuGraphNode = *mut Opaque;
/// `CUgraphExec`.
pub type CuGraphExec = *mut Opaque;

/// `CUuuid`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuUuid {
    /// `bytes`.
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuMemLocation {
    /// `type` (`CUmemLocationType`).
    pub kind: c_int,
    /// `id`: device ordinal (or NUMA node).
    pub id: c_int,
}

/// The `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuMemAllocationFlags {
    /// `compressionType`.
    pub compression_type: c_uchar,
    /// `gpuDirectRDMACapable`.
    pub gpu_direct_rdma_capable: c_uchar,
    /// `usage`.
    pub usage: c_ushort,
    /// `reserved`.
    pub reserved: [c_uchar; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuMemAllocationProp {
    /// `type` (`CUmemAllocationType`).
    pub kind: c_int,
    /// `requestedHandleTypes`.
    pub requested_handle_types: c_int,
    /// `location`.
    pub location: CuMemLocation,
    /// `win32HandleMetaData`.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`.
    pub alloc_flags: CuMemAllocationFlags,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuMemAccessDesc {
    /// `location`.
    pub location: CuMemLocation,
    /// `flags` (`CUmemAccess_flags`).
    pub flags: c_int,
}

/// `CUmemPoolProps` (12.2+ layout; before 12.2 `maxSize` and `usage` were
/// part of `reserved`, which callers zero, so reading them there gives 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuMemPoolProps {
    /// `allocType`.
    pub alloc_type: c_int,
    /// `handleTypes`.
    pub handle_types: c_int,
    /// `location`.
    pub location: CuMemLocation,
    /// `win32SecurityAttributes`.
    pub win32_security_attributes: *mut c_void,
    /// `maxSize`: most bytes the pool may hold; 0 = no limit beyond the device.
    pub max_size: usize,
    /// `usage`.
    pub usage: c_ushort,
    /// `reserved`.
    pub reserved: [c_uchar; 54],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuArrayDescriptor {
    /// `Width`.
    pub width: usize,
    /// `Height`.
    pub height: usize,
    /// `Format` (`CUarray_format`).
    pub format: c_uint,
    /// `NumChannels`.
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuArray3dDescriptor {
    /// `Width`.
    pub width: usize,
    /// `Height`.
    pub height: usize,
    /// `Depth`.
    pub depth: usize,
    /// `Format` (`CUarray_format`).
    pub format: c_uint,
    /// `NumChannels`.
    pub num_channels: c_uint,
    /// `Flags`.
    pub flags: c_uint,
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuLaunchConfig {
    /// `gridDimX`.
    pub grid_dim_x: c_uint,
    /// `gridDimY`.
    pub grid_dim_y: c_uint,
    /// `gridDimZ`.
    pub grid_dim_z: c_uint,
    /// `blockDimX`.
    pub block_dim_x: c_uint,
    /// `blockDimY`.
    pub block_dim_y: c_uint,
    /// `blockDimZ`.
    pub block_dim_z: c_uint,
    /// `sharedMemBytes`.
    pub shared_mem_bytes: c_uint,
    /// `hStream`.
    pub stream: CuStream,
    /// `attrs` (`CUlaunchAttribute*`), ignored.
    pub attrs: *mut c_void,
    /// `numAttrs`.
    pub num_attrs: c_uint,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`; `CUDA_KERNEL_NODE_PARAMS` (v1) is its
/// first seven fields, up to and including `extra`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuKernelNodeParams {
    /// `func`.
    pub func: CuFunction,
    /// `gridDimX`.
    pub grid_dim_x: c_uint,
    /// `gridDimY`.
    pub grid_dim_y: c_uint,
    /// `gridDimZ`.
    pub grid_dim_z: c_uint,
    /// `blockDimX`.
    pub block_dim_x: c_uint,
    /// `blockDimY`.
    pub block_dim_y: c_uint,
    /// `blockDimZ`.
    pub block_dim_z: c_uint,
    /// `sharedMemBytes`.
    pub shared_mem_bytes: c_uint,
    /// `kernelParams`.
    pub kernel_params: *mut *mut c_void,
    /// `extra`.
    pub extra: *mut *mut c_void,
    /// `kern` (`CUkernel`, v2 only).
    pub kern: *mut c_void,
    /// `ctx` (`CUcontext`, v2 only).
    pub ctx: CuContext,
}

/// Size of `CUDA_KERNEL_NODE_PARAMS` (v1): the v2 struct up to `kern`.
pub const KERNEL_NODE_PARAMS_V1_SIZE: usize = std::mem::offset_of!(CuKernelNodeParams, kern);

/// The launch geometry both kernel-node structs start with.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuKernelNodeParamsV1 {
    /// `func`.
    pub func: CuFunction,
    /// `gridDimX`.
    pub grid_dim_x: c_uint,
    /// `gridDimY`.
    pub grid_dim_y: c_uint,
    /// `gridDimZ`.
    pub grid_dim_z: c_uint,
    /// `blockDimX`.
    pub block_dim_x: c_uint,
    /// `blockDimY`.
    pub block_dim_y: c_uint,
    /// `blockDimZ`.
    pub block_dim_z: c_uint,
    /// `sharedMemBytes`.
    pub shared_mem_bytes: c_uint,
    /// `kernelParams`.
    pub kernel_params: *mut *mut c_void,
    /// `extra`.
    pub extra: *mut *mut c_void,
}

/// Bytes per element of a `CUarray_format` with `channels` channels; `None`
/// for formats this library does not size (NV12, block-compressed) and for
/// a channel count other than 1, 2 or 4 where the format takes one.
pub fn array_element_bytes(format: c_uint, channels: c_uint) -> Option<u64> {
    let per_channel = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        // UNORM/SNORM_INT{8,16}X{1,2,4}: the channel count is in the format.
        0xc0 | 0xc6 => return Some(1),
        0xc1 | 0xc7 | 0xc3 | 0xc9 => return Some(2),
        0xc2 | 0xc8 | 0xc4 | 0xca => return Some(4),
        0xc5 | 0xcb => return Some(8),
        _ => return None,
    };
    matches!(channels, 1 | 2 | 4).then(|| per_channel * u64::from(channels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // Sizes and offsets as a C compiler lays out cuda.h's structs on x86-64
    // (checked against bindgen output of the CUDA 12.8 header).

    #[test]
    fn memory_structs_match_the_header_layout() {
        assert_eq!(size_of::<CuMemLocation>(), 8);
        assert_eq!(size_of::<CuMemAllocationProp>(), 32);
        assert_eq!(offset_of!(CuMemAllocationProp, location), 8);
        assert_eq!(offset_of!(CuMemAllocationProp, win32_handle_meta_data), 16);
        assert_eq!(offset_of!(CuMemAllocationProp, alloc_flags), 24);
        assert_eq!(size_of::<CuMemAccessDesc>(), 12);
        assert_eq!(size_of::<CuMemPoolProps>(), 88);
        assert_eq!(offset_of!(CuMemPoolProps, max_size), 24);
        assert_eq!(offset_of!(CuMemPoolProps, usage), 32);
        assert_eq!(size_of::<CuUuid>(), 16);
    }

    #[test]
    fn array_descriptors_match_the_header_layout() {
        assert_eq!(size_of::<CuArrayDescriptor>(), 24);
        assert_eq!(offset_of!(CuArrayDescriptor, format), 16);
        assert_eq!(size_of::<CuArray3dDescriptor>(), 40);
        assert_eq!(offset_of!(CuArray3dDescriptor, format), 24);
        assert_eq!(offset_of!(CuArray3dDescriptor, flags), 32);
    }

    #[test]
    fn launch_structs_match_the_header_layout() {
        assert_eq!(size_of::<CuLaunchConfig>(), 56);
        assert_eq!(offset_of!(CuLaunchConfig, shared_mem_bytes), 24);
        assert_eq!(offset_of!(CuLaunchConfig, stream), 32);
        assert_eq!(offset_of!(CuLaunchConfig, attrs), 40);
        assert_eq!(offset_of!(CuLaunchConfig, num_attrs), 48);
        assert_eq!(size_of::<CuKernelNodeParams>(), 72);
        assert_eq!(offset_of!(CuKernelNodeParams, kernel_params), 40);
        assert_eq!(offset_of!(CuKernelNodeParams, ctx), 64);
        assert_eq!(KERNEL_NODE_PARAMS_V1_SIZE, 56);
        assert_eq!(size_of::<CuKernelNodeParamsV1>(), 56);
    }

    #[test]
    fn result_names_and_strings_cover_the_codes() {
        assert_eq!(
            error_name(CUDA_ERROR_OUT_OF_MEMORY),
            Some(c"CUDA_ERROR_OUT_OF_MEMORY")
        );
        assert_eq!(error_name(CUDA_SUCCESS), Some(c"CUDA_SUCCESS"));
        assert_eq!(
            error_string(CUDA_ERROR_INVALID_VALUE),
            Some(c"invalid argument")
        );
        assert_eq!(error_name(12345), None);
        for code in [0, 1, 2, 3, 100, 101, 201, 400, 500, 801, 999] {
            assert!(error_name(code).is_some(), "{code}");
            assert!(error_string(code).is_some(), "{code}");
        }
    }

    #[test]
    fn array_formats_size_their_elements() {
        assert_eq!(array_element_bytes(0x20, 4), Some(16));
        assert_eq!(array_element_bytes(0x01, 1), Some(1));
        assert_eq!(array_element_bytes(0x10, 2), Some(4));
        assert_eq!(array_element_bytes(0x20, 3), None);
        assert_eq!(array_element_bytes(0xc5, 1), Some(8));
        assert_eq!(array_element_bytes(0xb0, 1), None);
    }
}
