//! The transient CDI spec of one allocation (`tessera.io/alloc`, one device
//! named by the alloc-id) and the files it mounts.
//!
//! The builder is pure: node facts + the container's granted devices + the
//! allocation's host paths → [`Spec`] ([`build_spec`]), and the limits file
//! ([`limits_file`]). [`write_files`] and [`write_spec`] put them on disk, in
//! that order: the accounting directory and the limits file exist before the
//! spec that mounts them.
//!
//! Host layout of one allocation (the hook's, see `hook/src/binding.rs`):
//!
//! ```text
//! <state_dir>/alloc/<id>/                           0700 root
//! <state_dir>/alloc/<id>/vgpu.json                  0644 the limits file
//! <state_dir>/alloc/<id>/accounting/                0755 → /var/run/tessera (rw)
//! <state_dir>/alloc/<id>/accounting/vgpu.accounting 0666 empty; the library fills it
//! <state_dir>/ld.so.preload                         0644 names the container's library
//! <cdi_dir>/tessera.io-alloc_<id>.json              0644 the spec
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use tessera_model::alloc::AllocId;
use tessera_model::cdi::transient::{BIND_STAGE, UNBIND_STAGE};
use tessera_model::cdi::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
use tessera_model::contract::{self, env, vgpu as vgpu_contract};
use tessera_model::edits::{self, HookSettings};
use tessera_model::facts::{LibraryGroups, NodeFacts};
use tessera_model::vgpu::{CONFIG_VERSION, DeviceConfig, VgpuConfig};

use crate::config::PluginConfig;

/// File name of the limits file inside an allocation's directory.
pub const LIMITS_FILE: &str = "vgpu.json";
/// File name of the host's preload list inside `--state-dir`.
pub const PRELOAD_FILE: &str = "ld.so.preload";

/// Mode of an allocation's directory (root's alone).
pub const ALLOC_DIR_MODE: u32 = 0o700;
/// Mode of `<state_dir>/alloc/`.
pub const ALLOC_PARENT_MODE: u32 = 0o755;
/// Mode of the accounting directory (root's; the workload cannot replace entries).
pub const ACCOUNTING_DIR_MODE: u32 = 0o755;
/// Mode of the accounting file (every uid of the container shares it).
pub const ACCOUNTING_FILE_MODE: u32 = 0o666;

/// Options of the read-only binds (library, preload list, limits file).
const RO_BIND: [&str; 5] = ["ro", "nosuid", "nodev", "bind", "rprivate"];
/// Options of the accounting directory bind.
const RW_BIND: [&str; 6] = ["rw", "nosuid", "nodev", "noexec", "bind", "rprivate"];

/// Why a transient spec or its files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TransientError {
    /// A granted device is not among the node's discovered facts.
    #[error("{0}")]
    MissingFacts(String),
    /// The limits file would be invalid.
    #[error("the limits file would be invalid: {0}")]
    Limits(String),
    /// The spec breaks CDI's or Tessera's rules.
    #[error("the transient spec would be invalid: {0}")]
    Spec(String),
    /// Writing a file failed.
    #[error("{path}: {reason}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// One device a container was granted, as realized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantedDevice {
    /// A vGPU slice of a whole GPU.
    Share {
        /// The GPU's uuid.
        gpu_uuid: String,
        /// Memory limit, MiB.
        memory_mib: u64,
        /// SM share, percent (100: no SM limit).
        cores: u32,
    },
    /// A MIG device (hardware enforces its limits).
    Mig {
        /// The parent GPU's uuid.
        gpu_uuid: String,
        /// The MIG device's uuid.
        mig_uuid: String,
    },
}

impl GrantedDevice {
    /// The uuid the container's NVML and CUDA see: the GPU's, or the MIG device's.
    pub fn visible_uuid(&self) -> &str {
        match self {
            GrantedDevice::Share { gpu_uuid, .. } => gpu_uuid,
            GrantedDevice::Mig { mig_uuid, .. } => mig_uuid,
        }
    }
}

/// Whether the container holds only MIG devices: then neither the vGPU
/// library nor the preload list is mounted (hardware enforces the limits).
pub fn mig_only(devices: &[GrantedDevice]) -> bool {
    !devices.is_empty()
        && devices
            .iter()
            .all(|d| matches!(d, GrantedDevice::Mig { .. }))
}

