//! `tessera-sim`: build and inspect simulated GPU nodes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_sim::builder::{self, BuildOptions};
use tessera_sim::health;
use tessera_sim::profile::NodeProfile;
use tessera_sim::report;
use tessera_sim::state::StateStore;

#[derive(Parser)]
#[command(
    name = "tessera-sim",
    version,
    about = "Build and inspect simulated GPU nodes"
)]
struct Cli {
    /// Log format on stderr (the cluster stand-ins log with `tracing`;
    /// filter with TESSERA_LOG, default `info`).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Build a simulated node from a profile under a root directory (needs root for mknod).
    Create {
        /// A shipped profile name (see `tessera-sim profiles`) or a .toml/.json file.
        #[arg(long)]
        profile: String,
        /// Directory to build the node in.
        #[arg(long)]
        root: PathBuf,
        /// Replace the tessera-sim parts of a non-empty root.
        #[arg(long)]
        force: bool,
        /// The NVML stand-in library (default: libtessera_sim_nvml.so next to this binary).
        #[arg(long = "nvml-lib")]
        nvml_lib: Option<PathBuf>,
        /// The CUDA driver stand-in library (default: libtessera_sim_cuda.so next to this binary).
        #[arg(long = "cuda-lib")]
        cuda_lib: Option<PathBuf>,
    },
    /// List the shipped profiles.
    Profiles,
    /// Print the GPUs and MIG devices of a built node.
    Show {
        /// The node's root directory.
        #[arg(long)]
        root: PathBuf,
    },
    /// Print the device time each process's kernels took on a simulated
    /// device's shared timeline (key=value lines).
    Timeline {
        /// The node's root directory.
        #[arg(long)]
        root: PathBuf,
        /// NVML index of the GPU.
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        /// A MIG device of it, `<gi>:<ci>`.
        #[arg(long, value_parser = parse_mig)]
        mig: Option<(u32, u32)>,
        /// Seconds to wait before the (first) snapshot.
        #[arg(long, default_value_t = 0.0)]
        after: f64,
        /// Take a second snapshot this many seconds later and print busy
        /// fractions over the window (default: cumulative figures now).
        #[arg(long)]
        window: Option<f64>,
    },
    /// Record an XID critical error on a GPU (optionally inside a MIG
    /// instance); NVML event sets registered for XIDs deliver it.
    InjectXid {
        /// The node's root directory.
        #[arg(long)]
        root: PathBuf,
        /// The GPU: NVML index or `GPU-…` uuid.
        #[arg(long)]
        gpu: String,
        /// The XID number (positive).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        xid: u64,
        /// GPU-instance id of the MIG instance the error is attributed to (needs --ci).
        #[arg(long, requires = "ci")]
        gi: Option<u32>,
        /// Compute-instance id inside --gi (needs --gi).
        #[arg(long, requires = "gi")]
        ci: Option<u32>,
    },
    /// Mark a GPU as fallen off the bus (every NVML call naming it then fails
    /// with GPU_IS_LOST), or with --restore make it answer again.
    LoseGpu {
        /// The node's root directory.
        #[arg(long)]
        root: PathBuf,
        /// The GPU: NVML index or `GPU-…` uuid.
        #[arg(long)]
        gpu: String,
        /// Restore the GPU instead.
        #[arg(long)]
        restore: bool,
    },
    /// Stand-in kube-apiserver: serve the Kubernetes REST API over HTTP.
    Apiserver(tessera_kube_apiserver::Args),
    /// Stand-in kube-scheduler: schedule pending pods, calling the
    /// extenders of a KubeSchedulerConfiguration.
    Scheduler(tessera_kube_scheduler::Args),
    /// Stand-in kubelet for one simulated node: device plugins, PodResources,
    /// pods through CRI or podman.
    Kubelet(tessera_kube_kubelet::Args),
    /// A whole simulated cluster: nodes, API server, scheduler, kubelets.
    Cluster(tessera_kube_cluster::Args),
}

fn parse_mig(text: &str) -> Result<(u32, u32), String> {
    let (gi, ci) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected <gi>:<ci>"))?;
    let num = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("{s:?} is not a number"))
    };
    Ok((num(gi)?, num(ci)?))
}

