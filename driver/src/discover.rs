//! Node discovery: everything the edits layer needs to know about a GPU node,
//! found under its [`Layout`]: driver files under the driver root, device nodes
//! under the dev root, `/proc` under the proc root. It only reads: `/proc`,
//! `/dev`, driver files, and the [`GpuDriver`].
//!
//! Device numbers come from the nodes themselves when they exist and from `/proc`
//! otherwise: a CDI spec gives each node's type, major and minor explicitly, so the
//! runtime can create a node the host has not created yet. This matters for the MIG
//! capability nodes `/dev/nvidia-caps/nvidia-cap<m>`, which hosts create lazily;
//! they are never required on disk (major from the `nvidia-caps` line of
//! `/proc/devices`, minor from `/proc/driver/nvidia-caps/mig-minors`).

use std::fs;
use std::path::{Path, PathBuf};

use tessera_model::facts::{CharDevice, GpuFacts, MigDeviceFacts, NodeFacts};
use tessera_model::gpu::GpuInfo;

use crate::devices::{self, DevicesError, HostNodes, NodeStat};
use crate::procfs::{self, MigMinors, ProcDevices, ProcError, io_reason};
use crate::{DriverError, GpuDriver};

/// The major of `/dev/nvidia<minor>` when neither the node nor `/proc/devices` says.
pub const NVIDIA_MAJOR: u32 = 195;

/// Checks that the driver root is a readable directory, so a wrong root is
/// reported as such before anything under it is looked for.
pub fn check_root(root: &Path) -> Result<(), DiscoverError> {
    fs::read_dir(root)
        .map(drop)
        .map_err(|e| DiscoverError::Root {
            path: root.to_path_buf(),
            reason: io_reason(&e),
        })
}

/// Where a node's pieces are. NVIDIA's split layouts put them apart: on GKE the
/// driver files are under `/home/kubernetes/bin/nvidia` (`lib64/`, `bin/`) and
/// the device nodes in the host's `/dev`; under a driver container everything is
/// under `/run/nvidia/driver`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Root of the driver files: libraries, binaries, firmware, the
    /// `nvidia-persistenced` socket.
    pub driver_root: PathBuf,
    /// Root of `dev/`: GPU, control and capability nodes.
    pub dev_root: PathBuf,
    /// Root of `proc/`: `proc/devices`, `proc/driver/nvidia-caps/mig-minors`.
    pub proc_root: PathBuf,
}

/// `proc/driver/nvidia`, whose presence under a driver root says the root
/// carries the driver's `/proc` (a driver container's rbind of `/`, a simulated node).
pub const PROC_DRIVER_NVIDIA: &str = "proc/driver/nvidia";

impl Layout {
    /// Everything under `driver_root`; `/proc` per [`Layout::default_proc_root`].
    pub fn new(driver_root: impl Into<PathBuf>) -> Self {
        let driver_root = driver_root.into();
        Self {
            dev_root: driver_root.clone(),
            proc_root: Self::default_proc_root(&driver_root),
            driver_root,
        }
    }

    /// The layout the flags describe: `dev_root` defaults to the driver root
    /// (as `nvidia-ctk`'s `--dev-root`), `proc_root` to
    /// [`Layout::default_proc_root`].
    pub fn from_flags(
        driver_root: &Path,
        dev_root: Option<&Path>,
        proc_root: Option<&Path>,
    ) -> Self {
        let mut layout = Self::new(driver_root);
        if let Some(dev) = dev_root {
            layout.dev_root = dev.to_path_buf();
        }
        if let Some(proc) = proc_root {
            layout.proc_root = proc.to_path_buf();
        }
        layout
    }

    /// The driver root itself when it holds a `proc/driver/nvidia` directory
    /// (the root is a whole system's view: `/`, a driver container's
    /// `/run/nvidia/driver`, a simulated node), else the host's `/`: `/proc` is
    /// the kernel's, and a driver root that is only an install directory (GKE's
    /// `/home/kubernetes/bin/nvidia`) has none.
    pub fn default_proc_root(driver_root: &Path) -> PathBuf {
        if driver_root.join(PROC_DRIVER_NVIDIA).is_dir() {
            driver_root.to_path_buf()
        } else {
            PathBuf::from("/")
        }
    }
}

