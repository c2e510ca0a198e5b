//! Golden tests per driver layout: the static spec for a node whose driver is
//! installed the Debian way (`/usr/lib/x86_64-linux-gnu`), the RHEL way
//! (`/usr/lib64`) and the GKE way (an install directory
//! `/home/kubernetes/bin/nvidia` with `lib64/` and `bin/`, device nodes in the
//! host's `/dev`), compared with reviewed files in `tests/golden/layouts/`.
//!
//! Each tree is built here with real files: every library of every group as a
//! real ELF shared object naming its SONAME, the SONAME links a driver install
//! makes, the binaries, GSP firmware and the `nvidia-persistenced` socket. The
//! device nodes are described ([`FakeNodes`]) and NVML is the
//! [`FakeDriver`], so no root and no GPU are needed. The temporary directory
//! is written as `/ROOT`. `TESSERA_BLESS=1` rewrites differing files and fails.

// Helpers of these tests report failures by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use tessera_cdi::writer::{self, Format};
use tessera_driver::devices::{DRIVER_LIBRARIES, FakeNodes, PERSISTENCED_SOCKET};
use tessera_driver::discover::{Layout, discover_in_with};
use tessera_driver::fake::{FakeDriver, FakeGpu};
use tessera_driver::soname::minimal_shared_object;
use tessera_model::edits::HookSettings;
use tessera_model::facts::LibraryGroups;
use tessera_model::mig::Placement;
use tessera_test_support::golden::Goldens;

const VERSION: &str = "550.54.14";
const PROC_DEVICES: &str =
    "Character devices:\n195 nvidia-frontend\n238 nvidia-caps\n505 nvidia-uvm\n\nBlock devices:\n";
const MIG_MINORS: &str = "config 1\nmonitor 2\ngpu2/gi1/access 210\ngpu2/gi1/ci0/access 211\n";

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// A driver install under `root`: libraries in `lib_dir`, binaries in
/// `bin_dir`, firmware, and (when `socket`) the persistenced socket, whose
/// listener must live as long as the tree.
fn install_driver(root: &Path, lib_dir: &str, bin_dir: &str, socket: bool) -> Option<UnixListener> {
    let lib = root.join(lib_dir);
    for library in DRIVER_LIBRARIES {
        let file = library.file_name(VERSION);
        let soname = library.soname(VERSION);
        write(&lib.join(&file), &minimal_shared_object(&soname));
        if soname != file {
            std::os::unix::fs::symlink(&file, lib.join(&soname)).unwrap();
        }
    }
    for tool in [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
    ] {
        write(&root.join(bin_dir).join(tool), b"#!/bin/sh\n");
    }
    for fw in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        write(
            &root.join(format!("lib/firmware/nvidia/{VERSION}/{fw}")),
            b"firmware",
        );
    }
    socket.then(|| {
        let path = root.join(PERSISTENCED_SOCKET);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        UnixListener::bind(path).unwrap()
    })
}

/// The kernel's view: `/proc` files under `root`.
fn install_proc(root: &Path) {
    write(&root.join("proc/devices"), PROC_DEVICES.as_bytes());
    write(
        &root.join("proc/driver/nvidia/version"),
        b"NVRM version: 550.54.14\n",
    );
    write(
        &root.join("proc/driver/nvidia-caps/mig-minors"),
        MIG_MINORS.as_bytes(),
    );
}

/// Device nodes under `dev_root`: two GPUs (minors 0 and 2), the control nodes.
fn nodes(dev_root: &Path) -> FakeNodes {
    FakeNodes::new()
        .with_char_device(dev_root.join("dev/nvidia0"), 195, 0)
        .with_char_device(dev_root.join("dev/nvidia2"), 195, 2)
        .with_char_device(dev_root.join("dev/nvidiactl"), 195, 255)
        .with_char_device(dev_root.join("dev/nvidia-uvm"), 505, 0)
        .with_char_device(dev_root.join("dev/nvidia-uvm-tools"), 505, 1)
}

/// An H100 (index 0, minor 0) and a MIG A100 (index 1, minor 2) with one
/// 1g.5gb device.
fn driver() -> FakeDriver {
    FakeDriver::new()
        .with_gpu(FakeGpu::plain(0, "NVIDIA H100 80GB HBM3", 81559))
        .with_gpu(FakeGpu::a100_40gb(1).with_minor(2))
        .with_mig_device(1, 19, Placement { start: 0, size: 1 })
        .with_driver_version(VERSION)
}

