//! From node facts to CDI container edits: the pure middle layer between
//! discovery and spec writing. Nothing here reads the host.

use crate::cdi::{ContainerEdits, Device, DeviceNode, Hook, Mount};
use crate::facts::{CharDevice, GpuFacts, HostFile, LibraryGroups, MigDeviceFacts, NodeFacts};

/// Where the Tessera hook lives on the host and the environment it runs with.
///
/// Every hook entry Tessera emits carries an explicit `env`: a runtime that
/// finds none runs the hook with the container's environment, which is how
/// `LD_PRELOAD` from an image reached NVIDIA's hook (CVE-2025-23266).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSettings {
    /// Absolute host path of `tessera-hook`.
    pub path: String,
    /// The hook's complete environment (must not be empty).
    pub env: Vec<String>,
    /// `hook.toml` for the hook to read (`--config FILE`); `None`: the hook's
    /// default, `/etc/tessera/hook.toml`.
    pub config: Option<String>,
}

impl HookSettings {
    /// The hook's argv for `verb`: `tessera-hook [--config FILE] <verb>`.
    pub fn args(&self, verb: &str) -> Vec<String> {
        let mut args = vec![crate::contract::hook::BINARY_NAME.to_owned()];
        if let Some(config) = &self.config {
            args.extend(["--config".to_owned(), config.clone()]);
        }
        args.push(verb.to_owned());
        args
    }
}

impl Default for HookSettings {
    fn default() -> Self {
        Self {
            path: DEFAULT_HOOK_PATH.to_owned(),
            env: vec![HOOK_PATH_ENV.to_owned()],
            config: None,
        }
    }
}

use crate::contract::hook::{BINARY_PATH as DEFAULT_HOOK_PATH, PATH_ENV as HOOK_PATH_ENV};

/// Options of every driver file bind-mounted into a container: read-only, and
/// no set-uid or device files through it.
const LIBRARY_MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "bind", "rprivate"];

/// The CDI device node for a character device found on the host.
///
/// Type, major and minor are always written, so the runtime can create the node
/// even where the host creates it lazily (MIG capability nodes). The host path is
/// written only when it differs from the container path (a simulated root).
pub fn device_node(dev: &CharDevice) -> DeviceNode {
    DeviceNode {
        host_path: (dev.host_path != dev.container_path).then(|| dev.host_path.clone()),
        permissions: Some("rw".to_owned()),
        ..DeviceNode::char(dev.container_path.clone(), dev.major, dev.minor)
    }
}

fn library_mount(file: &HostFile) -> Mount {
    Mount {
        host_path: file.host_path.clone(),
        container_path: file.container_path.clone(),
        options: LIBRARY_MOUNT_OPTIONS
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        mount_type: None,
    }
}

/// Edits for a whole GPU: its `/dev/nvidia<minor>` node.
pub fn for_gpu(gpu: &GpuFacts) -> ContainerEdits {
    ContainerEdits {
        device_nodes: vec![device_node(&gpu.node)],
        ..ContainerEdits::default()
    }
}

/// Edits for a MIG device: the parent GPU's node plus the GI and CI capability nodes.
pub fn for_mig(parent: &GpuFacts, mig: &MigDeviceFacts) -> ContainerEdits {
    ContainerEdits {
        device_nodes: vec![
            device_node(&parent.node),
            device_node(&mig.gi_cap),
            device_node(&mig.ci_cap),
        ],
        ..ContainerEdits::default()
    }
}

/// The read-only bind mounts of the driver files of `groups`, in discovery
/// order, each at the container path the host has (a versioned library and its
/// SONAME name are two mounts of the same file).
pub fn library_mounts(facts: &NodeFacts, groups: &LibraryGroups) -> Vec<Mount> {
    facts
        .libraries
        .iter()
        .filter(|f| groups.contains(f.group))
        .map(library_mount)
        .collect()
}

/// Edits every GPU container of the node needs once: control and UVM nodes,
/// the driver files of `groups` (read-only, [`library_mounts`]), and the
/// Tessera hook.
///
/// `NVIDIA_VISIBLE_DEVICES=void` keeps a legacy NVIDIA runtime hook on the same
/// node from injecting devices a second time, as NVIDIA's own CDI specs do.
pub fn common(facts: &NodeFacts, hook: &HookSettings, groups: &LibraryGroups) -> ContainerEdits {
    ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()],
        device_nodes: facts.control_nodes.iter().map(device_node).collect(),
        hooks: vec![Hook {
            hook_name: crate::cdi::transient::BIND_STAGE.to_owned(),
            path: hook.path.clone(),
            args: hook.args(crate::cdi::transient::BIND_VERB),
            env: hook.env.clone(),
            timeout: None,
        }],
        mounts: library_mounts(facts, groups),
        ..ContainerEdits::default()
    }
}

