//! gRPC over a unix socket, as kubelet's sockets (CRI, device plugins,
//! PodResources) are reached: the stand-ins' dialer
//! ([`tessera_kube_proto::unix_channel`]) with the socket named in errors.

use std::path::Path;

use anyhow::{Context, Result};
use tonic::transport::Channel;

/// A channel to the gRPC server on `socket` (connected now; at most 5 s).
pub async fn dial(socket: &Path) -> Result<Channel> {
    tessera_kube_proto::unix_channel(socket)
        .await
        .with_context(|| format!("dialing {}", socket.display()))
}
