//! Puts the plugin together: load NVML, connect to the API server, sweep,
//! then serve kubelet, publish the inventory, reclaim, monitor and serve
//! metrics until SIGTERM.

use std::sync::Arc;

use tessera_driver::GpuDriver;

use crate::checkpoint::Store;
use crate::config::PluginConfig;

/// What every part of the running plugin shares.
pub struct NodeContext {
    /// The settings.
    pub config: PluginConfig,
    /// NVML (the real library, the simulated node's, or a fake in tests).
    pub driver: Arc<dyn GpuDriver + Send + Sync>,
    /// The API server.
    pub client: kube::Client,
    /// What this plugin created (`--state-dir`).
    pub checkpoint: Arc<Store>,
}

impl std::fmt::Debug for NodeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeContext")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
