//! `kubectl-tessera`: the kubectl plugin (`kubectl tessera inspect`). It reads
//! the API only and prints the cluster's GPU allocation
//! ([`tessera_extender::inspect`]).
//!
//! Exit codes: 0 done, 1 the API could not be read (one line on stderr),
//! 2 bad options.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tessera_extender::inspect::{self, Scope};

/// Tessera's kubectl plugin.
#[derive(Debug, Parser)]
#[command(name = "kubectl-tessera", bin_name = "kubectl tessera", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Each GPU's allocated/total memory and cores, its MIG slot map and (with
    /// -d) the pods holding it.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// Only these nodes (default: every node with GPUs).
    nodes: Vec<String>,
    /// List the pods on each GPU.
    #[arg(short = 'd', long)]
    details: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
    /// List only the pods of this namespace (the figures still count every pod).
    #[arg(short = 'n', long, value_name = "NS")]
    namespace: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprintln!("kubectl-tessera: a command is needed: inspect (see --help)");
            return ExitCode::from(2);
        }
        Err(e) if e.use_stderr() => {
            // One line: the error, without clap's usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad options");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("kubectl-tessera: {first} (see --help)");
            return ExitCode::from(2);
        }
        Err(e) => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    let Command::Inspect(args) = cli.command;
    match run_inspect(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kubectl-tessera: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run_inspect(args: InspectArgs) -> anyhow::Result<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let scope = Scope {
        nodes: (!args.nodes.is_empty())
            .then(|| args.nodes.iter().cloned().collect::<BTreeSet<_>>()),
        namespace: args.namespace.clone(),
    };
    let report = runtime.block_on(async {
        let client = client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
        inspect::fetch(client, &scope)
            .await
            .map_err(anyhow::Error::from)
    })?;
    Ok(match args.output {
        Output::Table => report.render_table(args.details),
        Output::Json => {
            let mut text =
                serde_json::to_string_pretty(&report).context("writing the report as JSON")?;
            text.push('\n');
            text
        }
    })
}

/// A client from the kubeconfig (file, context) the options name, else the
/// usual search: `$KUBECONFIG`, `~/.kube/config`, in-cluster.
async fn client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .context("kubeconfig")?,
        (None, None) => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    kube::Client::try_from(config).context("creating the API client")
}

/// The error and its causes on one line, each cause once (client errors
/// often repeat their source in their own message).
fn one_line(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text.replace('\n', " ")
}
