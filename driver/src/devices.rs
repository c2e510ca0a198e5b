//! Device nodes and driver files under a driver root.
//!
//! Every path is looked up under a configurable root (`/` on a plain host,
//! `/run/nvidia/driver` under a driver container, a temp dir in tests, the
//! simulated node's directory). A found file has two names: its **container
//! path**, the path relative to the root made absolute
//! (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`), and its **host path**, the root
//! joined with it. With root `/` both are equal.
//!
//! Host paths are not resolved: a symlink stays a symlink, and is followed on the
//! host when the runtime bind-mounts it (an absolute link target inside a non-`/`
//! driver root therefore points at the host's file, not the root's).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use tessera_model::facts::{CharDevice, HostFile};

use crate::DriverError;
use crate::procfs::io_reason;

/// Library directories searched, in order, relative to the root.
pub const LIBRARY_DIRS: &[&str] = &["usr/lib/x86_64-linux-gnu", "usr/lib64", "lib64", "usr/lib"];

/// Driver libraries a CUDA container needs, by soname.
///
/// NVML, the CUDA driver and its JIT/NVVM compilers, the allocator and config
/// libraries, OpenCL and the CUDA debugger. Each is looked up in every
/// [`LIBRARY_DIRS`] entry in order; the first hit wins and missing ones are skipped.
pub const LIBRARIES: &[&str] = &[
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-allocator.so.1",
    "libnvidia-cfg.so.1",
    "libnvidia-opencl.so.1",
    "libcudadebugger.so.1",
];

/// Libraries whose only name carries the driver version (`<name>.<version>`), found
/// only when the driver version is known: `libnvidia-gpucomp.so.550.54.14`.
pub const VERSIONED_LIBRARIES: &[&str] = &["libnvidia-gpucomp.so"];

/// Directory of the driver tools, relative to the root.
pub const TOOL_DIR: &str = "usr/bin";

/// Driver tools bound into containers when present.
pub const TOOLS: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// The NVML library's soname.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Errors finding device nodes.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    /// A node that must exist does not.
    #[error("{}: device node missing (is the NVIDIA driver loaded, and is the driver root right?)", .path.display())]
    Missing {
        /// The node, under the root.
        path: PathBuf,
    },
    /// The path exists but is not a character device.
    #[error("{}: not a character device", .path.display())]
    NotCharDevice {
        /// The path, under the root.
        path: PathBuf,
    },
    /// The node could not be examined.
    #[error("{}: {reason}", .path.display())]
    Stat {
        /// The path, under the root.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
}

/// The container path of a path relative to the root: `/` + relative.
fn container_path(rel: &str) -> String {
    format!("/{}", rel.trim_start_matches('/'))
}

/// The host path of a path relative to the root.
fn host_path(root: &Path, rel: &str) -> PathBuf {
    root.join(rel.trim_start_matches('/'))
}

/// What is at a path, as far as finding device nodes goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A character device with these numbers.
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// Anything else: a regular file, a directory, a block device, …
    Other,
}

/// Says what is at a path (following symlinks): the one place device
/// discovery meets the filesystem's device nodes, so tests can describe
/// nodes ([`FakeNodes`]) instead of making them, which needs root.
pub trait NodeStat {
    /// What is at `path`; `Ok(None)` when nothing is.
    fn stat(&self, path: &Path) -> io::Result<Option<NodeKind>>;
}

/// The host's filesystem: `stat(2)`; major and minor come from the node itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostNodes;

