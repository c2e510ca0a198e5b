//! The binary's options and start-up: parse, load the cluster config,
//! connect, start the reflectors, serve until SIGTERM (or SIGINT).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tessera_model::contract::cluster;
use tessera_model::sched::config::ClusterConfig;
use thiserror::Error;

use crate::lock::BindLocks;
use crate::metrics::Metrics;
use crate::state::ClusterState;
use crate::verbs::Extender;

/// How often the extender clears bind locks that are free by the rules.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `tessera-scheduler-extender` options.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "tessera-scheduler-extender",
    version,
    about = "kube-scheduler extender for GPUs: picks node, GPU and slice or MIG placement, reserves and binds"
)]
pub struct Args {
    /// Kubeconfig to use (else $KUBECONFIG, else the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The cluster config (HAMi's device ConfigMap shape). A missing default
    /// file means built-in defaults; a missing explicit file is an error.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to serve the verbs, /healthz, /readyz, /metrics and /inspect on.
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], cluster::EXTENDER_METRICS_PORT)))]
    pub listen: SocketAddr,
    /// Namespace of the per-node bind Leases.
    #[arg(long, default_value = cluster::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// This replica's name (default `<hostname>-<pid>`).
    #[arg(long)]
    pub identity: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Seconds bind waits for a node's lock.
    #[arg(long, default_value_t = 10)]
    pub lock_wait: u64,
}

/// Why the extender stopped or could not start.
#[derive(Debug, Error)]
pub enum RunError {
    /// A bad option or config file (exit code 2).
    #[error("{0}")]
    Config(String),
    /// Anything at run time (exit code 1).
    #[error("{0}")]
    Runtime(String),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Config(_) => 2,
            RunError::Runtime(_) => 1,
        }
    }
}

/// Loads the cluster config as the options say.
pub fn load_config(path: Option<&std::path::Path>) -> Result<ClusterConfig, RunError> {
    let (path, explicit) = match path {
        Some(path) => (path.to_path_buf(), true),
        None => (PathBuf::from(cluster::CONFIG_PATH), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => ClusterConfig::parse(&text)
            .map_err(|e| RunError::Config(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            Ok(ClusterConfig::default())
        }
        Err(e) => Err(RunError::Config(format!("{}: {e}", path.display()))),
    }
}

/// Sets up tracing to stderr (`TESSERA_LOG` filters; default `info`).
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

async fn client_for(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| RunError::Config(format!("--kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| RunError::Config(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| RunError::Config(format!("no kubeconfig: {e}")))?,
    };
    kube::Client::try_from(config).map_err(|e| RunError::Runtime(format!("kube client: {e}")))
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "extender".into());
    format!("{host}-{}", std::process::id())
}

/// Runs the extender until SIGTERM or SIGINT.
pub fn run(args: Args) -> Result<(), RunError> {
    init_tracing(args.log_format);
    let config = Arc::new(load_config(args.config.as_deref())?);
    for field in config.ignored_fields() {
        tracing::warn!(%field, "cluster config field accepted from HAMi has no effect");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| RunError::Runtime(format!("tokio runtime: {e}")))?;
    runtime.block_on(serve(args, config))
}

async fn serve(args: Args, config: Arc<ClusterConfig>) -> Result<(), RunError> {
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let client = client_for(args.kubeconfig.as_deref()).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| RunError::Runtime(format!("--listen {}: {e}", args.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|e| RunError::Runtime(e.to_string()))?;
    let state = ClusterState::start(client.clone(), config);
    let locks = BindLocks::new(
        client.clone(),
        &args.namespace,
        Duration::from_secs(args.lock_wait),
    );
    let sweeper = locks.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SWEEP_INTERVAL).await;
            match sweeper.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(released = n, "released finished bind locks"),
                Err(e) => tracing::debug!(error = %e, "sweeping bind locks"),
            }
        }
    });
    let extender = Extender::new(state, locks, client, Metrics::new());
    tracing::info!(%address, %identity, namespace = %args.namespace, "serving");
    axum::serve(listener, crate::server::router(extender))
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| RunError::Runtime(format!("serving: {e}")))?;
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
