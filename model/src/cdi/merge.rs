//! Combining container edits the way the reference applier applies them.
//!
//! When a runtime injects several CDI devices it applies their edits one after
//! another to the container's OCI config (`pkg/cdi/container-edits.go`,
//! `ContainerEdits.Apply`). [`ContainerEdits::append`] folds edits together so
//! that the result, applied once, gives the same container as applying both in
//! turn. Every path into the container (CDI runtime, native Allocate answer,
//! `tessera-hook` in legacy mode) can therefore work from one merged set.
//!
//! | field | rule |
//! |---|---|
//! | `env` | a `KEY=…` replaces the last earlier entry with the same `KEY` in place; a new key is appended (an entry without `=` is its own key) |
//! | `deviceNodes` | replace by container `path`: earlier nodes with that path are removed and the new one appended |
//! | `mounts` | replace by `containerPath` (exact string): earlier mounts are removed and the new one appended; then all mounts are stably sorted by path depth (the number of `/` in the cleaned path), so parents mount before children |
//! | `hooks` | appended, order kept |
//! | `intelRdt` | the later one wins |
//! | `additionalGids` | appended when not present yet; gid 0 is skipped, as the applier skips it |
//! | `netDevices` | replace by `hostInterfaceName` |
//!
//! Device cgroup rules are not edits but follow from them:
//! [`ContainerEdits::device_cgroup_rules`] lists the allow rules the applier adds.

use super::spec::{ContainerEdits, DeviceNode};

impl ContainerEdits {
    /// Folds `other` into `self` with the applier's semantics (see the module docs):
    /// applying the result equals applying `self`, then `other`.
    pub fn append(&mut self, other: &ContainerEdits) {
        for entry in &other.env {
            set_env(&mut self.env, entry);
        }
        for node in &other.device_nodes {
            self.device_nodes.retain(|n| n.path != node.path);
            self.device_nodes.push(node.clone());
        }
        for dev in &other.net_devices {
            self.net_devices
                .retain(|d| d.host_interface_name != dev.host_interface_name);
            self.net_devices.push(dev.clone());
        }
        if !other.mounts.is_empty() {
            for mount in &other.mounts {
                self.mounts
                    .retain(|m| m.container_path != mount.container_path);
                self.mounts.push(mount.clone());
            }
            self.mounts.sort_by_key(|m| mount_depth(&m.container_path));
        }
        self.hooks.extend(other.hooks.iter().cloned());
        if other.intel_rdt.is_some() {
            self.intel_rdt.clone_from(&other.intel_rdt);
        }
        for gid in &other.additional_gids {
            if *gid != 0 && !self.additional_gids.contains(gid) {
                self.additional_gids.push(*gid);
            }
        }
    }

    /// Merges a sequence of edits, first to last, with [`ContainerEdits::append`].
    pub fn merged<'a>(edits: impl IntoIterator<Item = &'a ContainerEdits>) -> ContainerEdits {
        let mut all = ContainerEdits::default();
        for e in edits {
            all.append(e);
        }
        all
    }

    /// The device cgroup allow rules the applier adds for these edits: one per
    /// block (`b`) or char (`c`) device node, in node order. Nodes without an
    /// explicit type are left out: the applier takes their type (and missing
    /// numbers) from the host node, which only an I/O layer can read.
    pub fn device_cgroup_rules(&self) -> Vec<DeviceCgroupRule> {
        self.device_nodes
            .iter()
            .filter_map(DeviceCgroupRule::for_node)
            .collect()
    }
}

/// A device cgroup rule, as in the OCI config's `linux.resources.devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCgroupRule {
    /// Allow (true) or deny; the applier only allows.
    pub allow: bool,
    /// `b` or `c`.
    pub node_type: char,
    /// Major number; `None` when the node leaves it to the host.
    pub major: Option<i64>,
    /// Minor number; `None` when the node leaves it to the host (0 when only the major is given).
    pub minor: Option<i64>,
    /// Access, a subset of `rwm`; empty for the reference's `"none"`.
    pub access: String,
}

