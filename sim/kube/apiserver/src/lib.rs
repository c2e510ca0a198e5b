//! Stand-in kube-apiserver: core/v1 and coordination/v1 REST with watch,
//! resourceVersions, selectors, patches and discovery; the kinds Tessera's
//! manifests hold (apps/v1, rbac/v1, policy/v1, monitoring.coreos.com/v1
//! ServiceMonitor as if its CRD were installed) as plain stored objects, with
//! no controller acting on them ([`resources`]).
//!
//! Layers: [`store`] (objects, resourceVersions, the change log; pure),
//! [`selectors`], [`patch`], [`admission`] (defaults and validation),
//! [`types`] (bodies decoded into k8s-openapi types), [`watch`] (event
//! streams), [`rest`] (HTTP routing and responses), [`state`] and
//! [`kubeconfig`] (files), and this module, which wires them to a socket.

pub mod admission;
pub mod discovery;
pub mod kubeconfig;
pub mod openapi;
pub mod patch;
pub mod resources;
pub mod rest;
pub mod selectors;
pub mod state;
pub mod status;
pub mod store;
pub mod table;
pub mod types;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Command-line options of `tessera-sim apiserver`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on (plain HTTP); port 0 (or `:0`) picks a free port.
    /// Given twice, the last one wins.
    #[arg(long, default_value = "127.0.0.1:6443", value_parser = parse_listen, overrides_with = "listen")]
    pub listen: SocketAddr,
    /// Write a kubeconfig for the server here (atomically, once it listens).
    #[arg(long = "kubeconfig-out")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Load the objects from this file at start (if it exists) and save
    /// them there after changes and at shutdown.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Changes kept for watches to resume from; a watch or continue token
    /// older than that gets 410 Gone.
    #[arg(long = "watch-window", default_value_t = 10_000)]
    pub watch_window: usize,
    /// Seconds between BOOKMARK events of watches that allow them.
    #[arg(long = "bookmark-interval", default_value_t = 5.0)]
    pub bookmark_interval: f64,
    /// Largest request body accepted (413 above).
    #[arg(long = "max-body-bytes", default_value_t = store::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
}

fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_owned(),
    };
    full.parse()
        .map_err(|_| format!("{text:?} is not an address:port (e.g. 127.0.0.1:6443 or :0)"))
}

/// What stops `tessera-sim apiserver`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The async runtime could not start.
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
    /// The listen address could not be bound.
    #[error("--listen {addr}: {error}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The kubeconfig could not be written.
    #[error("--kubeconfig-out {path}: {error}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The state file could not be loaded or saved.
    #[error(transparent)]
    State(#[from] state::StateError),
    /// An option out of range.
    #[error("{0}")]
    Option(String),
    /// Waiting for SIGTERM failed.
    #[error("installing the signal handler: {0}")]
    Signal(std::io::Error),
}

/// Runs `tessera-sim apiserver` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(args: Args) -> Result<(), Error> {
    let bookmark_interval = Duration::try_from_secs_f64(args.bookmark_interval)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::Option(format!(
                "--bookmark-interval {}: must be a positive number of seconds (at most about 1.8e19)",
                args.bookmark_interval
            ))
        })?;
    if args.watch_window == 0 {
        return Err(Error::Option(
            "--watch-window 0: must keep at least one change".into(),
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    runtime.block_on(serve(args, bookmark_interval))
}

async fn serve(args: Args, bookmark_interval: Duration) -> Result<(), Error> {
    let store = match &args.state {
        Some(path) => match state::load(path, args.watch_window)? {
            Some(store) => {
                tracing::info!(path = %path.display(), rv = store.current_rv(), "state loaded");
                store
            }
            None => store::Store::with_default_namespaces(args.watch_window),
        },
        None => store::Store::with_default_namespaces(args.watch_window),
    };
    let mut store = store;
    store.set_max_body_bytes(args.max_body_bytes);
    let store = Arc::new(store);
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|error| Error::Listen {
            addr: args.listen,
            error,
        })?;
    let addr = listener.local_addr().map_err(|error| Error::Listen {
        addr: args.listen,
        error,
    })?;
    if let Some(path) = &args.kubeconfig_out {
        kubeconfig::write(path, addr).map_err(|error| Error::Kubeconfig {
            path: path.clone(),
            error,
        })?;
    }
    tracing::info!("listening on {}", kubeconfig::server_url(addr));

    let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    let saver = args
        .state
        .clone()
        .map(|path| tokio::spawn(state::saver(store.clone(), path, shutdown.clone())));
    let app = Arc::new(rest::App {
        store: store.clone(),
        max_body_bytes: args.max_body_bytes,
        bookmark_interval,
        shutdown: shutdown.clone(),
    });
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signal)?;
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let app = app.clone();
                    let mut stop = shutdown.clone();
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| rest::handle(app.clone(), req));
                        let connection = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .serve_connection(TokioIo::new(stream), service);
                        tokio::pin!(connection);
                        tokio::select! {
                            result = connection.as_mut() => {
                                if let Err(e) = result {
                                    tracing::debug!("connection: {e}");
                                }
                            }
                            _ = stop.changed() => {
                                connection.as_mut().graceful_shutdown();
                                let _ = connection.await;
                            }
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    tracing::info!("stopping");
    shutdown_tx.send_replace(true);
    drop(listener);
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("connections still open after 5 s; closing them");
        connections.abort_all();
    }
    if let Some(saver) = saver {
        let _ = saver.await;
    }
    if let Some(path) = &args.state {
        let (store, path) = (store.clone(), path.clone());
        tokio::task::spawn_blocking(move || state::save(&store, &path))
            .await
            .map_err(|e| Error::Option(format!("saving the state: {e}")))??;
    }
    tracing::info!("stopped");
    Ok(())
}
