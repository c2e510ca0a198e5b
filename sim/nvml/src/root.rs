//! Which simulated node this library serves: `tessera_sim::libroot`'s rule
//! (`TESSERA_SIM_ROOT`, else the directory this library was installed in).
//! A stand-in NVML that cannot tell its node does not load, as NVML without a
//! driver does not. The state file itself is found by
//! `tessera_sim::state::StateStore::open`.

use std::path::PathBuf;

pub use tessera_sim::libroot::ROOT_ENV;
use tessera_sim::libroot::{self, LIBRARY_DIRS, RootSource};

/// The node root, or a one-line reason why none can be told.
pub fn discover() -> Result<PathBuf, String> {
    match libroot::discover() {
        RootSource::Env(root) | RootSource::LibraryPath(root) => Ok(root),
        RootSource::Unknown { library: None } => Err(format!(
            "{ROOT_ENV} is not set and the library cannot tell its own path"
        )),
        RootSource::Unknown { library: Some(lib) } => Err(format!(
            "{ROOT_ENV} is not set and the library at {} is not installed under \
             <root>/{}; set {ROOT_ENV}",
            lib.display(),
            LIBRARY_DIRS.join(" or <root>/")
        )),
    }
}
