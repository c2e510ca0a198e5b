//! The command line: flags with the seed's names, the cluster config file,
//! one [`PluginConfig`], and the exit code (0; 2 for a bad flag or config,
//! one line naming the field; 1 for a failure at run time).
//!
//! Device settings resolve as: a flag given > the node's `nodeconfig` entry
//! > the file's `nvidia:` values > built-in defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{ArgAction, Parser, ValueEnum};
use tessera_model::contract::{cdi, cluster, hook, kubelet, node, vgpu};
use tessera_model::facts::LibraryGroups;
use tessera_model::sched::config::ClusterConfig;

use crate::config::{CdiMode, DeviceSettings, PluginConfig};
use crate::run::{self, RunError};

/// The program's name in its one-line errors.
pub const PROGRAM: &str = "tessera-device-plugin";

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `tessera-device-plugin` options.
#[derive(Debug, Clone, Parser)]
#[command(
    name = PROGRAM,
    version,
    about = "kubelet device plugin for GPUs: vGPU slices and dynamic MIG instances, handed to containers through CDI"
)]
pub struct Args {
    /// Replicas (`nvidia.com/gpu` devices) per share GPU [config: deviceSplitCount, default 10].
    #[arg(long, value_name = "N")]
    pub device_split_count: Option<u32>,
    /// Memory a share GPU offers, × its memory; > 1 oversubscribes into host
    /// memory through the vGPU library [config: deviceMemoryScaling, default 1].
    #[arg(long, value_name = "X")]
    pub device_memory_scaling: Option<f64>,
    /// SM share a share GPU offers, × 100 % [config: deviceCoreScaling, default 1].
    #[arg(long, value_name = "X")]
    pub device_cores_scaling: Option<f64>,
    /// Exit on a node without GPUs or NVML (true), or log and block (false).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set)]
    pub fail_on_init_error: bool,
    /// This node's name (else $NODE_NAME).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Kubeconfig to use (else $KUBECONFIG, else the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Where the driver's files and device nodes are.
    #[arg(long, default_value = "/")]
    pub driver_root: PathBuf,
    /// Where the host has what this process sees at --driver-root: the
    /// host paths the CDI specs name [default: the driver root]. For a plugin
    /// in a container with the host's `/` mounted at `/host`:
    /// `--driver-root=/host --host-driver-root=/`.
    #[arg(long, value_name = "DIR")]
    pub host_driver_root: Option<PathBuf>,
    /// The NVML library to load (else found under the driver root).
    #[arg(long)]
    pub nvml_lib: Option<PathBuf>,
    /// Where `dev/` is, when not under the driver root (GKE: `/`).
    #[arg(long, value_name = "DIR")]
    pub dev_root: Option<PathBuf>,
    /// Where `proc/` is [default: the driver root when it holds
    /// proc/driver/nvidia, else /].
    #[arg(long, value_name = "DIR")]
    pub proc_root: Option<PathBuf>,
    /// Driver-file groups containers get: a comma-separated list of compute,
    /// video, graphics, utilities, or all.
    #[arg(long, value_name = "GROUPS", default_value_t = LibraryGroups::default())]
    pub library_groups: LibraryGroups,
    /// kubelet's directory (device-plugins/ and pod-resources/ below it).
    #[arg(long, default_value = kubelet::DIR)]
    pub kubelet_dir: PathBuf,
    /// Where transient CDI specs are written.
    #[arg(long, default_value = cdi::SPEC_DIR)]
    pub cdi_dir: PathBuf,
    /// Node state: checkpoint, per-allocation directories.
    #[arg(long, default_value = node::STATE_DIR)]
    pub state_dir: PathBuf,
    /// How Allocate hands devices over: cdi-field, cdi-annotations, native or all.
    #[arg(long, default_value = "cdi-field")]
    pub cdi_mode: CdiMode,
    /// Namespace of the per-node bind Leases.
    #[arg(long, default_value = cluster::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The hook the transient specs name.
    #[arg(long, default_value = hook::BINARY_PATH)]
    pub hook_path: PathBuf,
    /// The hook.toml the specs pass the hook (else the hook's default).
    #[arg(long)]
    pub hook_config: Option<PathBuf>,
    /// The vGPU library on the host.
    #[arg(long, default_value = vgpu::HOST_LIBRARY)]
    pub vgpu_library: PathBuf,
    /// The node monitor's metrics address, or `off`.
    #[arg(long, value_name = "ADDR|off", default_value_t = format!("0.0.0.0:{}", cluster::PLUGIN_METRICS_PORT))]
    pub metrics_listen: String,
    /// The cluster config (HAMi's device ConfigMap shape). A missing default
    /// file means built-in defaults; a missing explicit file is an error.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Loads the cluster config: `path`, else the default path, where a
/// missing default file means the built-in defaults.
pub fn load_config(path: Option<&Path>) -> Result<ClusterConfig, RunError> {
    let (path, explicit) = match path {
        Some(path) => (path.to_path_buf(), true),
        None => (PathBuf::from(cluster::CONFIG_PATH), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => ClusterConfig::parse(&text)
            .map_err(|e| RunError::Config(format!("--config {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            Ok(ClusterConfig::default())
        }
        Err(e) => Err(RunError::Config(format!(
            "--config {}: {e}",
            path.display()
        ))),
    }
}

fn check_scaling(flag: &str, value: f64) -> Result<f64, RunError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(RunError::Config(format!("{flag}: {value} is not > 0")))
    }
}

/// The settings in force: `args` over `file` (its `nodeconfig` entry for
/// the node, then its defaults). `env_node_name` is `$NODE_NAME`.
pub fn resolve(
    args: &Args,
    env_node_name: Option<String>,
    file: &ClusterConfig,
) -> Result<PluginConfig, RunError> {
    let node_name = args
        .node_name
        .clone()
        .or(env_node_name)
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            RunError::Config(format!(
                "--node-name: not given and ${} is not set",
                kubelet::NODE_NAME_ENV
            ))
        })?;
    let on_node = file.node_settings(&node_name);
    let split_count = match args.device_split_count {
        Some(0) => {
            return Err(RunError::Config(
                "--device-split-count: 0 is not ≥ 1".into(),
            ));
        }
        Some(n) => n,
        None => on_node.split_count,
    };
    let memory_scaling = match args.device_memory_scaling {
        Some(x) => check_scaling("--device-memory-scaling", x)?,
        None => on_node.memory_scaling,
    };
    let cores_scaling = match args.device_cores_scaling {
        Some(x) => check_scaling("--device-cores-scaling", x)?,
        None => on_node.core_scaling,
    };
    let metrics_listen = match args.metrics_listen.trim() {
        "off" => None,
        text => Some(text.parse::<SocketAddr>().map_err(|e| {
            RunError::Config(format!(
                "--metrics-listen: {text:?}: {e} (an address or off)"
            ))
        })?),
    };
    Ok(PluginConfig {
        node_name,
        kubeconfig: args.kubeconfig.clone(),
        driver_root: args.driver_root.clone(),
        host_driver_root: args
            .host_driver_root
            .clone()
            .unwrap_or_else(|| args.driver_root.clone()),
        nvml_lib: args.nvml_lib.clone(),
        kubelet_dir: args.kubelet_dir.clone(),
        cdi_dir: args.cdi_dir.clone(),
        state_dir: args.state_dir.clone(),
        cdi_mode: args.cdi_mode,
        namespace: args.namespace.clone(),
        hook_path: args.hook_path.clone(),
        hook_config: args.hook_config.clone(),
        vgpu_library: args.vgpu_library.clone(),
        metrics_listen,
        fail_on_init_error: args.fail_on_init_error,
        devices: DeviceSettings {
            split_count,
            memory_scaling,
            cores_scaling,
            mig_profile_allowlist: file.nvidia.mig_profile_allowlist.clone(),
            operating_mode: on_node.operating_mode,
            filter: on_node.filter,
            dev_root: args.dev_root.clone(),
            proc_root: args.proc_root.clone(),
            library_groups: args.library_groups.clone(),
        },
        resource_name: file.nvidia.resource_count_name.clone(),
    })
}

