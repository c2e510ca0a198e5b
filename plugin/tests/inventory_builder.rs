//! The node inventory builder, pure: NVML as the in-memory `FakeDriver`
//! reports it, a checkpoint, a health map and the device filters →
//! the `tessera.io/node-gpus` value the extender parses.

use std::collections::BTreeMap;

use tessera_driver::fake::{FakeDriver, FakeGpu};
use tessera_driver::{DriverError, GpuDriver};
use tessera_model::mig::Placement;
use tessera_model::mig::catalogue;
use tessera_model::sched::config::FilterDevices;
use tessera_model::sched::inventory::NodeGpus;
use tessera_plugin::checkpoint::{AllocRecord, Checkpoint, InstanceRecord, Phase, VERSION};
use tessera_plugin::config::DeviceSettings;
use tessera_plugin::inventory::{discover, node_gpus};

const A100: u32 = 1;

fn p(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

/// GPU 0: H100 with MIG off; GPU 1: A100-40GB with MIG on; GPU 2 and 3:
/// A100s the filters name (by uuid, by index).
fn node() -> FakeDriver {
    let h100 = catalogue::find("H100-80GB").expect("H100-80GB");
    FakeDriver::new()
        .with_gpu(FakeGpu::of_model(0, h100).with_mig_enabled(false))
        .with_gpu(FakeGpu::a100_40gb(A100))
        .with_gpu(FakeGpu::a100_40gb(2))
        .with_gpu(FakeGpu::a100_40gb(3))
        // Ours (the checkpoint names them): 3g.20gb @4 with its id, and
        // 2g.10gb @0 as an intent without one yet.
        .with_mig_device(A100, 9, p(4, 4))
        .with_gpu_instance(A100, 14, p(0, 2))
        // Made by hand: 1g.5gb @3 and 1g.5gb @2.
        .with_mig_device(A100, 19, p(3, 1))
        .with_gpu_instance(A100, 19, p(2, 1))
}

fn instance(uuid: &str, profile_id: u32, placement: Placement, gi: Option<u32>) -> InstanceRecord {
    InstanceRecord {
        gpu_uuid: uuid.to_owned(),
        gpu_index: A100,
        profile_id,
        profile: String::new(),
        placement,
        gpu_instance_id: gi,
        compute_instance_id: None,
        mig_uuid: None,
    }
}

fn checkpoint(instances: Vec<InstanceRecord>) -> Checkpoint {
    let record = AllocRecord {
        alloc_id: "pod-0".to_owned(),
        pod_uid: "pod".to_owned(),
        namespace: "default".to_owned(),
        pod: "p".to_owned(),
        container: "c".to_owned(),
        container_index: 0,
        phase: Phase::Ready,
        instances,
        device_ids: Vec::new(),
        created_unix: 1,
    };
    Checkpoint {
        version: VERSION,
        allocations: BTreeMap::from([(record.alloc_id.clone(), record)]),
    }
}

fn settings(filter_uuids: Vec<String>, filter_indexes: Vec<u32>) -> DeviceSettings {
    DeviceSettings {
        filter: FilterDevices {
            uuid: filter_uuids,
            index: filter_indexes,
        },
        ..DeviceSettings::default()
    }
}

#[test]
fn a_mig_a100_is_reported_with_nvml_placements_and_its_foreign_instances() {
    let driver = node();
    let gpus = driver.gpus().expect("gpus");
    let a100_uuid = gpus[A100 as usize].uuid.clone();
    let h100_uuid = gpus[0].uuid.clone();
    let ours = driver
        .gpu_instances(A100)
        .expect("instances")
        .into_iter()
        .find(|gi| gi.placement == p(4, 4))
        .expect("the 3g.20gb");
    let cp = checkpoint(vec![
        instance(&a100_uuid, 9, p(4, 4), Some(ours.id)),
        instance(&a100_uuid, 14, p(0, 2), None),
    ]);
    let nvml = discover(&driver).expect("discover");
    assert!(nvml.unreadable.is_empty(), "{:?}", nvml.unreadable);
    let health = BTreeMap::from([(h100_uuid.clone(), false), (a100_uuid.clone(), true)]);
    // GPU 2 by uuid, GPU 3 by an index written among the uuids.
    let filters = settings(vec![gpus[2].uuid.clone(), "3".to_owned()], Vec::new());
    let inventory = node_gpus(&nvml, &cp, &health, &filters);

    let indexes: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indexes, [0, 1], "filtered GPUs are left out");

    let h100 = &inventory.gpus[0];
    assert_eq!(h100.uuid, h100_uuid);
    assert!(!h100.mig && !h100.healthy, "{h100:?}");
    assert_eq!(
        h100.sm_count,
        catalogue::find("H100-80GB").unwrap().sm_count
    );
    assert!(h100.mig_profiles.is_empty() && h100.foreign_instances.is_empty());

    let a100 = &inventory.gpus[1];
    assert!(a100.mig && a100.healthy);
    assert_eq!(a100.model, "NVIDIA A100-SXM4-40GB");
    assert_eq!(a100.sm_count, 108);
    let nvml_profiles = driver.gpu_instance_profiles(A100).expect("profiles");
    assert_eq!(a100.mig_profiles.len(), nvml_profiles.len());
    for (reported, nvml) in a100.mig_profiles.iter().zip(&nvml_profiles) {
        assert_eq!((reported.id, &reported.name), (nvml.id, &nvml.name));
        assert_eq!(reported.memory_mib, nvml.memory_mib);
        assert_eq!(reported.compute_slices, nvml.slice_count);
        assert_eq!(reported.sm_count, nvml.multiprocessor_count);
        assert_eq!(reported.max_instances, nvml.instance_count);
        let placements = driver
            .possible_placements(A100, nvml.id)
            .expect("placements");
        assert_eq!(reported.placements, placements, "profile {}", nvml.name);
        assert_eq!(reported.memory_slices, placements[0].size);
    }
    let three = a100.mig_profiles.iter().find(|m| m.id == 9).unwrap();
    assert_eq!(three.placements, [p(0, 4), p(4, 4)]);
    assert_eq!(
        a100.foreign_instances,
        [p(2, 1), p(3, 1)],
        "only the GIs no checkpoint record names"
    );

    let text = inventory.to_annotation();
    assert_eq!(
        NodeGpus::parse(&text).expect("the extender's parse"),
        inventory
    );
}

