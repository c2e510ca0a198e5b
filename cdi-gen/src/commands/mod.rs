//! The verbs of `tessera-cdi`, one module each.

pub mod generate;
pub mod list;
pub mod profiles;
pub mod runtime;
pub mod validate;

use std::path::PathBuf;

use tessera_driver::discover::Layout;

/// Where the node's driver files, device nodes and `/proc` are, and how to reach NVML.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Root under which the driver's libraries, binaries and firmware are found
    /// (`/` on a GPU node, `/run/nvidia/driver` under a driver container,
    /// `/home/kubernetes/bin/nvidia` on GKE, a `tessera-sim` root on a simulated node).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub driver_root: PathBuf,
    /// Root under which `dev/` is found [default: the driver root].
    #[arg(long, value_name = "DIR")]
    pub dev_root: Option<PathBuf>,
    /// Root under which `proc/` is found [default: the driver root when it
    /// holds proc/driver/nvidia, else /].
    #[arg(long, value_name = "DIR")]
    pub proc_root: Option<PathBuf>,
    /// NVML library to load instead of the driver root's `libnvidia-ml.so.1`.
    #[arg(long, value_name = "FILE")]
    pub nvml_lib: Option<PathBuf>,
}

impl NodeArgs {
    /// The layout the flags describe.
    pub fn layout(&self) -> Layout {
        Layout::from_flags(
            &self.driver_root,
            self.dev_root.as_deref(),
            self.proc_root.as_deref(),
        )
    }
}
