//! Device nodes and driver files under their roots.
//!
//! Every path is looked up under a configurable root: driver files under the
//! driver root (`/` on a plain host, `/run/nvidia/driver` under a driver
//! container, `/home/kubernetes/bin/nvidia` on GKE, a temp dir in tests, the
//! simulated node's directory), device nodes under the dev root (the driver root
//! unless told otherwise; `/` on GKE). A found file has two names: its
//! **container path**, the path relative to the root made absolute
//! (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`), and its **host path**, the root
//! joined with it. With root `/` both are equal.
//!
//! Driver libraries are found by their versioned names
//! (`libcuda.so.<driver version>`, see [`DRIVER_LIBRARIES`]); each comes with its
//! SONAME name (`libcuda.so.1`, read from the file: [`crate::soname`]), both at
//! the container paths the host has.
//!
//! Host paths are not resolved: a symlink stays a symlink, and is followed on the
//! host when the runtime bind-mounts it (an absolute link target inside a non-`/`
//! driver root therefore points at the host's file, not the root's).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use tessera_model::facts::{CharDevice, HostFile, LibraryGroup};

use crate::DriverError;
use crate::procfs::io_reason;
use LibraryGroup::{Compute, Utilities};

/// Library directories searched, in order, relative to the driver root:
/// Debian/Ubuntu multiarch (`usr/lib/x86_64-linux-gnu`, `lib/x86_64-linux-gnu`,
/// the aarch64 ones), RHEL/SUSE (`usr/lib64`), GKE's `/home/kubernetes/bin/nvidia`
/// and other self-contained installs (`lib64`, `lib`), then `usr/lib`.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
];

pub use tessera_model::driver_files::{DRIVER_LIBRARIES, DriverLibrary};

/// Directories of the driver's binaries, in order, relative to the driver root
/// (`bin` for GKE's layout).
pub const TOOL_DIRS: &[&str] = &["usr/bin", "bin"];

/// Driver binaries bound into containers when present, with their groups.
pub const TOOLS: &[(&str, LibraryGroup)] = &[
    ("nvidia-smi", Utilities),
    ("nvidia-debugdump", Utilities),
    ("nvidia-persistenced", Utilities),
    ("nvidia-cuda-mps-control", Compute),
    ("nvidia-cuda-mps-server", Compute),
];

/// Directories of the GSP firmware, relative to the driver root; the first
/// holding `<version>/` wins (`lib` is `usr/lib` on merged-`/usr` hosts).
pub const FIRMWARE_DIRS: &[&str] = &["lib/firmware/nvidia", "usr/lib/firmware/nvidia"];

/// The `nvidia-persistenced` socket, relative to the driver root.
pub const PERSISTENCED_SOCKET: &str = "run/nvidia-persistenced/socket";

/// The NVML library's soname.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Errors finding device nodes.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    /// A node that must exist does not.
    #[error("{}: device node missing (is the NVIDIA driver loaded, and are the driver and dev roots right?)", .path.display())]
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

/// A file under `root` at `rel`, as a [`HostFile`] of `group`.
fn host_file(root: &Path, rel: &str, group: LibraryGroup) -> HostFile {
    HostFile {
        host_path: host_path(root, rel).display().to_string(),
        container_path: container_path(rel),
        group,
    }
}

/// The first of [`LIBRARY_DIRS`] under `root` holding a regular file `name`.
fn library_dir(root: &Path, name: &str) -> Option<&'static str> {
    LIBRARY_DIRS
        .iter()
        .copied()
        .find(|dir| is_file(&host_path(root, &format!("{dir}/{name}"))))
}