fn seconds(value: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(value.clamp(0.0, 3600.0))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // clap's message spans lines before its usage block; keep it to one.
            eprintln!(
                "{}",
                report::usage_error_line("tessera-sim", &e.to_string())
            );
            return ExitCode::from(2);
        }
    };
    let service = |name: &str, outcome: anyhow::Result<()>| match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-sim {name}: {e:#}");
            ExitCode::FAILURE
        }
    };
    let result = match cli.command {
        Command::Apiserver(args) => {
            init_tracing(cli.log_format);
            return service(
                "apiserver",
                tessera_kube_apiserver::run(args).map_err(Into::into),
            );
        }
        Command::Scheduler(args) => {
            init_tracing(cli.log_format);
            return service(
                "scheduler",
                tessera_kube_scheduler::run(args).map_err(Into::into),
            );
        }
        Command::Kubelet(args) => {
            init_tracing(cli.log_format);
            return service(
                "kubelet",
                tessera_kube_kubelet::run(args).map_err(Into::into),
            );
        }
        Command::Cluster(args) => {
            init_tracing(cli.log_format);
            return service(
                "cluster",
                tessera_kube_cluster::run(args).map_err(Into::into),
            );
        }
        Command::Create {
            profile,
            root,
            force,
            nvml_lib,
            cuda_lib,
        } => create(&profile, root, force, nvml_lib, cuda_lib),
        Command::InjectXid {
            root,
            gpu,
            xid,
            gi,
            ci,
        } => {
            return health_command("inject-xid", inject_xid(root, &gpu, xid, gi.zip(ci)));
        }
        Command::LoseGpu { root, gpu, restore } => {
            return health_command("lose-gpu", lose_gpu(root, &gpu, !restore));
        }
        Command::Profiles => Ok(report::list_profiles()),
        Command::Show { root } => show(root),
        Command::Timeline {
            root,
            gpu,
            mig,
            after,
            window,
        } => tessera_sim::timeline::report(
            &tessera_sim::timeline::path(&root, gpu, mig),
            seconds(after),
            window.map(seconds),
        ),
    };
    match result {
        Ok(text) => {
            // A closed stdout (e.g. `| head`) is not an error worth a panic.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tessera-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(tessera_model::contract::env::LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: `cluster up` sends each service's stderr to
    // a log file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn create(
    profile: &str,
    root: PathBuf,
    force: bool,
    nvml_lib: Option<PathBuf>,
    cuda_lib: Option<PathBuf>,
) -> Result<String, tessera_sim::SimError> {
    let profile = NodeProfile::load(profile)?;
    let opts = BuildOptions {
        nvml_library: nvml_lib,
        cuda_library: cuda_lib,
        force,
        ..BuildOptions::default()
    };
    let built = builder::build_node(&profile, &root, &opts)?;
    Ok(report::build_summary(&profile, &built))
}

/// Prints a health command's line, or its error: exit 2 when the arguments
/// name nothing on the node or make no sense for it (the state is then
/// unchanged), 1 when the node itself cannot be read or written.
fn health_command(name: &str, result: Result<String, tessera_sim::SimError>) -> ExitCode {
    use tessera_sim::SimError;
    match result {
        Ok(text) => {
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e @ (SimError::NotFound(_) | SimError::InvalidArgument(_))) => {
            eprintln!("tessera-sim {name}: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("tessera-sim {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn inject_xid(
    root: PathBuf,
    gpu: &str,
    xid: u64,
    instance: Option<(u32, u32)>,
) -> Result<String, tessera_sim::SimError> {
    let store = StateStore::open(&root)?;
    store.update(|state| {
        let index = health::resolve_gpu(state, gpu)?;
        let seq = health::inject_xid(state, index, xid, instance)?;
        let uuid = state.gpu(index).map_or("", |g| g.uuid.as_str());
        let place = instance.map_or(String::new(), |(gi, ci)| format!(" GI {gi} CI {ci}"));
        Ok(format!(
            "GPU {index} {uuid}{place}: xid {xid} (event {seq})\n"
        ))
    })
}

fn lose_gpu(root: PathBuf, gpu: &str, lost: bool) -> Result<String, tessera_sim::SimError> {
    let store = StateStore::open(&root)?;
    store.update(|state| {
        let index = health::resolve_gpu(state, gpu)?;
        let seq = health::set_lost(state, index, lost)?;
        let uuid = state.gpu(index).map_or("", |g| g.uuid.as_str()).to_string();
        let what = if lost { "lost" } else { "answering" };
        Ok(match seq {
            Some(seq) => format!("GPU {index} {uuid}: {what} (event {seq})\n"),
            None => format!("GPU {index} {uuid}: already {what}\n"),
        })
    })
}

fn show(root: PathBuf) -> Result<String, tessera_sim::SimError> {
    let state = StateStore::open(&root)?.read()?;
    Ok(report::describe_node(&root, &state))
}