/// Sets up tracing to stderr (`$TESSERA_LOG` filters; default `info`).
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(tessera_model::contract::env::LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// clap's error as one line (its first, without the `error: ` prefix).
fn one_line(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

fn fail(error: &RunError) -> ExitCode {
    eprintln!("{PROGRAM}: {error}");
    ExitCode::from(error.exit_code())
}

/// Parses the flags, runs the plugin, maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("{PROGRAM}: {}", one_line(&e));
            return ExitCode::from(2);
        }
    };
    init_tracing(args.log_format);
    let file = match load_config(args.config.as_deref()) {
        Ok(file) => file,
        Err(e) => return fail(&e),
    };
    for field in file.ignored_fields() {
        tracing::warn!(%field, "cluster config field accepted from HAMi has no effect");
    }
    let env_node = std::env::var(kubelet::NODE_NAME_ENV).ok();
    let config = match resolve(&args, env_node, &file) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    match run::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once(PROGRAM).chain(flags.iter().copied()))
            .expect("valid flags")
    }

    const FILE: &str = r#"
nvidia:
  resourceCountName: example.com/gpu
  deviceSplitCount: 5
  deviceMemoryScaling: 2
  migProfileAllowlist:
    - models: ["A100"]
      profiles: ["3g.20gb"]
nodeconfig:
  - name: n1
    operatingmode: mig
    devicesplitcount: 3
    filterdevices: {uuid: ["GPU-x"], index: [2]}