impl DeviceCgroupRule {
    /// The rule for one device node, if it is a block or char node.
    pub fn for_node(node: &DeviceNode) -> Option<DeviceCgroupRule> {
        let node_type = match node.node_type.as_deref() {
            Some("b") => 'b',
            Some("c") => 'c',
            _ => return None,
        };
        let access = match node.permissions.as_deref() {
            None | Some("") => "rwm",
            Some("none") => "",
            Some(p) => p,
        };
        let major = node.major.filter(|m| *m != 0);
        Some(DeviceCgroupRule {
            allow: true,
            node_type,
            major,
            minor: major.map(|_| node.minor.unwrap_or(0)),
            access: access.to_owned(),
        })
    }
}

/// Sets one `KEY=VALUE` entry: replaces the last entry with the same key, or appends.
pub fn set_env(env: &mut Vec<String>, entry: &str) {
    let key = env_key(entry);
    match env.iter().rposition(|e| env_key(e) == key) {
        Some(i) => entry.clone_into(&mut env[i]),
        None => env.push(entry.to_owned()),
    }
}

fn env_key(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(k, _)| k)
}

/// Depth of a mount target: the number of `/` in the lexically cleaned path,
/// as Go's `strings.Count(filepath.Clean(p), "/")`.
pub fn mount_depth(path: &str) -> usize {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !absolute {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    if absolute {
        parts.len().max(1)
    } else {
        parts.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{Hook, IntelRdt, Mount, NetDevice};

    fn env(entries: &[&str]) -> ContainerEdits {
        ContainerEdits {
            env: entries.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn node(path: &str, minor: u32) -> DeviceNode {
        DeviceNode::char(path, 195, minor)
    }

    fn mount(host: &str, container: &str) -> Mount {
        Mount {
            host_path: host.into(),
            container_path: container.into(),
            options: vec!["ro".into(), "bind".into()],
            mount_type: None,
        }
    }

    #[test]
    fn env_keys_replace_in_place_and_new_keys_append() {
        let mut a = env(&["A=1", "B=2", "C=3"]);
        a.append(&env(&["B=20", "D=4", "A=10", "D=40", "FLAG"]));
        assert_eq!(a.env, ["A=10", "B=20", "C=3", "D=40", "FLAG"]);
        a.append(&env(&["FLAG=on"]));
        assert_eq!(a.env, ["A=10", "B=20", "C=3", "D=40", "FLAG=on"]);
    }

    #[test]
    fn env_replaces_the_last_duplicate_like_the_applier() {
        let mut a = env(&["A=1", "A=2"]);
        a.append(&env(&["A=3"]));
        assert_eq!(a.env, ["A=1", "A=3"]);
    }

    #[test]
    fn device_nodes_replace_by_container_path() {
        let mut a = ContainerEdits {
            device_nodes: vec![node("/dev/nvidia0", 0), node("/dev/nvidiactl", 255)],
            ..Default::default()
        };
        let b = ContainerEdits {
            device_nodes: vec![node("/dev/nvidia0", 7), node("/dev/nvidia-uvm", 0)],
            ..Default::default()
        };
        a.append(&b);
        let got: Vec<(&str, Option<i64>)> = a
            .device_nodes
            .iter()
            .map(|n| (n.path.as_str(), n.minor))
            .collect();
        assert_eq!(
            got,
            [
                ("/dev/nvidiactl", Some(255)),
                ("/dev/nvidia0", Some(7)),
                ("/dev/nvidia-uvm", Some(0)),
            ]
        );
    }

    #[test]
    fn mounts_replace_by_container_path_and_sort_by_depth() {
        let mut a = ContainerEdits {
            mounts: vec![
                mount("/host/a", "/usr/local/tessera/libtessera_vgpu.so"),
                mount("/host/preload", "/etc/ld.so.preload"),
            ],
            ..Default::default()
        };
        let b = ContainerEdits {
            mounts: vec![
                mount("/host/b", "/usr/local/tessera/libtessera_vgpu.so"),
                mount("/host/dir", "/usr/local/tessera"),
                mount("/host/root", "/x"),
            ],
            ..Default::default()
        };
        a.append(&b);
        let got: Vec<(&str, &str)> = a
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m.host_path.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("/x", "/host/root"),
                ("/etc/ld.so.preload", "/host/preload"),
                ("/usr/local/tessera", "/host/dir"),
                ("/usr/local/tessera/libtessera_vgpu.so", "/host/b"),
            ]
        );
    }

    #[test]
    fn hooks_append_rdt_replaces_gids_dedupe_net_devices_replace() {
        let hook = |p: &str| Hook {
            hook_name: "createContainer".into(),
            path: p.into(),
            ..Default::default()
        };
        // Edits with the given hooks and gids, an RDT class and a net device named by `n`.
        let edits = |hooks: Vec<Hook>, gids: Vec<u32>, clos: &str, net: &str| ContainerEdits {
            hooks,
            additional_gids: gids,
            intel_rdt: Some(IntelRdt {
                clos_id: Some(clos.into()),
                ..Default::default()
            }),
            net_devices: vec![NetDevice {
                host_interface_name: "eth1".into(),
                name: net.into(),
            }],
            ..Default::default()
        };
        let mut a = edits(vec![hook("/a")], vec![44], "one", "net0");
        let b = edits(
            vec![hook("/a"), hook("/b")],
            vec![0, 44, 45, 45],
            "two",
            "net1",
        );
        a.append(&b);
        assert_eq!(a.hooks, [hook("/a"), hook("/a"), hook("/b")]);
        assert_eq!(a.additional_gids, [44, 45]);
        assert_eq!(a.intel_rdt.and_then(|r| r.clos_id).as_deref(), Some("two"));
        assert_eq!(a.net_devices.len(), 1);
        assert_eq!(a.net_devices[0].name, "net1");
    }

    #[test]
    fn merged_folds_in_order_and_empty_is_identity() {
        let a = env(&["A=1"]);
        let b = env(&["A=2", "B=1"]);
        assert_eq!(ContainerEdits::merged([&a, &b]).env, ["A=2", "B=1"]);
        let mut c = a.clone();
        c.append(&ContainerEdits::default());
        assert_eq!(c, a);
    }

    #[test]
    fn cgroup_rules_for_block_and_char_nodes() {
        let edits = ContainerEdits {
            device_nodes: vec![
                node("/dev/nvidia0", 0),
                DeviceNode {
                    permissions: Some("none".into()),
                    ..node("/dev/nvidia1", 1)
                },
                DeviceNode {
                    node_type: Some("b".into()),
                    major: Some(8),
                    minor: None,
                    permissions: Some("r".into()),
                    ..node("/dev/sda", 0)
                },
                DeviceNode {
                    node_type: Some("p".into()),
                    major: None,
                    minor: None,
                    ..node("/dev/fifo", 0)
                },
                DeviceNode {
                    path: "/dev/from-host".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let rule = |t, major, minor, access: &str| DeviceCgroupRule {
            allow: true,
            node_type: t,
            major,
            minor,
            access: access.into(),
        };
        assert_eq!(
            edits.device_cgroup_rules(),
            [
                rule('c', Some(195), Some(0), "rwm"),
                rule('c', Some(195), Some(1), ""),
                rule('b', Some(8), Some(0), "r"),
            ]
        );
    }

    #[test]
    fn mount_depth_matches_go_clean_and_count() {
        for (path, depth) in [
            ("/", 1),
            ("/a", 1),
            ("/a/b", 2),
            ("/a/b/", 2),
            ("/a//b", 2),
            ("/a/./b", 2),
            ("/a/../b", 1),
            ("/..", 1),
            ("", 0),
            ("a", 0),
            ("a/b", 1),
            ("../..", 1),
        ] {
            assert_eq!(mount_depth(path), depth, "path {path:?}");
        }
    }
}
