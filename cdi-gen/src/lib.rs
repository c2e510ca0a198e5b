//! `tessera-cdi`: CDI specs for a node's GPUs and MIG devices.
//!
//! Layered as discovery → edits → spec → writer: [`discover_node`] reads host
//! facts through `tessera-driver`, `tessera_model::edits` turns them into
//! container edits, [`static_spec`] assembles the spec with the minimum
//! `cdiVersion` its content needs, and [`writer`] serializes it atomically.
//! The binary's verbs live in [`commands`]; the device plugin reuses this
//! library for its transient specs. [`runtime`] enables CDI in a container
//! runtime's configuration (`tessera-cdi runtime configure`).

pub mod commands;
pub mod runtime;
pub mod writer;

use std::path::{Path, PathBuf};

use tessera_driver::DriverError;
use tessera_driver::discover::{DiscoverError, Layout};
use tessera_driver::nvml::NvmlDriver;
use tessera_model::cdi::{Spec, SpecError};
use tessera_model::contract;
use tessera_model::edits::{self, HookSettings};
use tessera_model::facts::{LibraryGroups, NodeFacts};

/// Errors of the generator library; each renders as one line.
#[derive(Debug, thiserror::Error)]
pub enum CdiGenError {
    /// NVML could not be found or loaded.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// Host discovery failed.
    #[error(transparent)]
    Discover(#[from] DiscoverError),
    /// The node has nothing to offer.
    #[error(
        "nothing to describe: no GPU without MIG and no MIG device on this node (MIG-enabled GPUs without instances are served by transient specs)"
    )]
    NoDevices,
    /// The assembled spec broke a CDI rule (a bug, or hostile facts).
    #[error("generated spec is invalid: {0}")]
    Spec(#[from] SpecError),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A spec file could not be parsed.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column where known.
        reason: String,
    },
    /// A spec file parsed but breaks CDI rules; one problem per line.
    #[error("{}", problems.iter().map(|p| format!("{}: {p}", path.display())).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<String>,
    },
}

/// Loads NVML for the node under `driver_root` (`/` on a real node): from
/// `nvml_lib` or, when `None`, from the driver root's library directories.
pub fn load_driver(driver_root: &Path, nvml_lib: Option<&Path>) -> Result<NvmlDriver, CdiGenError> {
    tessera_driver::discover::check_root(driver_root)?;
    let lib = match nvml_lib {
        Some(p) => p.to_owned(),
        None => tessera_driver::devices::find_nvml_library(driver_root)?,
    };
    Ok(NvmlDriver::load(&lib)?)
}

/// Finds host facts in `layout` through the NVML that [`load_driver`] loads
/// from its driver root.
pub fn discover_node(layout: &Layout, nvml_lib: Option<&Path>) -> Result<NodeFacts, CdiGenError> {
    let driver = load_driver(&layout.driver_root, nvml_lib)?;
    Ok(tessera_driver::discover::discover_in(layout, &driver)?)
}

/// Assembles the static `tessera.io/gpu` spec for the node, mounting the
/// driver files of `groups`.
pub fn static_spec(
    facts: &NodeFacts,
    hook: &HookSettings,
    groups: &LibraryGroups,
) -> Result<Spec, CdiGenError> {
    let devices = edits::static_devices(facts);
    if devices.is_empty() {
        return Err(CdiGenError::NoDevices);
    }
    Ok(Spec::new(
        contract::cdi::GPU_KIND,
        devices,
        edits::common(facts, hook, groups),
    )?)
}
