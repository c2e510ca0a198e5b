//! One client per registered plugin: dialing its socket, asking its options,
//! and following its ListAndWatch stream, whose every message replaces the
//! resource's device list. When the stream ends (the plugin died) every
//! device turns Unhealthy until the plugin registers again; the resource
//! itself stays, as kubelet keeps it (kubelet drops it only after a 5 minute
//! grace period; this stand-in keeps it for good, so capacity stays visible).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tessera_kube_proto::deviceplugin::v1beta1 as api;
use tonic::transport::Channel;

use super::Shared;

/// How long kubelet waits for a plugin's socket to answer.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The client of one plugin's DevicePlugin service.
pub(crate) type PluginClient = api::device_plugin_client::DevicePluginClient<Channel>;

/// What the manager knows of one resource.
pub(crate) struct Plugin {
    /// Which registration this is; a stream of an older one is ignored.
    pub generation: u64,
    /// The plugin's client; `None` for a resource restored from the
    /// checkpoint whose plugin has not registered again yet.
    pub client: Option<PluginClient>,
    /// The plugin's options (`None` until it registers).
    pub options: Option<api::DevicePluginOptions>,
    /// Devices by id.
    pub devices: BTreeMap<String, DeviceState>,
    /// The ListAndWatch task.
    pub task: Option<tokio::task::AbortHandle>,
}

impl Plugin {
    /// A resource restored from the checkpoint: known, no devices, no client.
    pub fn restored() -> Self {
        Plugin {
            generation: 0,
            client: None,
            options: None,
            devices: BTreeMap::new(),
            task: None,
        }
    }

    /// Ids of the healthy devices, sorted.
    pub fn healthy_ids(&self) -> Vec<String> {
        self.devices
            .iter()
            .filter(|(_, d)| d.healthy)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// One device as the plugin last listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceState {
    /// `health == "Healthy"`, and the plugin is alive.
    pub healthy: bool,
    /// NUMA nodes from `topology` (empty: none given).
    pub numa_nodes: Vec<i64>,
}

/// Why connecting to a registering plugin failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The socket did not answer.
    #[error("cannot dial the plugin at {socket}: {message}")]
    Dial {
        /// The plugin's socket.
        socket: PathBuf,
        /// Why.
        message: String,
    },
    /// GetDevicePluginOptions failed.
    #[error("GetDevicePluginOptions of the plugin at {socket} failed: {message}")]
    Options {
        /// The plugin's socket.
        socket: PathBuf,
        /// Why.
        message: String,
    },
}

/// Opens a gRPC channel over the unix socket `socket`.
pub(crate) async fn dial(socket: &Path) -> Result<Channel, String> {
    match tokio::time::timeout(DIAL_TIMEOUT, tessera_kube_proto::unix_channel(socket)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(error_chain(&e)),
        Err(_) => Err(format!("no answer within {DIAL_TIMEOUT:?}")),
    }
}

/// An error and its sources on one line (tonic's own message is terse).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl Shared {
    /// Connects to a plugin that registered `resource` at `endpoint` (a
    /// file name in the plugins dir): dial, GetDevicePluginOptions, then
    /// follow ListAndWatch in a task. Replaces an earlier registration of
    /// the same resource (the plugin restarted).
    pub(crate) async fn connect(
        self: &Arc<Self>,
        resource: &str,
        endpoint: &str,
    ) -> Result<(), ConnectError> {
        let socket = self.plugins_dir.join(endpoint);
        let channel = dial(&socket).await.map_err(|message| ConnectError::Dial {
            socket: socket.clone(),
            message,
        })?;
        let mut client = PluginClient::new(channel);
        let options = tokio::time::timeout(
            DIAL_TIMEOUT,
            client.get_device_plugin_options(api::Empty {}),
        )
        .await
        .map_err(|_| ConnectError::Options {
            socket: socket.clone(),
            message: format!("no answer within {DIAL_TIMEOUT:?}"),
        })?
        .map_err(|status| ConnectError::Options {
            socket: socket.clone(),
            message: status.message().to_owned(),
        })?
        .into_inner();
        tracing::info!(
            %resource,
            socket = %socket.display(),
            pre_start_required = options.pre_start_required,
            get_preferred_allocation_available = options.get_preferred_allocation_available,
            "device plugin registered"
        );

        let mut plugins = self.lock_plugins();
        if self.stopped.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Numbered under the lock: whichever registration installs itself
        // last has the highest number.
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed) + 1;
        let plugin = plugins
            .entry(resource.to_owned())
            .or_insert_with(Plugin::restored);
        if let Some(old) = plugin.task.take() {
            old.abort();
        }
        plugin.generation = generation;
        plugin.client = Some(client.clone());
        plugin.options = Some(options);
        let task = tokio::spawn(list_and_watch(
            Arc::clone(self),
            resource.to_owned(),
            generation,
            client,
        ));
        plugin.task = Some(task.abort_handle());
        drop(plugins);
        self.resources_changed();
        Ok(())
    }

    /// Applies `change` to the plugin of `resource` while it is still
    /// registration `generation` (the stream of an older one changes
    /// nothing), then tells the watchers.
    fn update_plugin(&self, resource: &str, generation: u64, change: impl FnOnce(&mut Plugin)) {
        let mut plugins = self.lock_plugins();
        let Some(plugin) = plugins
            .get_mut(resource)
            .filter(|p| p.generation == generation)
        else {
            return;
        };
        change(plugin);
        drop(plugins);
        self.resources_changed();
    }

    /// A ListAndWatch message of registration `generation`.
    fn devices_listed(&self, resource: &str, generation: u64, devices: Vec<api::Device>) {
        self.update_plugin(resource, generation, |plugin| {
            plugin.devices = devices
                .into_iter()
                .map(|d| {
                    let state = DeviceState {
                        healthy: d.health == "Healthy",
                        numa_nodes: d
                            .topology
                            .map(|t| t.nodes.iter().map(|n| n.id).collect())
                            .unwrap_or_default(),
                    };
                    (d.id, state)
                })
                .collect();
            tracing::info!(
                %resource,
                devices = plugin.devices.len(),
                healthy = plugin.devices.values().filter(|d| d.healthy).count(),
                "device plugin listed devices"
            );
        });
    }

    /// The ListAndWatch stream of registration `generation` ended.
    fn disconnected(&self, resource: &str, generation: u64) {
        self.update_plugin(resource, generation, |plugin| {
            for device in plugin.devices.values_mut() {
                device.healthy = false;
            }
            plugin.task = None;
        });
    }
}

async fn list_and_watch(
    shared: Arc<Shared>,
    resource: String,
    generation: u64,
    mut client: PluginClient,
) {
    match client.list_and_watch(api::Empty {}).await {
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(message)) => {
                        shared.devices_listed(&resource, generation, message.devices);
                    }
                    Ok(None) => {
                        tracing::warn!(%resource, "device plugin ended ListAndWatch; its devices are Unhealthy until it registers again");
                        break;
                    }
                    Err(status) => {
                        tracing::warn!(%resource, "device plugin ListAndWatch failed ({status}); its devices are Unhealthy until it registers again");
                        break;
                    }
                }
            }
        }
        Err(status) => {
            tracing::warn!(%resource, "device plugin ListAndWatch call failed: {status}");
        }
    }
    shared.disconnected(&resource, generation);
}
