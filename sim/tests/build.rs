//! Building nodes: device nodes, /proc files, libraries, state.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tessera_sim::builder::{BuildOptions, build_node};
use tessera_sim::caps;
use tessera_sim::profile::{NodeProfile, shipped_profiles};
use tessera_sim::state::StateStore;
use tessera_test_support::{Need, require};

fn assert_char(path: &Path, major: u32, minor: u32, mode: u32) {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        m.file_type().is_char_device(),
        "{} is not a char device",
        path.display()
    );
    let (ma, mi) = (libc::major(m.rdev()), libc::minor(m.rdev()));
    assert_eq!(
        (ma, mi),
        (major, minor),
        "{}: wrong numbers",
        path.display()
    );
    assert_eq!(
        m.permissions().mode() & 0o777,
        mode,
        "{}: wrong mode",
        path.display()
    );
}

#[test]
fn every_shipped_profile_builds_with_the_right_device_nodes() {
    require!(Need::DeviceNodes);
    for (name, _) in shipped_profiles() {
        let profile = NodeProfile::load(name).unwrap();
        let (_tmp, built) = common::build(&profile);
        let root = &built.root;
        for gpu in &built.state.gpus {
            assert_char(
                &root.join(format!("dev/nvidia{}", gpu.minor)),
                195,
                gpu.minor,
                0o666,
            );
            for gi in &gpu.gpu_instances {
                let gm = caps::gi_access_minor(gpu.minor, gi.id).unwrap();
                assert_char(&caps::cap_node_path(root, gm), 508, gm, 0o444);
                for ci in &gi.compute_instances {
                    let cm = caps::ci_access_minor(gpu.minor, gi.id, ci.id).unwrap();
                    assert_char(&caps::cap_node_path(root, cm), 508, cm, 0o444);
                }
            }
        }
        assert_char(&root.join("dev/nvidiactl"), 195, 255, 0o666);
        assert_char(&root.join("dev/nvidia-uvm"), 511, 0, 0o666);
        assert_char(&root.join("dev/nvidia-uvm-tools"), 511, 1, 0o666);
        assert_char(&root.join("dev/nvidia-caps/nvidia-cap1"), 508, 1, 0o400);
        assert_char(&root.join("dev/nvidia-caps/nvidia-cap2"), 508, 2, 0o444);
        let state = StateStore::open(root).unwrap().read().unwrap();
        assert_eq!(
            state, built.state,
            "{name}: state file differs from the build"
        );
        assert_eq!(state, profile.node_state(name).unwrap());
        for lib in [
            "libnvidia-ml.so.1",
            "libcuda.so.1",
            "libnvidia-ptxjitcompiler.so.1",
            "libnvidia-nvvm.so.4",
            "libnvidia-allocator.so.1",
            "libnvidia-cfg.so.1",
        ] {
            assert!(
                root.join("usr/lib/x86_64-linux-gnu").join(lib).is_file(),
                "{name}: {lib}"
            );
        }
        let smi = root.join("usr/bin/nvidia-smi");
        assert!(fs::metadata(&smi).unwrap().permissions().mode() & 0o111 != 0);
    }
}

#[test]
fn demo_node_makes_exactly_its_device_nodes() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("demo").unwrap());
    let mut caps: Vec<String> = fs::read_dir(built.root.join("dev/nvidia-caps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    caps.sort();
    // GPU 1 (minor 1): GI 1 → 147/148, GI 3 → 165/166, GI 9 → 219/220.
    assert_eq!(
        caps,
        [
            "nvidia-cap1",
            "nvidia-cap147",
            "nvidia-cap148",
            "nvidia-cap165",
            "nvidia-cap166",
            "nvidia-cap2",
            "nvidia-cap219",
            "nvidia-cap220"
        ]
    );
    assert_eq!(built.device_nodes.len(), 13);
}

#[test]
fn mig_minors_has_the_full_table_and_parses() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("h100-80gb").unwrap());
    let text = fs::read_to_string(built.root.join("proc/driver/nvidia-caps/mig-minors")).unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let (cap, minor) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("line {}: {line:?} is not \"<cap> <minor>\"", n + 1));
        let minor: u32 = minor.parse().unwrap();
        assert!(
            seen.insert(minor, cap.to_string()).is_none(),
            "minor {minor} twice"
        );
    }
    assert_eq!(seen.len(), 2 + 32 * 15 * 9);
    assert_eq!(seen[&1], "config");
    assert_eq!(seen[&2], "monitor");
    assert_eq!(seen[&3], "gpu0/gi0/access");
    assert_eq!(seen[&4], "gpu0/gi0/ci0/access");
    assert_eq!(seen[&439], "gpu3/gi3/ci3/access");
    assert_eq!(seen[&4322], "gpu31/gi14/ci7/access");
    for g in 0..32 {
        for i in 0..15 {
            assert_eq!(
                seen[&caps::gi_access_minor(g, i).unwrap()],
                format!("gpu{g}/gi{i}/access")
            );
            for c in 0..8 {
                assert_eq!(
                    seen[&caps::ci_access_minor(g, i, c).unwrap()],
                    format!("gpu{g}/gi{i}/ci{c}/access")
                );
            }
        }
    }
}