/// The host paths of one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocPaths {
    /// `<state_dir>/alloc/<id>/`.
    pub alloc_dir: PathBuf,
    /// `<alloc_dir>/vgpu.json`.
    pub limits_file: PathBuf,
    /// `<alloc_dir>/accounting/`.
    pub accounting_dir: PathBuf,
    /// The host file bound read-only over the container's `/etc/ld.so.preload`:
    /// the packaged one beside the vGPU library when it names the container's
    /// library (`/usr/lib/tessera/ld.so.preload` of `tessera-node`), else
    /// `<state_dir>/ld.so.preload`, which the plugin writes.
    pub preload_file: PathBuf,
    /// The vGPU library on the host.
    pub vgpu_library: PathBuf,
    /// `<cdi_dir>/tessera.io-alloc_<id>.json`.
    pub spec_file: PathBuf,
}

impl AllocPaths {
    /// The paths of allocation `id` under the plugin's directories.
    pub fn new(config: &PluginConfig, id: &AllocId) -> AllocPaths {
        let alloc_dir = config
            .state_dir
            .join(contract::node::ALLOC_DIR)
            .join(id.as_str());
        AllocPaths {
            limits_file: alloc_dir.join(LIMITS_FILE),
            accounting_dir: alloc_dir.join(contract::node::ACCOUNTING_SUBDIR),
            alloc_dir,
            preload_file: packaged_preload(&config.vgpu_library)
                .unwrap_or_else(|| config.state_dir.join(PRELOAD_FILE)),
            vgpu_library: config.vgpu_library.clone(),
            spec_file: AllocPaths::spec_file(config, id),
        }
    }

    /// `<cdi_dir>/tessera.io-alloc_<id>.json` alone: callers that only remove
    /// or check the spec need not look for the packaged preload list.
    pub fn spec_file(config: &PluginConfig, id: &AllocId) -> PathBuf {
        config.cdi_dir.join(id.spec_file_name())
    }
}

/// The hook as the plugin's specs name it: `--hook-path`, an explicit
/// minimal env, and `--hook-config` when given.
pub fn hook_settings(config: &PluginConfig) -> HookSettings {
    HookSettings {
        path: config.hook_path.display().to_string(),
        env: vec![contract::hook::PATH_ENV.to_owned()],
        config: config.hook_config.as_ref().map(|p| p.display().to_string()),
    }
}

/// The limits file for the container's devices: per visible uuid (the MIG
/// uuid for a MIG device, whose limits hardware enforces: no software limit),
/// memory in MiB and SM percent.
pub fn limits_file(
    devices: &[GrantedDevice],
    memory_scaling: f64,
) -> Result<VgpuConfig, TransientError> {
    let config = VgpuConfig {
        version: CONFIG_VERSION,
        devices: devices
            .iter()
            .map(|d| match d {
                GrantedDevice::Share {
                    gpu_uuid,
                    memory_mib,
                    cores,
                } => DeviceConfig {
                    uuid: gpu_uuid.clone(),
                    memory_limit_mib: *memory_mib,
                    sm_limit_percent: (*cores).min(100),
                },
                GrantedDevice::Mig { mig_uuid, .. } => DeviceConfig {
                    uuid: mig_uuid.clone(),
                    memory_limit_mib: 0,
                    sm_limit_percent: 0,
                },
            })
            .collect(),
        accounting_dir: PathBuf::from(vgpu_contract::ACCOUNTING_DIR),
        oversubscribe: memory_scaling > 1.0,
        memory_scaling,
        log_level: Default::default(),
    };
    config
        .validate()
        .map_err(|e| TransientError::Limits(e.to_string()))?;
    Ok(config)
}

