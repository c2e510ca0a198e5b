//! The plugin's settings: flags (see [`crate::cli`]) over the cluster config
//! file (HAMi's device ConfigMap shape, `model::sched::config`), resolved
//! once at start into [`PluginConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;

use tessera_model::facts::LibraryGroups;
use tessera_model::sched::config::{
    FilterDevices, MigAllowlistEntry, OperatingMode, default_mig_allowlist,
};

/// How Allocate hands a container its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CdiMode {
    /// `cdi_devices` in the Allocate answer (kubelet ≥ 1.28 passes them to CRI).
    #[default]
    CdiField,
    /// The `cdi.k8s.io/tessera_<alloc-id>` annotation (older kubelets).
    CdiAnnotations,
    /// Native `devices`, `mounts` and `envs`, for runtimes without CDI.
    Native,
    /// Every form at once.
    All,
}

impl CdiMode {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CdiMode::CdiField => "cdi-field",
            CdiMode::CdiAnnotations => "cdi-annotations",
            CdiMode::Native => "native",
            CdiMode::All => "all",
        }
    }

    /// Whether the answer carries `cdi_devices`.
    pub fn cdi_field(self) -> bool {
        matches!(self, CdiMode::CdiField | CdiMode::All)
    }

    /// Whether the answer carries the CDI annotation.
    pub fn cdi_annotation(self) -> bool {
        matches!(self, CdiMode::CdiAnnotations | CdiMode::All)
    }

    /// Whether the answer carries native devices, mounts and envs.
    pub fn native(self) -> bool {
        matches!(self, CdiMode::Native | CdiMode::All)
    }
}

impl std::str::FromStr for CdiMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cdi-field" => Ok(CdiMode::CdiField),
            "cdi-annotations" => Ok(CdiMode::CdiAnnotations),
            "native" => Ok(CdiMode::Native),
            "all" => Ok(CdiMode::All),
            other => Err(format!(
                "--cdi-mode: {other:?} is not one of cdi-field, cdi-annotations, native, all"
            )),
        }
    }
}

/// How the node's GPUs are offered: the seed's flags, after the cluster
/// config's defaults and the node's `nodeconfig` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSettings {
    /// Replicas (`nvidia.com/gpu` devices) per share GPU.
    pub split_count: u32,
    /// Memory a share GPU offers, × its physical memory (> 1 oversubscribes
    /// into host memory through the vGPU library).
    pub memory_scaling: f64,
    /// SM share a share GPU offers, × 100 %.
    pub cores_scaling: f64,
    /// MIG profiles pods may get, per GPU model (`migProfileAllowlist`; the
    /// most specific matching entry wins, a model no entry matches gets no
    /// MIG instances); see [`DeviceSettings::allowed_profiles`].
    pub mig_profile_allowlist: Vec<MigAllowlistEntry>,
    /// The node's `operatingmode`: only share GPUs, only MIG GPUs, or (`None`)
    /// each GPU by its MIG mode.
    pub operating_mode: Option<OperatingMode>,
    /// GPUs never offered (HAMi's `filterdevices`: uuids, indexes).
    pub filter: FilterDevices,
    /// Root of `dev/` (`--dev-root`); `None`: the driver root.
    pub dev_root: Option<PathBuf>,
    /// Root of `proc/` (`--proc-root`); `None`: the driver root when it holds
    /// `proc/driver/nvidia`, else `/` ([`Layout::default_proc_root`]).
    ///
    /// [`Layout::default_proc_root`]: tessera_driver::discover::Layout::default_proc_root
    pub proc_root: Option<PathBuf>,
    /// The driver-file groups containers get (`--library-groups`).
    pub library_groups: LibraryGroups,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        Self {
            split_count: 10,
            memory_scaling: 1.0,
            cores_scaling: 1.0,
            mig_profile_allowlist: default_mig_allowlist(),
            operating_mode: None,
            filter: FilterDevices::default(),
            dev_root: None,
            proc_root: None,
            library_groups: LibraryGroups::default(),
        }
    }
}

impl DeviceSettings {
    /// Where discovery looks: `driver_root` with this node's dev and proc roots.
    pub fn layout(&self, driver_root: &std::path::Path) -> tessera_driver::discover::Layout {
        tessera_driver::discover::Layout::from_flags(
            driver_root,
            self.dev_root.as_deref(),
            self.proc_root.as_deref(),
        )
    }

    /// The profile names allowed on a GPU whose product name is `model`
    /// (the most specific matching allowlist entry's; between equally
    /// specific entries the first), or `None`: no MIG profile on it. The
    /// extender's reading ([`tessera_model::sched::config::allowed_profiles`]).
    pub fn allowed_profiles(&self, model: &str) -> Option<&[String]> {
        tessera_model::sched::config::allowed_profiles(&self.mig_profile_allowlist, model)
    }

    /// Whether `filterdevices` leaves the GPU (NVML index and uuid) out; an
    /// entry of the uuid list that is a number names an index (as HAMi
    /// reads it).
    pub fn filtered(&self, index: u32, uuid: &str) -> bool {
        self.filter.excludes(index, uuid)
    }
}

/// Everything the plugin runs with.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// This node's name (`--node-name`, else `$NODE_NAME`).
    pub node_name: String,
    /// Kubeconfig (`--kubeconfig`); `None`: in-cluster, else `$KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// Where the driver's files and device nodes live (`/` on a real node).
    pub driver_root: PathBuf,
    /// The host's path of `driver_root` (`--host-driver-root`): specs name
    /// host paths, and a containerized plugin may see the driver elsewhere.
    pub host_driver_root: PathBuf,
    /// NVML to load; `None`: found under the driver root.
    pub nvml_lib: Option<PathBuf>,
    /// kubelet's directory (`/var/lib/kubelet`): `device-plugins/` and
    /// `pod-resources/` below it.
    pub kubelet_dir: PathBuf,
    /// Where transient specs are written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Node state (`/var/lib/tessera`): checkpoint, per-allocation dirs.
    pub state_dir: PathBuf,
    /// How Allocate answers.
    pub cdi_mode: CdiMode,
    /// The namespace of the bind lock Leases (`kube-system`).
    pub namespace: String,
    /// `tessera-hook` as the specs name it (`/usr/bin/tessera-hook`).
    pub hook_path: PathBuf,
    /// `hook.toml` the specs pass the hook; `None`: the hook's default.
    pub hook_config: Option<PathBuf>,
    /// The vGPU library on the host (`/usr/lib/tessera/libtessera_vgpu.so`).
    pub vgpu_library: PathBuf,
    /// The node monitor's metrics address (`0.0.0.0:31992`); `None`: off.
    pub metrics_listen: Option<SocketAddr>,
    /// Seed semantics: exit on a node without GPUs (true), or log and block
    /// (false).
    pub fail_on_init_error: bool,
    /// How GPUs are offered.
    pub devices: DeviceSettings,
    /// The resource name kubelet knows the devices by (`nvidia.com/gpu`).
    pub resource_name: String,
}