/// The devices of the node's static spec (`tessera.io/gpu`).
///
/// A GPU without MIG is offered as `<index>` and `GPU-<uuid>`; a MIG-enabled GPU
/// is not offered whole, only its existing MIG devices as `<gpu>:<mig-index>` and
/// `MIG-<uuid>`. `all` gathers every node of every device once. Returns no
/// devices when the node offers nothing.
pub fn static_devices(facts: &NodeFacts) -> Vec<Device> {
    let mut devices = Vec::new();
    let mut all = ContainerEdits::default();
    let mut push = |devices: &mut Vec<Device>, names: [String; 2], edits: ContainerEdits| {
        for node in &edits.device_nodes {
            if !all.device_nodes.iter().any(|n| n.path == node.path) {
                all.device_nodes.push(node.clone());
            }
        }
        for name in names {
            devices.push(Device {
                name,
                annotations: Default::default(),
                container_edits: edits.clone(),
            });
        }
    };
    for gpu in &facts.gpus {
        if gpu.info.mig_enabled() {
            for mig in &gpu.mig_devices {
                let names = [
                    crate::contract::cdi::mig_device_name(gpu.info.index, mig.device.mig_index),
                    mig.device.uuid.clone(),
                ];
                push(&mut devices, names, for_mig(gpu, mig));
            }
        } else {
            let names = [gpu.info.index.to_string(), gpu.info.uuid.clone()];
            push(&mut devices, names, for_gpu(gpu));
        }
    }
    if !devices.is_empty() {
        devices.push(Device {
            name: "all".to_owned(),
            annotations: Default::default(),
            container_edits: all,
        });
    }
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::LibraryGroup;
    use crate::gpu::{GpuInfo, MigDevice, MigModeState};
    use crate::mig::Placement;

    fn char_dev(path: &str, root: &str, major: u32, minor: u32) -> CharDevice {
        CharDevice {
            container_path: path.to_owned(),
            host_path: format!("{root}{path}"),
            major,
            minor,
        }
    }

    fn gpu(index: u32, minor: u32, mig: bool) -> GpuFacts {
        GpuFacts {
            info: GpuInfo {
                index,
                minor,
                uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
                name: "NVIDIA H100 80GB HBM3".to_owned(),
                memory_mib: 81559,
                mig: Some(MigModeState {
                    current: mig,
                    pending: mig,
                }),
            },
            node: char_dev(&format!("/dev/nvidia{minor}"), "", 195, minor),
            mig_devices: Vec::new(),
        }
    }

    fn mig(parent: u32, mig_index: u32, gi: u32, gi_minor: u32) -> MigDeviceFacts {
        MigDeviceFacts {
            device: MigDevice {
                parent_index: parent,
                mig_index,
                gpu_instance_id: gi,
                compute_instance_id: 0,
                profile: "1g.10gb".to_owned(),
                placement: Placement { start: 0, size: 1 },
                uuid: format!("MIG-{parent:04}{mig_index:04}-0000-0000-0000-000000000000"),
                memory_mib: 9856,
            },
            gi_cap: char_dev(
                &format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"),
                "",
                508,
                gi_minor,
            ),
            ci_cap: char_dev(
                &format!("/dev/nvidia-caps/nvidia-cap{}", gi_minor + 1),
                "",
                508,
                gi_minor + 1,
            ),
        }
    }

    fn names(devices: &[Device]) -> Vec<&str> {
        devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn whole_gpu_gets_index_and_uuid_names_and_its_node() {
        let facts = NodeFacts {
            driver_version: None,
            gpus: vec![gpu(0, 0, false), gpu(1, 3, false)],
            control_nodes: vec![],
            libraries: vec![],
        };
        let devices = static_devices(&facts);
        assert_eq!(
            names(&devices),
            [
                "0",
                "GPU-00000000-0000-0000-0000-000000000000",
                "1",
                "GPU-00000001-0000-0000-0000-000000000000",
                "all"
            ]
        );
        // GPU 1 has minor 3: the node follows the minor, not the index.
        assert_eq!(
            devices[2].container_edits.device_nodes[0].path,
            "/dev/nvidia3"
        );
        assert_eq!(devices[2].container_edits.device_nodes[0].minor, Some(3));
        assert_eq!(devices[4].container_edits.device_nodes.len(), 2);
    }

    #[test]
    fn mig_enabled_gpu_is_offered_only_as_its_mig_devices() {
        let mut g = gpu(0, 0, true);
        g.mig_devices = vec![mig(0, 0, 7, 84), mig(0, 1, 8, 93)];
        let facts = NodeFacts {
            driver_version: None,
            gpus: vec![g],
            control_nodes: vec![],
            libraries: vec![],
        };
        let devices = static_devices(&facts);
        assert_eq!(
            names(&devices),
            [
                "0:0",
                "MIG-00000000-0000-0000-0000-000000000000",
                "0:1",
                "MIG-00000001-0000-0000-0000-000000000000",
                "all"
            ]
        );
        let paths: Vec<_> = devices[2]
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap93",
                "/dev/nvidia-caps/nvidia-cap94"
            ]
        );
        // `all`: the parent node once, plus four cap nodes.
        assert_eq!(devices[4].container_edits.device_nodes.len(), 5);
    }

    #[test]
    fn mig_enabled_gpu_without_instances_offers_nothing() {
        let facts = NodeFacts {
            driver_version: None,
            gpus: vec![gpu(0, 0, true)],
            control_nodes: vec![],
            libraries: vec![],
        };
        assert!(static_devices(&facts).is_empty());
    }

    #[test]
    fn host_path_is_written_only_under_a_foreign_root() {
        let real = device_node(&char_dev("/dev/nvidiactl", "", 195, 255));
        assert_eq!(real.host_path, None);
        let sim = device_node(&char_dev("/dev/nvidiactl", "/tmp/node", 195, 255));
        assert_eq!(sim.host_path.as_deref(), Some("/tmp/node/dev/nvidiactl"));
        assert_eq!(sim.node_type.as_deref(), Some("c"));
    }

    #[test]
    fn common_edits_carry_a_hook_with_explicit_env_and_read_only_libraries() {
        let facts = NodeFacts {
            driver_version: None,
            gpus: vec![],
            control_nodes: vec![char_dev("/dev/nvidiactl", "", 195, 255)],
            libraries: vec![HostFile {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_owned(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_owned(),
                group: LibraryGroup::Compute,
            }],
        };
        let edits = common(&facts, &HookSettings::default(), &LibraryGroups::default());
        assert_eq!(edits.hooks.len(), 1);
        assert_eq!(edits.hooks[0].hook_name, "createContainer");
        assert_eq!(edits.hooks[0].env, [HOOK_PATH_ENV]);
        assert!(edits.mounts[0].options.contains(&"ro".to_owned()));
        assert_eq!(edits.device_nodes[0].path, "/dev/nvidiactl");
    }

    #[test]
    fn only_the_chosen_groups_are_mounted() {
        let file = |path: &str, group| HostFile {
            host_path: format!("/home/kubernetes/bin/nvidia{path}"),
            container_path: path.to_owned(),
            group,
        };
        let facts = NodeFacts {
            driver_version: Some("550.54.14".to_owned()),
            gpus: vec![],
            control_nodes: vec![],
            libraries: vec![
                file("/lib64/libcuda.so.550.54.14", LibraryGroup::Compute),
                file("/lib64/libcuda.so.1", LibraryGroup::Compute),
                file("/lib64/libnvcuvid.so.550.54.14", LibraryGroup::Video),
                file("/lib64/libnvoptix.so.550.54.14", LibraryGroup::Graphics),
                file("/bin/nvidia-smi", LibraryGroup::Utilities),
            ],
        };
        let paths = |groups: &str| -> Vec<String> {
            library_mounts(&facts, &groups.parse().unwrap())
                .into_iter()
                .map(|m| m.container_path)
                .collect()
        };
        assert_eq!(
            paths("compute,video,utilities"),
            [
                "/lib64/libcuda.so.550.54.14",
                "/lib64/libcuda.so.1",
                "/lib64/libnvcuvid.so.550.54.14",
                "/bin/nvidia-smi"
            ]
        );
        assert_eq!(paths("graphics"), ["/lib64/libnvoptix.so.550.54.14"]);
        assert_eq!(paths("all").len(), 5);
        let mount = &library_mounts(&facts, &LibraryGroups::all())[0];
        assert_eq!(
            mount.host_path,
            "/home/kubernetes/bin/nvidia/lib64/libcuda.so.550.54.14"
        );
        assert_eq!(mount.options, LIBRARY_MOUNT_OPTIONS);
    }
}
