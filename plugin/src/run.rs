//! Puts the plugin together: load NVML, connect to the API server, sweep,
//! then serve kubelet, publish the inventory, reclaim, monitor and serve
//! metrics until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tessera_driver::GpuDriver;
use tessera_driver::nvml::NvmlDriver;
use tokio::sync::watch;

use crate::checkpoint::Store;
use crate::config::PluginConfig;
use crate::health::Health;
use crate::monitor::Monitor;
use crate::server;

/// What every part of the running plugin shares.
pub struct NodeContext {
    /// The settings.
    pub config: PluginConfig,
    /// NVML (the real library, the simulated node's, or a fake in tests).
    pub driver: Arc<dyn GpuDriver + Send + Sync>,
    /// The API server.
    pub client: kube::Client,
    /// What this plugin created (`--state-dir`).
    pub checkpoint: Arc<Store>,
}

impl std::fmt::Debug for NodeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeContext")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why the plugin stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A bad flag, config file or kubeconfig (exit code 2).
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

/// How long the parts get to stop after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs the plugin until SIGTERM or SIGINT (on a tokio runtime of its own).
pub fn run(config: PluginConfig) -> Result<(), RunError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| RunError::Runtime(format!("tokio runtime: {e}")))?;
    runtime.block_on(run_async(config))
}

/// Loads NVML and checks that the node has a GPU.
fn load_driver(config: &PluginConfig) -> Result<Arc<NvmlDriver>, String> {
    let driver = tessera_cdi::load_driver(&config.driver_root, config.nvml_lib.as_deref())
        .map_err(|e| format!("loading NVML: {e}"))?;
    let gpus = driver.gpus().map_err(|e| format!("listing GPUs: {e}"))?;
    if gpus.is_empty() {
        return Err(format!(
            "no GPU on this node (driver root {})",
            config.driver_root.display()
        ));
    }
    Ok(Arc::new(driver))
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

/// Resolves on SIGTERM or SIGINT.
pub async fn signalled() {
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

async fn run_async(config: PluginConfig) -> Result<(), RunError> {
    let driver = match load_driver(&config) {
        Ok(driver) => driver,
        Err(problem) if config.fail_on_init_error => return Err(RunError::Runtime(problem)),
        Err(problem) => {
            // The seed's semantics: a DaemonSet pod on a node without GPUs
            // stays up, idle, instead of crash-looping.
            tracing::error!(
                "{problem}; --fail-on-init-error=false: serving nothing until signalled"
            );
            signalled().await;
            return Ok(());
        }
    };
    let client = client_for(config.kubeconfig.as_deref()).await?;
    let checkpoint = Store::open(&config.state_dir)
        .map_err(|e| RunError::Runtime(format!("checkpoint: {e}")))?;
    let metrics_on = config.metrics_listen.is_some();
    let ctx = Arc::new(NodeContext {
        config,
        driver,
        client,
        checkpoint: Arc::new(checkpoint),
    });
    tracing::info!(
        node = %ctx.config.node_name,
        resource = %ctx.config.resource_name,
        kubelet_dir = %ctx.config.kubelet_dir.display(),
        cdi_mode = ctx.config.cdi_mode.as_str(),
        "starting"
    );
    let report = crate::reconcile::startup_sweep(&ctx)
        .await
        .map_err(|e| RunError::Runtime(format!("startup sweep: {e}")))?;
    tracing::info!(?report, "startup sweep done");

    let (shutdown_tx, shutdown) = watch::channel(false);
    let health = Health::new(ctx.clone());
    let mut parts = tokio::task::JoinSet::new();
    parts.spawn(named("health", {
        let (health, shutdown) = (health.clone(), shutdown.clone());
        async move {
            health.run(shutdown).await;
            Ok::<(), RunError>(())
        }
    }));
    parts.spawn(named(
        "kubelet server",
        server::run(ctx.clone(), health.subscribe(), shutdown.clone()),
    ));
    parts.spawn(named("inventory", {
        let fut = crate::inventory::run(ctx.clone(), health.subscribe(), shutdown.clone());
        async move {
            fut.await;
            Ok::<(), RunError>(())
        }
    }));
    parts.spawn(named("reconciler", {
        let fut = crate::reconcile::run(ctx.clone(), shutdown.clone());
        async move {
            fut.await;
            Ok::<(), RunError>(())
        }
    }));
    let monitor = Monitor::new(ctx.clone());
    parts.spawn(named("monitor", {
        let fut = monitor.clone().run(shutdown.clone());
        async move {
            fut.await;
            Ok::<(), RunError>(())
        }
    }));
    if metrics_on {
        parts.spawn(named(
            "metrics",
            crate::metrics::serve(ctx.clone(), monitor, shutdown.clone()),
        ));
    }

    // Until a signal, or a part that fails (a part that ends early without
    // an error is logged and the rest go on).
    let mut failure: Option<RunError> = None;
    tokio::select! {
        _ = signalled() => tracing::info!("signalled: stopping"),
        ended = wait_for_failure(&mut parts) => failure = Some(ended),
    }
    let _ = shutdown_tx.send(true);
    let stopped = tokio::time::timeout(STOP_GRACE, async {
        while let Some(joined) = parts.join_next().await {
            if let Ok((name, Err(e))) = joined {
                tracing::error!(part = name, error = %e, "stopping");
            }
        }
    })
    .await;
    if stopped.is_err() {
        tracing::warn!("parts still running after {STOP_GRACE:?}: aborted");
        parts.abort_all();
    }
    match failure {
        Some(e) => Err(e),
        None => {
            tracing::info!("stopped");
            Ok(())
        }
    }
}

/// A part of the plugin, its result tagged with its name.
async fn named<E: std::fmt::Display>(
    name: &'static str,
    part: impl Future<Output = Result<(), E>>,
) -> (&'static str, Result<(), RunError>) {
    let result = part
        .await
        .map_err(|e| RunError::Runtime(format!("{name}: {e}")));
    (name, result)
}

/// Waits until a part fails (or panics); never resolves while they run well.
async fn wait_for_failure(
    parts: &mut tokio::task::JoinSet<(&'static str, Result<(), RunError>)>,
) -> RunError {
    loop {
        match parts.join_next().await {
            Some(Ok((_, Err(e)))) => return e,
            Some(Ok((name, Ok(())))) => tracing::warn!(part = name, "ended early"),
            Some(Err(e)) => return RunError::Runtime(format!("a part panicked: {e}")),
            None => std::future::pending::<()>().await,
        }
    }
}
