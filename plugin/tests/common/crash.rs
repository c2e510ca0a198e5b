//! The harness the reclaim and crash tests share: a simulated node (profile
//! `dynamic`: an H100 and an A100-40GB in MIG mode without instances), a
//! stand-in API server of its own, and this process playing kubelet
//! (test-support's [`FakeKubelet`] on a kubelet directory of its own) and
//! the extender (a pod bound to the node with its reservation by
//! [`super::bind_pod`]). The plugin is the real
//! `tessera-device-plugin` binary; NVML is read through the node's stand-in
//! library loaded in this process (its state is a file under the node root,
//! shared with the plugin).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use tessera_driver::GpuDriver;
use tessera_driver::nvml::NvmlDriver;
use tessera_model::contract::cdi;
use tessera_model::contract::kubelet::PLUGIN_SOCKET;
use tessera_model::gpu::GpuInstance;
use tessera_model::mig::Placement;
use tessera_model::sched::allocation::{
    ALLOCATION_VERSION, Allocation, ContainerAllocation, DeviceAllocation,
};
use tessera_plugin::api::deviceplugin::v1beta1 as dp;
use tessera_plugin::checkpoint::{Checkpoint, Store};
use tessera_plugin::cluster::PodRef;
use tessera_plugin::server::unix_channel;
use tessera_test_support::kube::StandInApiServer;
use tessera_test_support::kubelet::FakeKubelet;
use tessera_test_support::node::SimNode;
use tessera_test_support::{Need, prereq};
use tonic::Status;

use super::{MIG_GPU, NODE, NS, bind_pod, lease_holder};

/// 1g.5gb on the A100-40GB.
pub const PROFILE_ID: u32 = 19;

/// What the tests need: root (device nodes), the stand-ins and `tessera-sim`.
pub fn needs() -> Vec<Need> {
    let mut needs = SimNode::profile("dynamic").needs();
    needs.push(Need::Root);
    needs.extend(tessera_test_support::kube::needs());
    needs
}

/// One simulated node with its API server and kubelet stand-in.
pub struct Harness {
    pub node: SimNode,
    pub api: StandInApiServer,
    pub client: kube::Client,
    pub driver: NvmlDriver,
    pub kubelet_dir: tempfile::TempDir,
    pub state: tempfile::TempDir,
    kubelet: FakeKubelet,
    plugin: Option<Child>,
    log: PathBuf,
    mig_uuid: String,
}

impl Harness {
    /// Builds the node, starts the API server and the kubelet stand-in.
    pub async fn start() -> Result<Harness> {
        let node = SimNode::profile("dynamic")
            .build()
            .map_err(|s| anyhow::anyhow!("{}", s.reason))?;
        let api = StandInApiServer::start(&[])?;
        let client = tessera_test_support::kube::client(api.kubeconfig()).await?;
        tessera_test_support::kube::ensure_node(&client, NODE).await?;

        let kubelet_dir = tempfile::Builder::new()
            .prefix("crash")
            .tempdir_in("/tmp")?;
        let kubelet = FakeKubelet::start(kubelet_dir.path())?;

        let driver = NvmlDriver::load(&tessera_driver::devices::find_nvml_library(node.root())?)?;
        let mig_uuid = driver
            .gpus()?
            .into_iter()
            .find(|g| g.index == MIG_GPU && g.mig_enabled())
            .context("profile dynamic: GPU 1 is not in MIG mode")?
            .uuid;
        let state = tempfile::tempdir()?;
        std::fs::create_dir_all(state.path().join("cdi"))?;
        let log = state.path().join("plugin.log");
        Ok(Harness {
            node,
            api,
            client,
            driver,
            kubelet_dir,
            state,
            kubelet,
            plugin: None,
            log,
            mig_uuid,
        })
    }

    /// The transient specs' directory.
    pub fn cdi_dir(&self) -> PathBuf {
        self.state.path().join("cdi")
    }

    /// The plugin's `--state-dir`.
    pub fn state_dir(&self) -> PathBuf {
        self.state.path().join("tessera")
    }

    /// The MIG GPU's uuid.
    pub fn mig_uuid(&self) -> &str {
        &self.mig_uuid
    }

