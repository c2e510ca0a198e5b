//! Host facts found by discovery, the input of the pure edits layer.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gpu::{GpuInfo, MigDevice};

/// A character device node: where it is on the host and where it goes in a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CharDevice {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub container_path: String,
    /// Path on the host; differs from `container_path` when the driver root is not `/`.
    pub host_path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// A host file (driver library, tool, firmware or socket) that containers get
/// as a read-only bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFile {
    /// Path on the host.
    pub host_path: String,
    /// Path inside the container.
    pub container_path: String,
    /// The group the file belongs to; only files of the chosen groups are
    /// mounted (see [`LibraryGroups`]).
    #[serde(default)]
    pub group: LibraryGroup,
}

/// A group of driver files, chosen as a whole (`--library-groups`), like
/// NVIDIA's driver capabilities.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LibraryGroup {
    /// CUDA and NVML: `libcuda`, `libnvidia-ml`, the JIT and NVVM compilers,
    /// OpenCL, the allocator and config libraries, the MPS binaries, GSP firmware.
    #[default]
    Compute,
    /// Video encode and decode: `libnvcuvid`, `libnvidia-encode`, `libnvidia-opticalflow`.
    Video,
    /// OpenGL, EGL, GLES, Vulkan ray tracing and OptiX (`libnvoptix`, `libnvidia-rtcore`, …).
    Graphics,
    /// The driver's tools (`nvidia-smi`, `nvidia-debugdump`, `nvidia-persistenced`)
    /// and the `nvidia-persistenced` socket.
    Utilities,
}

impl LibraryGroup {
    /// Every group, in order.
    pub const ALL: [Self; 4] = [Self::Compute, Self::Video, Self::Graphics, Self::Utilities];

    /// The group's name on the command line and in listings.
    pub fn name(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Video => "video",
            Self::Graphics => "graphics",
            Self::Utilities => "utilities",
        }
    }
}

impl fmt::Display for LibraryGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--library-groups` value that is not a comma-separated list of groups.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{found:?} is not a library group list (want a comma-separated list of compute, video, graphics, utilities, or all)"
)]
pub struct LibraryGroupsError {
    /// The offending text.
    pub found: String,
}

impl FromStr for LibraryGroup {
    type Err = LibraryGroupsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| LibraryGroupsError {
                found: s.to_owned(),
            })
    }
}

/// The driver-file groups containers get. The default is `compute,video,utilities`:
/// NVIDIA's default capabilities (`compute,utility`) plus video decode and encode,
/// which frameworks' data loaders use and which need nothing else from the host;
/// graphics needs ICD files and display setup and is asked for explicitly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LibraryGroups(BTreeSet<LibraryGroup>);

impl LibraryGroups {
    /// Exactly these groups.
    pub fn of(groups: impl IntoIterator<Item = LibraryGroup>) -> Self {
        Self(groups.into_iter().collect())
    }

    /// Every group.
    pub fn all() -> Self {
        Self::of(LibraryGroup::ALL)
    }

    /// Whether `group` is chosen.
    pub fn contains(&self, group: LibraryGroup) -> bool {
        self.0.contains(&group)
    }

    /// The chosen groups, in order.
    pub fn iter(&self) -> impl Iterator<Item = LibraryGroup> + '_ {
        self.0.iter().copied()
    }
}

impl Default for LibraryGroups {
    fn default() -> Self {
        Self::of([
            LibraryGroup::Compute,
            LibraryGroup::Video,
            LibraryGroup::Utilities,
        ])
    }
}

impl fmt::Display for LibraryGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(LibraryGroup::name).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for LibraryGroups {
    type Err = LibraryGroupsError;

    /// `compute,video`, `all`; spaces around names are ignored, an empty list
    /// or an unknown name is an error.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || LibraryGroupsError {
            found: s.to_owned(),
        };
        if s.trim() == "all" {
            return Ok(Self::all());
        }
        let mut groups = BTreeSet::new();
        for name in s.split(',') {
            groups.insert(name.trim().parse::<LibraryGroup>().map_err(|_| err())?);
        }
        if groups.is_empty() {
            return Err(err());
        }
        Ok(Self(groups))
    }
}

/// A MIG device with the two capability nodes that grant access to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDeviceFacts {
    /// The MIG device as the driver reports it.
    pub device: MigDevice,
    /// `nvidia-cap<A>` for `gpu<minor>/gi<G>/access`.
    pub gi_cap: CharDevice,
    /// `nvidia-cap<B>` for `gpu<minor>/gi<G>/ci<C>/access`.
    pub ci_cap: CharDevice,
}

/// One GPU with its device node and MIG devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFacts {
    /// What the driver says about the GPU.
    pub info: GpuInfo,
    /// `/dev/nvidia<minor>`.
    pub node: CharDevice,
    /// Existing MIG devices, in MIG-index order (empty unless MIG is enabled).
    pub mig_devices: Vec<MigDeviceFacts>,
}

/// Everything discovery found on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    /// Driver version string, when known.
    pub driver_version: Option<String>,
    /// GPUs in index order.
    pub gpus: Vec<GpuFacts>,
    /// Nodes every GPU container needs: `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`.
    pub control_nodes: Vec<CharDevice>,
    /// Driver libraries, tools, firmware and sockets found, of every group;
    /// the edits mount those of the chosen groups, read-only.
    pub libraries: Vec<HostFile>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_groups_parse_and_print() {
        assert_eq!(
            LibraryGroups::default().to_string(),
            "compute,video,utilities"
        );
        let g: LibraryGroups = " graphics, compute".parse().unwrap();
        assert_eq!(g.to_string(), "compute,graphics");
        assert!(g.contains(LibraryGroup::Graphics) && !g.contains(LibraryGroup::Video));
        assert_eq!(
            "all".parse::<LibraryGroups>().unwrap(),
            LibraryGroups::all()
        );
        for bad in ["", "compute,", "gpu", "compute,utility"] {
            let err = bad.parse::<LibraryGroups>().unwrap_err();
            assert_eq!(err.found, bad);
            assert!(
                err.to_string()
                    .contains("compute, video, graphics, utilities")
            );
        }
    }
}