/// Errors from [`discover`], one line each.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// The driver root is missing or unreadable.
    #[error("driver root {}: {reason}", .path.display())]
    Root {
        /// The root.
        path: PathBuf,
        /// The operating system's reason, e.g. `No such file or directory`.
        reason: String,
    },
    /// The dev root is missing or unreadable.
    #[error("dev root {}: {reason}", .path.display())]
    DevRoot {
        /// The root.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A `/proc` file is missing where needed, unreadable or corrupt.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// A device node is missing or wrong.
    #[error(transparent)]
    Devices(#[from] DevicesError),
    /// MIG devices exist but `/proc/devices` names no `nvidia-caps` major.
    #[error(
        "{} has no \"nvidia-caps\" line, but GPU {gpu} has MIG devices (is the nvidia-caps module loaded?)",
        .path.display()
    )]
    CapsMajorMissing {
        /// `/proc/devices` under the root.
        path: PathBuf,
        /// Index of the GPU with MIG devices.
        gpu: u32,
    },
    /// `mig-minors` has no line for a capability a MIG device needs.
    #[error("{} has no minor for {cap:?}, needed by MIG device {mig_index} of GPU {gpu}", .path.display())]
    CapMinorMissing {
        /// `mig-minors` under the root.
        path: PathBuf,
        /// The capability path, e.g. `gpu0/gi3/access`.
        cap: String,
        /// GPU index.
        gpu: u32,
        /// MIG device index under the GPU.
        mig_index: u32,
    },
    /// The GPU driver failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

/// Finds the node's facts under `root` (use `/` on a plain host): [`discover_in`]
/// with [`Layout::new`].
pub fn discover(root: &Path, driver: &dyn GpuDriver) -> Result<NodeFacts, DiscoverError> {
    discover_in(&Layout::new(root), driver)
}

/// [`discover`], with the device nodes as `nodes` sees them (tests describe
/// them with [`FakeNodes`](devices::FakeNodes) instead of making them).
pub fn discover_with(
    root: &Path,
    driver: &dyn GpuDriver,
    nodes: &dyn NodeStat,
) -> Result<NodeFacts, DiscoverError> {
    discover_in_with(&Layout::new(root), driver, nodes)
}

/// Finds the node's facts in `layout`.
///
/// GPUs come in index order, each with its node `/dev/nvidia<minor>` and, when MIG
/// is enabled, its MIG devices with their GI and CI capability nodes (keyed by the
/// GPU's **minor** number in `mig-minors`, not its index). Then the control nodes
/// ([`devices::control_nodes`]: `nvidiactl` required) and the driver files of
/// every group ([`devices::driver_files`]). A failing driver-version query is
/// logged and leaves the version unknown; every other driver error fails discovery.
pub fn discover_in(layout: &Layout, driver: &dyn GpuDriver) -> Result<NodeFacts, DiscoverError> {
    discover_in_with(layout, driver, &HostNodes)
}

/// [`discover_in`], with the device nodes as `nodes` sees them.
pub fn discover_in_with(
    layout: &Layout,
    driver: &dyn GpuDriver,
    nodes: &dyn NodeStat,
) -> Result<NodeFacts, DiscoverError> {
    check_root(&layout.driver_root)?;
    if layout.dev_root != layout.driver_root {
        fs::read_dir(&layout.dev_root)
            .map(drop)
            .map_err(|e| DiscoverError::DevRoot {
                path: layout.dev_root.clone(),
                reason: io_reason(&e),
            })?;
    }
    let (root, dev, proc) = (
        layout.driver_root.as_path(),
        layout.dev_root.as_path(),
        layout.proc_root.as_path(),
    );

    let proc_devices = match ProcDevices::read(proc) {
        Ok(d) => Some(d),
        Err(ProcError::Missing { path }) => {
            tracing::warn!(path = %path.display(), "missing; using default device majors");
            None
        }
        Err(e) => return Err(e.into()),
    };

    let driver_version = match driver.driver_version() {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e, "driver version unknown");
            None
        }
    };

    let mut gpus = driver.gpus()?;
    gpus.sort_by_key(|g| g.index);

    let mut mig_minors: Option<MigMinors> = None;
    let mut facts = Vec::with_capacity(gpus.len());
    for info in gpus {
        let node = gpu_node(dev, &info, proc_devices.as_ref(), nodes)?;
        let mig_devices = if info.mig_enabled() {
            let devices = driver.mig_devices(info.index)?;
            if devices.is_empty() {
                Vec::new()
            } else {
                let caps_major = caps_major(proc, proc_devices.as_ref(), info.index)?;
                // Read once, and only when some GPU has MIG devices.
                let minors = match mig_minors.take() {
                    Some(m) => m,
                    None => MigMinors::read(proc)?,
                };
                let devices = devices
                    .into_iter()
                    .map(|device| mig_device_facts(dev, proc, &info, device, caps_major, &minors))
                    .collect::<Result<Vec<_>, _>>()?;
                mig_minors = Some(minors);
                devices
            }
        } else {
            Vec::new()
        };
        facts.push(GpuFacts {
            info,
            node,
            mig_devices,
        });
    }

    let control_nodes = devices::control_nodes(dev, nodes)?;
    let libraries = devices::driver_files(root, driver_version.as_deref());
    Ok(NodeFacts {
        driver_version,
        gpus: facts,
        control_nodes,
        libraries,
    })
}

