//! The one error type of the simulated node.
//!
//! The simulated driver's rules ([`crate::mig`]) answer with the first four
//! variants, which map one-to-one onto NVML return codes
//! (`NVML_ERROR_INVALID_ARGUMENT`, `…_INSUFFICIENT_RESOURCES`, `…_NOT_FOUND`,
//! `…_IN_USE`); the rest are about files: the state file, node profiles and
//! the built root. Every message is one line that names the file or field.

use std::path::PathBuf;

/// What went wrong in the simulated node.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A request the simulated driver refuses as malformed (NVML `INVALID_ARGUMENT`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The GPU has no room for the request (NVML `INSUFFICIENT_RESOURCES`).
    #[error("insufficient resources: {0}")]
    InsufficientResources(String),
    /// The named GPU, GPU instance or compute instance does not exist (NVML `NOT_FOUND`).
    #[error("not found: {0}")]
    NotFound(String),
    /// The object still holds others (NVML `IN_USE`), e.g. a GPU instance with compute instances.
    #[error("in use: {0}")]
    InUse(String),
    /// The GPU cannot do this at all (NVML `NOT_SUPPORTED`), e.g. MIG on a model without MIG.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file exists but its content is not what the simulated node wrote.
    #[error("{}: {reason}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A GPU model key the catalogue does not know.
    #[error("unknown GPU model {key:?} (known: {known})")]
    UnknownModel {
        /// The key asked for.
        key: String,
        /// The known keys, comma separated.
        known: String,
    },
    /// A node profile is malformed: names the file (or shipped profile) and the field.
    #[error("profile {source_name}: {field}: {reason}")]
    Profile {
        /// The profile file path, or the shipped profile's name.
        source_name: String,
        /// The field, e.g. `gpu[1].instances[2]`; `document` for whole-file errors.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A profile name that is neither a shipped profile nor a file.
    #[error(
        "unknown profile {name:?} (shipped: {shipped}); to use a file, give a path ending in .toml or .json"
    )]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The shipped profile names, comma separated.
        shipped: String,
    },
    /// No simulated node has been built at this root.
    #[error("no simulated node at {}: {} is missing (build one with `tessera-sim create`)", root.display(), state.display())]
    NoNode {
        /// The root asked for.
        root: PathBuf,
        /// The state file that is absent.
        state: PathBuf,
    },
    /// Building a root failed for a reason that is not a plain I/O error.
    #[error("{}: {reason}", path.display())]
    Build {
        /// The path involved (the root, a device node, the NVML library).
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
}

impl SimError {
    /// An [`SimError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SimError::Io {
            path: path.into(),
            source,
        }
    }
}
