//! The verbs of `tessera-cdi`, one module each.

pub mod generate;
pub mod list;
pub mod profiles;
pub mod validate;

use std::path::PathBuf;

/// Where the node's driver files are and how to reach NVML.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Root under which `dev/`, `proc/` and the driver libraries are found
    /// (`/` on a GPU node; a `tessera-sim` root on a simulated one).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub driver_root: PathBuf,
    /// NVML library to load instead of the driver root's `libnvidia-ml.so.1`.
    #[arg(long, value_name = "FILE")]
    pub nvml_lib: Option<PathBuf>,
}