"#;

    #[test]
    fn flags_beat_nodeconfig_beats_file_defaults() {
        let file = ClusterConfig::parse(FILE).expect("valid file");
        let c = resolve(&args(&["--node-name", "n1"]), None, &file).expect("valid");
        assert_eq!(c.devices.split_count, 3, "nodeconfig over the file");
        assert_eq!(c.devices.memory_scaling, 2.0, "the file's default");
        assert_eq!(c.devices.cores_scaling, 1.0, "built in");
        assert_eq!(c.devices.filter.uuid, ["GPU-x"]);
        assert_eq!(c.devices.filter.index, [2]);
        assert_eq!(
            c.devices.operating_mode,
            Some(tessera_model::sched::config::OperatingMode::Mig)
        );
        assert_eq!(
            c.devices
                .allowed_profiles("NVIDIA A100-SXM4-40GB")
                .map(<[String]>::to_vec),
            Some(vec!["3g.20gb".to_owned()])
        );
        assert_eq!(c.resource_name, "example.com/gpu");

        let c = resolve(
            &args(&[
                "--device-split-count",
                "7",
                "--device-memory-scaling",
                "1.5",
            ]),
            Some("n1".into()),
            &file,
        )
        .expect("valid");
        assert_eq!(c.node_name, "n1", "from $NODE_NAME");
        assert_eq!(c.devices.split_count, 7, "the flag over nodeconfig");
        assert_eq!(c.devices.memory_scaling, 1.5);

        let c = resolve(&args(&[]), Some("other".into()), &file).expect("valid");
        assert_eq!(c.devices.split_count, 5, "no nodeconfig entry");
        assert_eq!(c.devices.operating_mode, None);
    }

    #[test]
    fn defaults_work_on_a_real_node() {
        let c = resolve(&args(&[]), Some("n".into()), &ClusterConfig::default()).expect("valid");
        assert_eq!(c.kubelet_dir, Path::new("/var/lib/kubelet"));
        assert_eq!(c.cdi_dir, Path::new("/var/run/cdi"));
        assert_eq!(c.state_dir, Path::new("/var/lib/tessera"));
        assert_eq!(c.resource_name, "nvidia.com/gpu");
        assert_eq!(
            c.metrics_listen,
            Some("0.0.0.0:31992".parse().expect("addr"))
        );
        assert_eq!(c.cdi_mode, CdiMode::CdiField);
        assert!(c.fail_on_init_error);
        assert_eq!(c.devices.split_count, 10);
        let c = resolve(
            &args(&["--metrics-listen", "off", "--fail-on-init-error=false"]),
            Some("n".into()),
            &ClusterConfig::default(),
        )
        .expect("valid");
        assert_eq!(c.metrics_listen, None);
        assert!(!c.fail_on_init_error);
    }

    #[test]
    fn driver_layout_flags_reach_discovery() {
        let file = ClusterConfig::default();
        let c = resolve(&args(&[]), Some("n".into()), &file).expect("valid");
        assert_eq!(c.devices.library_groups, LibraryGroups::default());
        let layout = c.devices.layout(&c.driver_root);
        assert_eq!(
            (layout.dev_root.as_path(), layout.proc_root.as_path()),
            (Path::new("/"), Path::new("/"))
        );
        let c = resolve(
            &args(&[
                "--driver-root",
                "/home/kubernetes/bin/nvidia",
                "--dev-root",
                "/",
                "--proc-root",
                "/host",
                "--library-groups",
                "compute,graphics",
            ]),
            Some("n".into()),
            &file,
        )
        .expect("valid");
        let layout = c.devices.layout(&c.driver_root);
        assert_eq!(layout.driver_root, Path::new("/home/kubernetes/bin/nvidia"));
        assert_eq!(layout.dev_root, Path::new("/"));
        assert_eq!(layout.proc_root, Path::new("/host"));
        assert_eq!(c.devices.library_groups.to_string(), "compute,graphics");
        assert!(
            Args::try_parse_from([PROGRAM, "--library-groups", "compute,utility"]).is_err(),
            "an unknown group is refused"
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let file = ClusterConfig::default();
        let err = |flags: &[&str], env: Option<&str>| {
            resolve(&args(flags), env.map(str::to_owned), &file)
                .expect_err("refused")
                .to_string()
        };
        assert!(err(&[], None).starts_with("--node-name:"));
        assert!(
            err(&["--device-split-count", "0"], Some("n")).starts_with("--device-split-count:")
        );
        assert!(
            err(&["--device-cores-scaling=-1"], Some("n")).starts_with("--device-cores-scaling:")
        );
        assert!(
            err(&["--device-memory-scaling", "NaN"], Some("n"))
                .starts_with("--device-memory-scaling:")
        );
        assert!(err(&["--metrics-listen", "nowhere"], Some("n")).starts_with("--metrics-listen:"));
        let parse = Args::try_parse_from([PROGRAM, "--cdi-mode", "magic"]).expect_err("refused");
        let line = one_line(&parse);
        assert!(line.contains("--cdi-mode"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_missing_default_file_is_the_defaults_but_a_named_one_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("cluster.yaml");
        let e = load_config(Some(&missing)).expect_err("named and missing");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("--config "), "{e}");
        std::fs::write(&missing, "nvidia:\n  deviceSplitCount: 0\n").expect("write");
        let e = load_config(Some(&missing)).expect_err("invalid");
        assert!(e.to_string().contains("deviceSplitCount"), "{e}");
    }
}
