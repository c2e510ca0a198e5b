//! The slice of NVML's C ABI this library implements: return codes, constants,
//! opaque handle types and the `#[repr(C)]` structs, written from `nvml.h`
//! (API version 13) and checked against the `nvml-wrapper-sys` 0.10 bindings
//! by the size and offset tests below. Field order and C types are what
//! matter; field names are ours (snake case, the C name in each doc line).

use std::ffi::{c_char, c_uint, c_ulonglong};
use std::mem::size_of;

/// `nvmlReturn_t`: a C enum, passed as `unsigned int`.
pub type NvmlReturn = c_uint;

/// `NVML_SUCCESS`.
pub const SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_UNINITIALIZED`.
pub const ERROR_UNINITIALIZED: NvmlReturn = 1;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const ERROR_NOT_SUPPORTED: NvmlReturn = 3;
/// `NVML_ERROR_NO_PERMISSION`.
pub const ERROR_NO_PERMISSION: NvmlReturn = 4;
/// `NVML_ERROR_ALREADY_INITIALIZED` (deprecated, never returned).
pub const ERROR_ALREADY_INITIALIZED: NvmlReturn = 5;
/// `NVML_ERROR_NOT_FOUND`.
pub const ERROR_NOT_FOUND: NvmlReturn = 6;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `NVML_ERROR_INSUFFICIENT_POWER`.
pub const ERROR_INSUFFICIENT_POWER: NvmlReturn = 8;
/// `NVML_ERROR_DRIVER_NOT_LOADED`.
pub const ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
/// `NVML_ERROR_TIMEOUT`.
pub const ERROR_TIMEOUT: NvmlReturn = 10;
/// `NVML_ERROR_IRQ_ISSUE`.
pub const ERROR_IRQ_ISSUE: NvmlReturn = 11;
/// `NVML_ERROR_LIBRARY_NOT_FOUND`.
pub const ERROR_LIBRARY_NOT_FOUND: NvmlReturn = 12;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
/// `NVML_ERROR_CORRUPTED_INFOROM`.
pub const ERROR_CORRUPTED_INFOROM: NvmlReturn = 14;
/// `NVML_ERROR_GPU_IS_LOST`.
pub const ERROR_GPU_IS_LOST: NvmlReturn = 15;
/// `NVML_ERROR_RESET_REQUIRED`.
pub const ERROR_RESET_REQUIRED: NvmlReturn = 16;
/// `NVML_ERROR_OPERATING_SYSTEM`.
pub const ERROR_OPERATING_SYSTEM: NvmlReturn = 17;
/// `NVML_ERROR_LIB_RM_VERSION_MISMATCH`.
pub const ERROR_LIB_RM_VERSION_MISMATCH: NvmlReturn = 18;
/// `NVML_ERROR_IN_USE`.
pub const ERROR_IN_USE: NvmlReturn = 19;
/// `NVML_ERROR_MEMORY`.
pub const ERROR_MEMORY: NvmlReturn = 20;
/// `NVML_ERROR_NO_DATA`.
pub const ERROR_NO_DATA: NvmlReturn = 21;
/// `NVML_ERROR_VGPU_ECC_NOT_SUPPORTED`.
pub const ERROR_VGPU_ECC_NOT_SUPPORTED: NvmlReturn = 22;
/// `NVML_ERROR_INSUFFICIENT_RESOURCES`.
pub const ERROR_INSUFFICIENT_RESOURCES: NvmlReturn = 23;
/// `NVML_ERROR_FREQ_NOT_SUPPORTED`.
pub const ERROR_FREQ_NOT_SUPPORTED: NvmlReturn = 24;
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: a versioned struct's `version` is not one we know.
pub const ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
/// `NVML_ERROR_DEPRECATED`.
pub const ERROR_DEPRECATED: NvmlReturn = 26;
/// `NVML_ERROR_NOT_READY`.
pub const ERROR_NOT_READY: NvmlReturn = 27;
/// `NVML_ERROR_GPU_NOT_FOUND`.
pub const ERROR_GPU_NOT_FOUND: NvmlReturn = 28;
/// `NVML_ERROR_INVALID_STATE`.
pub const ERROR_INVALID_STATE: NvmlReturn = 29;
/// `NVML_ERROR_RESET_TYPE_NOT_SUPPORTED`.
pub const ERROR_RESET_TYPE_NOT_SUPPORTED: NvmlReturn = 30;
/// `NVML_ERROR_UNKNOWN`: also what a panic inside the library turns into.
pub const ERROR_UNKNOWN: NvmlReturn = 999;

/// `NVML_DEVICE_MIG_DISABLE`.
pub const DEVICE_MIG_DISABLE: c_uint = 0;
/// `NVML_DEVICE_MIG_ENABLE`.
pub const DEVICE_MIG_ENABLE: c_uint = 1;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of the current header (0x12: the last
/// enum is `3_SLICE_GFX` = 0x11). Enum indexes at or past it are
/// `INVALID_ARGUMENT`, which is how callers find the end of the enumeration.
pub const GPU_INSTANCE_PROFILE_COUNT: c_uint = 0x12;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of the current header (9: the last
/// enum is `7_SLICE_NVL` = 8).
pub const COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = 9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
pub const COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint = 0;
/// `NVML_GPU_INSTANCE_PROFILE_CAPS_GFX`.
pub const GPU_INSTANCE_PROFILE_CAPS_GFX: c_uint = 2;
/// `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_GFX`.
pub const COMPUTE_INSTANCE_PROFILE_CAPS_GFX: c_uint = 1;

/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`: room for any name we return.
pub const DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
pub const DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
/// Size of the `name` arrays in the versioned profile-info structs.
pub const PROFILE_NAME_SIZE: usize = 96;

