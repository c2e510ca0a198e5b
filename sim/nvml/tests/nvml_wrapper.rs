//! `nvml-wrapper` 0.13, the crate Tessera's driver uses, accepts the
//! simulated library as it would the real one.

mod common;

use std::mem::zeroed;
use std::ptr;

use std::fmt::Debug;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Brand, Clock, ClockId, EccCounter, InfoRom, MemoryError, MemoryLocation, PcieUtilCounter,
    PerformancePolicy, RetirementCause, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
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

/// The result of one call as NVIDIA's tools accept it: a value, or a clean
/// `NOT_SUPPORTED`. Anything else (a missing symbol above all) fails.
fn accepted<T: Debug>(call: &str, result: Result<T, NvmlError>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => panic!("{call}: {e:?} (expected a value or NotSupported)"),
    }
}

/// Every call NVIDIA's device plugin (with GPU feature discovery and the
/// container toolkit, all through go-nvml/go-nvlib) and the DCGM exporter
/// (through DCGM's NVML collectors) make, as `nvml-wrapper` binds them.
/// Tags: [plugin] device plugin, [gfd] GPU feature discovery, [ctk]
/// nvidia-container-toolkit (`nvidia-ctk cdi generate`), [dcgm] DCGM
/// exporter's default counters and labels.
#[test]
fn every_call_of_nvidias_tools_answers_a_value_or_not_supported() {
    let mut h100 = gpu(0, 3, "H100-80GB", true);
    h100.pci_bus = Some(0x1b);
    let mut a100 = gpu(1, 0, "A100-80GB", false);
    a100.pci_bus = Some(0x9d);
    let node = SimNode::new(vec![h100, a100]);
    let path = node.lib_path();
    let nvml = Nvml::builder()
        .lib_path(path.as_os_str())
        .init()
        .expect("init"); // [all]
    let gpu0 = nvml.device_by_index(0).unwrap(); // [all]
    let gpu1 = nvml.device_by_index(1).unwrap();

    // A MIG device (1g.10gb, profile id 19), made as the plugin's MIG manager would.
    let lib = nvml.lib();
    let mut gi = ptr::null_mut();
    let placement = nvmlGpuInstancePlacement_t { start: 0, size: 1 };
    // SAFETY: the device handle comes from this Nvml; pointers are to locals.
    let code = unsafe {
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(gpu0.handle(), 19, &placement, &mut gi)
    };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
    let mut ci = ptr::null_mut();
    // SAFETY: GI handle from the call above; out-pointer to a local.
    let code = unsafe { lib.nvmlGpuInstanceCreateComputeInstance(gi, 0, &mut ci) };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
    let mig = gpu0.mig_device_by_index(0).unwrap(); // [plugin][dcgm]

    // System. [plugin][gfd][ctk][dcgm]
    accepted("sys_driver_version", nvml.sys_driver_version()).unwrap();
    accepted("sys_nvml_version", nvml.sys_nvml_version()).unwrap();
    accepted("sys_cuda_driver_version", nvml.sys_cuda_driver_version()).unwrap();
    accepted("device_count", nvml.device_count()).unwrap();
    // [dcgm] process names of the pods' processes.
    let me = accepted(
        "sys_process_name",
        nvml.sys_process_name(std::process::id(), 64),
    )
    .unwrap();
    assert!(!me.is_empty());
    assert_eq!(accepted("unit_count", nvml.unit_count()), Some(0));
    accepted("excluded_device_count", nvml.excluded_device_count());

    // Identity. [plugin][gfd][ctk][dcgm]
    let uuid = accepted("uuid", gpu0.uuid()).unwrap();
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
        0
    );
    accepted("name", gpu0.name()).unwrap();
    assert_eq!(accepted("minor_number", gpu0.minor_number()), Some(3));
    assert_eq!(accepted("minor_number", gpu1.minor_number()), Some(0));
    // [plugin] NUMA/health, [ctk] PCI paths, [dcgm] labels.
    let pci = accepted("pci_info", gpu0.pci_info()).unwrap();
    assert_eq!(pci.bus_id, "00000000:1B:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x1b, 0));
    assert_eq!(
        pci.pci_device_id, 0x2330_10de,
        "H100 SXM5 device id, NVIDIA vendor id"
    );
    assert_eq!(
        nvml.device_by_pci_bus_id("00000000:9D:00.0")
            .unwrap()
            .index()
            .unwrap(),
        1
    );
    let mig_pci = accepted("pci_info (MIG)", mig.pci_info()).unwrap();
    assert_eq!(
        mig_pci.bus_id, pci.bus_id,
        "a MIG device answers with its parent's"
    );
    // [gfd] labels: compute capability, architecture, brand.
    assert_eq!(
        accepted("cuda_compute_capability", gpu0.cuda_compute_capability())
            .map(|c| (c.major, c.minor)),
        Some((9, 0))
    );
    assert_eq!(
        accepted("cuda_compute_capability", gpu1.cuda_compute_capability())
            .map(|c| (c.major, c.minor)),
        Some((8, 0))
    );
    assert_eq!(
        accepted("architecture", gpu0.architecture()),
        Some(DeviceArchitecture::Hopper)
    );
    assert_eq!(
        accepted("architecture", gpu1.architecture()),
        Some(DeviceArchitecture::Ampere)
    );
    assert_eq!(accepted("brand", gpu0.brand()), Some(Brand::Nvidia));
    // [dcgm] labels and inventory.
    let serial = accepted("serial", gpu0.serial()).unwrap();
    let c_serial = std::ffi::CString::new(serial).unwrap();
    let mut by_serial = ptr::null_mut();
    // SAFETY: a NUL-terminated string and an out-pointer to a local.
    let code = unsafe { lib.nvmlDeviceGetHandleBySerial(c_serial.as_ptr(), &mut by_serial) };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
    // SAFETY: the raw handle is only compared, never used.
    assert_eq!(by_serial, unsafe { gpu0.handle() });
    accepted("board_part_number", gpu0.board_part_number()).unwrap();
    accepted("vbios_version", gpu0.vbios_version()).unwrap();
    accepted("info_rom_version", gpu0.info_rom_version(InfoRom::OEM)).unwrap();
    accepted("info_rom_image_version", gpu0.info_rom_image_version()).unwrap();
    accepted("board_id", gpu0.board_id()).unwrap();
    accepted("is_multi_gpu_board", gpu0.is_multi_gpu_board()).unwrap();
    accepted("numa_node_id", gpu0.numa_node_id());

    // MIG. [plugin][gfd][ctk][dcgm]
    assert!(accepted("mig_is_mig_device_handle", mig.mig_is_mig_device_handle()).unwrap());
    accepted("mig_device_count", gpu0.mig_device_count()).unwrap();
    accepted("mig_mode", gpu0.mig_mode()).unwrap();
    accepted("mig_parent_device", mig.mig_parent_device()).unwrap();
    accepted("profile_info", gpu0.profile_info(0)).unwrap();
    // [plugin] MIG resource sizes, [gfd] mig.* labels.
    let attributes = accepted("attributes", mig.attributes()).unwrap();
    assert_eq!(
        (
            attributes.multiprocessor_count,
            attributes.shared_copy_engine_count,
            attributes.gpu_instance_slice_count,
            attributes.compute_instance_slice_count,
            attributes.memory_size_mb,
        ),
        (16, 1, 1, 1, 9984),
        "H100 1g.10gb"
    );
    assert!(
        matches!(gpu0.attributes(), Err(NvmlError::NotSupported)),
        "attributes are for MIG devices only"
    );
    accepted("memory_info (MIG)", mig.memory_info()).unwrap();
    accepted("uuid (MIG)", mig.uuid()).unwrap();
    accepted("name (MIG)", mig.name()).unwrap();

    // Topology. [plugin] aligned allocation (go-gpuallocator), [dcgm].
    assert_eq!(
        accepted(
            "topology_common_ancestor",
            gpu0.topology_common_ancestor(gpu1)
        ),
        Some(TopologyLevel::System),
        "buses 0x1b and 0x9d sit on different sockets"
    );
    let gpu1 = nvml.device_by_index(1).unwrap();
    accepted("is_on_same_board_as", gpu0.is_on_same_board_as(&gpu1)).unwrap();
    accepted("nvlink is_active", gpu0.link_wrapper_for(0).is_active());
    accepted(
        "nvlink remote_pci_info",
        gpu0.link_wrapper_for(0).remote_pci_info(),
    );
    let mut p2p = 9;
    // SAFETY: handles from this Nvml; out-pointer to a local.
    let code = unsafe { lib.nvmlDeviceGetP2PStatus(gpu0.handle(), gpu1.handle(), 0, &mut p2p) };
    assert_eq!((code, p2p), (nvmlReturn_enum_NVML_SUCCESS, 0), "P2P OK");
    accepted("cpu_affinity", gpu0.cpu_affinity(4)).unwrap();
    accepted(
        "cpu_affinity_within_scope",
        gpu0.cpu_affinity_within_scope(4, 0),
    )
    .unwrap();
    accepted("memory_affinity", gpu0.memory_affinity(1, 0)).unwrap();

    // Telemetry. [dcgm] default counters; [plugin] health.
    let power = accepted("power_usage", gpu0.power_usage()).unwrap();
    assert!((10_000..=700_000).contains(&power), "{power} mW");
    accepted("total_energy_consumption", gpu0.total_energy_consumption()).unwrap();
    accepted("enforced_power_limit", gpu0.enforced_power_limit()).unwrap();
    accepted("power_management_limit", gpu0.power_management_limit()).unwrap();
    accepted(
        "power_management_limit_default",
        gpu0.power_management_limit_default(),
    )
    .unwrap();
    accepted("temperature", gpu0.temperature(TemperatureSensor::Gpu)).unwrap();
    for clock in [Clock::Graphics, Clock::SM, Clock::Memory, Clock::Video] {
        accepted("clock_info", gpu0.clock_info(clock)).unwrap();
        accepted("max_clock_info", gpu0.max_clock_info(clock)).unwrap();
        accepted("clock", gpu0.clock(clock, ClockId::Current)).unwrap();
        accepted("applications_clock", gpu0.applications_clock(clock));
        accepted(
            "max_customer_boost_clock",
            gpu0.max_customer_boost_clock(clock),
        );
    }
    accepted("current_throttle_reasons", gpu0.current_throttle_reasons()).unwrap();
    accepted(
        "supported_throttle_reasons",
        gpu0.supported_throttle_reasons(),
    )
    .unwrap();
    accepted("performance_state", gpu0.performance_state()).unwrap();
    accepted("utilization_rates", gpu0.utilization_rates()).unwrap();
    accepted("encoder_utilization", gpu0.encoder_utilization()).unwrap();
    accepted("decoder_utilization", gpu0.decoder_utilization()).unwrap();
    accepted("encoder_stats", gpu0.encoder_stats()).unwrap();
    accepted("encoder_sessions", gpu0.encoder_sessions()).unwrap();
    accepted("fbc_stats", gpu0.fbc_stats());
    accepted("memory_info", gpu0.memory_info()).unwrap();
    let bar1 = accepted("bar1_memory_info", gpu0.bar1_memory_info()).unwrap();
    assert!(bar1.total > bar1.used);
    accepted("is_ecc_enabled", gpu0.is_ecc_enabled()).unwrap();
    for error in [MemoryError::Corrected, MemoryError::Uncorrected] {
        assert_eq!(
            accepted(
                "total_ecc_errors",
                gpu0.total_ecc_errors(error, EccCounter::Volatile)
            ),
            Some(0)
        );
        accepted(
            "memory_error_counter",
            gpu0.memory_error_counter(error, EccCounter::Aggregate, MemoryLocation::Device),
        )
        .unwrap();
    }
    accepted(
        "retired_pages",
        gpu0.retired_pages(RetirementCause::MultipleSingleBitEccErrors),
    );
    accepted(
        "are_pages_pending_retired",
        gpu0.are_pages_pending_retired(),
    );
    accepted("pcie_replay_counter", gpu0.pcie_replay_counter()).unwrap();
    accepted(
        "pcie_throughput",
        gpu0.pcie_throughput(PcieUtilCounter::Send),
    )
    .unwrap();
    accepted("current_pcie_link_gen", gpu0.current_pcie_link_gen()).unwrap();
    accepted("current_pcie_link_width", gpu0.current_pcie_link_width()).unwrap();
    accepted("max_pcie_link_gen", gpu0.max_pcie_link_gen()).unwrap();
    accepted("max_pcie_link_width", gpu0.max_pcie_link_width()).unwrap();
    accepted(
        "violation_status",
        gpu0.violation_status(PerformancePolicy::Power),
    )
    .unwrap();
    accepted("is_in_persistent_mode", gpu0.is_in_persistent_mode()).unwrap();
    accepted("compute_mode", gpu0.compute_mode()).unwrap();
    accepted("is_display_active", gpu0.is_display_active()).unwrap();
    accepted("is_display_connected", gpu0.is_display_connected()).unwrap();
    accepted("fan_speed", gpu0.fan_speed(0));
    accepted("num_fans", gpu0.num_fans());
    accepted("virtualization_mode", gpu0.virtualization_mode()).unwrap();
    accepted("gsp_firmware_mode", gpu0.gsp_firmware_mode());
    accepted("is_accounting_enabled", gpu0.is_accounting_enabled());
    accepted("num_cores", gpu0.num_cores());
    accepted("memory_bus_width", gpu0.memory_bus_width());
    accepted("irq_num", gpu0.irq_num());
    // [dcgm] per-field reads: each field answers NotSupported on its own.
    let fields = accepted(
        "field_values_for",
        gpu0.field_values_for(&[FieldId(82), FieldId(83)]),
    )
    .unwrap();
    assert_eq!(fields.len(), 2);
    for field in fields {
        accepted("field value", field);
    }
    // [dcgm] pod mapping: processes.
    accepted(
        "running_compute_processes",
        gpu0.running_compute_processes(),
    )
    .unwrap();
    accepted(
        "running_graphics_processes",
        gpu0.running_graphics_processes(),
    )
    .unwrap();
    accepted(
        "mps_running_compute_processes",
        gpu0.mps_running_compute_processes(),
    )
    .unwrap();
    // [plugin][dcgm] XID health events.
    let set = accepted("create_event_set", nvml.create_event_set()).unwrap();
    accepted("supported_event_types", gpu0.supported_event_types()).unwrap();
    drop(set);

    nvml.shutdown().expect("shutdown");
}

