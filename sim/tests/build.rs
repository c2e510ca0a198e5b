//! Building nodes: device nodes, /proc files, libraries, state.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tessera_sim::builder::{BuildOptions, DRIVER_BINARIES, DRIVER_LIBRARIES, Soname, build_node};
use tessera_sim::caps;
use tessera_sim::elf;
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
            "libnvidia-encode.so.1",
            "libnvcuvid.so.1",
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

/// `dlopen`s `path` now and closes it; the loader's message on failure.
fn dlopen(path: &Path) -> Result<(), String> {
    let c_path =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path without NUL");
    // SAFETY: the placeholder objects run no code (no initialisers, no
    // symbols); the handle is closed at once and not used otherwise.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or libc's NUL-terminated message, read at once.
        let e = unsafe { libc::dlerror() };
        return Err(if e.is_null() {
            "dlopen failed".into()
        } else {
            // SAFETY: non-null and NUL-terminated, as above.
            unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned()
        });
    }
    // SAFETY: a handle dlopen just returned, closed once.
    unsafe { libc::dlclose(handle) };
    Ok(())
}

#[test]
fn driver_libraries_are_versioned_elf_objects_with_soname_links() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("h100-80gb").unwrap());
    let lib_dir = built.root.join("usr/lib/x86_64-linux-gnu");
    let version = &built.state.driver_version;
    // The agreed list (8 compute, 3 video, 9 graphics) and what discovery
    // knows besides: the one table of `tessera_model::driver_files`.
    assert_eq!(
        DRIVER_LIBRARIES.len(),
        26,
        "11 compute, 3 video, 12 graphics"
    );
    for library in DRIVER_LIBRARIES {
        let file = lib_dir.join(format!("{}.so.{version}", library.name));
        let meta =
            fs::symlink_metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(meta.is_file(), "{} is a regular file", file.display());
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        let soname = library.soname(version);
        match library.soname {
            Soname::Major(_) => {
                let link = lib_dir.join(&soname);
                assert_eq!(
                    fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display())),
                    Path::new(&format!("{}.so.{version}", library.name)),
                    "{soname} links to the versioned file, relatively"
                );
            }
            Soname::Versioned => assert_eq!(soname, format!("{}.so.{version}", library.name)),
        }
        if matches!(library.name, "libcuda" | "libnvidia-ml") {
            // The fake stand-ins of this test are copied as they are.
            continue;
        }
        let bytes = fs::read(&file).unwrap();
        assert_eq!(
            elf::soname(&bytes).as_deref(),
            Some(soname.as_str()),
            "{}",
            file.display()
        );
        dlopen(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
    // SONAME links of libraries whose SONAME is versioned do not exist.
    assert!(!lib_dir.join("libnvidia-glcore.so.1").exists());
    for tool in DRIVER_BINARIES {
        let path = built.root.join("usr/bin").join(tool);
        let out = std::process::Command::new(&path).output().unwrap();
        assert!(out.status.success(), "{tool}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(version.as_str()),
            "{tool}"
        );
    }
    let smi = std::process::Command::new(built.root.join("usr/bin/nvidia-smi"))
        .arg("-L")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&smi.stdout),
        format!(
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: {})\n",
            built.state.gpus[0].uuid
        )
    );
}

#[test]
fn ldconfig_files_the_placeholders_under_their_sonames() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("demo").unwrap());
    let lib_dir = built.root.join("usr/lib/x86_64-linux-gnu");
    // Remove the links the builder made: ldconfig -n must make the same ones
    // from the SONAMEs it reads out of the files.
    for library in DRIVER_LIBRARIES {
        if let Soname::Major(_) = library.soname
            && !matches!(library.name, "libcuda" | "libnvidia-ml")
        {
            fs::remove_file(lib_dir.join(library.soname(&built.state.driver_version))).unwrap();
        }
    }
    let status = std::process::Command::new("ldconfig")
        .arg("-n")
        .arg(&lib_dir)
        .status()
        .expect("run ldconfig (glibc's, on every Linux host)");
    assert!(status.success());
    for library in DRIVER_LIBRARIES {
        if let Soname::Major(_) = library.soname
            && !matches!(library.name, "libcuda" | "libnvidia-ml")
        {
            let link = lib_dir.join(library.soname(&built.state.driver_version));
            assert_eq!(
                fs::read_link(&link)
                    .unwrap_or_else(|e| panic!("ldconfig made no {}: {e}", link.display())),
                Path::new(&library.file_name(&built.state.driver_version))
            );
        }
    }
}

#[test]
fn probe_order_profile_gives_minors_other_than_the_indexes() {
    require!(Need::DeviceNodes);
    let (_tmp, built) = common::build(&NodeProfile::load("probe-order").unwrap());
    let minors: Vec<(u32, u32, u32)> = built
        .state
        .gpus
        .iter()
        .map(|g| (g.index, g.minor, g.pci_bus()))
        .collect();
    assert_eq!(minors, vec![(0, 2, 0x1b), (1, 0, 0x43), (2, 5, 0x9d)]);
    for gpu in &built.state.gpus {
        assert_char(
            &built.root.join(format!("dev/nvidia{}", gpu.minor)),
            195,
            gpu.minor,
            0o666,
        );
    }
    assert!(!built.root.join("dev/nvidia1").exists());
    // The cap nodes of each instance are keyed by the GPU's minor.
    let h100 = &built.state.gpus[0];
    for gi in &h100.gpu_instances {
        let minor = caps::gi_access_minor(2, gi.id).unwrap();
        assert_char(&caps::cap_node_path(&built.root, minor), 508, minor, 0o444);
    }
    let a100 = &built.state.gpus[2];
    let gi = &a100.gpu_instances[0];
    let minor = caps::ci_access_minor(5, gi.id, gi.compute_instances[0].id).unwrap();
    assert_char(&caps::cap_node_path(&built.root, minor), 508, minor, 0o444);
}