impl NodeStat for HostNodes {
    fn stat(&self, path: &Path) -> io::Result<Option<NodeKind>> {
        match fs::metadata(path) {
            Ok(meta) if meta.file_type().is_char_device() => {
                let rdev = meta.rdev();
                Ok(Some(NodeKind::CharDevice {
                    major: libc::major(rdev),
                    minor: libc::minor(rdev),
                }))
            }
            Ok(_) => Ok(Some(NodeKind::Other)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Device nodes described in memory, for tests: each path added holds what
/// it was added as; every other path holds nothing.
#[derive(Debug, Clone, Default)]
pub struct FakeNodes {
    nodes: HashMap<PathBuf, NodeKind>,
}

impl FakeNodes {
    /// No nodes at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a character device `major:minor` at `path` (a host path: the
    /// root joined with the node's path).
    pub fn with_char_device(mut self, path: impl Into<PathBuf>, major: u32, minor: u32) -> Self {
        self.nodes
            .insert(path.into(), NodeKind::CharDevice { major, minor });
        self
    }

    /// Puts something that is not a character device at `path`.
    pub fn with_other(mut self, path: impl Into<PathBuf>) -> Self {
        self.nodes.insert(path.into(), NodeKind::Other);
        self
    }

    /// Removes whatever is at `path`.
    pub fn without(mut self, path: &Path) -> Self {
        self.nodes.remove(path);
        self
    }
}

impl NodeStat for FakeNodes {
    fn stat(&self, path: &Path) -> io::Result<Option<NodeKind>> {
        Ok(self.nodes.get(path).copied())
    }
}

/// [`char_device_with`] on the host's filesystem.
pub fn char_device(root: &Path, rel: &str) -> Result<Option<CharDevice>, DevicesError> {
    char_device_with(root, rel, &HostNodes)
}

/// The character device at `rel` (e.g. `dev/nvidia0`) under `root`, as `nodes`
/// sees it.
///
/// `Ok(None)` when nothing is there; an error when something else than a character
/// device is there or stat fails otherwise. Major and minor come from the node itself.
pub fn char_device_with(
    root: &Path,
    rel: &str,
    nodes: &dyn NodeStat,
) -> Result<Option<CharDevice>, DevicesError> {
    let path = host_path(root, rel);
    let (major, minor) = match nodes.stat(&path) {
        Ok(None) => return Ok(None),
        Ok(Some(NodeKind::CharDevice { major, minor })) => (major, minor),
        Ok(Some(NodeKind::Other)) => return Err(DevicesError::NotCharDevice { path }),
        Err(e) => {
            return Err(DevicesError::Stat {
                path,
                reason: io_reason(&e),
            });
        }
    };
    Ok(Some(CharDevice {
        container_path: container_path(rel),
        host_path: path.display().to_string(),
        major,
        minor,
    }))
}

/// The GPU's node `dev/nvidia<minor>` under `root`, if it exists.
pub fn gpu_node(
    root: &Path,
    minor: u32,
    nodes: &dyn NodeStat,
) -> Result<Option<CharDevice>, DevicesError> {
    char_device_with(root, &format!("dev/nvidia{minor}"), nodes)
}

/// The nodes every GPU container needs: `/dev/nvidiactl`, `/dev/nvidia-uvm`,
/// `/dev/nvidia-uvm-tools`, in that order.
///
/// `nvidiactl` is created when the driver loads, so its absence means no driver (or
/// a wrong root): an error. The uvm nodes appear only once `nvidia-uvm` is loaded
/// (often lazily, by `nvidia-modprobe`), so a missing one is skipped with a warning.
pub fn control_nodes(root: &Path, nodes: &dyn NodeStat) -> Result<Vec<CharDevice>, DevicesError> {
    let mut found = Vec::with_capacity(3);
    match char_device_with(root, "dev/nvidiactl", nodes)? {
        Some(ctl) => found.push(ctl),
        None => {
            return Err(DevicesError::Missing {
                path: host_path(root, "dev/nvidiactl"),
            });
        }
    }
    for rel in ["dev/nvidia-uvm", "dev/nvidia-uvm-tools"] {
        match char_device_with(root, rel, nodes)? {
            Some(node) => found.push(node),
            None => tracing::warn!(
                path = %host_path(root, rel).display(),
                "device node missing (nvidia-uvm not loaded yet?); containers will not get it"
            ),
        }
    }
    Ok(found)
}

/// True when `path` leads (through symlinks) to a regular file.
fn is_file(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Finds `name` in the first of [`LIBRARY_DIRS`] under `root` holding it.
fn find_library(root: &Path, name: &str) -> Option<HostFile> {
    LIBRARY_DIRS.iter().find_map(|dir| {
        let rel = format!("{dir}/{name}");
        let host = host_path(root, &rel);
        is_file(&host).then(|| HostFile {
            host_path: host.display().to_string(),
            container_path: container_path(&rel),
        })
    })
}

/// The driver libraries ([`LIBRARIES`], then [`VERSIONED_LIBRARIES`] when
/// `driver_version` is known) and tools ([`TOOLS`] in [`TOOL_DIR`]) present under
/// `root`, in list order. Missing ones are skipped (logged at debug level).
pub fn driver_files(root: &Path, driver_version: Option<&str>) -> Vec<HostFile> {
    let mut files = Vec::new();
    let versioned = driver_version
        .filter(|v| !v.is_empty() && !v.contains('/'))
        .map(|v| {
            VERSIONED_LIBRARIES
                .iter()
                .map(|name| format!("{name}.{v}"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let names = LIBRARIES.iter().map(|s| s.to_string()).chain(versioned);
    for name in names {
        match find_library(root, &name) {
            Some(file) => files.push(file),
            None => {
                tracing::debug!(library = %name, root = %root.display(), "driver library not found")
            }
        }
    }
    for tool in TOOLS {
        let rel = format!("{TOOL_DIR}/{tool}");
        let host = host_path(root, &rel);
        if is_file(&host) {
            files.push(HostFile {
                host_path: host.display().to_string(),
                container_path: container_path(&rel),
            });
        } else {
            tracing::debug!(tool, root = %root.display(), "driver tool not found");
        }
    }
    files
}

/// The host path of `libnvidia-ml.so.1` under `root`: the first of [`LIBRARY_DIRS`]
/// holding it, ready for [`NvmlDriver::load`](crate::nvml::NvmlDriver::load).
pub fn find_nvml_library(root: &Path) -> Result<PathBuf, DriverError> {
    LIBRARY_DIRS
        .iter()
        .map(|dir| host_path(root, &format!("{dir}/{NVML_LIBRARY}")))
        .find(|p| is_file(p))
        .ok_or_else(|| DriverError::Load {
            path: root.display().to_string(),
            reason: format!(
                "{NVML_LIBRARY} not found in any of {} under the root",
                LIBRARY_DIRS.join(", ")
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes a character device node with the `mknod` tool (root only).
    fn mknod(path: &Path, major: u32, minor: u32) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let status = std::process::Command::new("mknod")
            .arg(path)
            .arg("c")
            .arg(major.to_string())
            .arg(minor.to_string())
            .status()
            .expect("run mknod");
        assert!(
            status.success(),
            "mknod {} c {major} {minor} failed",
            path.display()
        );
    }

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    #[test]
    fn char_device_reads_numbers_from_the_node() {
        let root = Path::new("/node");
        let nodes = FakeNodes::new().with_char_device(root.join("dev/nvidia3"), 195, 3);
        let node = gpu_node(root, 3, &nodes).unwrap().unwrap();
        assert_eq!(node.container_path, "/dev/nvidia3");
        assert_eq!(node.host_path, "/node/dev/nvidia3");
        assert_eq!((node.major, node.minor), (195, 3));
        assert_eq!(gpu_node(root, 4, &nodes).unwrap(), None);
    }

    #[test]
    fn host_nodes_read_numbers_from_real_nodes() {
        // Every Linux system has /dev/null, 1:3.
        assert_eq!(
            HostNodes.stat(Path::new("/dev/null")).unwrap(),
            Some(NodeKind::CharDevice { major: 1, minor: 3 })
        );
        let root = tempfile::tempdir().unwrap();
        touch(&root.path().join("dev/file"));
        assert_eq!(
            HostNodes.stat(&root.path().join("dev/file")).unwrap(),
            Some(NodeKind::Other)
        );
        assert_eq!(HostNodes.stat(&root.path().join("dev/none")).unwrap(), None);
    }

    #[test]
    fn host_nodes_decode_majors_past_255() {
        // Only a node made here has such a major everywhere; making one needs root.
        tessera_test_support::require!(tessera_test_support::Need::DeviceNodes);
        let root = tempfile::tempdir().unwrap();
        mknod(&root.path().join("dev/nvidia-uvm-tools"), 505, 1);
        let node = char_device(root.path(), "dev/nvidia-uvm-tools")
            .unwrap()
            .unwrap();
        assert_eq!((node.major, node.minor), (505, 1));
    }

    #[test]
    fn a_regular_file_is_not_a_device_node() {
        let root = tempfile::tempdir().unwrap();
        touch(&root.path().join("dev/nvidia0"));
        for nodes in [
            &HostNodes as &dyn NodeStat,
            &FakeNodes::new().with_other(root.path().join("dev/nvidia0")),
        ] {
            let err = gpu_node(root.path(), 0, nodes).unwrap_err();
            assert!(matches!(err, DevicesError::NotCharDevice { .. }), "{err:?}");
            assert!(
                err.to_string()
                    .ends_with("dev/nvidia0: not a character device"),
                "{err}"
            );
        }
    }

    #[test]
    fn control_nodes_need_nvidiactl_and_skip_missing_uvm() {
        let root = Path::new("/node");
        let nodes = FakeNodes::new();
        let err = control_nodes(root, &nodes).unwrap_err();
        assert!(matches!(err, DevicesError::Missing { .. }), "{err:?}");

        let nodes = nodes.with_char_device(root.join("dev/nvidiactl"), 195, 255);
        let found = control_nodes(root, &nodes).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].container_path, "/dev/nvidiactl");
        assert_eq!((found[0].major, found[0].minor), (195, 255));

        let nodes = nodes
            .with_char_device(root.join("dev/nvidia-uvm"), 505, 0)
            .with_char_device(root.join("dev/nvidia-uvm-tools"), 505, 1);
        let found = control_nodes(root, &nodes).unwrap();
        let paths: Vec<_> = found.iter().map(|n| n.container_path.as_str()).collect();
        assert_eq!(
            paths,
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert_eq!((found[2].major, found[2].minor), (505, 1));
    }

    #[test]
    fn driver_files_have_container_and_host_paths() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        touch(&r.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"));
        std::os::unix::fs::symlink(
            "libcuda.so.550.54.14",
            r.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        )
        .unwrap();
        touch(&r.join("usr/lib64/libnvidia-ml.so.1"));
        // A later directory never shadows an earlier one.
        touch(&r.join("usr/lib/libnvidia-ml.so.1"));
        touch(&r.join("lib64/libnvidia-gpucomp.so.550.54.14"));
        touch(&r.join("lib64/libnvidia-gpucomp.so.535.00.00"));
        touch(&r.join("usr/bin/nvidia-smi"));
        // A dangling link is not a library.
        std::os::unix::fs::symlink("nowhere", r.join("usr/lib/libnvidia-cfg.so.1")).unwrap();

        let files = driver_files(r, Some("550.54.14"));
        let pairs: Vec<(String, String)> = files
            .iter()
            .map(|f| (f.container_path.clone(), f.host_path.clone()))
            .collect();
        let host = |rel: &str| r.join(rel).display().to_string();
        assert_eq!(
            pairs,
            [
                (
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_string(),
                    host("usr/lib/x86_64-linux-gnu/libcuda.so.1")
                ),
                (
                    "/usr/lib64/libnvidia-ml.so.1".to_string(),
                    host("usr/lib64/libnvidia-ml.so.1")
                ),
                (
                    "/lib64/libnvidia-gpucomp.so.550.54.14".to_string(),
                    host("lib64/libnvidia-gpucomp.so.550.54.14")
                ),
                (
                    "/usr/bin/nvidia-smi".to_string(),
                    host("usr/bin/nvidia-smi")
                ),
            ]
        );

        let without_version = driver_files(r, None);
        assert_eq!(without_version.len(), 3, "{without_version:?}");
    }

    #[test]
    fn root_slash_gives_equal_host_and_container_paths() {
        assert_eq!(
            host_path(Path::new("/"), "usr/lib64/libcuda.so.1"),
            Path::new("/usr/lib64/libcuda.so.1")
        );
        assert_eq!(
            container_path("usr/lib64/libcuda.so.1"),
            "/usr/lib64/libcuda.so.1"
        );
        // Whatever the host has, every file found under `/` has equal paths.
        for f in driver_files(Path::new("/"), None) {
            assert_eq!(f.host_path, f.container_path);
        }
        let node = char_device(Path::new("/"), "dev/null")
            .unwrap()
            .expect("/dev/null is a character device");
        assert_eq!(node.host_path, "/dev/null");
        assert_eq!(node.container_path, "/dev/null");
        assert_eq!((node.major, node.minor), (1, 3));
    }

    #[test]
    fn find_nvml_library_takes_the_first_directory() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let err = find_nvml_library(r).unwrap_err();
        assert!(
            err.to_string().contains("libnvidia-ml.so.1 not found"),
            "{err}"
        );
        touch(&r.join("usr/lib/libnvidia-ml.so.1"));
        assert_eq!(
            find_nvml_library(r).unwrap(),
            r.join("usr/lib/libnvidia-ml.so.1")
        );
        touch(&r.join("lib64/libnvidia-ml.so.1"));
        assert_eq!(
            find_nvml_library(r).unwrap(),
            r.join("lib64/libnvidia-ml.so.1")
        );
    }
}
