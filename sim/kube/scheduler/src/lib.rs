//! Stand-in kube-scheduler: reads a real `KubeSchedulerConfiguration`,
//! schedules pending pods of its profiles one at a time, calls the
//! configured extenders over the real HTTP wire format (filter, prioritize,
//! bind), and reports failures as kube-scheduler does.
//!
//! Modules: [`config`] (the configuration), [`wire`] (the extender JSON
//! types, reusable by an extender), [`resources`] and [`algorithm`] (pure
//! filters, scores and messages), [`queue`] (the scheduling queue),
//! [`extender`] (the HTTP client), [`events`] (Events), [`scheduler`] (the
//! loop). What the stand-in leaves out: preemption (`preemptVerb` is never
//! called), pod (anti-)affinity, topology spread, volumes, node ports,
//! score plugins other than least-allocated, leader election; among equal
//! scores it picks the first node name where kube-scheduler picks at random.

use std::path::PathBuf;

pub mod algorithm;
pub mod config;
pub mod events;
pub mod extender;
pub mod queue;
pub mod resources;
pub mod scheduler;
pub mod wire;

pub use config::{ConfigError, SchedulerConfig};

/// Command-line options of `tessera-sim scheduler`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1), YAML or JSON.
    #[arg(long)]
    pub config: PathBuf,
    /// The kubeconfig to reach the API server (overrides the configuration's
    /// clientConnection.kubeconfig; default: KUBECONFIG, ~/.kube/config or
    /// in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// What stops `tessera-sim scheduler`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is bad.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The kubeconfig is bad or missing.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file (or "(inferred)").
        path: String,
        /// Why.
        message: String,
    },
    /// The async runtime did not start.
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The loop stopped.
    #[error(transparent)]
    Loop(#[from] scheduler::LoopError),
}

/// A kube client from a kubeconfig file, or inferred from the environment.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, Error> {
    let (path, config) = match kubeconfig {
        Some(path) => {
            let err = |message: String| Error::Kubeconfig {
                path: path.display().to_string(),
                message,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            let config = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| err(e.to_string()))?;
            (path.display().to_string(), config)
        }
        None => (
            "(inferred)".to_owned(),
            kube::Config::infer().await.map_err(|e| Error::Kubeconfig {
                path: "(inferred)".into(),
                message: e.to_string(),
            })?,
        ),
    };
    kube::Client::try_from(config).map_err(|e| Error::Kubeconfig {
        path,
        message: e.to_string(),
    })
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("no SIGTERM handler: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// Runs a scheduler with a loaded configuration until `shutdown` resolves.
pub async fn serve(
    config: SchedulerConfig,
    kubeconfig: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let kubeconfig = kubeconfig.or_else(|| config.kubeconfig.clone());
    let client = client(kubeconfig.as_deref()).await?;
    scheduler::Scheduler::new(client, config)
        .run(shutdown)
        .await?;
    Ok(())
}

/// Runs `tessera-sim scheduler` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(args: Args) -> Result<(), Error> {
    let config = SchedulerConfig::load(&args.config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    runtime.block_on(serve(config, args.kubeconfig, shutdown_signal()))
}