/// Opaque target of `nvmlDevice_t` (never dereferenced: handles are tagged integers).
#[repr(C)]
pub struct NvmlDeviceSt {
    _opaque: [u8; 0],
}
/// `nvmlDevice_t`.
pub type NvmlDevice = *mut NvmlDeviceSt;

/// Opaque target of `nvmlGpuInstance_t`.
#[repr(C)]
pub struct NvmlGpuInstanceSt {
    _opaque: [u8; 0],
}
/// `nvmlGpuInstance_t`.
pub type NvmlGpuInstance = *mut NvmlGpuInstanceSt;

/// Opaque target of `nvmlComputeInstance_t`.
#[repr(C)]
pub struct NvmlComputeInstanceSt {
    _opaque: [u8; 0],
}
/// `nvmlComputeInstance_t`.
pub type NvmlComputeInstance = *mut NvmlComputeInstanceSt;

/// Opaque target of `nvmlEventSet_t`.
#[repr(C)]
pub struct NvmlEventSetSt {
    _opaque: [u8; 0],
}
/// `nvmlEventSet_t`.
pub type NvmlEventSet = *mut NvmlEventSetSt;

/// `nvmlEventTypeXidCriticalError`: the only event type the simulated node raises.
pub const EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 0x8;

/// `nvmlEventData_t` (the `_v2` wait's struct, with the MIG ids).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlEventData {
    /// `device`: the physical GPU the event happened on.
    pub device: NvmlDevice,
    /// `eventType`: one `nvmlEventType*` bit.
    pub event_type: c_ulonglong,
    /// `eventData`: the XID for `nvmlEventTypeXidCriticalError`.
    pub event_data: c_ulonglong,
    /// `gpuInstanceId`: the GI an XID is attributed to, or [`VALUE_NOT_AVAILABLE_UINT`].
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId`: the CI an XID is attributed to, or [`VALUE_NOT_AVAILABLE_UINT`].
    pub compute_instance_id: c_uint,
}

/// The `nvmlEventData_t` of NVML before MIG (what the unversioned
/// `nvmlEventSetWait` fills): no instance ids.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlEventDataV1 {
    /// `device`.
    pub device: NvmlDevice,
    /// `eventType`.
    pub event_type: c_ulonglong,
    /// `eventData`.
    pub event_data: c_ulonglong,
}

/// `NVML_STRUCT_VERSION(data, ver)`: `sizeof(struct) | ver << 24`.
pub const fn struct_version(size: usize, version: u32) -> c_uint {
    (size as c_uint) | (version << 24)
}

/// `nvmlMemory_t`, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlMemory {
    /// `total`.
    pub total: c_ulonglong,
    /// `free`.
    pub free: c_ulonglong,
    /// `used`.
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlMemoryV2 {
    /// `version`: [`MEMORY_V2`].
    pub version: c_uint,
    /// `total`.
    pub total: c_ulonglong,
    /// `reserved`.
    pub reserved: c_ulonglong,
    /// `free`.
    pub free: c_ulonglong,
    /// `used` (includes `reserved`).
    pub used: c_ulonglong,
}
/// `nvmlMemory_v2`.
pub const MEMORY_V2: c_uint = struct_version(size_of::<NvmlMemoryV2>(), 2);

/// `nvmlGpuInstancePlacement_t` (and `nvmlComputeInstancePlacement_t`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlPlacement {
    /// `start`: first memory slice (compute slice for a CI).
    pub start: c_uint,
    /// `size`: slices.
    pub size: c_uint,
}

/// Declares a `#[repr(C)]` version of `nvmlGpuInstanceProfileInfo*_t`: the
/// given leading fields, then the engine counts and memory size every version
/// carries in the same order, then the given trailing fields.
macro_rules! gpu_instance_profile_info {
    ($(#[$meta:meta])* $name:ident { $($head:tt)* } { $($tail:tt)* }) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            $($head)*
            /// `multiprocessorCount`.
            pub multiprocessor_count: c_uint,
            /// `copyEngineCount`.
            pub copy_engine_count: c_uint,
            /// `decoderCount`.
            pub decoder_count: c_uint,
            /// `encoderCount`.
            pub encoder_count: c_uint,
            /// `jpegCount`.
            pub jpeg_count: c_uint,
            /// `ofaCount`.
            pub ofa_count: c_uint,
            /// `memorySizeMB` (MiB).
            pub memory_size_mb: c_ulonglong,
            $($tail)*
        }
    };
}

