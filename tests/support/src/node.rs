//! Simulated GPU nodes for tests: one builder ([`SimNode`]) for every crate,
//! and an independent reading of a node's files ([`NodeView`]), so tests can
//! say what a container should see without asking the code under test.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use tessera_sim::builder::{BuildOptions, build_node};
use tessera_sim::profile::NodeProfile;
use tessera_sim::state::{NodeState, StateStore};

use crate::prereq::{Need, Skip, require};

/// Where a node's libraries live, relative to its root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// A stand-in library a node can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandIn {
    /// `libtessera_sim_nvml.so`, installed as `libnvidia-ml.so.1`.
    Nvml,
    /// `libtessera_sim_cuda.so`, installed as `libcuda.so.1`.
    Cuda,
}

impl StandIn {
    /// The cdylib cargo builds.
    pub fn built_name(self) -> &'static str {
        match self {
            StandIn::Nvml => "libtessera_sim_nvml.so",
            StandIn::Cuda => "libtessera_sim_cuda.so",
        }
    }

    /// The name it is installed under in [`LIB_DIR`].
    pub fn installed_name(self) -> &'static str {
        match self {
            StandIn::Nvml => "libnvidia-ml.so.1",
            StandIn::Cuda => "libcuda.so.1",
        }
    }
}

enum Source {
    Profile(String),
    State(Box<NodeState>),
}

/// How a [`SimNode`] is to be built; see [`SimNode::profile`] and [`SimNode::state`].
pub struct SimNodeBuilder {
    source: Source,
    full: bool,
    stand_ins: Vec<StandIn>,
    root: Option<PathBuf>,
    state_file: bool,
}

impl SimNodeBuilder {
    /// Only the state file and the stand-ins: no device nodes and no
    /// `/proc` files, so no root needed (what the stand-ins' own tests use).
    pub fn files_only(mut self) -> Self {
        self.full = false;
        self
    }

    /// Which stand-ins a [`files_only`](Self::files_only) node carries
    /// (default: both). A full node always carries both.
    pub fn stand_ins(mut self, stand_ins: &[StandIn]) -> Self {
        self.stand_ins = stand_ins.to_vec();
        self
    }

    /// Leaves the state file out of a [`files_only`](Self::files_only) node
    /// (a root the stand-ins must refuse).
    pub fn without_state_file(mut self) -> Self {
        self.state_file = false;
        self
    }

    /// Builds the node at `root` (which must not exist or be empty) instead
    /// of in a fresh temporary directory; the caller removes it.
    pub fn at(mut self, root: &Path) -> Self {
        self.root = Some(root.to_owned());
        self
    }

    /// The prerequisites: the stand-ins built, and for a full node device nodes.
    pub fn needs(&self) -> Vec<Need> {
        let mut needs: Vec<Need> = self
            .stand_ins
            .iter()
            .map(|s| Need::Built(s.built_name()))
            .collect();
        if self.full {
            needs.push(Need::DeviceNodes);
        }
        needs
    }

    /// Builds the node in a fresh temporary directory, after [`require`]ing
    /// [`needs`](Self::needs). A build that fails after that fails the test.
    pub fn build(self) -> Result<SimNode, Skip> {
        require(&self.needs())?;
        let (dir, root) = match self.root {
            Some(root) => (None, root),
            None => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let root = dir.path().join("node");
                (Some(dir), root)
            }
        };
        let library = |s: StandIn| crate::find_built(s.built_name()).expect("checked by require");
        let state = match (self.source, self.full) {
            (Source::Profile(name), true) => {
                let profile =
                    NodeProfile::load(&name).unwrap_or_else(|e| panic!("node profile {name}: {e}"));
                let opts = BuildOptions {
                    nvml_library: Some(library(StandIn::Nvml)),
                    cuda_library: Some(library(StandIn::Cuda)),
                    ..BuildOptions::default()
                };
                build_node(&profile, &root, &opts)
                    .unwrap_or_else(|e| panic!("building node profile {name}: {e}"))
                    .state
            }
            (source, full) => {
                assert!(!full, "a full node is built from a profile");
                let state = match source {
                    Source::Profile(name) => NodeProfile::load(&name)
                        .and_then(|p| p.node_state(&name))
                        .unwrap_or_else(|e| panic!("node profile {name}: {e}")),
                    Source::State(state) => *state,
                };
                let lib_dir = root.join(LIB_DIR);
                fs::create_dir_all(&lib_dir).expect("make the library directory");
                for s in &self.stand_ins {
                    fs::copy(library(*s), lib_dir.join(s.installed_name()))
                        .unwrap_or_else(|e| panic!("install {}: {e}", s.installed_name()));
                }
                if self.state_file {
                    StateStore::write_new(&root, &state).expect("write the state file");
                }
                state
            }
        };
        Ok(SimNode { dir, root, state })
    }
}