/// `/dev/nvidia<minor>`: the node's own numbers when it exists, else the `nvidia`
/// major from `/proc/devices` (or 195) and the driver's minor.
fn gpu_node(
    root: &Path,
    info: &GpuInfo,
    proc_devices: Option<&ProcDevices>,
    nodes: &dyn NodeStat,
) -> Result<CharDevice, DiscoverError> {
    if let Some(node) = devices::gpu_node(root, info.minor, nodes)? {
        if node.minor != info.minor {
            tracing::warn!(
                path = %node.host_path,
                node_minor = node.minor,
                driver_minor = info.minor,
                "GPU node's minor differs from the driver's; using the node's"
            );
        }
        return Ok(node);
    }
    let major = proc_devices
        .and_then(ProcDevices::nvidia)
        .unwrap_or(NVIDIA_MAJOR);
    let rel = format!("dev/nvidia{}", info.minor);
    tracing::debug!(
        gpu = info.index,
        major,
        "GPU node not on disk; using numbers from /proc"
    );
    Ok(CharDevice {
        container_path: format!("/{rel}"),
        host_path: root.join(&rel).display().to_string(),
        major,
        minor: info.minor,
    })
}

fn caps_major(
    root: &Path,
    proc_devices: Option<&ProcDevices>,
    gpu: u32,
) -> Result<u32, DiscoverError> {
    let path = root.join(procfs::PROC_DEVICES);
    let Some(proc_devices) = proc_devices else {
        return Err(ProcError::Missing { path }.into());
    };
    proc_devices
        .nvidia_caps()
        .ok_or(DiscoverError::CapsMajorMissing { path, gpu })
}

fn cap_node(root: &Path, major: u32, minor: u32) -> CharDevice {
    let rel = format!("dev/nvidia-caps/nvidia-cap{minor}");
    CharDevice {
        container_path: format!("/{rel}"),
        host_path: root.join(&rel).display().to_string(),
        major,
        minor,
    }
}

