//! An independent reading of a simulated node's files, so tests can say what a
//! container should see without asking the code under test.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

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