/// A simulated GPU node in a temporary directory (removed on drop): its root
/// is `<dir>/node`, the rest of the directory is the test's scratch space.
/// (Built [`at`](SimNodeBuilder::at) a root of the caller's, it has no directory.)
pub struct SimNode {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    state: NodeState,
}

impl SimNode {
    /// A node from a shipped profile (or profile file), laid out as
    /// `tessera-sim create` lays it out: device nodes (root needed), `/proc`
    /// files, state file, both stand-ins.
    pub fn profile(name: &str) -> SimNodeBuilder {
        SimNodeBuilder {
            source: Source::Profile(name.to_owned()),
            full: true,
            stand_ins: vec![StandIn::Nvml, StandIn::Cuda],
            root: None,
            state_file: true,
        }
    }

    /// A [`files_only`](SimNodeBuilder::files_only) node holding `state`.
    pub fn state(state: NodeState) -> SimNodeBuilder {
        SimNodeBuilder {
            source: Source::State(Box::new(state)),
            full: false,
            stand_ins: vec![StandIn::Nvml, StandIn::Cuda],
            root: None,
            state_file: true,
        }
    }

    /// The node root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The temporary directory holding the root, for the test's own files
    /// (the root's parent for a node built [`at`](SimNodeBuilder::at) a root).
    pub fn dir(&self) -> &Path {
        match &self.dir {
            Some(dir) => dir.path(),
            None => self.root.parent().unwrap_or(&self.root),
        }
    }

    /// `<root>/usr/lib/x86_64-linux-gnu`, where the stand-ins are.
    pub fn lib_dir(&self) -> PathBuf {
        self.root.join(LIB_DIR)
    }

    /// The installed stand-in.
    pub fn library(&self, stand_in: StandIn) -> PathBuf {
        self.lib_dir().join(stand_in.installed_name())
    }

    /// The state the node was built with.
    pub fn state_at_build(&self) -> &NodeState {
        &self.state
    }

    /// `MIG-…` uuids of the node's MIG devices, GPU by GPU, in the order
    /// `tessera-sim create` lists them.
    pub fn mig_uuids(&self) -> Vec<String> {
        self.state
            .gpus
            .iter()
            .flat_map(|g| &g.gpu_instances)
            .flat_map(|gi| &gi.compute_instances)
            .map(|ci| ci.uuid.clone())
            .collect()
    }
}

/// A device node a container should see: path, major, minor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExpectedNode {
    /// Path in the container.
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// What the test reads of a simulated node: state file, `/proc/devices`, mig-minors.
pub struct NodeView {
    state: Value,
    majors: BTreeMap<String, u32>,
    mig_minors: BTreeMap<String, u32>,
}

impl NodeView {
    /// Reads the node under `root`.
    pub fn read(root: &Path) -> Result<Self> {
        let state_path = root.join("run/tessera-sim/state.json");
        let state = serde_json::from_str(
            &fs::read_to_string(&state_path).with_context(|| state_path.display().to_string())?,
        )?;
        let devices = fs::read_to_string(root.join("proc/devices"))?;
        let majors = devices
            .lines()
            .take_while(|l| !l.starts_with("Block"))
            .filter_map(|l| {
                let (major, name) = l.trim().split_once(' ')?;
                Some((name.trim().to_owned(), major.parse().ok()?))
            })
            .collect();
        let minors = fs::read_to_string(root.join("proc/driver/nvidia-caps/mig-minors"))?;
        let mig_minors = minors
            .lines()
            .filter_map(|l| {
                let (cap, minor) = l.split_once(' ')?;
                Some((cap.to_owned(), minor.trim().parse().ok()?))
            })
            .collect();
        Ok(Self {
            state,
            majors,
            mig_minors,
        })
    }

