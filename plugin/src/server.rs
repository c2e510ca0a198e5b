//! The kubelet side: the DevicePlugin gRPC service on
//! `<kubelet-dir>/device-plugins/tessera-gpu.sock`, registration with
//! kubelet's `Registration` service on `kubelet.sock`, and re-registration.
//!
//! kubelet wipes its `device-plugins/` directory when it starts, so our socket
//! vanishing means kubelet restarted: [`run`] watches the directory (every
//! [`WATCH_INTERVAL`]) and, when our socket is gone, serves again on a fresh
//! socket and registers again. A new `kubelet.sock` (another inode) with our
//! socket still there gets a new registration. A stale socket of ours (a
//! crashed earlier run) is removed before binding.
//!
//! ListAndWatch sends the whole list at once and again on every change of
//! health ([`crate::health`]); the stream ends when the plugin stops or the
//! server is restarted. GetPreferredAllocation and Allocate are
//! [`Allocator`]'s.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use tessera_model::contract::kubelet;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use crate::allocate::Allocator;
use crate::api::deviceplugin::v1beta1 as dp;
use crate::devices::{self, GpuOffer};
use crate::health::HealthMap;
use crate::run::NodeContext;

/// How often the device-plugins directory is looked at.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// How long a registration may take.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping server gets to finish its calls.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Why the kubelet side could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The GPUs to offer could not be listed.
    #[error("listing the GPUs to offer: {0}")]
    Discover(#[from] tessera_driver::DriverError),
    /// Our socket could not be made.
    #[error("{path}: {reason}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// kubelet refused or did not answer the registration.
    #[error("registering with {path}: {reason}")]
    Register {
        /// kubelet's socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// `<kubelet-dir>/device-plugins`.
pub fn plugins_dir(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir.join(kubelet::DEVICE_PLUGINS_SUBDIR)
}

/// Our socket: `<kubelet-dir>/device-plugins/tessera-gpu.sock`.
pub fn socket_path(kubelet_dir: &Path) -> PathBuf {
    plugins_dir(kubelet_dir).join(kubelet::PLUGIN_SOCKET)
}

/// The options we register with and answer GetDevicePluginOptions with.
pub fn options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The DevicePlugin service of one server instance.
#[derive(Clone)]
pub struct DevicePluginService {
    allocator: Arc<Allocator>,
    devices: watch::Receiver<Vec<dp::Device>>,
    stop: watch::Receiver<bool>,
}

impl DevicePluginService {
    /// A service answering ListAndWatch from `devices`; its streams end when
    /// `stop` turns true (or its sender is gone).
    pub fn new(
        allocator: Arc<Allocator>,
        devices: watch::Receiver<Vec<dp::Device>>,
        stop: watch::Receiver<bool>,
    ) -> DevicePluginService {
        DevicePluginService {
            allocator,
            devices,
            stop,
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

/// The list now, then one list per change, until `stop`.
fn device_stream(
    devices: watch::Receiver<Vec<dp::Device>>,
    stop: watch::Receiver<bool>,
) -> DeviceStream {
    Box::pin(futures::stream::unfold(
        (devices, stop, true),
        |(mut devices, mut stop, first)| async move {
            if *stop.borrow() {
                return None;
            }
            if !first {
                tokio::select! {
                    changed = devices.changed() => changed.ok()?,
                    _ = stop.wait_for(|s| *s) => return None,
                }
            }
            let list = devices.borrow_and_update().clone();
            let unhealthy = list.iter().filter(|d| d.health != kubelet::HEALTHY).count();
            tracing::info!(devices = list.len(), unhealthy, "ListAndWatch: sending");
            let item = Ok(dp::ListAndWatchResponse { devices: list });
            Some((item, (devices, stop, false)))
        },
    ))
}

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for DevicePluginService {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        Ok(Response::new(device_stream(
            self.devices.clone(),
            self.stop.clone(),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        self.allocator
            .preferred_allocation(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        self.allocator
            .allocate(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// A channel to a gRPC server on a unix socket (dialed now, 5 s at most).
pub async fn unix_channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_owned();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move {
            Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?))
        }
    });
    // tonic wants an http URI; the connector never reads it.
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(connector)
        .await
}

/// Registers `resource_name`, served on our socket, with the kubelet
/// listening on `kubelet_socket`.
pub async fn register(kubelet_socket: &Path, resource_name: &str) -> Result<(), ServerError> {
    let fail = |reason: String| ServerError::Register {
        path: kubelet_socket.to_owned(),
        reason,
    };
    let attempt = async {
        let channel = unix_channel(kubelet_socket)
            .await
            .map_err(|e| fail(e.to_string()))?;
        dp::registration_client::RegistrationClient::new(channel)
            .register(dp::RegisterRequest {
                version: kubelet::API_VERSION.to_owned(),
                endpoint: kubelet::PLUGIN_SOCKET.to_owned(),
                resource_name: resource_name.to_owned(),
                options: Some(options()),
            })
            .await
            .map_err(|s| fail(format!("{}: {}", s.code(), s.message())))?;
        Ok(())
    };
    tokio::time::timeout(REGISTER_TIMEOUT, attempt)
        .await
        .map_err(|_| fail(format!("no answer in {REGISTER_TIMEOUT:?}")))?
}

/// One running gRPC server on our socket.
struct Instance {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Instance {
    /// Removes a stale socket, binds a fresh one (0600) and serves on it.
    fn start(
        socket: &Path,
        allocator: Arc<Allocator>,
        devices: watch::Receiver<Vec<dp::Device>>,
    ) -> Result<Instance, ServerError> {
        let fail = |reason: String| ServerError::Socket {
            path: socket.to_owned(),
            reason,
        };
        match std::fs::remove_file(socket) {
            Ok(()) => tracing::info!(socket = %socket.display(), "removed a stale socket"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(format!("removing the stale socket: {e}"))),
        }
        let listener = tokio::net::UnixListener::bind(socket).map_err(|e| fail(e.to_string()))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| fail(format!("chmod 0600: {e}")))?;
        let (stop, stop_rx) = watch::channel(false);
        let service = DevicePluginService::new(allocator, devices, stop_rx.clone());
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let mut until = stop_rx;
        let task = tokio::spawn(async move {
            let served = Server::builder()
                .add_service(dp::device_plugin_server::DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = until.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "device plugin server");
            }
        });
        Ok(Instance { stop, task })
    }

    /// Ends its streams and calls (after [`STOP_GRACE`], by force).
    async fn stop(self) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
            task.abort();
        }
    }

    fn finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// The identity of a file (device and inode), to tell a new `kubelet.sock`.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Publishes the device list for `offers` with the health in `health`,
/// until `shutdown`.
async fn publish_devices(
    offers: Vec<GpuOffer>,
    mut health: watch::Receiver<HealthMap>,
    tx: watch::Sender<Vec<dp::Device>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let list = devices::device_list(&offers, &health.borrow_and_update());
        tx.send_if_modified(|current| {
            if *current == list {
                false
            } else {
                *current = list;
                true
            }
        });
        tokio::select! {
            changed = health.changed() => if changed.is_err() { return },
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// Serves kubelet until `shutdown` turns true (or its sender is gone):
/// serve, register, and again whenever kubelet restarts. Removes our socket
/// at the end.
pub async fn run(
    ctx: Arc<NodeContext>,
    health: watch::Receiver<HealthMap>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let offers = devices::discover(ctx.driver.as_ref(), &ctx.config.devices)?;
    let (shares, units) = devices::totals(&offers);
    tracing::info!(
        resource = %ctx.config.resource_name,
        gpus = offers.len(),
        share_replicas = shares,
        mig_units = units,
        "offering devices"
    );
    let first = devices::device_list(&offers, &health.borrow());
    let (devices_tx, devices_rx) = watch::channel(first);
    let publisher = tokio::spawn(publish_devices(
        offers,
        health,
        devices_tx,
        shutdown.clone(),
    ));
    let allocator = Arc::new(Allocator::new(ctx.clone()));
    let served = serve_and_register(&ctx, allocator, devices_rx, shutdown).await;
    publisher.abort();
    served
}

async fn serve_and_register(
    ctx: &NodeContext,
    allocator: Arc<Allocator>,
    devices: watch::Receiver<Vec<dp::Device>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let dir = plugins_dir(&ctx.config.kubelet_dir);
    let socket = socket_path(&ctx.config.kubelet_dir);
    let kubelet_socket = dir.join(kubelet::REGISTRATION_SOCKET);
    let resource = ctx.config.resource_name.as_str();
    let mut instance: Option<Instance> = None;
    // kubelet.sock's identity when we registered.
    let mut registered: Option<(u64, u64)> = None;
    let mut last_problem: Option<String> = None;
    let mut note = |problem: Option<String>| {
        if problem != last_problem {
            if let Some(p) = &problem {
                tracing::warn!("{p}; trying again");
            }
            last_problem = problem;
        }
    };
    while !*shutdown.borrow() {
        let ours = socket.exists();
        let restart = match &instance {
            None => true,
            Some(i) => !ours || i.finished(),
        };
        if restart {
            if let Some(old) = instance.take() {
                tracing::info!(socket = %socket.display(), "our socket is gone (kubelet restarted?): serving again");
                old.stop().await;
            }
            registered = None;
            if dir.is_dir() {
                match Instance::start(&socket, allocator.clone(), devices.clone()) {
                    Ok(i) => {
                        tracing::info!(socket = %socket.display(), "serving");
                        instance = Some(i);
                    }
                    Err(e) => note(Some(e.to_string())),
                }
            } else {
                note(Some(format!(
                    "{} does not exist (kubelet not up?)",
                    dir.display()
                )));
            }
        }
        let kubelet_id = identity(&kubelet_socket);
        if instance.is_some() && kubelet_id.is_some() && registered != kubelet_id {
            match register(&kubelet_socket, resource).await {
                Ok(()) => {
                    tracing::info!(%resource, kubelet = %kubelet_socket.display(), "registered with kubelet");
                    registered = kubelet_id;
                    note(None);
                }
                Err(e) => note(Some(e.to_string())),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            stopping = shutdown.wait_for(|s| *s) => if stopping.is_err() { break },
        }
    }
    if let Some(i) = instance.take() {
        i.stop().await;
        match std::fs::remove_file(&socket) {
            Ok(()) => tracing::info!(socket = %socket.display(), "removed our socket"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(socket = %socket.display(), error = %e, "removing our socket"),
        }
    }
    Ok(())
}