gpu_instance_profile_info! {
    /// `nvmlGpuInstanceProfileInfo_t` (unversioned, v1).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    NvmlGpuInstanceProfileInfo {
        /// `id`: the device profile id.
        pub id: c_uint,
        /// `isP2pSupported`.
        pub is_p2p_supported: c_uint,
        /// `sliceCount`: compute slices.
        pub slice_count: c_uint,
        /// `instanceCount`: most instances of the profile.
        pub instance_count: c_uint,
    } {}
}

gpu_instance_profile_info! {
    /// `nvmlGpuInstanceProfileInfo_v2_t`.
    #[derive(Debug, Clone, Copy)]
    NvmlGpuInstanceProfileInfoV2 {
        /// `version`: [`GPU_INSTANCE_PROFILE_INFO_V2`].
        pub version: c_uint,
        /// `id`.
        pub id: c_uint,
        /// `isP2pSupported`.
        pub is_p2p_supported: c_uint,
        /// `sliceCount`.
        pub slice_count: c_uint,
        /// `instanceCount`.
        pub instance_count: c_uint,
    } {
        /// `name`, e.g. `MIG 1g.10gb`.
        pub name: [c_char; PROFILE_NAME_SIZE],
    }
}
/// `nvmlGpuInstanceProfileInfo_v2`.
pub const GPU_INSTANCE_PROFILE_INFO_V2: c_uint =
    struct_version(size_of::<NvmlGpuInstanceProfileInfoV2>(), 2);

