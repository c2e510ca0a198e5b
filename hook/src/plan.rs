//! From container edits to what legacy injection will do: device nodes,
//! device-cgroup rules and bind mounts, each checked before anything is touched.
//!
//! Pure except for one injected lookup: a device node the spec gives without
//! type or numbers takes them from the host node, as the CDI applier does.
//!
//! What legacy injection cannot apply:
//!
//! - `env`: the runtime read `config.json` before any hook ran, so the process
//!   environment is fixed; the vGPU library reads `vgpu.json` (mounted) first
//!   anyway. Skipped, and said at `info` level.
//! - `hooks`: the hook never runs other programs (it is the hook). Skipped.
//! - `additionalGids`, `intelRdt`, `netDevices`: need the runtime; the
//!   container is refused rather than started without them.

use std::fmt;

use tessera_model::cdi::{ContainerEdits, DeviceCgroupRule, DeviceNode, Mount};

/// A path in the container, split into plain components (no `.`, `..` or empty parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPath {
    components: Vec<String>,
}

impl ContainerPath {
    /// Checks an absolute container path: no `..`, no NUL, not `/` itself.
    pub fn parse(path: &str) -> Result<ContainerPath, String> {
        if !path.starts_with('/') {
            return Err(format!("container path {path:?} is not absolute"));
        }
        if path.contains('\0') {
            return Err(format!("container path {path:?} contains NUL"));
        }
        let mut components = Vec::new();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(format!("container path {path:?} contains \"..\"")),
                other => components.push(other.to_owned()),
            }
        }
        if components.is_empty() {
            return Err(format!("container path {path:?} names the root itself"));
        }
        Ok(ContainerPath { components })
    }

    /// The components, first to last.
    pub fn components(&self) -> &[String] {
        &self.components
    }

    /// The parent directory's components.
    pub fn parent(&self) -> &[String] {
        &self.components[..self.components.len() - 1]
    }

    /// The last component.
    pub fn name(&self) -> &str {
        &self.components[self.components.len() - 1]
    }

    /// The directories above the path, outermost first (`/dev`, then
    /// `/dev/nvidia-caps` for `/dev/nvidia-caps/nvidia-cap1`).
    pub fn ancestors(&self) -> impl Iterator<Item = ContainerPath> + '_ {
        (1..self.components.len()).map(|n| ContainerPath {
            components: self.components[..n].to_vec(),
        })
    }
}

impl fmt::Display for ContainerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.components {
            write!(f, "/{c}")?;
        }
        Ok(())
    }
}

/// The kind of a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Character device (`c`, or `u` for unbuffered).
    Char,
    /// Block device (`b`).
    Block,
    /// Named pipe (`p`).
    Fifo,
}

impl NodeKind {
    /// The letter a device-cgroup rule uses, if the kind gets a rule.
    pub fn cgroup_letter(self) -> Option<char> {
        match self {
            NodeKind::Char => Some('c'),
            NodeKind::Block => Some('b'),
            NodeKind::Fifo => None,
        }
    }
}

/// The largest major and minor numbers Linux supports (12 and 20 bits).
const MAX_MAJOR: u32 = (1 << 12) - 1;
const MAX_MINOR: u32 = (1 << 20) - 1;

/// One device node to create in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// Where, in the container.
    pub path: ContainerPath,
    /// Char, block or fifo.
    pub kind: NodeKind,
    /// Major number (0 for a fifo).
    pub major: u32,
    /// Minor number (0 for a fifo).
    pub minor: u32,
    /// Permission bits (`fileMode`, default 0666; set-id and sticky bits dropped).
    pub mode: u32,
    /// Owner in the container.
    pub uid: u32,
    /// Group in the container.
    pub gid: u32,
    /// Device-cgroup access (`rwm` subset); empty for no rule.
    pub access: String,
}

impl NodePlan {
    /// The `devices.allow` line for this node, if it gets one.
    pub fn cgroup_rule(&self) -> Option<String> {
        let letter = self.kind.cgroup_letter()?;
        (!self.access.is_empty())
            .then(|| format!("{letter} {}:{} {}", self.major, self.minor, self.access))
    }
}