/// The HAMi-core environment for tools that read it (the library itself
/// reads the limits file): per share device `i` (its position in the
/// container's device list) `CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m` and,
/// below 100 %, `CUDA_DEVICE_SM_LIMIT_<i>`; the accounting file; and
/// `CUDA_OVERSUBSCRIBE=true` when memory is scaled over 1.
pub fn hami_env(devices: &[GrantedDevice], memory_scaling: f64) -> Vec<String> {
    let mut out = Vec::new();
    for (i, device) in devices.iter().enumerate() {
        if let GrantedDevice::Share {
            memory_mib, cores, ..
        } = device
        {
            out.push(format!(
                "{}{i}={memory_mib}m",
                env::hami::MEMORY_LIMIT_PREFIX
            ));
            if *cores > 0 && *cores < 100 {
                out.push(format!("{}{i}={cores}", env::hami::SM_LIMIT_PREFIX));
            }
        }
    }
    out.push(format!(
        "{}={}/{}",
        env::hami::SHARED_CACHE,
        vgpu_contract::ACCOUNTING_DIR,
        vgpu_contract::ACCOUNTING_FILE
    ));
    if memory_scaling > 1.0 {
        out.push(format!("{}=true", env::hami::OVERSUBSCRIBE));
    }
    out
}

/// What [`build_spec`] needs.
#[derive(Debug, Clone, Copy)]
pub struct SpecInput<'a> {
    /// The allocation.
    pub alloc_id: &'a AllocId,
    /// The node, discovered after the container's MIG instances were made.
    pub facts: &'a NodeFacts,
    /// The container's devices, in the reservation's order.
    pub devices: &'a [GrantedDevice],
    /// The allocation's host paths.
    pub paths: &'a AllocPaths,
    /// The hook.
    pub hook: &'a HookSettings,
    /// The node's memory scaling.
    pub memory_scaling: f64,
    /// The driver-file groups the container gets.
    pub library_groups: &'a LibraryGroups,
}

fn device_nodes(
    facts: &NodeFacts,
    device: &GrantedDevice,
) -> Result<Vec<DeviceNode>, TransientError> {
    let uuid = match device {
        GrantedDevice::Share { gpu_uuid, .. } | GrantedDevice::Mig { gpu_uuid, .. } => gpu_uuid,
    };
    let gpu = facts
        .gpus
        .iter()
        .find(|g| g.info.uuid == *uuid)
        .ok_or_else(|| TransientError::MissingFacts(format!("{uuid} is not on this node")))?;
    let edits = match device {
        GrantedDevice::Share { .. } => edits::for_gpu(gpu),
        GrantedDevice::Mig { mig_uuid, .. } => {
            let mig = gpu
                .mig_devices
                .iter()
                .find(|m| m.device.uuid == *mig_uuid)
                .ok_or_else(|| {
                    TransientError::MissingFacts(format!(
                        "MIG device {mig_uuid} is not on {uuid} (discovery did not find it)"
                    ))
                })?;
            edits::for_mig(gpu, mig)
        }
    };
    Ok(edits.device_nodes)
}

fn bind(host: &Path, container: &str, options: &[&str]) -> Mount {
    Mount {
        host_path: host.display().to_string(),
        container_path: container.to_owned(),
        options: options.iter().map(|s| (*s).to_owned()).collect(),
        mount_type: None,
    }
}

/// The container edits of one allocation: the node's common edits (control
/// nodes, driver libraries, the bind hook), each device's nodes (once each),
/// the unbind hook, `TESSERA_ALLOC_ID`, the accounting dir, and — unless the
/// container holds only MIG devices — the vGPU library, the preload list,
/// the limits file and the HAMi-core env.
pub fn container_edits(input: &SpecInput<'_>) -> Result<ContainerEdits, TransientError> {
    let mut edits = edits::common(input.facts, input.hook, input.library_groups);
    for device in input.devices {
        for node in device_nodes(input.facts, device)? {
            if !edits.device_nodes.iter().any(|n| n.path == node.path) {
                edits.device_nodes.push(node);
            }
        }
    }
    edits.hooks.push(Hook {
        hook_name: UNBIND_STAGE.to_owned(),
        path: input.hook.path.clone(),
        args: input.hook.args(UNBIND_STAGE),
        env: input.hook.env.clone(),
        timeout: None,
    });
    debug_assert!(edits.hooks.iter().any(|h| h.hook_name == BIND_STAGE));
    edits
        .env
        .push(format!("{}={}", env::ALLOC_ID, input.alloc_id));
    edits.mounts.push(bind(
        &input.paths.accounting_dir,
        vgpu_contract::ACCOUNTING_DIR,
        &RW_BIND,
    ));
    if !mig_only(input.devices) {
        edits.mounts.push(bind(
            &input.paths.vgpu_library,
            vgpu_contract::CONTAINER_LIBRARY,
            &RO_BIND,
        ));
        edits.mounts.push(bind(
            &input.paths.preload_file,
            vgpu_contract::LD_SO_PRELOAD,
            &RO_BIND,
        ));
        edits.mounts.push(bind(
            &input.paths.limits_file,
            vgpu_contract::CONTAINER_CONFIG_PATH,
            &RO_BIND,
        ));
        edits
            .env
            .extend(hami_env(input.devices, input.memory_scaling));
    }
    Ok(edits)
}