gpu_instance_profile_info! {
    /// `nvmlGpuInstanceProfileInfo_v3_t`: no `isP2pSupported`, a `capabilities` word at the end.
    #[derive(Debug, Clone, Copy)]
    NvmlGpuInstanceProfileInfoV3 {
        /// `version`: [`GPU_INSTANCE_PROFILE_INFO_V3`].
        pub version: c_uint,
        /// `id`.
        pub id: c_uint,
        /// `sliceCount`.
        pub slice_count: c_uint,
        /// `instanceCount`.
        pub instance_count: c_uint,
    } {
        /// `name`.
        pub name: [c_char; PROFILE_NAME_SIZE],
        /// `capabilities`: `NVML_GPU_INSTANCE_PROFILE_CAPS_*` bits.
        pub capabilities: c_uint,
    }
}
/// `nvmlGpuInstanceProfileInfo_v3`.
pub const GPU_INSTANCE_PROFILE_INFO_V3: c_uint =
    struct_version(size_of::<NvmlGpuInstanceProfileInfoV3>(), 3);

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlGpuInstanceInfo {
    /// `device`: the parent GPU.
    pub device: NvmlDevice,
    /// `id`: driver-assigned GI id.
    pub id: c_uint,
    /// `profileId`: device profile id.
    pub profile_id: c_uint,
    /// `placement`.
    pub placement: NvmlPlacement,
}

/// Declares a `#[repr(C)]` version of `nvmlComputeInstanceProfileInfo*_t`:
/// the given leading fields, then the id, slice and shared engine counts every
/// version carries in the same order, then the given trailing fields.
macro_rules! compute_instance_profile_info {
    ($(#[$meta:meta])* $name:ident { $($head:tt)* } { $($tail:tt)* }) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            $($head)*
            /// `id`.
            pub id: c_uint,
            /// `sliceCount`.
            pub slice_count: c_uint,
            /// `instanceCount`.
            pub instance_count: c_uint,
            /// `multiprocessorCount`.
            pub multiprocessor_count: c_uint,
            /// `sharedCopyEngineCount`.
            pub shared_copy_engine_count: c_uint,
            /// `sharedDecoderCount`.
            pub shared_decoder_count: c_uint,
            /// `sharedEncoderCount`.
            pub shared_encoder_count: c_uint,
            /// `sharedJpegCount`.
            pub shared_jpeg_count: c_uint,
            /// `sharedOfaCount`.
            pub shared_ofa_count: c_uint,
            $($tail)*
        }
    };
}

compute_instance_profile_info! {
    /// `nvmlComputeInstanceProfileInfo_t` (unversioned, v1).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    NvmlComputeInstanceProfileInfo {} {}
}

compute_instance_profile_info! {
    /// `nvmlComputeInstanceProfileInfo_v2_t`.
    #[derive(Debug, Clone, Copy)]
    NvmlComputeInstanceProfileInfoV2 {
        /// `version`: [`COMPUTE_INSTANCE_PROFILE_INFO_V2`].
        pub version: c_uint,
    } {
        /// `name`.
        pub name: [c_char; PROFILE_NAME_SIZE],
    }
}
/// `nvmlComputeInstanceProfileInfo_v2`.
pub const COMPUTE_INSTANCE_PROFILE_INFO_V2: c_uint =
    struct_version(size_of::<NvmlComputeInstanceProfileInfoV2>(), 2);

compute_instance_profile_info! {
    /// `nvmlComputeInstanceProfileInfo_v3_t`: v2 plus a `capabilities` word.
    #[derive(Debug, Clone, Copy)]
    NvmlComputeInstanceProfileInfoV3 {
        /// `version`: [`COMPUTE_INSTANCE_PROFILE_INFO_V3`].
        pub version: c_uint,
    } {
        /// `name`.
        pub name: [c_char; PROFILE_NAME_SIZE],
        /// `capabilities`: `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_*` bits.
        pub capabilities: c_uint,
    }
}
/// `nvmlComputeInstanceProfileInfo_v3`.
pub const COMPUTE_INSTANCE_PROFILE_INFO_V3: c_uint =
    struct_version(size_of::<NvmlComputeInstanceProfileInfoV3>(), 3);

/// `nvmlComputeInstanceInfo_t` (used by both `nvmlComputeInstanceGetInfo` and `_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlComputeInstanceInfo {
    /// `device`: the parent GPU.
    pub device: NvmlDevice,
    /// `gpuInstance`: the parent GI.
    pub gpu_instance: NvmlGpuInstance,
    /// `id`: CI id within its GI.
    pub id: c_uint,
    /// `profileId`: CI profile id.
    pub profile_id: c_uint,
    /// `placement`: on the GI's compute-slice axis.
    pub placement: NvmlPlacement,
}

