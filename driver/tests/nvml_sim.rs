//! `NvmlDriver` end to end against the simulated node: the `tessera-sim` builder
//! lays out a node (profile `demo`) in a temp dir with the NVML stand-in installed
//! as `<root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`, and the driver loads it
//! exactly as it loads the real library.
//!
//! Needs root (the node's device nodes), the stand-ins and `tessera-sim`
//! (`cargo build --workspace`): `tessera-test-support`'s prerequisite rule
//! skips (locally) or fails (`CI`, `TESSERA_REQUIRE_ALL=1`) without them.

use std::process::Command;

use tessera_driver::discover::discover;
use tessera_driver::{DriverError, GpuDriver};
use tessera_model::mig::Placement;
use tessera_test_support::artefact;

#[macro_use]
mod common;
use common::load;

/// The index of the demo node's MIG GPU (an A100-40GB).
const MIG_GPU: u32 = 1;

fn p(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

#[test]
fn nvml_driver_manages_mig_on_the_simulated_node() {
    let root = demo_node_or_skip!();
    let driver = load(root.root());

    // Enumeration.
    assert!(!driver.driver_version().unwrap().is_empty());
    let gpus = driver.gpus().unwrap();
    assert_eq!(gpus.len(), 2, "{gpus:#?}");
    assert_eq!(gpus[0].index, 0);
    assert!(gpus[0].name.contains("H100"), "{:?}", gpus[0].name);
    assert!(!gpus[0].mig_enabled());
    let a100 = &gpus[MIG_GPU as usize];
    assert!(a100.name.contains("A100"), "{:?}", a100.name);
    assert!(a100.mig_enabled());
    assert!(a100.uuid.starts_with("GPU-"), "{:?}", a100.uuid);
    assert!(
        (39_000..=41_000).contains(&a100.memory_mib),
        "{}",
        a100.memory_mib
    );

    // Profiles: (enum, id, name) of the A100-40GB, per reference/mig.md.
    let profiles = driver.gpu_instance_profiles(MIG_GPU).unwrap();
    let got: Vec<(u32, u32, &str)> = profiles
        .iter()
        .map(|p| (p.enum_index, p.id, p.name.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (0, 19, "1g.5gb"),
            (1, 14, "2g.10gb"),
            (2, 9, "3g.20gb"),
            (3, 5, "4g.20gb"),
            (4, 0, "7g.40gb"),
            (7, 20, "1g.5gb+me"),
            (9, 15, "1g.10gb"),
        ]
    );
    let by_id = |id: u32| profiles.iter().find(|p| p.id == id).unwrap();
    assert_eq!((by_id(9).slice_count, by_id(9).instance_count), (3, 2));
    assert_eq!(by_id(0).multiprocessor_count, 98);

    // Possible placements (not nvml-wrapper's buggy empty list).
    assert_eq!(
        driver.possible_placements(MIG_GPU, 9).unwrap(),
        [p(0, 4), p(4, 4)]
    );
    assert_eq!(
        driver.possible_placements(MIG_GPU, 15).unwrap(),
        [p(0, 2), p(2, 2), p(4, 2), p(6, 2)]
    );
    assert_eq!(
        driver.possible_placements(MIG_GPU, 19).unwrap(),
        (0..7).map(|s| p(s, 1)).collect::<Vec<_>>()
    );

    // The demo's instances: 3g.20gb@4, 2g.10gb@0, 1g.5gb@2, each with a CI.
    let existing = driver.gpu_instances(MIG_GPU).unwrap();
    let mut layout: Vec<(u32, Placement)> = existing
        .iter()
        .map(|gi| (gi.profile_id, gi.placement))
        .collect();
    layout.sort_by_key(|(_, pl)| pl.start);
    assert_eq!(layout, [(14, p(0, 2)), (19, p(2, 1)), (9, p(4, 4))]);
    let before = driver.mig_devices(MIG_GPU).unwrap();
    assert_eq!(before.len(), 3, "{before:#?}");
    assert!(
        driver.mig_devices(0).unwrap().is_empty(),
        "MIG off: no MIG devices"
    );

    // Overlap and illegal placements are refused with the right kinds.
    let err = driver
        .create_gpu_instance(MIG_GPU, 19, p(2, 1))
        .unwrap_err();
    assert!(
        matches!(err, DriverError::InsufficientResources(_)),
        "{err:?}"
    );
    let err = driver.create_gpu_instance(MIG_GPU, 9, p(2, 4)).unwrap_err();
    assert!(matches!(err, DriverError::InvalidArgument(_)), "{err:?}");

    // Create a 1g.5gb at the free slice 3, with its CI.
    let gi = driver.create_gpu_instance(MIG_GPU, 19, p(3, 1)).unwrap();
    assert_eq!(
        (gi.gpu_index, gi.profile_id, gi.placement),
        (MIG_GPU, 19, p(3, 1))
    );
    assert!(driver.gpu_instances(MIG_GPU).unwrap().contains(&gi));
    let ci = driver.create_compute_instance(MIG_GPU, gi.id).unwrap();
    assert_eq!(ci.gpu_instance_id, gi.id);
    assert_eq!(driver.compute_instances(MIG_GPU, gi.id).unwrap(), [ci]);

    let devices = driver.mig_devices(MIG_GPU).unwrap();
    assert_eq!(devices.len(), 4, "{devices:#?}");
    let mine = devices
        .iter()
        .find(|m| m.gpu_instance_id == gi.id)
        .expect("the new instance is a MIG device");
    assert!(mine.uuid.starts_with("MIG-"), "{:?}", mine.uuid);
    assert_eq!(mine.compute_instance_id, ci.id);
    assert_eq!(mine.profile, "1g.5gb");
    assert_eq!(mine.placement, p(3, 1));
    assert_eq!(mine.parent_index, MIG_GPU);
    assert!(
        (4_000..=5_500).contains(&mine.memory_mib),
        "{}",
        mine.memory_mib
    );

    // Discovery sees it too, with cap nodes from the sim's /proc.
    let facts = discover(root.root(), &driver).unwrap();
    let gpu = &facts.gpus[MIG_GPU as usize];
    let found = gpu
        .mig_devices
        .iter()
        .find(|m| m.device.uuid == mine.uuid)
        .expect("discover reports the new MIG device");
    assert_eq!(
        found.gi_cap.container_path,
        format!("/dev/nvidia-caps/nvidia-cap{}", found.gi_cap.minor)
    );
    assert_ne!(found.gi_cap.minor, found.ci_cap.minor);
    assert_eq!(found.gi_cap.major, found.ci_cap.major);

    // A GI with a CI is in use; CI first, then GI.
    let err = driver.destroy_gpu_instance(MIG_GPU, gi.id).unwrap_err();
    assert!(matches!(err, DriverError::InUse(_)), "{err:?}");
    driver
        .destroy_compute_instance(MIG_GPU, gi.id, ci.id)
        .unwrap();
    assert!(driver.compute_instances(MIG_GPU, gi.id).unwrap().is_empty());
    driver.destroy_gpu_instance(MIG_GPU, gi.id).unwrap();
    assert!(
        !driver
            .gpu_instances(MIG_GPU)
            .unwrap()
            .iter()
            .any(|g| g.id == gi.id)
    );
    let err = driver.destroy_gpu_instance(MIG_GPU, gi.id).unwrap_err();
    assert!(matches!(err, DriverError::NotFound(_)), "{err:?}");
    assert_eq!(driver.mig_devices(MIG_GPU).unwrap(), before);
}

#[test]
fn instances_persist_across_driver_instances() {
    let root = demo_node_or_skip!();
    let gi = {
        let driver = load(root.root());
        let gi = driver.create_gpu_instance(MIG_GPU, 19, p(3, 1)).unwrap();
        driver.create_compute_instance(MIG_GPU, gi.id).unwrap();
        gi
    };
    // The stand-in keeps GI/CI state in a file under the root; a second load
    // of the same library (same process) sees the instance.
    let driver = load(root.root());
    assert!(driver.gpu_instances(MIG_GPU).unwrap().contains(&gi));
    let out = Command::new(artefact("tessera-sim"))
        .args(["show", "--root"])
        .arg(root.root())
        .output()
        .unwrap();
    assert!(out.status.success());
    let shown = String::from_utf8_lossy(&out.stdout);
    let devices = driver.mig_devices(MIG_GPU).unwrap();
    let mine = devices.iter().find(|m| m.gpu_instance_id == gi.id).unwrap();
    assert!(
        shown.contains(&mine.uuid),
        "tessera-sim show lacks {}:\n{shown}",
        mine.uuid
    );
}

#[test]
fn discover_on_the_demo_node() {
    let root = demo_node_or_skip!();
    let driver = load(root.root());
    let facts = discover(root.root(), &driver).unwrap();
    assert_eq!(facts.gpus.len(), 2);
    for gpu in &facts.gpus {
        assert_eq!(
            gpu.node.container_path,
            format!("/dev/nvidia{}", gpu.info.minor)
        );
        assert_eq!(gpu.node.major, 195);
        assert_eq!(gpu.node.minor, gpu.info.minor);
    }
    assert!(facts.gpus[0].mig_devices.is_empty());
    let mig = &facts.gpus[MIG_GPU as usize].mig_devices;
    assert_eq!(mig.len(), 3);
    for m in mig {
        // The sim lays out the cap nodes of its pre-created instances: the numbers
        // discovery takes from /proc must match the nodes on disk.
        for cap in [&m.gi_cap, &m.ci_cap] {
            assert_eq!(
                cap.host_path,
                root.root()
                    .join(&cap.container_path[1..])
                    .display()
                    .to_string()
            );
            if let Some(node) =
                tessera_driver::devices::char_device(root.root(), &cap.container_path[1..]).unwrap()
            {
                assert_eq!(
                    (node.major, node.minor),
                    (cap.major, cap.minor),
                    "{}",
                    cap.container_path
                );
            }
        }
    }
    let ctl: Vec<&str> = facts
        .control_nodes
        .iter()
        .map(|n| n.container_path.as_str())
        .collect();
    assert_eq!(
        ctl,
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    );
    let libs: Vec<&str> = facts
        .libraries
        .iter()
        .map(|f| f.container_path.as_str())
        .collect();
    assert!(
        libs.contains(&"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        "{libs:?}"
    );
    assert!(
        libs.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{libs:?}"
    );
}

#[test]
fn discover_on_a_node_whose_minors_are_not_its_indexes() {
    // probe-order: index 0 is minor 2 (MIG, two instances), index 1 minor 0,
    // index 2 minor 5 (MIG, one instance).
    let root = node_or_skip!("probe-order");
    let driver = load(root.root());
    let facts = discover(root.root(), &driver).unwrap();
    let got: Vec<(u32, String, u32)> = facts
        .gpus
        .iter()
        .map(|g| (g.info.index, g.node.container_path.clone(), g.node.minor))
        .collect();
    assert_eq!(
        got,
        [
            (0, "/dev/nvidia2".to_string(), 2),
            (1, "/dev/nvidia0".to_string(), 0),
            (2, "/dev/nvidia5".to_string(), 5),
        ]
    );
    let mig_minors =
        std::fs::read_to_string(root.root().join("proc/driver/nvidia-caps/mig-minors")).unwrap();
    for (gpu, minor) in [(0, 2), (2, 5)] {
        let mig = &facts.gpus[gpu].mig_devices;
        assert!(!mig.is_empty());
        for m in mig {
            // Each cap node is the mig-minors entry of the GPU's minor, not its index.
            let line = mig_minors
                .lines()
                .find(|l| l.ends_with(&format!(" {}", m.gi_cap.minor)))
                .unwrap();
            assert!(line.starts_with(&format!("gpu{minor}/gi")), "{line}");
        }
    }
}
