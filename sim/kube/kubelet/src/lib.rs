//! Stand-in kubelet: device plugin v1beta1 manager, PodResources v1, pods through CRI (containerd) or podman.

pub mod devices;

/// Command-line options of `tessera-sim kubelet`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// What stops `tessera-sim kubelet`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder until the stand-in exists.
    #[error("tessera-sim kubelet: not built yet")]
    NotBuilt,
}

/// Runs `tessera-sim kubelet` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(_args: Args) -> Result<(), Error> {
    Err(Error::NotBuilt)
}
