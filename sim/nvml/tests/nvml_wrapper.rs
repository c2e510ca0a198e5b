//! `nvml-wrapper` 0.13, the crate Tessera's driver uses, accepts the
//! simulated library as it would the real one.

mod common;

use std::mem::zeroed;
use std::ptr;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceProfileInfo_t, nvmlGpuInstancePlacement_t, nvmlReturn_enum_NVML_SUCCESS,
};

use common::{SimNode, gpu};

#[test]
fn nvml_wrapper_reads_devices_and_mig_devices() {
    let node = SimNode::new(vec![
        gpu(0, 0, "H100-80GB", true),
        gpu(1, 1, "A100-80GB", false),
    ]);
    let state = node.store().read().unwrap();
    let path = node.lib_path();
    let nvml = Nvml::builder()
        .lib_path(path.as_os_str())
        .init()
        .expect("nvml-wrapper initialises the simulated library");

    assert_eq!(nvml.sys_driver_version().unwrap(), "570.133.20");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12080);
    assert_eq!(nvml.device_count().unwrap(), 2);

    let h100 = nvml.device_by_index(0).unwrap();
    let a100 = nvml.device_by_index(1).unwrap();
    assert!(matches!(
        nvml.device_by_index(2),
        Err(NvmlError::InvalidArg)
    ));
    assert_eq!(h100.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(a100.name().unwrap(), "NVIDIA A100-SXM4-80GB");
    assert_eq!(h100.uuid().unwrap(), state.gpus[0].uuid);
    assert_eq!(a100.uuid().unwrap(), state.gpus[1].uuid);
    assert_eq!(a100.minor_number().unwrap(), 1);
    assert_eq!(
        h100.memory_info().unwrap().total,
        81559 * common::MIB,
        "H100 80GB HBM3: 81559 MiB as the simulated node serves it"
    );
    let mode = h100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    let mode = a100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 0));
    assert!(!h100.mig_is_mig_device_handle().unwrap());
    assert_eq!(h100.mig_device_count().unwrap(), 7);
    assert_eq!(a100.mig_device_count().unwrap(), 0);
    assert!(matches!(
        h100.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    let p = h100.profile_info(0).unwrap();
    // 1g.10gb: 9984 MiB = 9.75 GiB (mig.md: ≈ 9.75 GiB).
    assert_eq!((p.id, p.slice_count, p.memory_size_mb), (19, 1, 9984));

    // GI and CI through the raw calls, as the driver makes them.
    let lib = nvml.lib();
    let mut gi = ptr::null_mut();
    let placement = nvmlGpuInstancePlacement_t { start: 4, size: 4 };
    // SAFETY: the device handle comes from this Nvml; pointers are to locals.
    let code = unsafe {
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(h100.handle(), 9, &placement, &mut gi)
    };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
    // SAFETY: plain C struct, all-zero is valid.
    let mut ci_profile: nvmlComputeInstanceProfileInfo_t = unsafe { zeroed() };
    // SAFETY: GI handle from the call above; out-pointer to a local.
    let code =
        unsafe { lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0, &mut ci_profile) };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
    let mut ci = ptr::null_mut();
    // SAFETY: as above.
    let code = unsafe { lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id, &mut ci) };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);

    let mig = h100.mig_device_by_index(0).unwrap();
    assert!(mig.mig_is_mig_device_handle().unwrap());
    assert!(mig.uuid().unwrap().starts_with("MIG-"));
    assert_eq!(mig.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
    // 3g.40gb: 40448 MiB = 39.5 GiB (mig.md: ≈ 39.5 GiB).
    assert_eq!(mig.memory_info().unwrap().total, 40448 * common::MIB);
    assert_eq!(
        mig.mig_parent_device().unwrap().uuid().unwrap(),
        state.gpus[0].uuid
    );
    assert!(matches!(mig.minor_number(), Err(NvmlError::NotSupported)));

    nvml.shutdown().expect("shutdown");
}

#[test]
fn nvml_wrapper_sees_driver_not_loaded_without_a_node() {
    let node = SimNode::without_state();
    let path = node.lib_path();
    let result = Nvml::builder().lib_path(path.as_os_str()).init();
    match result {
        Err(NvmlError::DriverNotLoaded) => {}
        Err(e) => panic!("expected DriverNotLoaded, got {e:?}"),
        Ok(_) => panic!("init succeeded without a node"),
    }
}