/// The files of one library: the versioned file and its SONAME name when the
/// driver version is known and the versioned file exists; else, the library's
/// usual SONAME file alone (an install without versioned files, or an unknown
/// version).
fn library_files(root: &Path, library: &DriverLibrary, version: Option<&str>) -> Vec<HostFile> {
    let group = library.group;
    if let Some(version) = version {
        let versioned = library.file_name(version);
        if let Some(dir) = library_dir(root, &versioned) {
            let rel = format!("{dir}/{versioned}");
            let file = host_file(root, &rel, group);
            // The file's own SONAME; the usual one only for a file that is not
            // ELF and whose usual SONAME name is there.
            let soname = crate::soname::read(&host_path(root, &rel)).or_else(|| {
                library
                    .usual_soname()
                    .filter(|name| is_file(&host_path(root, &format!("{dir}/{name}"))))
            });
            let mut files = vec![file];
            if let Some(soname) = soname.filter(|s| *s != versioned) {
                // Mounted from the versioned file, so a stale link on the host
                // (left by an older driver) cannot give the container the wrong file.
                files.push(HostFile {
                    container_path: container_path(&format!("{dir}/{soname}")),
                    ..files[0].clone()
                });
            }
            return files;
        }
    }
    let Some(soname) = library.usual_soname() else {
        return Vec::new();
    };
    library_dir(root, &soname)
        .map(|dir| vec![host_file(root, &format!("{dir}/{soname}"), group)])
        .unwrap_or_default()
}

/// GSP firmware `gsp*.bin` of `version`, in name order, from the first of
/// [`FIRMWARE_DIRS`] that has the version's directory.
fn firmware_files(root: &Path, version: &str) -> Vec<HostFile> {
    let Some(dir) = FIRMWARE_DIRS
        .iter()
        .map(|d| format!("{d}/{version}"))
        .find(|d| host_path(root, d).is_dir())
    else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(host_path(root, &dir)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("gsp") && n.ends_with(".bin"))
        .filter(|n| is_file(&host_path(root, &format!("{dir}/{n}"))))
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| host_file(root, &format!("{dir}/{n}"), Compute))
        .collect()
}

/// The driver files under `root`, of every group, in this order: the
/// libraries ([`DRIVER_LIBRARIES`] order; for each, the versioned file then its
/// SONAME name), the binaries ([`TOOLS`], from the first of [`TOOL_DIRS`]
/// holding each), the GSP firmware of `driver_version`, the
/// `nvidia-persistenced` socket. Missing ones are skipped (logged at debug
/// level). Versioned names need `driver_version`; without it only the usual
/// SONAME files are found.
pub fn driver_files(root: &Path, driver_version: Option<&str>) -> Vec<HostFile> {
    let version = driver_version.filter(|v| {
        !v.is_empty() && !v.contains('/') && *v != "." && *v != ".." && !v.contains('\0')
    });
    let mut files = Vec::new();
    for library in DRIVER_LIBRARIES {
        let found = library_files(root, library, version);
        if found.is_empty() {
            tracing::debug!(library = library.name, root = %root.display(), "driver library not found");
        }
        files.extend(found);
    }
    for (tool, group) in TOOLS {
        let found = TOOL_DIRS
            .iter()
            .map(|dir| format!("{dir}/{tool}"))
            .find(|rel| is_file(&host_path(root, rel)));
        match found {
            Some(rel) => files.push(host_file(root, &rel, *group)),
            None => tracing::debug!(tool, root = %root.display(), "driver binary not found"),
        }
    }
    if let Some(version) = version {
        files.extend(firmware_files(root, version));
    }
    let socket = host_path(root, PERSISTENCED_SOCKET);
    if fs::metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
        files.push(host_file(root, PERSISTENCED_SOCKET, Utilities));
    }
    files
}

/// The host path of `libnvidia-ml.so.1` under `root`: the first of [`LIBRARY_DIRS`]
/// holding it, ready for [`NvmlDriver::load`](crate::nvml::NvmlDriver::load).
///
/// An install whose SONAME links were never made (no `ldconfig` run) has only
/// the versioned file: then the first directory holding exactly one
/// `libnvidia-ml.so.<version>` gives that file.
pub fn find_nvml_library(root: &Path) -> Result<PathBuf, DriverError> {
    let soname = LIBRARY_DIRS
        .iter()
        .map(|dir| host_path(root, &format!("{dir}/{NVML_LIBRARY}")))
        .find(|p| is_file(p));
    soname
        .or_else(|| {
            LIBRARY_DIRS
                .iter()
                .find_map(|dir| versioned_nvml(root, dir))
        })
        .ok_or_else(|| DriverError::Load {
            path: root.display().to_string(),
            reason: format!(
                "{NVML_LIBRARY} not found in any of {} under the root",
                LIBRARY_DIRS.join(", ")
            ),
        })
}