    /// What the plugin logged so far (every run, appended).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Starts the plugin (crashing at `crash_at`, if given) and waits until
    /// it registered with the kubelet stand-in.
    pub async fn start_plugin(&mut self, crash_at: Option<&str>) -> Result<()> {
        ensure!(self.plugin.is_none(), "the plugin already runs");
        self.kubelet.clear_registrations();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_tessera-device-plugin"));
        command
            .args(["--node-name", NODE, "--kubeconfig"])
            .arg(self.api.kubeconfig())
            .arg("--driver-root")
            .arg(self.node.root())
            .arg("--kubelet-dir")
            .arg(self.kubelet_dir.path())
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(["--metrics-listen", "off"])
            .env("TESSERA_LOG", "info")
            .env_remove(tessera_plugin::failpoint::ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(point) = crash_at {
            command.env(tessera_plugin::failpoint::ENV, point);
        }
        self.plugin = Some(command.spawn().context("starting tessera-device-plugin")?);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.kubelet.registered(PLUGIN_SOCKET).is_some() {
                return Ok(());
            }
            if let Some(status) = self
                .plugin
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.plugin = None;
                bail!(
                    "the plugin exited with {status} before registering:\n{}",
                    self.log_text()
                );
            }
            if Instant::now() > deadline {
                bail!("the plugin did not register in 30 s:\n{}", self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the plugin exits (a crash point), up to `within`; true
    /// when it was killed by SIGKILL.
    pub async fn wait_crash(&mut self, within: Duration) -> Result<bool> {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + within;
        loop {
            let child = self.plugin.as_mut().context("no plugin running")?;
            if let Some(status) = child.try_wait()? {
                self.plugin = None;
                return Ok(status.signal() == Some(libc::SIGKILL));
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the plugin (SIGKILL) if it runs.
    pub fn kill_plugin(&mut self) {
        if let Some(mut child) = self.plugin.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the plugin still runs.
    pub fn plugin_runs(&mut self) -> bool {
        self.plugin
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// A pod bound to the node reserving a 1g.5gb instance at `placement`
    /// on the MIG GPU, `bind-phase: allocating`, the bind Lease naming it.
    pub async fn reserve(&self, name: &str, placement: Placement) -> Result<PodRef> {
        let allocation = Allocation {
            version: ALLOCATION_VERSION,
            node: NODE.to_owned(),
            containers: vec![ContainerAllocation {
                index: 0,
                name: "main".to_owned(),
                init: false,
                devices: vec![DeviceAllocation::Mig {
                    uuid: self.mig_uuid.clone(),
                    profile: "1g.5gb".to_owned(),
                    profile_id: PROFILE_ID,
                    placement,
                    memory_mib: 4864,
                    realized: None,
                }],
            }],
        };
        bind_pod(
            &self.client,
            name,
            &["main"],
            &allocation.to_annotation(),
            true,
        )
        .await
    }

    /// The pod, if it exists.
    pub async fn pod(&self, name: &str) -> Result<Option<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        Ok(pods.get_opt(name).await?)
    }

    /// The node's bind Lease holder, if any.
    pub async fn lease_holder(&self) -> Result<Option<String>> {
        lease_holder(&self.client).await
    }

    /// Deletes the pod at once (grace 0).
    pub async fn delete(&self, name: &str) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
        Ok(())
    }

    /// Kubelet's Allocate of one MIG device of the A100 (the first the
    /// plugin lists on it).
    pub async fn allocate(&self) -> Result<std::result::Result<dp::AllocateResponse, Status>> {
        let socket = self.kubelet.plugin_socket(PLUGIN_SOCKET);
        let channel = unix_channel(&socket)
            .await
            .with_context(|| format!("dialing {}", socket.display()))?;
        let mut client = dp::device_plugin_client::DevicePluginClient::new(channel);
        let mut stream = client.list_and_watch(dp::Empty {}).await?.into_inner();
        let list = stream
            .next()
            .await
            .context("ListAndWatch ended before its first list")??;
        let id = list
            .devices
            .iter()
            .find(|d| d.id.starts_with(&self.mig_uuid))
            .map(|d| d.id.clone())
            .with_context(|| {
                format!("no device of {} listed: {:?}", self.mig_uuid, list.devices)
            })?;
        Ok(client
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: vec![id],
                }],
            })
            .await
            .map(tonic::Response::into_inner))
    }

    /// The GPU instances on the MIG GPU.
    pub fn gis(&self) -> Result<Vec<GpuInstance>> {
        Ok(self.driver.gpu_instances(MIG_GPU)?)
    }

    /// Makes a GI (with its CI) by hand, as another tool would.
    pub fn hand_made(&self, placement: Placement) -> Result<GpuInstance> {
        let gi = self
            .driver
            .create_gpu_instance(MIG_GPU, PROFILE_ID, placement)?;
        self.driver.create_compute_instance(MIG_GPU, gi.id)?;
        Ok(gi)
    }

    /// The checkpoint as the plugin last wrote it.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        Ok(Store::open(&self.state_dir())?.snapshot())
    }

    /// The transient specs' alloc-ids in the CDI directory.
    pub fn spec_ids(&self) -> Result<BTreeSet<String>> {
        let prefix = cdi::transient_spec_file("");
        let prefix = prefix.trim_end_matches(".json");
        let mut ids = BTreeSet::new();
        for entry in std::fs::read_dir(self.cdi_dir())? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Some(id) = name
                .strip_prefix(prefix)
                .and_then(|r| r.strip_suffix(".json"))
            {
                ids.insert(id.to_owned());
            }
        }
        Ok(ids)
    }