/// `NVML_VALUE_NOT_AVAILABLE` as `unsigned int` (`gpuInstanceId` and
/// `computeInstanceId` of a process not on a MIG device).
pub const VALUE_NOT_AVAILABLE_UINT: c_uint = c_uint::MAX;

/// `nvmlUtilization_t`, percent over the last sample period.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlUtilization {
    /// `gpu`: time one or more kernels ran.
    pub gpu: c_uint,
    /// `memory`: time device memory was read or written.
    pub memory: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlProcessUtilizationSample {
    /// `pid`.
    pub pid: c_uint,
    /// `timeStamp`: CPU timestamp in µs since the epoch.
    pub time_stamp: c_ulonglong,
    /// `smUtil`: percent.
    pub sm_util: c_uint,
    /// `memUtil`: percent.
    pub mem_util: c_uint,
    /// `encUtil`: percent.
    pub enc_util: c_uint,
    /// `decUtil`: percent.
    pub dec_util: c_uint,
}

/// `nvmlProcessInfo_t` (the v2/v3 layout `…GetComputeRunningProcesses_v3` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlProcessInfo {
    /// `pid`.
    pub pid: c_uint,
    /// `usedGpuMemory`, bytes.
    pub used_gpu_memory: c_ulonglong,
    /// `gpuInstanceId`, or [`VALUE_NOT_AVAILABLE_UINT`].
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId`, or [`VALUE_NOT_AVAILABLE_UINT`].
    pub compute_instance_id: c_uint,
}

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`: the `busId` of [`NvmlPciInfo`].
pub const PCI_BUS_ID_BUFFER_V2_SIZE: usize = 32;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`: `busIdLegacy`, and the v1 `busId`.
pub const PCI_BUS_ID_BUFFER_SIZE: usize = 16;

/// `nvmlPciInfo_t` (what `nvmlDeviceGetPciInfo_v3` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlPciInfo {
    /// `busIdLegacy`: `0000:07:00.0`.
    pub bus_id_legacy: [c_char; PCI_BUS_ID_BUFFER_SIZE],
    /// `domain`.
    pub domain: c_uint,
    /// `bus`.
    pub bus: c_uint,
    /// `device`.
    pub device: c_uint,
    /// `pciDeviceId`: device id in the upper 16 bits, vendor id in the lower.
    pub pci_device_id: c_uint,
    /// `pciSubSystemId`.
    pub pci_sub_system_id: c_uint,
    /// `busId`: `00000000:07:00.0`.
    pub bus_id: [c_char; PCI_BUS_ID_BUFFER_V2_SIZE],
}

/// The `nvmlPciInfo_t` of `nvmlDeviceGetPciInfo` and `_v2` (before the
/// 32-byte `busId`): `busId[16]`, the ids, four reserved words.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlPciInfoV1 {
    /// `busId`: `0000:07:00.0`.
    pub bus_id: [c_char; PCI_BUS_ID_BUFFER_SIZE],
    /// `domain`.
    pub domain: c_uint,
    /// `bus`.
    pub bus: c_uint,
    /// `device`.
    pub device: c_uint,
    /// `pciDeviceId`.
    pub pci_device_id: c_uint,
    /// `pciSubSystemId`.
    pub pci_sub_system_id: c_uint,
    /// `reserved0..3`.
    pub reserved: [c_uint; 4],
}

/// `nvmlPciInfoExt_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlPciInfoExt {
    /// `version`: [`PCI_INFO_EXT_V1`].
    pub version: c_uint,
    /// `domain`.
    pub domain: c_uint,
    /// `bus`.
    pub bus: c_uint,
    /// `device`.
    pub device: c_uint,
    /// `pciDeviceId`.
    pub pci_device_id: c_uint,
    /// `pciSubSystemId`.
    pub pci_sub_system_id: c_uint,
    /// `baseClass`: 3, display controller.
    pub base_class: c_uint,
    /// `subClass`: 2, 3D controller.
    pub sub_class: c_uint,
    /// `busId`.
    pub bus_id: [c_char; PCI_BUS_ID_BUFFER_V2_SIZE],
}
/// `nvmlPciInfoExt_v1`.
pub const PCI_INFO_EXT_V1: c_uint = struct_version(size_of::<NvmlPciInfoExt>(), 1);

