//! The Kubernetes gRPC APIs the simulated cluster speaks, compiled from
//! `proto/cri-api-v1-subset.proto` and the kubelet APIs in the top-level
//! `proto/kubelet/` that the device plugin compiles too (names and field
//! numbers are upstream's; each file says which fields it keeps). Clients
//! and servers both: the kubelet stand-in serves Registration and
//! PodResources and calls device plugins and CRI; the tests serve a device
//! plugin. Every one of those sockets is a unix socket:
//! [`unix_channel`] (or [`unix_channel_lazy`]) is the one way to reach them.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// CRI, package `runtime.v1` (`proto/cri-api-v1-subset.proto`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

/// The kubelet device plugin API (`proto/kubelet/deviceplugin-v1beta1.proto`, top level).
pub mod deviceplugin {
    /// Package `v1beta1`: services `Registration` and `DevicePlugin`.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
}

/// The kubelet PodResources API (`proto/kubelet/podresources-v1.proto`, top level).
pub mod podresources {
    /// Package `v1`: service `PodResourcesLister`.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// How long dialing a unix socket may take.
const UNIX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A tonic endpoint that, whatever its URI says, reaches the gRPC server on
/// the unix socket `socket` (tonic wants an `http` URI; this one is a
/// placeholder the connector never reads).
fn unix_endpoint(
    socket: &Path,
) -> (
    Endpoint,
    impl tower::Service<
        Uri,
        Response = TokioIo<tokio::net::UnixStream>,
        Error = std::io::Error,
        Future: Send,
    > + Send
    + 'static,
) {
    let socket = socket.to_owned();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(UNIX_CONNECT_TIMEOUT);
    (endpoint, connector)
}

/// A channel to the gRPC server on the unix socket `socket`, connected now
/// (dialing gives up after 5 s).
pub async fn unix_channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let (endpoint, connector) = unix_endpoint(socket);
    endpoint.connect_with_connector(connector).await
}

/// A channel to the gRPC server on the unix socket `socket` that dials on
/// first use and again after a failure: for a server that may not be up yet
/// or may restart (each dial gives up after 5 s).
pub fn unix_channel_lazy(socket: &Path) -> Channel {
    let (endpoint, connector) = unix_endpoint(socket);
    endpoint.connect_with_connector_lazy(connector)
}