#[test]
fn an_empty_checkpoint_makes_every_instance_foreign_and_a_stale_id_does_not_claim() {
    let driver = node();
    let uuid = driver.gpus().unwrap()[A100 as usize].uuid.clone();
    let nvml = discover(&driver).expect("discover");
    let all = node_gpus(
        &nvml,
        &checkpoint(Vec::new()),
        &BTreeMap::new(),
        &DeviceSettings::default(),
    );
    assert_eq!(
        all.gpus[A100 as usize].foreign_instances,
        [p(0, 2), p(2, 1), p(3, 1), p(4, 4)]
    );
    // A record at the same placement but with another GI id (ours was
    // destroyed, someone made a new one there) does not claim it; nor does
    // a record of another GPU.
    let cp = checkpoint(vec![
        instance(&uuid, 9, p(4, 4), Some(999)),
        instance("GPU-other", 19, p(3, 1), None),
    ]);
    let inventory = node_gpus(&nvml, &cp, &BTreeMap::new(), &DeviceSettings::default());
    assert!(
        inventory.gpus[A100 as usize]
            .foreign_instances
            .contains(&p(4, 4))
    );
    assert!(
        inventory.gpus[A100 as usize]
            .foreign_instances
            .contains(&p(3, 1))
    );
    assert_eq!(inventory.gpus.len(), 4, "no filters: every GPU");
}

#[test]
fn the_allowlist_does_not_shorten_the_profiles_nvml_reports() {
    // The extender applies migProfileAllowlist itself; an empty list here
    // would make it fall back to the catalogue.
    let driver = node();
    let nvml = discover(&driver).expect("discover");
    let mut only_small = DeviceSettings::default();
    for entry in &mut only_small.mig_profile_allowlist {
        entry.profiles = vec!["1g.5gb".to_owned()];
    }
    let inventory = node_gpus(
        &nvml,
        &checkpoint(Vec::new()),
        &BTreeMap::new(),
        &only_small,
    );
    assert_eq!(inventory.gpus[A100 as usize].mig_profiles.len(), 7);
}

#[test]
fn a_mig_gpu_nvml_cannot_read_is_reported_unhealthy_without_profiles() {
    let driver = node();
    driver.fail_next(
        "gpu_instances",
        DriverError::GpuLost("GPU 1 fell off the bus".to_owned()),
    );
    let nvml = discover(&driver).expect("the GPU list still reads");
    assert!(nvml.unreadable.contains_key(&A100), "{nvml:?}");
    let inventory = node_gpus(
        &nvml,
        &checkpoint(Vec::new()),
        &BTreeMap::new(),
        &DeviceSettings::default(),
    );
    let a100 = &inventory.gpus[A100 as usize];
    assert!(a100.mig && !a100.healthy);
    assert!(a100.mig_profiles.is_empty() && a100.foreign_instances.is_empty());
    // The other MIG GPUs still read.
    assert!(inventory.gpus[2].healthy && !inventory.gpus[2].mig_profiles.is_empty());
    assert!(NodeGpus::parse(&inventory.to_annotation()).is_ok());
}

#[test]
fn a_failing_gpu_list_is_an_error() {
    let driver = node();
    driver.fail_next(
        "gpus",
        DriverError::Call {
            call: "nvmlDeviceGetCount",
            reason: "uninitialized".to_owned(),
        },
    );
    assert!(discover(&driver).is_err());
}