/// `nvmlDeviceAttributes_t` (MIG device handles only).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlDeviceAttributes {
    /// `multiprocessorCount`.
    pub multiprocessor_count: c_uint,
    /// `sharedCopyEngineCount`.
    pub shared_copy_engine_count: c_uint,
    /// `sharedDecoderCount`.
    pub shared_decoder_count: c_uint,
    /// `sharedEncoderCount`.
    pub shared_encoder_count: c_uint,
    /// `sharedJpegCount`.
    pub shared_jpeg_count: c_uint,
    /// `sharedOfaCount`.
    pub shared_ofa_count: c_uint,
    /// `gpuInstanceSliceCount`.
    pub gpu_instance_slice_count: c_uint,
    /// `computeInstanceSliceCount`.
    pub compute_instance_slice_count: c_uint,
    /// `memorySizeMB`.
    pub memory_size_mb: c_ulonglong,
}

/// `nvmlBAR1Memory_t`, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlBar1Memory {
    /// `bar1Total`.
    pub total: c_ulonglong,
    /// `bar1Free`.
    pub free: c_ulonglong,
    /// `bar1Used`.
    pub used: c_ulonglong,
}

/// `nvmlViolationTime_t`, in nanoseconds.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlViolationTime {
    /// `referenceTime`.
    pub reference_time: c_ulonglong,
    /// `violationTime`.
    pub violation_time: c_ulonglong,
}

