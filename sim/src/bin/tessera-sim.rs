//! `tessera-sim`: build and inspect simulated GPU nodes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_sim::builder::{self, BuildOptions};
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
    #[command(subcommand)]
    command: Command,
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
            let text = e.to_string();
            let message = text.split("Usage:").next().unwrap_or_default();
            let message = message.strip_prefix("error:").unwrap_or(message);
            let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
            eprintln!("tessera-sim: {message} (see tessera-sim --help)");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Create {
            profile,
            root,
            force,
            nvml_lib,
            cuda_lib,
        } => create(&profile, root, force, nvml_lib, cuda_lib),
        Command::Profiles => Ok(report::list_profiles()),
        Command::Show { root } => show(root),
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

fn show(root: PathBuf) -> Result<String, tessera_sim::SimError> {
    let state = StateStore::open(&root)?.read()?;
    Ok(report::describe_node(&root, &state))
}