#[test]
fn proc_devices_names_the_nvidia_majors() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("h100-80gb").unwrap());
    let text = fs::read_to_string(built.root.join("proc/devices")).unwrap();
    assert!(text.starts_with("Character devices:\n"), "{text}");
    assert!(
        text.contains("\n195 nvidia-frontend\n195 nvidia\n"),
        "{text}"
    );
    assert!(text.contains("\n\nBlock devices:\n"), "{text}");
    assert_eq!(caps::char_major(&text, "nvidia-caps"), Some(508));
    assert_eq!(caps::char_major(&text, "nvidia-uvm"), Some(511));
    assert_eq!(caps::char_major(&text, "nvidia-frontend"), Some(195));
}

#[test]
fn non_empty_root_is_refused_without_force_and_force_keeps_foreign_files() {
    require!(Need::DeviceNodes);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let opts = common::fake_libs(tmp.path());
    build_node(&NodeProfile::load("demo").unwrap(), &root, &opts).unwrap();
    fs::write(root.join("dev/keep-me"), "x").unwrap();

    let err = build_node(&NodeProfile::load("h100-80gb").unwrap(), &root, &opts).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");

    let forced = BuildOptions {
        force: true,
        ..opts.clone()
    };
    let built = build_node(&NodeProfile::load("h100-80gb").unwrap(), &root, &forced).unwrap();
    assert_eq!(built.state.gpus.len(), 1);
    assert!(
        root.join("dev/keep-me").is_file(),
        "force removed a foreign file"
    );
    assert!(
        !root.join("dev/nvidia1").exists(),
        "stale GPU node of the old build"
    );
    assert!(
        !root.join("dev/nvidia-caps/nvidia-cap147").exists(),
        "stale cap node"
    );
    assert_eq!(
        StateStore::open(&root).unwrap().read().unwrap().gpus.len(),
        1
    );
}

#[test]
fn missing_nvml_library_says_how_to_get_one() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        nvml_library: Some(tmp.path().join("nope.so")),
        ..BuildOptions::default()
    };
    let err = build_node(
        &NodeProfile::load("demo").unwrap(),
        &tmp.path().join("r"),
        &opts,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("tessera-sim-nvml"), "{err}");
    assert!(
        !tmp.path().join("r").exists(),
        "nothing is built when the library is missing"
    );
}

#[test]
fn missing_cuda_library_says_how_to_get_one() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        cuda_library: Some(tmp.path().join("nope.so")),
        ..common::fake_libs(tmp.path())
    };
    let err = build_node(
        &NodeProfile::load("demo").unwrap(),
        &tmp.path().join("r"),
        &opts,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("nope.so"), "{err}");
    assert!(err.contains("cargo build -p tessera-sim-cuda"), "{err}");
    assert!(
        !tmp.path().join("r").exists(),
        "nothing is built when the library is missing"
    );
}

#[test]
fn the_cuda_stand_in_is_installed_as_libcuda_and_util_dir_is_open_to_all() {
    require!(Need::DeviceNodes);
    let (tmp, built) = common::build(&NodeProfile::load("demo").unwrap());
    let lib = built.root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1");
    assert_eq!(built.cuda_library, lib);
    assert_eq!(
        fs::read(&lib).unwrap(),
        fs::read(tmp.path().join("libtessera_sim_cuda.so")).unwrap(),
        "libcuda.so.1 is a copy of the CUDA stand-in"
    );
    assert_eq!(
        fs::metadata(&lib).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let util = fs::metadata(built.root.join(tessera_sim::builder::UTIL_DIR)).unwrap();
    assert!(util.is_dir());
    assert_eq!(util.permissions().mode() & 0o7777, 0o1777);
}

#[test]
fn ensure_cap_nodes_adds_nodes_for_a_new_instance() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("b200").unwrap());
    let (gi, ci) = caps::ensure_cap_nodes(&built.root, 0, 1, 0).unwrap();
    assert_char(&gi, 508, 12, 0o444);
    assert_char(&ci, 508, 13, 0o444);
    // Idempotent.
    caps::ensure_cap_nodes(&built.root, 0, 1, 0).unwrap();
}