/// The allocation's transient spec: kind `tessera.io/alloc`, one device named
/// by the alloc-id holding every edit; checked with `validate_tessera`.
pub fn build_spec(input: &SpecInput<'_>) -> Result<Spec, TransientError> {
    let edits = container_edits(input)?;
    let spec = Spec::new(
        contract::cdi::ALLOC_KIND,
        vec![Device::new(input.alloc_id.as_str(), edits)],
        ContainerEdits::default(),
    )
    .map_err(|e| TransientError::Spec(e.to_string()))?;
    spec.validate_tessera().map_err(|problems| {
        TransientError::Spec(
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    Ok(spec)
}

/// Rewrites the spec's host paths below `seen` (the driver root as this
/// process sees it) to the same paths below `host` (where the host has it):
/// the container runtime resolves a spec's `hostPath`s on the host, not in
/// the plugin's container. Paths outside `seen`, and every path when the two
/// roots are the same, are left alone.
pub fn to_host_paths(spec: &mut Spec, seen: &Path, host: &Path) {
    if seen == host || seen == Path::new("/") {
        // A plugin that sees the host's `/` names host paths already; below
        // `/` is every path, so a rewrite would move all of them.
        return;
    }
    let rewrite = |path: &str| -> Option<String> {
        let rest = Path::new(path).strip_prefix(seen).ok()?;
        Some(host.join(rest).to_string_lossy().into_owned())
    };
    for edits in std::iter::once(&mut spec.container_edits)
        .chain(spec.devices.iter_mut().map(|d| &mut d.container_edits))
    {
        for mount in &mut edits.mounts {
            if let Some(new) = rewrite(&mount.host_path) {
                mount.host_path = new;
            }
        }
        for node in &mut edits.device_nodes {
            let on_host = node.host_path.as_deref().unwrap_or(&node.path);
            if let Some(new) = rewrite(on_host) {
                node.host_path = Some(new);
            }
        }
    }
}

/// The host preload list's contents: the container's library path.
pub fn preload_contents() -> String {
    format!("{}\n", vgpu_contract::CONTAINER_LIBRARY)
}

/// The package's preload list beside `vgpu_library`, if it is there and
/// names exactly the container's library. A file with other contents is not
/// ours to trust (or rewrite: it belongs to the package), so the plugin then
/// writes its own under the state directory.
pub fn packaged_preload(vgpu_library: &Path) -> Option<PathBuf> {
    let candidate = vgpu_library.with_file_name(PRELOAD_FILE);
    let text = std::fs::read_to_string(&candidate).ok()?;
    (text == preload_contents()).then_some(candidate)
}

/// The same edits in the native form of kubelet's answer (for runtimes
/// without CDI): `(envs, mounts, devices)` as `(key, value)`,
/// `(container, host, read_only)` and `(container, host, permissions)`.
/// Hooks have no native form (the hook is installed by the runtime's
/// hooks.d there).
#[allow(clippy::type_complexity)]
pub fn native_edits(
    spec: &Spec,
) -> (
    BTreeMap<String, String>,
    Vec<(String, String, bool)>,
    Vec<(String, String, String)>,
) {
    let mut envs = BTreeMap::new();
    let mut mounts = Vec::new();
    let mut devices = Vec::new();
    let all = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    for edits in all {
        for entry in &edits.env {
            if let Some((k, v)) = entry.split_once('=') {
                envs.insert(k.to_owned(), v.to_owned());
            }
        }
        for m in &edits.mounts {
            mounts.push((
                m.container_path.clone(),
                m.host_path.clone(),
                m.options.iter().any(|o| o == "ro"),
            ));
        }
        for n in &edits.device_nodes {
            devices.push((
                n.path.clone(),
                n.host_path.clone().unwrap_or_else(|| n.path.clone()),
                n.permissions.clone().unwrap_or_else(|| "rw".to_owned()),
            ));
        }
    }
    (envs, mounts, devices)
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> TransientError + '_ {
    move |e| TransientError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

fn make_dir(path: &Path, mode: u32) -> Result<(), TransientError> {
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(path).map_err(io_err(path))?;
            if !meta.is_dir() {
                return Err(TransientError::Io {
                    path: path.to_owned(),
                    reason: "exists and is not a directory".to_owned(),
                });
            }
        }
        Err(e) => return Err(io_err(path)(e)),
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// Writes the allocation's files, each before anything that names it: the
/// directory, the accounting directory and its empty region file, the limits
/// file, and (unless `mig_only`) the host preload list.
pub fn write_files(
    paths: &AllocPaths,
    limits: &VgpuConfig,
    mig_only: bool,
) -> Result<(), TransientError> {
    if let Some(parent) = paths.alloc_dir.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(ALLOC_PARENT_MODE))
            .map_err(io_err(parent))?;
    }
    make_dir(&paths.alloc_dir, ALLOC_DIR_MODE)?;
    make_dir(&paths.accounting_dir, ACCOUNTING_DIR_MODE)?;
    let region = paths.accounting_dir.join(vgpu_contract::ACCOUNTING_FILE);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(ACCOUNTING_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&region)
        .map_err(io_err(&region))?;
    file.set_permissions(std::fs::Permissions::from_mode(ACCOUNTING_FILE_MODE))
        .map_err(io_err(&region))?;
    drop(file);
    let mut text = serde_json::to_string_pretty(limits).map_err(|e| TransientError::Io {
        path: paths.limits_file.clone(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    tessera_cdi::writer::write_atomic(&paths.limits_file, text.as_bytes()).map_err(|e| {
        TransientError::Io {
            path: paths.limits_file.clone(),
            reason: e.to_string(),
        }
    })?;
    if !mig_only {
        let want = preload_contents();
        let current = std::fs::read_to_string(&paths.preload_file).ok();
        if current.as_deref() != Some(want.as_str()) {
            tessera_cdi::writer::write_atomic(&paths.preload_file, want.as_bytes()).map_err(
                |e| TransientError::Io {
                    path: paths.preload_file.clone(),
                    reason: e.to_string(),
                },
            )?;
        }
    }
    Ok(())
}

/// Writes the spec atomically (temporary file, fsync, rename), root 0644.
pub fn write_spec(path: &Path, spec: &Spec) -> Result<(), TransientError> {
    let mut text = serde_json::to_vec_pretty(spec).map_err(|e| TransientError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    text.write_all(b"\n").ok();
    tessera_cdi::writer::write_atomic(path, &text).map_err(|e| TransientError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use tessera_model::facts::{CharDevice, GpuFacts, MigDeviceFacts};
    use tessera_model::gpu::{GpuInfo, MigDevice, MigModeState};
    use tessera_model::mig::Placement;

    use super::*;

    const ID: &str = "3f2b7c1a-9d4e-4f6a-8b1c-2d3e4f5a6b7c-0";
    const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    const GPU1: &str = "GPU-11111111-0000-0000-0000-000000000000";

    fn dev(path: &str, major: u32, minor: u32) -> CharDevice {
        CharDevice {
            container_path: path.to_owned(),
            host_path: format!("/sim{path}"),
            major,
            minor,
        }
    }

    fn mig(gi: u32, cap: u32) -> MigDeviceFacts {
        MigDeviceFacts {
            device: MigDevice {
                parent_index: 1,
                mig_index: gi,
                gpu_instance_id: gi,
                compute_instance_id: 0,
                profile: "1g.5gb".to_owned(),
                placement: Placement { start: gi, size: 1 },
                uuid: format!("MIG-{gi:08}-0000-0000-0000-000000000000"),
                memory_mib: 4864,
            },
            gi_cap: dev(&format!("/dev/nvidia-caps/nvidia-cap{cap}"), 508, cap),
            ci_cap: dev(
                &format!("/dev/nvidia-caps/nvidia-cap{}", cap + 1),
                508,
                cap + 1,
            ),
        }
    }

    fn facts() -> NodeFacts {
        let info = |index: u32, uuid: &str, mig: bool| GpuInfo {
            index,
            minor: index + 4,
            uuid: uuid.to_owned(),
            name: "NVIDIA A100-SXM4-40GB".to_owned(),
            memory_mib: 40960,
            mig: Some(MigModeState {
                current: mig,
                pending: mig,
            }),
        };
        NodeFacts {
            driver_version: Some("550.0".to_owned()),
            gpus: vec![
                GpuFacts {
                    info: info(0, GPU0, false),
                    node: dev("/dev/nvidia4", 195, 4),
                    mig_devices: Vec::new(),
                },
                GpuFacts {
                    info: info(1, GPU1, true),
                    node: dev("/dev/nvidia5", 195, 5),
                    mig_devices: vec![mig(1, 20), mig(2, 30)],
                },
            ],
            control_nodes: vec![dev("/dev/nvidiactl", 195, 255)],
            libraries: Vec::new(),
        }
    }

    fn paths() -> AllocPaths {
        AllocPaths {
            alloc_dir: PathBuf::from("/var/lib/tessera/alloc").join(ID),
            limits_file: PathBuf::from("/var/lib/tessera/alloc")
                .join(ID)
                .join("vgpu.json"),
            accounting_dir: PathBuf::from("/var/lib/tessera/alloc")
                .join(ID)
                .join("accounting"),
            preload_file: PathBuf::from("/var/lib/tessera/ld.so.preload"),
            vgpu_library: PathBuf::from(vgpu_contract::HOST_LIBRARY),
            spec_file: PathBuf::from("/var/run/cdi").join(format!("tessera.io-alloc_{ID}.json")),
        }
    }

    fn spec(devices: &[GrantedDevice], scaling: f64) -> Result<Spec, TransientError> {
        let id = AllocId::new(ID).expect("id");
        let facts = facts();
        let paths = paths();
        let hook = HookSettings::default();
        build_spec(&SpecInput {
            alloc_id: &id,
            facts: &facts,
            devices,
            paths: &paths,
            hook: &hook,
            memory_scaling: scaling,
            library_groups: &LibraryGroups::default(),
        })
    }

    fn share() -> GrantedDevice {
        GrantedDevice::Share {
            gpu_uuid: GPU0.to_owned(),
            memory_mib: 4096,
            cores: 30,
        }
    }

    fn mig_granted(gi: u32) -> GrantedDevice {
        GrantedDevice::Mig {
            gpu_uuid: GPU1.to_owned(),
            mig_uuid: format!("MIG-{gi:08}-0000-0000-0000-000000000000"),
        }
    }

    fn targets(spec: &Spec) -> Vec<&str> {
        spec.devices[0]
            .container_edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect()
    }

    #[test]
    fn a_share_spec_carries_library_preload_limits_env_and_both_hooks() {
        let spec = spec(&[share()], 1.0).expect("valid");
        assert_eq!(spec.kind, "tessera.io/alloc");
        assert_eq!(spec.devices.len(), 1);
        assert_eq!(spec.devices[0].name, ID);
        let edits = &spec.devices[0].container_edits;
        let nodes: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(nodes, ["/dev/nvidiactl", "/dev/nvidia4"]);
        assert_eq!(
            targets(&spec),
            [
                "/var/run/tessera",
                "/usr/local/tessera/libtessera_vgpu.so",
                "/etc/ld.so.preload",
                "/usr/local/tessera/vgpu.json"
            ]
        );
        for m in &edits.mounts {
            let ro = m.options.iter().any(|o| o == "ro");
            assert_eq!(ro, m.container_path != "/var/run/tessera", "{m:?}");
        }
        assert!(edits.env.contains(&format!("TESSERA_ALLOC_ID={ID}")));
        assert!(
            edits
                .env
                .contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=4096m".to_owned())
        );
        assert!(edits.env.contains(&"CUDA_DEVICE_SM_LIMIT_0=30".to_owned()));
        assert!(edits.env.contains(
            &"CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/run/tessera/vgpu.accounting".to_owned()
        ));
        assert!(
            !edits
                .env
                .iter()
                .any(|e| e.starts_with("CUDA_OVERSUBSCRIBE"))
        );
        let stages: Vec<&str> = edits.hooks.iter().map(|h| h.hook_name.as_str()).collect();
        assert_eq!(stages, ["createContainer", "poststop"]);
        assert!(edits.hooks.iter().all(|h| !h.env.is_empty()));
    }

    #[test]
    fn a_mig_only_spec_has_cap_nodes_once_and_no_library() {
        let spec = spec(&[mig_granted(1), mig_granted(2)], 1.0).expect("valid");
        let edits = &spec.devices[0].container_edits;
        let nodes: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
        // The parent node once, each instance's GI and CI caps.
        assert_eq!(
            nodes,
            [
                "/dev/nvidiactl",
                "/dev/nvidia5",
                "/dev/nvidia-caps/nvidia-cap20",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap30",
                "/dev/nvidia-caps/nvidia-cap31"
            ]
        );
        let cap = &edits.device_nodes[2];
        assert_eq!(
            (cap.node_type.as_deref(), cap.major, cap.minor),
            (Some("c"), Some(508), Some(20))
        );
        assert_eq!(targets(&spec), ["/var/run/tessera"]);
        assert!(edits.env.contains(&format!("TESSERA_ALLOC_ID={ID}")));
        assert!(!edits.env.iter().any(|e| e.starts_with("CUDA_DEVICE_")));
    }

    #[test]
    fn a_mixed_container_lists_the_mig_device_unlimited_and_scaling_oversubscribes() {
        let devices = [share(), mig_granted(1)];
        let spec = spec(&devices, 1.5).expect("valid");
        assert!(targets(&spec).contains(&"/etc/ld.so.preload"));
        let env = &spec.devices[0].container_edits.env;
        assert!(env.contains(&"CUDA_OVERSUBSCRIBE=true".to_owned()));
        assert!(
            !env.iter()
                .any(|e| e.starts_with("CUDA_DEVICE_MEMORY_LIMIT_1"))
        );
        let limits = limits_file(&devices, 1.5).expect("limits");
        assert!(limits.oversubscribe);
        assert_eq!(
            limits.devices[1].uuid,
            "MIG-00000001-0000-0000-0000-000000000000"
        );
        assert_eq!(
            (
                limits.devices[1].memory_limit_mib,
                limits.devices[1].sm_limit_percent
            ),
            (0, 0)
        );
        // The file reads back through the library's strict parser.
        let text = serde_json::to_string(&limits).expect("json");
        assert_eq!(VgpuConfig::parse(&text).expect("parses"), limits);
    }

    #[test]
    fn a_device_missing_from_the_facts_is_named() {
        let err = spec(&[mig_granted(7)], 1.0).expect_err("no such MIG device");
        assert!(err.to_string().contains("MIG-00000007"), "{err}");
        let gone = GrantedDevice::Share {
            gpu_uuid: "GPU-gone".to_owned(),
            memory_mib: 1,
            cores: 1,
        };
        let err = spec(&[gone], 1.0).expect_err("no such GPU");
        assert!(
            err.to_string().contains("GPU-gone is not on this node"),
            "{err}"
        );
    }

    #[test]
    fn native_edits_mirror_the_spec() {
        let spec = spec(&[share()], 1.0).expect("valid");
        let (envs, mounts, devices) = native_edits(&spec);
        assert_eq!(envs.get("TESSERA_ALLOC_ID").map(String::as_str), Some(ID));
        assert!(
            mounts
                .iter()
                .any(|(c, h, ro)| c == "/usr/local/tessera/vgpu.json"
                    && h.ends_with("/vgpu.json")
                    && *ro)
        );
        assert!(
            devices
                .iter()
                .any(|(c, h, p)| c == "/dev/nvidia4" && h == "/sim/dev/nvidia4" && p == "rw")
        );
    }

    #[test]
    fn host_paths_below_the_seen_driver_root_move_to_the_host_root() {
        let mut built = spec(&[share()], 1.0).expect("valid");
        let edits = &mut built.devices[0].container_edits;
        edits.mounts.push(Mount {
            host_path: "/host/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            ..Default::default()
        });
        edits.device_nodes.push(DeviceNode {
            path: "/host/dev/nvidia0".into(),
            ..Default::default()
        });
        // A lookalike prefix is not below the root.
        edits.mounts.push(Mount {
            host_path: "/hostile/lib.so".into(),
            container_path: "/lib.so".into(),
            ..Default::default()
        });
        let before = built.clone();
        to_host_paths(&mut built, Path::new("/host"), Path::new("/"));
        let edits = &built.devices[0].container_edits;
        let hosts: Vec<&str> = edits.mounts.iter().map(|m| m.host_path.as_str()).collect();
        assert!(hosts.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.1"));
        assert!(hosts.contains(&"/hostile/lib.so"));
        assert!(!hosts.iter().any(|h| h.starts_with("/host/")));
        let node = edits.device_nodes.last().expect("node");
        assert_eq!(node.path, "/host/dev/nvidia0", "the container path stays");
        assert_eq!(node.host_path.as_deref(), Some("/dev/nvidia0"));
        // Container paths never change.
        let containers = |s: &Spec| -> Vec<String> {
            s.devices[0]
                .container_edits
                .mounts
                .iter()
                .map(|m| m.container_path.clone())
                .collect()
        };
        assert_eq!(containers(&built), containers(&before));
        // The same root, or a plugin that sees `/`: nothing moves.
        let mut same = before.clone();
        to_host_paths(&mut same, Path::new("/host"), Path::new("/host"));
        assert_eq!(same, before);
        let mut from_slash = before.clone();
        to_host_paths(&mut from_slash, Path::new("/"), Path::new("/host"));
        assert_eq!(from_slash, before);
    }

    #[test]
    fn the_packaged_preload_list_is_used_only_when_it_names_the_container_library() {
        // The file tessera-node ships is this constant's text, byte for byte.
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/node/ld.so.preload");
        assert_eq!(
            std::fs::read_to_string(&shipped).expect("packaging/node/ld.so.preload"),
            preload_contents()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let library = dir.path().join("libtessera_vgpu.so");
        assert_eq!(packaged_preload(&library), None, "no file beside it");
        let beside = dir.path().join(PRELOAD_FILE);
        std::fs::write(&beside, "/usr/lib/evil.so\n").expect("write");
        assert_eq!(packaged_preload(&library), None, "other contents");
        std::fs::copy(&shipped, &beside).expect("copy");
        assert_eq!(packaged_preload(&library), Some(beside));
    }

    #[test]
    fn files_are_made_with_their_modes_before_the_spec() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path();
        let alloc_dir = base.join("alloc").join(ID);
        let paths = AllocPaths {
            limits_file: alloc_dir.join(LIMITS_FILE),
            accounting_dir: alloc_dir.join("accounting"),
            alloc_dir: alloc_dir.clone(),
            preload_file: base.join(PRELOAD_FILE),
            vgpu_library: PathBuf::from(vgpu_contract::HOST_LIBRARY),
            spec_file: base.join("cdi").join("x.json"),
        };
        let limits = limits_file(&[share()], 1.0).expect("limits");
        write_files(&paths, &limits, false).expect("written");
        // Idempotent: a second write changes nothing and does not fail.
        write_files(&paths, &limits, false).expect("written again");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&alloc_dir), 0o700);
        assert_eq!(mode(&paths.accounting_dir), 0o755);
        let region = paths.accounting_dir.join(vgpu_contract::ACCOUNTING_FILE);
        assert_eq!(mode(&region), 0o666);
        assert_eq!(std::fs::metadata(&region).expect("stat").len(), 0);
        assert_eq!(mode(&paths.limits_file), 0o644);
        assert_eq!(
            std::fs::read_to_string(&paths.preload_file).expect("preload"),
            preload_contents()
        );
        let spec = spec(&[share()], 1.0).expect("valid");
        write_spec(&paths.spec_file, &spec).expect("spec");
        assert_eq!(mode(&paths.spec_file), 0o644);
    }
}
