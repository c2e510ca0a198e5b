//! Stand-in kube-apiserver: core/v1 and coordination/v1 REST with watch,
//! resourceVersions, selectors, patches and discovery.

pub mod discovery;
pub mod openapi;
pub mod resources;
pub mod table;

/// Command-line options of `tessera-sim apiserver`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// What stops `tessera-sim apiserver`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder until the stand-in exists.
    #[error("tessera-sim apiserver: not built yet")]
    NotBuilt,
}

/// Runs `tessera-sim apiserver` until it is stopped (SIGTERM or Ctrl-C).
pub fn run(_args: Args) -> Result<(), Error> {
    Err(Error::NotBuilt)
}