fn mig_device_facts(
    dev_root: &Path,
    proc_root: &Path,
    gpu: &GpuInfo,
    device: tessera_model::gpu::MigDevice,
    caps_major: u32,
    minors: &MigMinors,
) -> Result<MigDeviceFacts, DiscoverError> {
    let (g, gi, ci) = (
        gpu.minor,
        device.gpu_instance_id,
        device.compute_instance_id,
    );
    let missing = |cap: String| DiscoverError::CapMinorMissing {
        path: proc_root.join(procfs::MIG_MINORS),
        cap,
        gpu: gpu.index,
        mig_index: device.mig_index,
    };
    let gi_minor = minors
        .gi_access(g, gi)
        .ok_or_else(|| missing(format!("gpu{g}/gi{gi}/access")))?;
    let ci_minor = minors
        .ci_access(g, gi, ci)
        .ok_or_else(|| missing(format!("gpu{g}/gi{gi}/ci{ci}/access")))?;
    Ok(MigDeviceFacts {
        device,
        gi_cap: cap_node(dev_root, caps_major, gi_minor),
        ci_cap: cap_node(dev_root, caps_major, ci_minor),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::FakeNodes;
    use crate::fake::{FakeDriver, FakeGpu};
    use tessera_model::mig::Placement;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n238 nvidia-caps\n505 nvidia-uvm\n\nBlock devices:\n  8 sd\n";

    /// A fixture node: files on disk under a temp root, device nodes described.
    struct Node {
        dir: tempfile::TempDir,
        nodes: FakeNodes,
    }

    impl Node {
        fn path(&self) -> &Path {
            self.dir.path()
        }

        fn discover(&self, driver: &dyn GpuDriver) -> Result<NodeFacts, DiscoverError> {
            discover_with(self.path(), driver, &self.nodes)
        }
    }

    /// A fixture root: two GPUs (minors 0 and 2), control nodes, /proc files, libraries.
    fn node_root() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let nodes = FakeNodes::new()
            .with_char_device(r.join("dev/nvidia0"), 195, 0)
            .with_char_device(r.join("dev/nvidia2"), 195, 2)
            .with_char_device(r.join("dev/nvidiactl"), 195, 255)
            .with_char_device(r.join("dev/nvidia-uvm"), 505, 0)
            .with_char_device(r.join("dev/nvidia-uvm-tools"), 505, 1);
        write(r, "proc/devices", PROC_DEVICES);
        // A whole system's view: its /proc is the driver root's (Layout::new).
        write(r, "proc/driver/nvidia/version", "NVRM version: 550.54.14\n");
        write(
            r,
            "proc/driver/nvidia-caps/mig-minors",
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
             gpu2/gi1/access 210\ngpu2/gi1/ci0/access 211\ngpu2/gi2/access 219\ngpu2/gi2/ci0/access 220\n",
        );
        write(r, "usr/lib/x86_64-linux-gnu/libcuda.so.1", "");
        write(r, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "");
        write(r, "usr/bin/nvidia-smi", "");
        Node { dir, nodes }
    }

    fn p(start: u32, size: u32) -> Placement {
        Placement { start, size }
    }

    #[test]
    fn mig_instance_brings_its_two_cap_nodes() {
        let root = node_root();
        let r = root.path();
        // GPU index 1 has minor 2: caps are keyed by the minor.
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::plain(0, "NVIDIA T4", 15360))
            .with_gpu(FakeGpu::a100_40gb(1).with_minor(2))
            .with_mig_device(1, 9, p(4, 4))
            .with_mig_device(1, 19, p(0, 1));
        let facts = root.discover(&driver).unwrap();

        assert_eq!(facts.driver_version.as_deref(), Some("550.54.14"));
        assert_eq!(facts.gpus.len(), 2);
        let g0 = &facts.gpus[0];
        assert_eq!(g0.node.container_path, "/dev/nvidia0");
        assert!(g0.mig_devices.is_empty());

        let g1 = &facts.gpus[1];
        assert_eq!(g1.node.container_path, "/dev/nvidia2");
        assert_eq!(
            g1.node.host_path,
            r.join("dev/nvidia2").display().to_string()
        );
        assert_eq!((g1.node.major, g1.node.minor), (195, 2));
        assert_eq!(g1.mig_devices.len(), 2);
        let m0 = &g1.mig_devices[0];
        assert_eq!(m0.device.gpu_instance_id, 1);
        assert_eq!(m0.device.profile, "3g.20gb");
        assert_eq!(m0.gi_cap.container_path, "/dev/nvidia-caps/nvidia-cap210");
        assert_eq!(
            m0.gi_cap.host_path,
            r.join("dev/nvidia-caps/nvidia-cap210")
                .display()
                .to_string()
        );
        assert_eq!((m0.gi_cap.major, m0.gi_cap.minor), (238, 210));
        assert_eq!((m0.ci_cap.major, m0.ci_cap.minor), (238, 211));
        let m1 = &g1.mig_devices[1];
        assert_eq!((m1.gi_cap.minor, m1.ci_cap.minor), (219, 220));
        assert!(
            !r.join("dev/nvidia-caps").exists(),
            "cap nodes are not required on disk"
        );

        let ctl: Vec<_> = facts
            .control_nodes
            .iter()
            .map(|n| (n.container_path.as_str(), n.major, n.minor))
            .collect();
        assert_eq!(
            ctl,
            [
                ("/dev/nvidiactl", 195, 255),
                ("/dev/nvidia-uvm", 505, 0),
                ("/dev/nvidia-uvm-tools", 505, 1)
            ]
        );
        let libs: Vec<_> = facts
            .libraries
            .iter()
            .map(|f| f.container_path.as_str())
            .collect();
        assert_eq!(
            libs,
            [
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "/usr/bin/nvidia-smi"
            ]
        );
        // Discovery only reads.
        assert!(
            driver
                .calls()
                .iter()
                .all(|c| !c.starts_with("create") && !c.starts_with("destroy")),
            "{:?}",
            driver.calls()
        );
    }

    #[test]
    fn a_gpu_node_missing_on_disk_takes_numbers_from_proc() {
        let root = node_root();
        let driver =
            FakeDriver::new().with_gpu(FakeGpu::plain(0, "NVIDIA T4", 15360).with_minor(5));
        let facts = root.discover(&driver).unwrap();
        let node = &facts.gpus[0].node;
        assert_eq!(node.container_path, "/dev/nvidia5");
        assert_eq!((node.major, node.minor), (195, 5));
    }

    #[test]
    fn a_missing_root_is_one_line() {
        let driver = FakeDriver::new();
        let err = discover(Path::new("/nonexistent-tessera-root"), &driver).unwrap_err();
        assert_eq!(
            err.to_string(),
            "driver root /nonexistent-tessera-root: No such file or directory"
        );
        assert!(
            driver.calls().is_empty(),
            "the driver is not asked before the root is checked"
        );
    }

    /// Discovery on the fixture root with `file` rewritten to `text`, for an
    /// A100 with one MIG device; the root is kept alive for the error's paths.
    fn one_mig_device_with_file(file: &str, text: &str) -> (Node, DiscoverError) {
        let root = node_root();
        write(root.path(), file, text);
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::a100_40gb(0))
            .with_mig_device(0, 19, p(0, 1));
        let err = root.discover(&driver).unwrap_err();
        (root, err)
    }

    #[test]
    fn corrupt_mig_minors_names_file_and_line() {
        let (root, err) = one_mig_device_with_file(
            "proc/driver/nvidia-caps/mig-minors",
            "config 1\ngpu0/gi1/access\n",
        );
        assert_eq!(
            err.to_string(),
            format!(
                r#"{}/proc/driver/nvidia-caps/mig-minors line 2: expected "<cap> <minor>", found "gpu0/gi1/access""#,
                root.path().display()
            )
        );
    }

    #[test]
    fn mig_minors_is_not_needed_without_mig_devices() {
        let root = node_root();
        fs::remove_file(root.path().join("proc/driver/nvidia-caps/mig-minors")).unwrap();
        let driver = FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0));
        let facts = root.discover(&driver).unwrap();
        assert!(facts.gpus[0].mig_devices.is_empty());

        let driver = driver.with_mig_device(0, 19, p(0, 1));
        let err = root.discover(&driver).unwrap_err();
        assert!(
            matches!(err, DiscoverError::Proc(ProcError::Missing { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn an_unknown_cap_minor_is_an_error() {
        let root = node_root();
        // GI ids 1 and 2 exist in the fixture; a third GI gets id 3.
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::a100_40gb(0))
            .with_mig_device(0, 19, p(0, 1))
            .with_mig_device(0, 19, p(1, 1))
            .with_mig_device(0, 19, p(2, 1));
        let err = root.discover(&driver).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                r#"{}/proc/driver/nvidia-caps/mig-minors has no minor for "gpu0/gi2/access", needed by MIG device 1 of GPU 0"#,
                root.path().display()
            )
        );
    }

    #[test]
    fn caps_major_missing_while_mig_devices_exist() {
        let (_root, err) = one_mig_device_with_file(
            "proc/devices",
            "Character devices:\n195 nvidia\n505 nvidia-uvm\n",
        );
        assert!(
            matches!(err, DiscoverError::CapsMajorMissing { gpu: 0, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(r#"has no "nvidia-caps" line"#),
            "{err}"
        );
    }

    #[test]
    fn driver_errors_are_wrapped() {
        let root = node_root();
        let driver = FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0));
        driver.fail_next(
            "mig_devices",
            DriverError::Call {
                call: "nvmlDeviceGetMaxMigDeviceCount",
                reason: "gpu 0: Unknown Error".into(),
            },
        );
        let err = root.discover(&driver).unwrap_err();
        assert!(matches!(err, DiscoverError::Driver(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "nvmlDeviceGetMaxMigDeviceCount failed: gpu 0: Unknown Error"
        );
    }

    #[test]
    fn a_missing_nvidiactl_fails_discovery() {
        let mut root = node_root();
        let ctl = root.path().join("dev/nvidiactl");
        root.nodes = root.nodes.without(&ctl);
        let err = root.discover(&FakeDriver::new()).unwrap_err();
        assert!(
            matches!(err, DiscoverError::Devices(DevicesError::Missing { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn proc_is_under_the_driver_root_only_when_the_root_carries_the_driver_s_proc() {
        let node = node_root();
        assert_eq!(Layout::new(node.path()).proc_root, node.path());
        let install = tempfile::tempdir().unwrap();
        write(install.path(), "lib64/libcuda.so.1", "");
        let layout = Layout::new(install.path());
        assert_eq!(layout.proc_root, Path::new("/"));
        assert_eq!(layout.dev_root, install.path());
        let layout = Layout::from_flags(install.path(), Some(Path::new("/")), Some(node.path()));
        assert_eq!(
            (layout.dev_root.as_path(), layout.proc_root.as_path()),
            (Path::new("/"), node.path())
        );
    }

    /// GKE's split: driver files in an install directory (`lib64/`, `bin/`),
    /// device nodes and /proc elsewhere.
    #[test]
    fn a_split_layout_takes_nodes_proc_and_files_from_their_own_roots() {
        let system = node_root();
        let install = tempfile::tempdir().unwrap();
        let i = install.path();
        fs::create_dir_all(i.join("lib64")).unwrap();
        fs::write(
            i.join("lib64/libcuda.so.550.54.14"),
            crate::soname::minimal_shared_object("libcuda.so.1"),
        )
        .unwrap();
        write(i, "bin/nvidia-smi", "");
        let layout = Layout {
            driver_root: i.to_path_buf(),
            dev_root: system.path().to_path_buf(),
            proc_root: system.path().to_path_buf(),
        };
        let driver = FakeDriver::new()
            .with_gpu(FakeGpu::a100_40gb(0).with_minor(2))
            .with_mig_device(0, 19, p(0, 1));
        let facts = discover_in_with(&layout, &driver, &system.nodes).unwrap();
        let gpu = &facts.gpus[0];
        assert_eq!(
            gpu.node.host_path,
            system.path().join("dev/nvidia2").display().to_string()
        );
        // Cap minors from the proc root's mig-minors, nodes under the dev root.
        let mig = &gpu.mig_devices[0];
        assert_eq!((mig.gi_cap.major, mig.gi_cap.minor), (238, 210));
        assert!(
            mig.gi_cap
                .host_path
                .starts_with(&system.path().display().to_string())
        );
        assert_eq!(facts.control_nodes[0].container_path, "/dev/nvidiactl");
        let libs: Vec<(&str, &str)> = facts
            .libraries
            .iter()
            .map(|f| (f.container_path.as_str(), f.host_path.as_str()))
            .collect();
        let host = |rel: &str| i.join(rel).display().to_string();
        assert_eq!(
            libs,
            [
                (
                    "/lib64/libcuda.so.550.54.14",
                    host("lib64/libcuda.so.550.54.14").as_str()
                ),
                (
                    "/lib64/libcuda.so.1",
                    host("lib64/libcuda.so.550.54.14").as_str()
                ),
                ("/bin/nvidia-smi", host("bin/nvidia-smi").as_str()),
            ]
        );
    }

    #[test]
    fn a_missing_dev_root_is_one_line() {
        let node = node_root();
        let layout =
            Layout::from_flags(node.path(), Some(Path::new("/nonexistent-dev-root")), None);
        let err = discover_in_with(&layout, &FakeDriver::new(), &node.nodes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "dev root /nonexistent-dev-root: No such file or directory"
        );
    }
}
