//! A fake kubelet for device plugin tests and benchmarks: kubelet's two
//! gRPC services a device plugin talks to, served on unix sockets in a
//! kubelet directory of the test's own. Registration on
//! `<dir>/device-plugins/kubelet.sock` records every `RegisterRequest` (a
//! test waits for an endpoint to register); PodResources on
//! `<dir>/pod-resources/kubelet.sock` answers a list of pods the test sets
//! (none by default: a kubelet that runs nothing).
//!
//! The types are `tessera-kube-proto`'s, compiled from the same
//! `proto/kubelet/` files the plugin compiles: the wire is the same whichever
//! crate's types a client uses. To dial a socket use
//! [`tessera_kube_proto::unix_channel`] (re-exported as [`unix_channel`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tessera_kube_proto::deviceplugin::v1beta1 as dp;
use tessera_kube_proto::podresources::v1 as pr;
use tessera_model::contract::kubelet;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

pub use tessera_kube_proto::unix_channel;

/// What the fake kubelet's two services share with the test.
#[derive(Default)]
struct Shared {
    registrations: Mutex<Vec<dp::RegisterRequest>>,
    pods: Mutex<Vec<pr::PodResources>>,
}

#[derive(Clone)]
struct Registration(Arc<Shared>);

#[tonic::async_trait]
impl dp::registration_server::Registration for Registration {
    async fn register(
        &self,
        request: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        self.0
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request.into_inner());
        Ok(Response::new(dp::Empty {}))
    }
}

#[derive(Clone)]
struct PodResources(Arc<Shared>);

impl PodResources {
    fn pods(&self) -> Vec<pr::PodResources> {
        self.0
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for PodResources {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.pods(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let want = request.into_inner();
        let pod = self
            .pods()
            .into_iter()
            .find(|p| p.name == want.pod_name && p.namespace == want.pod_namespace)
            .ok_or_else(|| {
                Status::not_found(format!("pod {}/{}", want.pod_namespace, want.pod_name))
            })?;
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// A fake kubelet serving Registration and PodResources until dropped
/// (dropping it stops both servers; the sockets stay, as a killed kubelet's
/// would).
pub struct FakeKubelet {
    dir: PathBuf,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

/// A listener on `socket`, a stale file there removed first.
fn listen(socket: &Path) -> Result<tokio_stream::wrappers::UnixListenerStream> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    Ok(tokio_stream::wrappers::UnixListenerStream::new(listener))
}

impl FakeKubelet {
    /// Starts serving in `kubelet_dir` (its `device-plugins/` and
    /// `pod-resources/` made if missing). Call it inside a tokio runtime:
    /// the servers run as tasks of it.
    pub fn start(kubelet_dir: &Path) -> Result<FakeKubelet> {
        let plugins = kubelet_dir.join(kubelet::DEVICE_PLUGINS_SUBDIR);
        let pod_resources = kubelet_dir.join(kubelet::POD_RESOURCES_SUBDIR);
        for dir in [&plugins, &pod_resources] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let shared = Arc::new(Shared::default());
        let incoming = listen(&plugins.join(kubelet::REGISTRATION_SOCKET))?;
        let registration =
            dp::registration_server::RegistrationServer::new(Registration(shared.clone()));
        let registration = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(registration)
                .serve_with_incoming(incoming)
                .await;
        });
        let incoming = listen(&pod_resources.join(kubelet::POD_RESOURCES_SOCKET))?;
        let lister = pr::pod_resources_lister_server::PodResourcesListerServer::new(PodResources(
            shared.clone(),
        ));
        let lister = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(lister)
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(FakeKubelet {
            dir: kubelet_dir.to_owned(),
            shared,
            tasks: vec![registration, lister],
        })
    }

    /// The kubelet directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/device-plugins/`, where plugins put their sockets.
    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.join(kubelet::DEVICE_PLUGINS_SUBDIR)
    }

    /// The socket of the plugin file name `endpoint` in
    /// [`plugins_dir`](Self::plugins_dir).
    pub fn plugin_socket(&self, endpoint: &str) -> PathBuf {
        self.plugins_dir().join(endpoint)
    }

    /// Every `RegisterRequest` received so far, oldest first.
    pub fn registrations(&self) -> Vec<dp::RegisterRequest> {
        self.shared
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Forgets the requests received so far (before a plugin restart).
    pub fn clear_registrations(&self) {
        self.shared
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The latest registration of `endpoint`, if any.
    pub fn registered(&self, endpoint: &str) -> Option<dp::RegisterRequest> {
        self.registrations()
            .into_iter()
            .rev()
            .find(|r| r.endpoint == endpoint)
    }

    /// Waits up to `within` for a registration of `endpoint`.
    pub async fn wait_registered(
        &self,
        endpoint: &str,
        within: Duration,
    ) -> Result<dp::RegisterRequest> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(request) = self.registered(endpoint) {
                return Ok(request);
            }
            if Instant::now() > deadline {
                bail!(
                    "{endpoint} did not register within {within:?} (got {:?})",
                    self.registrations()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sets what PodResources answers from now on.
    pub fn set_pods(&self, pods: Vec<pr::PodResources>) {
        *self
            .shared
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = pods;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