/// One bind mount to make in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    /// Source on the host, from the trusted spec.
    pub host_path: String,
    /// Target in the container.
    pub target: ContainerPath,
    /// `rbind`: the source's submounts come along.
    pub recursive: bool,
    /// `ro`.
    pub readonly: bool,
    /// `nosuid`.
    pub nosuid: bool,
    /// `nodev`.
    pub nodev: bool,
    /// `noexec`.
    pub noexec: bool,
}

/// Everything legacy injection does, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Device nodes, in edit order.
    pub nodes: Vec<NodePlan>,
    /// Bind mounts, parents before children (the merge sorted them by depth).
    pub mounts: Vec<MountPlan>,
    /// Edits skipped on purpose (env, hooks), for an `info` line.
    pub skipped: Vec<String>,
}

impl Plan {
    /// The `devices.allow` lines, in node order, without repeats.
    pub fn cgroup_rules(&self) -> Vec<String> {
        let mut rules: Vec<String> = Vec::new();
        for rule in self.nodes.iter().filter_map(NodePlan::cgroup_rule) {
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
        rules
    }
}

/// What a host device node is, for nodes the spec leaves incomplete.
pub type HostNodeLookup<'a> = dyn Fn(&str) -> Result<(NodeKind, u32, u32), String> + 'a;

/// Checks `edits` and turns them into a [`Plan`]. `host_node` answers for
/// nodes without type or numbers (their `hostPath`, else `path`).
pub fn plan(edits: &ContainerEdits, host_node: &HostNodeLookup<'_>) -> Result<Plan, String> {
    if !edits.additional_gids.is_empty() {
        return Err("the spec asks for additionalGids, which only a CDI runtime can apply".into());
    }
    if edits.intel_rdt.is_some() {
        return Err("the spec asks for intelRdt, which only a CDI runtime can apply".into());
    }
    if !edits.net_devices.is_empty() {
        return Err("the spec asks for netDevices, which only a CDI runtime can apply".into());
    }
    let mut out = Plan::default();
    if !edits.env.is_empty() {
        out.skipped.push(format!(
            "{} env entries (the process environment is fixed before hooks run)",
            edits.env.len()
        ));
    }
    if !edits.hooks.is_empty() {
        out.skipped
            .push(format!("{} hook entries", edits.hooks.len()));
    }
    for node in &edits.device_nodes {
        out.nodes.push(node_plan(node, host_node)?);
    }
    for mount in &edits.mounts {
        out.mounts.push(mount_plan(mount)?);
    }
    Ok(out)
}

fn number(value: Option<i64>, max: u32, what: &str, path: &str) -> Result<u32, String> {
    let v = value.unwrap_or(0);
    u32::try_from(v)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| format!("device node {path}: {what} {v} is out of range (0..={max})"))
}

fn node_plan(node: &DeviceNode, host_node: &HostNodeLookup<'_>) -> Result<NodePlan, String> {
    let path = ContainerPath::parse(&node.path)?;
    let given = match node.node_type.as_deref() {
        Some("c" | "u") => Some(NodeKind::Char),
        Some("b") => Some(NodeKind::Block),
        Some("p") => Some(NodeKind::Fifo),
        Some(other) => {
            return Err(format!(
                "device node {}: type {other:?} is not b, c, u or p",
                node.path
            ));
        }
        None => None,
    };
    let (kind, major, minor) = match given {
        Some(NodeKind::Fifo) => (NodeKind::Fifo, 0, 0),
        Some(kind) if node.major.is_some_and(|m| m != 0) => (
            kind,
            number(node.major, MAX_MAJOR, "major", &node.path)?,
            number(node.minor, MAX_MINOR, "minor", &node.path)?,
        ),
        _ => {
            let host = node.host_path.as_deref().unwrap_or(&node.path);
            let (kind, major, minor) = host_node(host)
                .map_err(|e| format!("device node {}: host node {host}: {e}", node.path))?;
            if given.is_some_and(|g| g != kind) {
                return Err(format!(
                    "device node {}: the spec's type differs from the host node {host}",
                    node.path
                ));
            }
            (kind, major, minor)
        }
    };
    // The access string as the CDI applier derives it (the spec was validated:
    // permissions are a subset of rwm, or "none" for no rule).
    let access = match kind {
        NodeKind::Fifo => String::new(),
        NodeKind::Char | NodeKind::Block => DeviceCgroupRule::for_node(&DeviceNode {
            node_type: Some(if kind == NodeKind::Block { "b" } else { "c" }.to_owned()),
            ..node.clone()
        })
        .map(|rule| rule.access)
        .unwrap_or_default(),
    };
    Ok(NodePlan {
        path,
        kind,
        major,
        minor,
        mode: node.file_mode.map_or(0o666, |m| m & 0o777),
        uid: node.uid.unwrap_or(0),
        gid: node.gid.unwrap_or(0),
        access,
    })
}

