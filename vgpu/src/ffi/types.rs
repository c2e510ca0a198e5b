//! The C types and constants of the driver and NVML calls the library
//! intercepts (`cuda.h`, `nvml.h`), and the two integer widths of the
//! driver's ABIs.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::ptr::null_mut;

use crate::arrays::ArrayShape;

/// `CUresult`.
pub type CUresult = c_int;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr` (`_v2` ABI).
pub type CUdeviceptr = c_ulonglong;
/// Any opaque driver handle (`CUstream`, `CUarray`, `CUfunction`, …).
pub type Handle = *mut c_void;
/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;

pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
pub const CU_DEVICE_CPU: CUdevice = -1;
/// `CU_GET_PROC_ADDRESS_SUCCESS` (`CUdriverProcAddressQueryResult`).
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
pub const CU_STREAM_LEGACY: usize = 1;
pub const CU_STREAM_PER_THREAD: usize = 2;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;

pub const RTLD_DEFAULT: *mut c_void = null_mut();
pub const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CuMemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp` (only `location` is read).
#[repr(C)]
pub struct CuMemAllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    pub location: CuMemLocation,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

/// `CUmemPoolProps` (88 bytes; only the location is read).
#[repr(C)]
pub struct CuMemPoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    pub location: CuMemLocation,
    rest: [u8; 72],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    num_channels: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1`.
#[repr(C)]
pub struct ArrayDescriptorV1 {
    width: c_uint,
    height: c_uint,
    format: c_uint,
    num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    num_channels: c_uint,
    flags: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
pub struct Array3dDescriptorV1 {
    width: c_uint,
    height: c_uint,
    depth: c_uint,
    format: c_uint,
    num_channels: c_uint,
    flags: c_uint,
}

/// `CUlaunchConfig` (only the grid is read).
#[repr(C)]
pub struct LaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    block_dim_x: c_uint,
    block_dim_y: c_uint,
    block_dim_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// A size or device pointer of one of the driver's two ABIs: `c_uint`
/// before CUDA 3.2, 64 bits (`usize`, `CUdeviceptr`) in the `_v2` entry
/// points. The bodies of the twins (`cuMemAlloc` / `cuMemAlloc_v2`, …) are
/// generic over it.
pub trait AbiInt: Copy {
    /// The value, widened to 64 bits.
    fn widen(self) -> u64;
    /// `value` in this width, saturating at its maximum.
    fn saturate(value: u64) -> Self;
}

/// [`AbiInt`] for each unsigned width: widening is lossless, narrowing
/// saturates.
macro_rules! abi_int {
    ($($int:ty),+) => {$(
        impl AbiInt for $int {
            #[inline]
            fn widen(self) -> u64 {
                self as u64
            }

            #[inline]
            fn saturate(value: u64) -> $int {
                <$int>::try_from(value).unwrap_or(<$int>::MAX)
            }
        }
    )+};
}

abi_int!(c_uint, usize, u64);

/// An array descriptor of either ABI, 2D or 3D: the shape it asks for.
pub trait ArrayDescriptorAbi {
    /// The array's shape (a 2D array has depth 0 and no flags).
    fn shape(&self) -> ArrayShape;
}

/// [`ArrayDescriptorAbi`] for descriptors of both ABIs: `|d| (depth,
/// flags)` reads what a 3D descriptor adds (a 2D one: `(0, 0)`).
macro_rules! array_descriptor_abi {
    ($($desc:ty => |$d:ident| ($depth:expr, $flags:expr)),+ $(,)?) => {$(
        impl ArrayDescriptorAbi for $desc {
            fn shape(&self) -> ArrayShape {
                let $d = self;
                ArrayShape {
                    width: $d.width.widen(),
                    height: $d.height.widen(),
                    depth: $depth,
                    format: $d.format,
                    channels: $d.num_channels,
                    flags: $flags,
                }
            }
        }
    )+};
}

array_descriptor_abi! {
    ArrayDescriptor => |d| (0, 0),
    ArrayDescriptorV1 => |d| (0, 0),
    Array3dDescriptor => |d| (d.depth.widen(), d.flags),
    Array3dDescriptorV1 => |d| (d.depth.widen(), d.flags),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_layouts_match_the_c_headers() {
        assert_eq!(size_of::<CuMemAllocationProp>(), 32);
        assert_eq!(offset_of!(CuMemAllocationProp, location), 8);
        assert_eq!(size_of::<CuMemPoolProps>(), 88, "CUmemPoolProps");
        assert_eq!(size_of::<ArrayDescriptor>(), 24);
        assert_eq!(size_of::<Array3dDescriptor>(), 40);
        assert_eq!(size_of::<ArrayDescriptorV1>(), 16);
        assert_eq!(size_of::<Array3dDescriptorV1>(), 24);
        assert_eq!(offset_of!(LaunchConfig, stream), 32);
        assert_eq!(size_of::<LaunchConfig>(), 56);
        assert_eq!(size_of::<NvmlMemory>(), 24);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(size_of::<NvmlProcessUtilizationSample>(), 32);
        assert_eq!(size_of::<NvmlProcessInfo>(), 24, "nvmlProcessInfo_t");
    }

    #[test]
    fn both_abis_widen_and_saturate_alike() {
        assert_eq!(c_uint::saturate(1 << 40), c_uint::MAX);
        assert_eq!(c_uint::saturate(7), 7);
        assert_eq!(usize::saturate(1 << 40), 1 << 40);
        assert_eq!(AbiInt::widen(c_uint::MAX), u64::from(u32::MAX));
        // The same 4 × 3 × 2 array in either ABI's descriptor.
        macro_rules! shape {
            ($desc:ident) => {
                $desc {
                    width: 4,
                    height: 3,
                    depth: 2,
                    format: 0x20,
                    num_channels: 1,
                    flags: 0,
                }
                .shape()
            };
        }
        let (v1, v2) = (shape!(Array3dDescriptorV1), shape!(Array3dDescriptor));
        assert_eq!(v1.bytes(), v2.bytes());
    }
}