/// Every function `nvml-wrapper-sys` declares (the whole of `nvml.h` it was
/// generated from) resolves in the stand-in: no client finds a symbol
/// missing. The names are read from the bindings' source, found through
/// `cargo metadata`, so the check does not trust a list of our own.
#[test]
fn every_function_the_bindings_declare_is_exported() {
    let metadata = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        metadata.status.success(),
        "{}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    let text = String::from_utf8(metadata.stdout).unwrap();
    let manifest = text
        .split("\"manifest_path\":\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap()])
        .find(|p| p.contains("/nvml-wrapper-sys-"))
        .expect("nvml-wrapper-sys in cargo metadata");
    let bindings = std::path::Path::new(manifest)
        .parent()
        .unwrap()
        .join("src/bindings.rs");
    let source = std::fs::read_to_string(&bindings).unwrap();
    let names: Vec<&str> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub unsafe fn nvml"))
        .map(|rest| &rest[..rest.find('(').unwrap()])
        .collect();
    assert!(
        names.len() > 350,
        "{} functions in the bindings",
        names.len()
    );

    let node = SimNode::new(vec![gpu(0, 0, "A30", false)]);
    // SAFETY: loading the stand-in runs no initialiser with preconditions.
    let library = unsafe { libloading::Library::new(node.lib_path()) }.unwrap();
    let missing: Vec<String> = names
        .iter()
        .map(|n| format!("nvml{n}"))
        .filter(|name| {
            // SAFETY: only the symbol's presence is checked; it is not called.
            unsafe { library.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err()
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// A call the simulation does not model (NVLink, GPM) answers `NOT_SUPPORTED`.
#[test]
fn an_unmodelled_call_is_not_supported_once_initialised() {
    let node = SimNode::new(vec![gpu(0, 0, "A30", false)]);
    let nvml = Nvml::builder()
        .lib_path(node.lib_path().as_os_str())
        .init()
        .unwrap();
    let device = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        device.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(device.gpm_support(), Err(NvmlError::NotSupported)));
}