/// The spec for `layout`, its temporary root written as `/ROOT`.
fn spec(layout: &Layout, nodes: &FakeNodes, groups: &str, tmp: &Path) -> String {
    let facts = discover_in_with(layout, &driver(), nodes).unwrap();
    let groups: LibraryGroups = groups.parse().unwrap();
    let spec = tessera_cdi::static_spec(&facts, &HookSettings::default(), &groups).unwrap();
    writer::render(&spec, Format::Json)
        .unwrap()
        .replace(tmp.to_str().unwrap(), "/ROOT")
}

fn goldens() -> Goldens {
    Goldens::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/layouts"))
}

/// A whole system under one root (a plain host's `/`, a driver container's
/// `/run/nvidia/driver`): driver files, `/dev` and `/proc` all under it.
fn single_root(lib_dir: &str) -> (tempfile::TempDir, PathBuf, Option<UnixListener>) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("host");
    let socket = install_driver(&root, lib_dir, "usr/bin", true);
    install_proc(&root);
    (tmp, root, socket)
}

#[test]
fn debian_multiarch_layout() {
    let (tmp, root, _socket) = single_root("usr/lib/x86_64-linux-gnu");
    let layout = Layout::new(&root);
    assert_eq!(
        layout.proc_root, root,
        "the root carries proc/driver/nvidia"
    );
    let mut goldens = goldens();
    goldens.check(
        "debian.json",
        &spec(
            &layout,
            &nodes(&root),
            "compute,video,utilities",
            tmp.path(),
        ),
    );
    goldens.check(
        "debian-all-groups.json",
        &spec(&layout, &nodes(&root), "all", tmp.path()),
    );
    goldens.finish();
}

#[test]
fn rhel_lib64_layout() {
    let (tmp, root, _socket) = single_root("usr/lib64");
    let layout = Layout::new(&root);
    let mut goldens = goldens();
    goldens.check(
        "rhel.json",
        &spec(
            &layout,
            &nodes(&root),
            "compute,video,utilities",
            tmp.path(),
        ),
    );
    goldens.finish();
}

/// `--driver-root /home/kubernetes/bin/nvidia --dev-root /`: the nodes are the
/// host's own (`/dev/nvidia0`, no `hostPath` in the spec), the libraries keep
/// their paths under the install directory (`/lib64/…`, `/bin/…`), and `/proc`
/// is the host's (here a stand-in directory, as `--proc-root` gives it).
#[test]
fn gke_split_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let driver_root = tmp.path().join("home/kubernetes/bin/nvidia");
    install_driver(&driver_root, "lib64", "bin", false);
    let proc_root = tmp.path().join("host-proc");
    install_proc(&proc_root);
    let default = Layout::from_flags(&driver_root, Some(Path::new("/")), None);
    assert_eq!(
        default.proc_root,
        Path::new("/"),
        "an install directory has no proc/driver/nvidia: the host's /proc"
    );
    let layout = Layout::from_flags(&driver_root, Some(Path::new("/")), Some(&proc_root));
    let mut goldens = goldens();
    goldens.check(
        "gke.json",
        &spec(
            &layout,
            &nodes(Path::new("/")),
            "compute,video,utilities",
            tmp.path(),
        ),
    );
    goldens.finish();
}

#[test]
fn every_library_of_the_agreed_list_is_known_with_its_group() {
    use tessera_model::facts::LibraryGroup::{Compute, Graphics, Video};
    let group = |stem: &str| {
        DRIVER_LIBRARIES
            .iter()
            .find(|l| l.stem() == stem)
            .unwrap_or_else(|| panic!("{stem} is not a known driver library"))
            .group
    };
    for stem in [
        "libcuda",
        "libnvidia-ml",
        "libnvidia-ptxjitcompiler",
        "libnvidia-nvvm",
        "libnvidia-gpucomp",
        "libnvidia-cfg",
        "libnvidia-allocator",
        "libnvidia-opencl",
    ] {
        assert_eq!(group(&format!("{stem}.so")), Compute, "{stem}");
    }
    for stem in ["libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow"] {
        assert_eq!(group(&format!("{stem}.so")), Video, "{stem}");
    }
    for stem in [
        "libnvidia-eglcore",
        "libnvidia-glcore",
        "libnvidia-tls",
        "libnvidia-glsi",
        "libEGL_nvidia",
        "libGLX_nvidia",
        "libGLESv2_nvidia",
        "libnvidia-rtcore",
        "libnvoptix",
    ] {
        assert_eq!(group(&format!("{stem}.so")), Graphics, "{stem}");
    }
}
