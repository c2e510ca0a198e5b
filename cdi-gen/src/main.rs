//! `tessera-cdi`: generate, list and validate CDI specs for a node's GPUs;
//! enable CDI in a container runtime's configuration.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_cdi::commands::runtime::{self, Outcome, RuntimeCommand};
use tessera_cdi::commands::{generate, list, profiles, validate};

#[derive(Parser)]
#[command(
    name = "tessera-cdi",
    version,
    about = "CDI specs for a node's GPUs and MIG devices"
)]
struct Cli {
    /// Log format on stderr.
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
    /// Discover GPUs and MIG devices and write the static `tessera.io/gpu` spec.
    Generate(generate::GenerateArgs),
    /// Show what the node offers.
    List(list::ListArgs),
    /// Check a spec file strictly; one line per problem.
    Validate(validate::ValidateArgs),
    /// Show the MIG profiles and legal placements NVML reports (read-only).
    Profiles(profiles::ProfilesArgs),
    /// Configure a container runtime for CDI (`runtime configure --runtime containerd`).
    Runtime(runtime::RuntimeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let result = match &cli.command {
        Command::Generate(args) => generate::run(args).map(|generated| match generated {
            generate::Generated::Written {
                output,
                devices,
                cdi_version,
            } => {
                if output.as_os_str() != "-" {
                    eprintln!(
                        "tessera-cdi: wrote {} ({devices} devices, cdiVersion {cdi_version})",
                        output.display()
                    );
                }
            }
            generate::Generated::Empty { removed } => eprintln!(
                "tessera-cdi: nothing to describe on this node (no GPU without MIG, no MIG device); {}",
                removed.map_or("no spec written".to_owned(), |path| format!(
                    "removed {}",
                    path.display()
                ))
            ),
        }),
        Command::List(args) => list::run(args).map(|table| print!("{table}")),
        Command::Profiles(args) => profiles::run(args).map(|report| print!("{report}")),
        Command::Runtime(args) => return runtime_command(args),
        Command::Validate(args) => {
            let mut failed = false;
            for (file, outcome) in validate::run(args) {
                match outcome {
                    Ok(spec) => println!(
                        "{}: valid (cdiVersion {}, kind {}, {} devices)",
                        file.display(),
                        spec.cdi_version,
                        spec.kind,
                        spec.devices.len()
                    ),
                    Err(err) => {
                        failed = true;
                        report(&err);
                    }
                }
            }
            return if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            report(&err);
            ExitCode::FAILURE
        }
    }
}

/// Runs a `runtime` verb and reports its outcome: the diff on stdout for a
/// dry run, one line on stdout otherwise, one line on stderr for an error.
fn runtime_command(args: &runtime::RuntimeArgs) -> ExitCode {
    match &args.command {
        RuntimeCommand::Configure(args) => match runtime::configure(args) {
            Ok(done) => {
                let name = done.runtime.name();
                let file = done.file.display();
                match done.outcome {
                    Outcome::AlreadyConfigured => {
                        println!(
                            "{name} {}: already configured ({file}); nothing written",
                            done.version
                        );
                    }
                    Outcome::Written => {
                        println!("{name} {}: CDI enabled in {file}", done.version);
                        let service = done.runtime.service();
                        println!("restart {service} to apply (systemctl restart {service})");
                    }
                    Outcome::WouldWrite(diff) => {
                        print!("{diff}");
                        eprintln!("tessera-cdi: dry run: {file} not written");
                    }
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("tessera-cdi: {err}");
                ExitCode::from(err.exit_code())
            }
        },
    }
}

/// One stderr line per line of the error (a spec's problems, one each).
fn report(err: &tessera_cdi::CdiGenError) {
    for line in err.to_string().lines() {
        eprintln!("tessera-cdi: {line}");
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(tessera_model::contract::env::LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