    /// The allocation directories' names.
    pub fn alloc_dirs(&self) -> Result<BTreeSet<String>> {
        let dir = self
            .state_dir()
            .join(tessera_model::contract::node::ALLOC_DIR);
        let mut names = BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries {
                names.insert(entry?.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    /// The crash invariants: every GI on the MIG GPU but `foreign` is named
    /// by exactly one checkpoint record and holds exactly the CI it
    /// records; no two records name one GI; every transient spec and
    /// allocation directory belongs to a record; every record's GI exists.
    pub fn check_invariants(&self, foreign: &[GpuInstance], context: &str) -> Result<()> {
        let checkpoint = self.checkpoint()?;
        let mut named = BTreeSet::new();
        for record in checkpoint.allocations.values() {
            for instance in &record.instances {
                let gi = instance.gpu_instance_id.with_context(|| {
                    format!(
                        "{context}: record {} keeps an intent without a GI id",
                        record.alloc_id
                    )
                })?;
                ensure!(
                    named.insert(gi),
                    "{context}: GI {gi} named by two records (double booking)"
                );
            }
        }
        let foreign_ids: BTreeSet<u32> = foreign.iter().map(|g| g.id).collect();
        let gis = self.gis()?;
        for gi in &gis {
            if foreign_ids.contains(&gi.id) {
                continue;
            }
            ensure!(
                named.contains(&gi.id),
                "{context}: GI {} at {:?} leaked (no record names it); checkpoint {checkpoint:?}",
                gi.id,
                gi.placement
            );
        }
        for f in foreign {
            ensure!(
                gis.contains(f),
                "{context}: the hand-made GI {} at {:?} was touched; GIs now {gis:?}",
                f.id,
                f.placement
            );
            ensure!(
                self.driver.compute_instances(MIG_GPU, f.id)?.len() == 1,
                "{context}: the hand-made GI's CI was touched"
            );
        }
        for gi in &named {
            ensure!(
                gis.iter().any(|g| g.id == *gi),
                "{context}: a record names GI {gi}, which is gone"
            );
        }
        for id in self.spec_ids()? {
            ensure!(
                checkpoint.allocations.contains_key(&id),
                "{context}: transient spec of {id} without a record (it may name a destroyed instance)"
            );
        }
        for id in self.alloc_dirs()? {
            ensure!(
                checkpoint.allocations.contains_key(&id),
                "{context}: allocation directory {id} without a record"
            );
        }
        Ok(())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.kill_plugin();
    }
}

/// Requires the prerequisites; `false`: skipped.
pub fn ready() -> bool {
    prereq::require(&needs()).is_ok()
}
