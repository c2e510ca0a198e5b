//! Stand-in kube-scheduler: KubeSchedulerConfiguration extenders (filter, prioritize, bind) over the real HTTP wire format.

/// Command-line options of `tessera-sim scheduler`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// What stops `tessera-sim scheduler`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder until the stand-in exists.
    #[error("tessera-sim scheduler: not built yet")]
    NotBuilt,
}

/// Runs `tessera-sim scheduler` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(_args: Args) -> Result<(), Error> {
    Err(Error::NotBuilt)
}