/// The one `libnvidia-ml.so.<version>` (a version: digits and dots, with a
/// dot) in `dir` under `root`; `None` for none or several.
fn versioned_nvml(root: &Path, dir: &str) -> Option<PathBuf> {
    let dir = host_path(root, dir);
    let prefix = "libnvidia-ml.so.";
    let mut found = fs::read_dir(&dir).ok()?.filter_map(|e| {
        let name = e.ok()?.file_name().into_string().ok()?;
        let version = name.strip_prefix(prefix)?;
        let versioned = version.contains('.')
            && version
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        let path = dir.join(&name);
        (versioned && is_file(&path)).then_some(path)
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use LibraryGroup::{Graphics, Video};

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

    /// Installs `stem.<version>` in `dir` as a real ELF object naming itself
    /// `soname`, with the SONAME link a driver install makes.
    fn install(dir: &Path, stem: &str, version: &str, soname: &str) {
        fs::create_dir_all(dir).unwrap();
        let file = format!("{stem}.{version}");
        fs::write(
            dir.join(&file),
            crate::soname::minimal_shared_object(soname),
        )
        .unwrap();
        if soname != file {
            std::os::unix::fs::symlink(&file, dir.join(soname)).unwrap();
        }
    }

    fn pairs(files: &[HostFile]) -> Vec<(String, String, LibraryGroup)> {
        files
            .iter()
            .map(|f| (f.container_path.clone(), f.host_path.clone(), f.group))
            .collect()
    }

    #[test]
    fn versioned_libraries_come_with_their_soname_and_group() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let v = "550.54.14";
        let lib = r.join("usr/lib/x86_64-linux-gnu");
        install(&lib, "libcuda.so", v, "libcuda.so.1");
        install(&lib, "libnvidia-nvvm.so", v, "libnvidia-nvvm.so.4");
        install(
            &lib,
            "libnvidia-glcore.so",
            v,
            &format!("libnvidia-glcore.so.{v}"),
        );
        install(&lib, "libnvcuvid.so", v, "libnvcuvid.so.1");
        // A stale SONAME link from an older driver: the mount comes from the
        // versioned file all the same.
        install(&lib, "libnvidia-ml.so", "535.00.00", "libnvidia-ml.so.1");
        fs::write(
            lib.join(format!("libnvidia-ml.so.{v}")),
            crate::soname::minimal_shared_object("libnvidia-ml.so.1"),
        )
        .unwrap();
        // Not ELF (a placeholder): the usual SONAME, since its name is there.
        touch(&lib.join(format!("libnvidia-cfg.so.{v}")));
        touch(&lib.join("libnvidia-cfg.so.1"));
        // A later directory never shadows an earlier one.
        install(&r.join("usr/lib64"), "libcuda.so", v, "libcuda.so.1");
        touch(&r.join("usr/bin/nvidia-smi"));
        touch(&r.join("usr/bin/nvidia-cuda-mps-control"));
        touch(&r.join(format!("lib/firmware/nvidia/{v}/gsp_tu10x.bin")));
        touch(&r.join(format!("lib/firmware/nvidia/{v}/gsp_ga10x.bin")));
        touch(&r.join(format!("lib/firmware/nvidia/{v}/README")));
        touch(&r.join("lib/firmware/nvidia/535.00.00/gsp_ga10x.bin"));
        // A dangling link is not a library.
        std::os::unix::fs::symlink("nowhere", lib.join("libnvidia-opencl.so.1")).unwrap();
        fs::create_dir_all(r.join("run/nvidia-persistenced")).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(r.join(PERSISTENCED_SOCKET)).unwrap();

        let host = |rel: &str| r.join(rel).display().to_string();
        let d = "usr/lib/x86_64-linux-gnu";
        let file =
            |container: &str, host_rel: &str, group| (container.to_owned(), host(host_rel), group);
        assert_eq!(
            pairs(&driver_files(r, Some(v))),
            [
                file(
                    &format!("/{d}/libcuda.so.{v}"),
                    &format!("{d}/libcuda.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libcuda.so.1"),
                    &format!("{d}/libcuda.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvidia-ml.so.{v}"),
                    &format!("{d}/libnvidia-ml.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvidia-ml.so.1"),
                    &format!("{d}/libnvidia-ml.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvidia-nvvm.so.{v}"),
                    &format!("{d}/libnvidia-nvvm.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvidia-nvvm.so.4"),
                    &format!("{d}/libnvidia-nvvm.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvidia-cfg.so.{v}"),
                    &format!("{d}/libnvidia-cfg.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvidia-cfg.so.1"),
                    &format!("{d}/libnvidia-cfg.so.{v}"),
                    Compute
                ),
                file(
                    &format!("/{d}/libnvcuvid.so.{v}"),
                    &format!("{d}/libnvcuvid.so.{v}"),
                    Video
                ),
                file(
                    &format!("/{d}/libnvcuvid.so.1"),
                    &format!("{d}/libnvcuvid.so.{v}"),
                    Video
                ),
                file(
                    &format!("/{d}/libnvidia-glcore.so.{v}"),
                    &format!("{d}/libnvidia-glcore.so.{v}"),
                    Graphics
                ),
                file("/usr/bin/nvidia-smi", "usr/bin/nvidia-smi", Utilities),
                file(
                    "/usr/bin/nvidia-cuda-mps-control",
                    "usr/bin/nvidia-cuda-mps-control",
                    Compute
                ),
                file(
                    &format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
                    &format!("lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
                    Compute
                ),
                file(
                    &format!("/lib/firmware/nvidia/{v}/gsp_tu10x.bin"),
                    &format!("lib/firmware/nvidia/{v}/gsp_tu10x.bin"),
                    Compute
                ),
                file(
                    "/run/nvidia-persistenced/socket",
                    PERSISTENCED_SOCKET,
                    Utilities
                ),
            ]
        );

        // Without the version only the SONAME files are found, as they are
        // on the host (a link stays a link).
        let without_version = pairs(&driver_files(r, None));
        let containers: Vec<&str> = without_version.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            containers,
            [
                format!("/{d}/libcuda.so.1").as_str(),
                &format!("/{d}/libnvidia-ml.so.1"),
                &format!("/{d}/libnvidia-nvvm.so.4"),
                &format!("/{d}/libnvidia-cfg.so.1"),
                &format!("/{d}/libnvcuvid.so.1"),
                "/usr/bin/nvidia-smi",
                "/usr/bin/nvidia-cuda-mps-control",
                "/run/nvidia-persistenced/socket",
            ]
        );
        assert_eq!(without_version[0].1, host(&format!("{d}/libcuda.so.1")));
    }

    #[test]
    fn a_gke_install_directory_is_found_by_its_lib64_and_bin() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        install(&r.join("lib64"), "libcuda.so", "570.86.15", "libcuda.so.1");
        touch(&r.join("bin/nvidia-smi"));
        let files = pairs(&driver_files(r, Some("570.86.15")));
        let containers: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            containers,
            [
                "/lib64/libcuda.so.570.86.15",
                "/lib64/libcuda.so.1",
                "/bin/nvidia-smi"
            ]
        );
        // A version with a path in it finds nothing versioned.
        assert_eq!(driver_files(r, Some("../x")).len(), 2);
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
        // Only versioned files: one is taken, two are ambiguous.
        touch(&r.join("lib64/libnvidia-ml.so.550.54.14"));
        assert_eq!(
            find_nvml_library(r).unwrap(),
            r.join("lib64/libnvidia-ml.so.550.54.14")
        );
        touch(&r.join("lib64/libnvidia-ml.so.535.1.2"));
        assert!(find_nvml_library(r).is_err());
        fs::remove_file(r.join("lib64/libnvidia-ml.so.535.1.2")).unwrap();
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