fn mount_plan(mount: &Mount) -> Result<MountPlan, String> {
    let target = ContainerPath::parse(&mount.container_path)?;
    let what = || format!("mount {} -> {}", mount.host_path, mount.container_path);
    if !mount.host_path.starts_with('/') || mount.host_path.contains('\0') {
        return Err(format!("{}: the host path is not absolute", what()));
    }
    if !matches!(mount.mount_type.as_deref(), None | Some("bind" | "none")) {
        return Err(format!(
            "{}: type {:?} is not a bind mount; only bind mounts are applied",
            what(),
            mount.mount_type.as_deref().unwrap_or_default()
        ));
    }
    let mut plan = MountPlan {
        host_path: mount.host_path.clone(),
        target,
        recursive: false,
        readonly: false,
        nosuid: false,
        nodev: false,
        noexec: false,
    };
    let mut bind = mount.mount_type.as_deref() == Some("bind");
    for option in &mount.options {
        match option.as_str() {
            "bind" => bind = true,
            "rbind" => {
                bind = true;
                plan.recursive = true;
            }
            "ro" => plan.readonly = true,
            "rw" => plan.readonly = false,
            "nosuid" => plan.nosuid = true,
            "suid" => plan.nosuid = false,
            "nodev" => plan.nodev = true,
            "dev" => plan.nodev = false,
            "noexec" => plan.noexec = true,
            "exec" => plan.noexec = false,
            // Every mount the hook makes is private; these agree or are weaker.
            "private" | "rprivate" | "slave" | "rslave" => {}
            // Access-time options do not change what the container sees.
            "relatime" | "norelatime" | "noatime" | "strictatime" | "nodiratime" => {}
            other => {
                return Err(format!(
                    "{}: option {other:?} is not supported by legacy injection",
                    what()
                ));
            }
        }
    }
    if !bind {
        return Err(format!(
            "{}: not a bind mount (no bind/rbind option)",
            what()
        ));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use tessera_model::cdi::{Hook, IntelRdt};
    use tessera_model::contract::vgpu::{CONTAINER_LIBRARY, HOST_LIBRARY};

    use super::*;

    fn no_host(_: &str) -> Result<(NodeKind, u32, u32), String> {
        Err("no host lookups expected".into())
    }

    fn node(path: &str, t: Option<&str>, major: Option<i64>, minor: Option<i64>) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            node_type: t.map(Into::into),
            major,
            minor,
            ..Default::default()
        }
    }

    fn mount(options: &[&str]) -> Mount {
        Mount {
            host_path: HOST_LIBRARY.into(),
            container_path: CONTAINER_LIBRARY.into(),
            options: options.iter().map(|s| (*s).to_owned()).collect(),
            mount_type: None,
        }
    }

    #[test]
    fn container_paths_are_cleaned_and_dotdot_refused() {
        let p = ContainerPath::parse("/dev//nvidia-caps/./nvidia-cap1").expect("ok");
        assert_eq!(p.to_string(), "/dev/nvidia-caps/nvidia-cap1");
        assert_eq!(p.parent(), ["dev", "nvidia-caps"]);
        assert_eq!(p.name(), "nvidia-cap1");
        let above: Vec<String> = p.ancestors().map(|a| a.to_string()).collect();
        assert_eq!(above, ["/dev", "/dev/nvidia-caps"]);
        assert_eq!(
            ContainerPath::parse("/x").expect("ok").ancestors().count(),
            0
        );
        for bad in ["dev/x", "/", "/dev/../etc/passwd", "/a\0b", ""] {
            assert!(ContainerPath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tessera_nodes_and_mounts_plan_with_defaults() {
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            device_nodes: vec![
                DeviceNode {
                    permissions: Some("rw".into()),
                    ..node("/dev/nvidia0", Some("c"), Some(195), Some(0))
                },
                DeviceNode {
                    file_mode: Some(0o4660),
                    uid: Some(10),
                    gid: Some(20),
                    permissions: Some("none".into()),
                    ..node("/dev/nvidia-caps/nvidia-cap1", Some("c"), Some(508), None)
                },
                node("/dev/fifo", Some("p"), None, None),
            ],
            hooks: vec![Hook::default()],
            mounts: vec![mount(&["ro", "nosuid", "nodev", "bind", "rprivate"])],
            ..Default::default()
        };
        let p = plan(&edits, &no_host).expect("plan");
        assert_eq!(p.nodes[0].mode, 0o666);
        assert_eq!(p.nodes[0].cgroup_rule().as_deref(), Some("c 195:0 rw"));
        assert_eq!(
            (
                p.nodes[1].mode,
                p.nodes[1].uid,
                p.nodes[1].gid,
                p.nodes[1].minor
            ),
            (0o660, 10, 20, 0)
        );
        assert_eq!(p.nodes[1].cgroup_rule(), None);
        assert_eq!(p.nodes[2].kind, NodeKind::Fifo);
        assert_eq!(p.cgroup_rules(), ["c 195:0 rw"]);
        let m = &p.mounts[0];
        assert!(m.readonly && m.nosuid && m.nodev && !m.noexec && !m.recursive);
        assert_eq!(p.skipped.len(), 2);
    }

    #[test]
    fn incomplete_nodes_take_numbers_from_the_host() {
        let edits = ContainerEdits {
            device_nodes: vec![DeviceNode {
                host_path: Some("/sim/dev/nvidiactl".into()),
                ..node("/dev/nvidiactl", None, None, None)
            }],
            ..Default::default()
        };
        let seen = std::cell::RefCell::new(String::new());
        let lookup = |p: &str| {
            seen.replace(p.to_owned());
            Ok((NodeKind::Char, 195, 255))
        };
        let p = plan(&edits, &lookup).expect("plan");
        assert_eq!(seen.into_inner(), "/sim/dev/nvidiactl");
        assert_eq!(p.cgroup_rules(), ["c 195:255 rwm"]);
    }

    #[test]
    fn what_cannot_be_applied_is_refused() {
        let cases: Vec<(ContainerEdits, &str)> = vec![
            (
                ContainerEdits {
                    additional_gids: vec![5],
                    ..Default::default()
                },
                "additionalGids",
            ),
            (
                ContainerEdits {
                    intel_rdt: Some(IntelRdt::default()),
                    ..Default::default()
                },
                "intelRdt",
            ),
            (
                ContainerEdits {
                    mounts: vec![mount(&["ro"])],
                    ..Default::default()
                },
                "not a bind mount",
            ),
            (
                ContainerEdits {
                    mounts: vec![mount(&["bind", "shared"])],
                    ..Default::default()
                },
                "\"shared\"",
            ),
            (
                ContainerEdits {
                    mounts: vec![Mount {
                        mount_type: Some("tmpfs".into()),
                        ..mount(&["bind"])
                    }],
                    ..Default::default()
                },
                "type \"tmpfs\"",
            ),
            (
                ContainerEdits {
                    device_nodes: vec![node("/dev/x", Some("c"), Some(5000), Some(0))],
                    ..Default::default()
                },
                "major 5000 is out of range",
            ),
            (
                ContainerEdits {
                    device_nodes: vec![node("/dev/../x", Some("c"), Some(1), Some(0))],
                    ..Default::default()
                },
                "\"..\"",
            ),
        ];
        for (edits, expect) in cases {
            let e = plan(&edits, &no_host).expect_err(expect);
            assert!(e.contains(expect), "{e:?} lacks {expect:?}");
        }
    }
}
