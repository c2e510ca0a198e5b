//! tessera-sim cluster up|down|status: simulated GPU nodes, the API server, the scheduler and one kubelet per node.

/// Command-line options of `tessera-sim cluster`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// What stops `tessera-sim cluster`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder until the stand-in exists.
    #[error("tessera-sim cluster: not built yet")]
    NotBuilt,
}

/// Runs `tessera-sim cluster` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(_args: Args) -> Result<(), Error> {
    Err(Error::NotBuilt)
}