    fn major(&self, name: &str) -> u32 {
        *self
            .majors
            .get(name)
            .unwrap_or_else(|| panic!("/proc/devices has no {name} line"))
    }

    fn gpus(&self) -> &Vec<Value> {
        self.state["gpus"].as_array().expect("state.gpus")
    }

    /// uuid of GPU `index`.
    pub fn gpu_uuid(&self, index: usize) -> String {
        self.gpus()[index]["uuid"]
            .as_str()
            .expect("uuid")
            .to_owned()
    }

    /// `/dev/nvidia<minor>` of GPU `index`.
    pub fn gpu_node(&self, index: usize) -> ExpectedNode {
        let minor = self.gpus()[index]["minor"].as_u64().expect("minor") as u32;
        ExpectedNode {
            path: format!("/dev/nvidia{minor}"),
            major: 195,
            minor,
        }
    }

    /// Every `(gpu index, MIG uuid, gi id, ci id)` in the state file.
    pub fn mig_devices(&self) -> Vec<(usize, String, u64, u64)> {
        let mut out = Vec::new();
        for (index, gpu) in self.gpus().iter().enumerate() {
            for gi in gpu["gpu_instances"].as_array().into_iter().flatten() {
                for ci in gi["compute_instances"].as_array().into_iter().flatten() {
                    out.push((
                        index,
                        ci["uuid"].as_str().expect("ci uuid").to_owned(),
                        gi["id"].as_u64().expect("gi id"),
                        ci["id"].as_u64().expect("ci id"),
                    ));
                }
            }
        }
        out
    }

    /// The two capability nodes of a MIG device, from mig-minors and the
    /// `nvidia-caps` major.
    pub fn mig_cap_nodes(&self, gpu: usize, gi: u64, ci: u64) -> [ExpectedNode; 2] {
        let gpu_minor = self.gpu_node(gpu).minor;
        let caps_major = self.major("nvidia-caps");
        let node = |cap: String| {
            let minor = *self
                .mig_minors
                .get(&cap)
                .unwrap_or_else(|| panic!("mig-minors has no {cap}"));
            ExpectedNode {
                path: format!("/dev/nvidia-caps/nvidia-cap{minor}"),
                major: caps_major,
                minor,
            }
        };
        [
            node(format!("gpu{gpu_minor}/gi{gi}/access")),
            node(format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access")),
        ]
    }

    /// `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`: what every GPU container gets.
    pub fn control_nodes(&self) -> Vec<ExpectedNode> {
        let uvm = self.major("nvidia-uvm");
        vec![
            ExpectedNode {
                path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
            },
            ExpectedNode {
                path: "/dev/nvidia-uvm".into(),
                major: uvm,
                minor: 0,
            },
            ExpectedNode {
                path: "/dev/nvidia-uvm-tools".into(),
                major: uvm,
                minor: 1,
            },
        ]
    }
}

/// Parses lines of `stat -c '%n %F %t %T'` (busybox; major and minor in hex)
/// into character-device nodes; any other file type is an error.
pub fn parse_stat_lines(text: &str) -> Result<Vec<ExpectedNode>> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (path, rest) = line.split_once(' ').context("stat line")?;
        let rest = rest
            .strip_prefix("character special file ")
            .with_context(|| format!("{path} is not a character device: {rest}"))?;
        let (major, minor) = rest.trim().split_once(' ').context("major minor")?;
        nodes.push(ExpectedNode {
            path: path.to_owned(),
            major: u32::from_str_radix(major, 16)?,
            minor: u32::from_str_radix(minor, 16)?,
        });
    }
    nodes.sort();
    Ok(nodes)
}