/// `nvmlFieldValue_t`; the value union is kept as its 8 raw bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlFieldValue {
    /// `fieldId`.
    pub field_id: c_uint,
    /// `scopeId`.
    pub scope_id: c_uint,
    /// `timestamp` (µs since the epoch).
    pub timestamp: i64,
    /// `latencyUsec`.
    pub latency_usec: i64,
    /// `valueType`.
    pub value_type: c_uint,
    /// `nvmlReturn`: this field's own result.
    pub nvml_return: NvmlReturn,
    /// `value`.
    pub value: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of};

    // Sizes and offsets as the C compiler lays out the structs of nvml.h
    // (x86-64 SysV), cross-checked against nvml-wrapper-sys 0.10's bindgen output.

    /// Asserts that our struct has bindgen's size and, for each named pair,
    /// the same field offset.
    macro_rules! same_layout {
        ($ours:ty = $theirs:ty { $($field:ident = $their_field:ident),* $(,)? }) => {
            assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), stringify!($ours));
            $(
                assert_eq!(
                    offset_of!($ours, $field),
                    offset_of!($theirs, $their_field),
                    concat!(stringify!($ours), ".", stringify!($field))
                );
            )*
        };
    }

    #[test]
    fn device_info_structs_match_the_header_layout() {
        use nvml_wrapper_sys::bindings as b;
        same_layout!(NvmlPciInfo = b::nvmlPciInfo_t {
            bus_id = busId,
            pci_sub_system_id = pciSubSystemId,
        });
        assert_eq!(size_of::<NvmlPciInfoV1>(), 52);
        same_layout!(NvmlPciInfoExt = b::nvmlPciInfoExt_t { bus_id = busId });
        same_layout!(NvmlDeviceAttributes = b::nvmlDeviceAttributes_t {
            memory_size_mb = memorySizeMB,
        });
        same_layout!(NvmlBar1Memory = b::nvmlBAR1Memory_t {});
        same_layout!(NvmlViolationTime = b::nvmlViolationTime_t {});
        same_layout!(NvmlFieldValue = b::nvmlFieldValue_t {
            nvml_return = nvmlReturn,
            value = value,
        });
    }

    #[test]
    fn memory_structs_match_the_header_layout() {
        assert_eq!(size_of::<NvmlMemory>(), 24);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(offset_of!(NvmlMemoryV2, total), 8);
        assert_eq!(offset_of!(NvmlMemoryV2, used), 32);
        assert_eq!(MEMORY_V2, 40 | (2 << 24));
    }

    #[test]
    fn gpu_instance_structs_match_the_header_layout() {
        assert_eq!(size_of::<NvmlPlacement>(), 8);
        assert_eq!(size_of::<NvmlGpuInstanceProfileInfo>(), 48);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfo, memory_size_mb), 40);
        assert_eq!(
            offset_of!(NvmlGpuInstanceProfileInfoV2, is_p2p_supported),
            8
        );
        assert_eq!(
            offset_of!(NvmlGpuInstanceProfileInfoV2, multiprocessor_count),
            20
        );
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV3, slice_count), 8);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV3, ofa_count), 36);
        assert_eq!(size_of::<NvmlGpuInstanceProfileInfoV2>(), 152);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV2, memory_size_mb), 48);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV2, name), 56);
        assert_eq!(size_of::<NvmlGpuInstanceProfileInfoV3>(), 152);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV3, memory_size_mb), 40);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV3, name), 48);
        assert_eq!(offset_of!(NvmlGpuInstanceProfileInfoV3, capabilities), 144);
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V2, 152 | (2 << 24));
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V3, 152 | (3 << 24));
        assert_eq!(size_of::<NvmlGpuInstanceInfo>(), 24);
        assert_eq!(offset_of!(NvmlGpuInstanceInfo, placement), 16);
        assert_eq!(align_of::<NvmlGpuInstanceInfo>(), 8);
    }

    #[test]
    fn process_structs_match_the_header_layout() {
        assert_eq!(size_of::<NvmlUtilization>(), 8);
        assert_eq!(size_of::<NvmlProcessUtilizationSample>(), 32);
        assert_eq!(offset_of!(NvmlProcessUtilizationSample, time_stamp), 8);
        assert_eq!(offset_of!(NvmlProcessUtilizationSample, sm_util), 16);
        assert_eq!(offset_of!(NvmlProcessUtilizationSample, dec_util), 28);
        assert_eq!(size_of::<NvmlProcessInfo>(), 24);
        assert_eq!(offset_of!(NvmlProcessInfo, used_gpu_memory), 8);
        assert_eq!(offset_of!(NvmlProcessInfo, gpu_instance_id), 16);
        assert_eq!(offset_of!(NvmlProcessInfo, compute_instance_id), 20);
    }

    #[test]
    fn event_structs_match_the_header_layout() {
        assert_eq!(size_of::<NvmlEventData>(), 32);
        assert_eq!(offset_of!(NvmlEventData, event_type), 8);
        assert_eq!(offset_of!(NvmlEventData, event_data), 16);
        assert_eq!(offset_of!(NvmlEventData, gpu_instance_id), 24);
        assert_eq!(offset_of!(NvmlEventData, compute_instance_id), 28);
        assert_eq!(size_of::<NvmlEventDataV1>(), 24);
    }

    #[test]
    fn compute_instance_structs_match_the_header_layout() {
        assert_eq!(size_of::<NvmlComputeInstanceProfileInfo>(), 36);
        assert_eq!(size_of::<NvmlComputeInstanceProfileInfoV2>(), 136);
        assert_eq!(size_of::<NvmlComputeInstanceProfileInfoV3>(), 140);
        assert_eq!(
            offset_of!(NvmlComputeInstanceProfileInfo, shared_ofa_count),
            32
        );
        assert_eq!(offset_of!(NvmlComputeInstanceProfileInfoV2, id), 4);
        assert_eq!(offset_of!(NvmlComputeInstanceProfileInfoV2, name), 40);
        assert_eq!(offset_of!(NvmlComputeInstanceProfileInfoV3, name), 40);
        assert_eq!(
            offset_of!(NvmlComputeInstanceProfileInfoV3, capabilities),
            136
        );
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V2, 136 | (2 << 24));
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V3, 140 | (3 << 24));
        assert_eq!(size_of::<NvmlComputeInstanceInfo>(), 32);
        assert_eq!(offset_of!(NvmlComputeInstanceInfo, id), 16);
        assert_eq!(offset_of!(NvmlComputeInstanceInfo, placement), 24);
    }
}
