//! Reclaiming what ended pods held, and the startup sweep that settles the
//! checkpoint against NVML and the API after a crash.
//!
//! An allocation lives as long as its **pod** (kubelet reuses its cached
//! Allocate answer when a container restarts). Three witnesses say whether
//! the pod still holds it, and any one of them keeps it:
//!
//! - the API server: the pod (by uid) is on this node and not terminal
//!   (`Succeeded`/`Failed`); a pod being deleted still runs until kubelet
//!   removes it, so a deletion timestamp alone keeps it;
//! - kubelet's PodResources `List`: a pod kubelet still lists with the
//!   record's devices keeps them even if the API forgot it;
//! - the hook's binding record `<state_dir>/alloc/<id>/binding.json` naming a
//!   live process: a container still bound keeps its allocation.
//!
//! When the API cannot be read the answer is "unknown" and nothing is
//! reclaimed; the same when kubelet's socket is there but does not answer.
//!
//! Reclaim ([`reclaim`]) marks the record `Reclaiming` first, then destroys
//! each instance's compute instances and its GPU instance (only those the
//! record names, and only while NVML still shows that GI id with the
//! recorded profile at the recorded placement: an id reused by someone
//! else's GI is never touched), dropping each instance from the record as it
//! goes, deletes the transient spec and the allocation's directory, and
//! drops the record. Every step finds its object possibly gone already (a
//! crash in between) and counts that as done.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;
use tessera_driver::{DriverError, GpuDriver};
use tessera_model::alloc::{AllocId, BindingRecord};
use tessera_model::contract;

use crate::allocate::{
    self, Destroyed, UndoError, Unnamed, alloc_dir, blocking, gpu_index_of, lock_gpu, spec_path,
};
use crate::api::podresources::v1::ListPodResourcesRequest;
use crate::api::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use crate::checkpoint::{AllocRecord, CheckpointError, InstanceRecord, Phase};
use crate::cluster::{Cluster, PodRef};
use crate::failpoint;
use crate::run::NodeContext;

/// How often the reconciler checks every record even without a pod event.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(10);

/// How soon the reconciler checks again while a record [lingers](Witnesses::lingering)
/// (its pod gone from the API or ended, a container still holding it): the
/// container's end is then noticed within this, not at the next resync.
pub const LINGER_RECHECK: Duration = Duration::from_millis(250);

/// How long one record may keep the reconciler re-checking every
/// [`LINGER_RECHECK`]; after that it waits for pod events and the resync
/// like any other (a container that never ends costs no busy loop).
pub const LINGER_LIMIT: Duration = Duration::from_secs(30);

/// How long one API or kubelet request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A `Realizing` record older than this (the bind lock's lifetime) belongs
/// to no running Allocate call; the reconciler treats it like a `Ready` one.
pub const STALE_REALIZING: Duration =
    Duration::from_secs(contract::cluster::BIND_LEASE_SECONDS as u64);

/// Why reconciling failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A driver call failed while reclaiming an allocation.
    #[error("reclaiming {alloc_id}: {what} on {gpu}: {source}")]
    Driver {
        /// The allocation.
        alloc_id: String,
        /// What was being done (`listing GPUs`, `destroying its instance (GI 3)`).
        what: String,
        /// The parent GPU's uuid.
        gpu: String,
        /// The driver's error.
        source: DriverError,
    },
    /// A file or directory could not be removed or read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The checkpoint holds an id that is not an alloc-id.
    #[error("checkpoint record {alloc_id:?}: {reason}")]
    BadRecord {
        /// The id as recorded.
        alloc_id: String,
        /// Why it is refused.
        reason: String,
    },
    /// The API server could not be read or written.
    #[error("API server: {what}: {reason}")]
    Api {
        /// What was asked.
        what: String,
        /// The error.
        reason: String,
    },
}

/// What one reconcile pass ([`pass`]) did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Allocations reclaimed.
    pub reclaimed: usize,
    /// Allocations that [linger](Witnesses::lingering): about to be free.
    pub lingering: Vec<String>,
}

/// What the startup sweep did, in counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Instances a killed Allocate created but did not record, now recorded.
    pub adopted: usize,
    /// Allocations undone or reclaimed.
    pub reclaimed: usize,
    /// Allocations kept (their pod still holds them).
    pub kept: usize,
    /// GPU instances no record names (another tool's; never touched).
    pub foreign: usize,
    /// Orphaned transient specs and allocation directories removed.
    pub files_removed: usize,
    /// Pods set to `bind-phase: failed` (their Allocate died half-way).
    pub pods_failed: usize,
}

/// A pod on this node as the API server shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `status.phase` is `Succeeded` or `Failed`.
    pub terminal: bool,
    /// `tessera.io/bind-phase`, if any.
    pub bind_phase: Option<String>,
}

/// A pod kubelet's PodResources `List` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Container name → the device ids it holds of our resource.
    pub containers: BTreeMap<String, Vec<String>>,
}

/// What kubelet says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletView {
    /// No PodResources socket on this node: the witness is not consulted.
    Absent,
    /// The socket is there but did not answer: nothing may be reclaimed.
    Failed,
    /// The pods kubelet lists.
    Listed(Vec<KubeletPod>),
}

/// The three witnesses at one moment.
#[derive(Debug, Clone)]
pub struct Witnesses {
    /// Pods on this node by uid; `None` when the API could not be read.
    pub pods: Option<HashMap<String, PodState>>,
    /// kubelet's PodResources listing.
    pub kubelet: KubeletView,
    /// Allocation ids whose binding record names a live process.
    pub bound: BTreeSet<String>,
}

/// Whether a record's pod still holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Something holds it (the reason, for the log).
    Held(&'static str),
    /// Nothing holds it: reclaim.
    Gone,
    /// A witness could not be read: decide later.
    Unknown,
}

impl Witnesses {
    /// Judges one record by the rules of the [module docs](self).
    pub fn verdict(&self, record: &AllocRecord) -> Verdict {
        if self.bound.contains(&record.alloc_id) {
            return Verdict::Held("a container is bound to it");
        }
        match &self.kubelet {
            KubeletView::Failed => return Verdict::Unknown,
            KubeletView::Listed(pods) if kubelet_holds(pods, record) => {
                return Verdict::Held("kubelet lists its pod with its devices");
            }
            _ => {}
        }
        match &self.pods {
            None => Verdict::Unknown,
            Some(pods) => match pods.get(&record.pod_uid) {
                Some(pod) if !pod.terminal => Verdict::Held("its pod runs"),
                _ => Verdict::Gone,
            },
        }
    }

    /// Whether a container of the record's pod ran: bound, or listed by
    /// kubelet with the record's devices.
    pub fn ran(&self, record: &AllocRecord) -> bool {
        self.bound.contains(&record.alloc_id)
            || matches!(&self.kubelet, KubeletView::Listed(pods) if kubelet_holds(pods, record))
    }

    /// Whether the record is held only by a container: the API (readable)
    /// shows its pod gone or ended, yet a binding or kubelet still holds it.
    /// Such a record is about to be free (the container is stopping) and is
    /// worth checking again soon.
    pub fn lingering(&self, record: &AllocRecord) -> bool {
        let ended = self
            .pods
            .as_ref()
            .is_some_and(|pods| pods.get(&record.pod_uid).is_none_or(|pod| pod.terminal));
        ended && matches!(self.verdict(record), Verdict::Held(_))
    }

    /// The running (non-terminal) pod whose uid the alloc-id starts with.
    fn running_owner(&self, alloc_id: &str) -> Option<&PodState> {
        let pods = self.pods.as_ref()?;
        let (uid, index) = alloc_id.rsplit_once('-')?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        pods.get(uid).filter(|p| !p.terminal)
    }
}

fn kubelet_holds(pods: &[KubeletPod], record: &AllocRecord) -> bool {
    pods.iter()
        .filter(|p| p.namespace == record.namespace && p.name == record.pod)
        .filter_map(|p| p.containers.get(&record.container))
        .any(|ids| {
            if record.device_ids.is_empty() {
                !ids.is_empty()
            } else {
                ids.iter().any(|id| record.device_ids.contains(id))
            }
        })
}

/// Loops until `shutdown` turns true: a pod watch on this node triggers a
/// check at once, and every [`RESYNC_PERIOD`] a full check runs anyway; each
/// check reclaims the records nothing holds. While a record lingers (its pod
/// gone, a container still stopping) the next check comes after
/// [`LINGER_RECHECK`], for at most [`LINGER_LIMIT`] per record.
pub async fn run(ctx: Arc<NodeContext>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let notify = Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(watch_pods(ctx.clone(), notify.clone()));
    let mut tick = tokio::time::interval(RESYNC_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lingering = Lingering::default();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let soon = lingering.recheck(std::time::Instant::now());
        tokio::select! {
            _ = tick.tick() => {}
            () = notify.notified() => {}
            () = tokio::time::sleep(LINGER_RECHECK), if soon => {}
            changed = shutdown.changed() => {
                if changed.is_err() { break; }
                continue;
            }
        }
        match pass(&ctx).await {
            Ok(found) => {
                if found.reclaimed > 0 {
                    tracing::info!(
                        reclaimed = found.reclaimed,
                        "reclaimed allocations of ended pods"
                    );
                }
                lingering.track(&found.lingering, std::time::Instant::now());
            }
            Err(e) => tracing::warn!(error = %e, "reconcile pass failed; retrying"),
        }
    }
    watch.abort();
}

/// The records seen lingering, each with when it was first seen so.
#[derive(Debug, Default)]
struct Lingering(HashMap<String, std::time::Instant>);

impl Lingering {
    /// Keeps exactly `now_lingering`, remembering when each was first seen.
    fn track(&mut self, now_lingering: &[String], now: std::time::Instant) {
        self.0.retain(|id, _| now_lingering.contains(id));
        for id in now_lingering {
            self.0.entry(id.clone()).or_insert(now);
        }
    }

    /// Whether to check again after [`LINGER_RECHECK`]: some record has
    /// lingered for less than [`LINGER_LIMIT`].
    fn recheck(&self, now: std::time::Instant) -> bool {
        self.0
            .values()
            .any(|since| now.saturating_duration_since(*since) < LINGER_LIMIT)
    }
}

/// Watches the pods on this node; every change wakes the loop (the check
/// itself lists the pods again: the watch is only a trigger).
async fn watch_pods(ctx: Arc<NodeContext>, notify: Arc<tokio::sync::Notify>) {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&node_selector(&ctx.config.node_name));
    let mut stream = watcher(pods, config).boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Delete(_) | watcher::Event::Apply(_)) => notify.notify_one(),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "pod watch interrupted; resuming");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn node_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// One pass: reads the witnesses and reclaims every `Ready` or `Reclaiming`
/// record nothing holds (and `Realizing` ones older than
/// [`STALE_REALIZING`]). Returns how many were reclaimed.
pub async fn check_once(ctx: &Arc<NodeContext>) -> Result<usize, ReconcileError> {
    pass(ctx).await.map(|found| found.reclaimed)
}

/// [`check_once`], also naming the records that linger.
pub async fn pass(ctx: &Arc<NodeContext>) -> Result<Pass, ReconcileError> {
    let snapshot = ctx.checkpoint.snapshot();
    if snapshot.allocations.is_empty() {
        return Ok(Pass::default());
    }
    let witnesses = gather(ctx).await;
    let mut lingering = Vec::new();
    let now = unix_now();
    let mut doomed = Vec::new();
    for record in snapshot.allocations.values() {
        let due = match record.phase {
            Phase::Reclaiming => true,
            Phase::Ready => true,
            Phase::Realizing => now.saturating_sub(record.created_unix) > STALE_REALIZING.as_secs(),
        };
        if !due {
            continue;
        }
        let verdict = if record.phase == Phase::Reclaiming {
            Verdict::Gone
        } else {
            witnesses.verdict(record)
        };
        if verdict == Verdict::Gone {
            doomed.push(record.alloc_id.clone());
        } else if witnesses.lingering(record) {
            lingering.push(record.alloc_id.clone());
        }
    }
    if doomed.is_empty() {
        return Ok(Pass {
            reclaimed: 0,
            lingering,
        });
    }
    let mut reclaimed = 0;
    let mut first_error = None;
    for id in &doomed {
        match reclaim(ctx, id).await {
            Ok(()) => reclaimed += 1,
            Err(e) => {
                tracing::warn!(alloc = %id, error = %e, "reclaim failed; retrying next pass");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if reclaimed == 0 => Err(e),
        _ => Ok(Pass {
            reclaimed,
            lingering,
        }),
    }
}

/// Reads the three witnesses; never fails (an unreadable witness says so).
pub async fn gather(ctx: &NodeContext) -> Witnesses {
    let pods = match list_pods(ctx).await {
        Ok(pods) => Some(pods),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this node's pods; reclaiming nothing this pass");
            None
        }
    };
    let kubelet = kubelet_view(
        &ctx.config
            .kubelet_dir
            .join(contract::kubelet::POD_RESOURCES_SUBDIR)
            .join(contract::kubelet::POD_RESOURCES_SOCKET),
        &ctx.config.resource_name,
    )
    .await;
    let bound = bound_allocations(&ctx.config.state_dir);
    Witnesses {
        pods,
        kubelet,
        bound,
    }
}

async fn list_pods(ctx: &NodeContext) -> Result<HashMap<String, PodState>, ReconcileError> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let params = ListParams::default().fields(&node_selector(&ctx.config.node_name));
    let list = tokio::time::timeout(REQUEST_TIMEOUT, api.list(&params))
        .await
        .map_err(|_| ReconcileError::Api {
            what: "list pods".to_owned(),
            reason: format!("no answer in {REQUEST_TIMEOUT:?}"),
        })?
        .map_err(|e| ReconcileError::Api {
            what: "list pods".to_owned(),
            reason: e.to_string(),
        })?;
    let mut pods = HashMap::new();
    for pod in list.items {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        pods.insert(
            uid,
            PodState {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                terminal: matches!(phase, Some("Succeeded" | "Failed")),
                bind_phase: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(contract::annotations::BIND_PHASE))
                    .cloned(),
            },
        );
    }
    Ok(pods)
}

/// kubelet's PodResources listing through `socket`, with each container's
/// devices of `resource_name`.
pub async fn kubelet_view(socket: &Path, resource_name: &str) -> KubeletView {
    if !socket.exists() {
        return KubeletView::Absent;
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, list_kubelet(socket, resource_name)).await {
        Ok(Ok(pods)) => KubeletView::Listed(pods),
        Ok(Err(e)) => {
            tracing::warn!(socket = %socket.display(), error = %e, "kubelet PodResources List failed; reclaiming nothing this pass");
            KubeletView::Failed
        }
        Err(_) => {
            tracing::warn!(socket = %socket.display(), "kubelet PodResources List timed out; reclaiming nothing this pass");
            KubeletView::Failed
        }
    }
}

async fn list_kubelet(socket: &Path, resource_name: &str) -> Result<Vec<KubeletPod>, String> {
    let path = socket.to_owned();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(path).await?,
            ))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(REQUEST_TIMEOUT)
        .connect_with_connector(connector)
        .await
        .map_err(|e| e.to_string())?;
    let response = PodResourcesListerClient::new(channel)
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    Ok(response
        .pod_resources
        .into_iter()
        .map(|p| KubeletPod {
            namespace: p.namespace,
            name: p.name,
            containers: p
                .containers
                .into_iter()
                .map(|c| {
                    let ids = c
                        .devices
                        .into_iter()
                        .filter(|d| d.resource_name == resource_name)
                        .flat_map(|d| d.device_ids)
                        .collect();
                    (c.name, ids)
                })
                .collect(),
        })
        .collect())
}

/// Allocation ids under `<state_dir>/alloc/` whose `binding.json` names a
/// process that is alive.
pub fn bound_allocations(state_dir: &Path) -> BTreeSet<String> {
    let mut bound = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(state_dir.join(contract::node::ALLOC_DIR)) else {
        return bound;
    };
    for entry in entries.flatten() {
        let path = entry.path().join(contract::node::BINDING_FILE);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        match serde_json::from_slice::<BindingRecord>(&bytes) {
            Ok(binding) if pid_alive(binding.pid) => {
                bound.insert(binding.alloc_id);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable binding record")
            }
        }
    }
    bound
}

fn pid_alive(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reclaims one allocation (see the [module docs](self)); a record that is
/// already gone is done. Each instance is destroyed under its GPU's lock
/// ([`crate::allocate::lock_gpu`]); reclaims run one at a time.
pub async fn reclaim(ctx: &NodeContext, alloc_id: &str) -> Result<(), ReconcileError> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(record) = ctx.checkpoint.get(alloc_id) else {
        return Ok(());
    };
    let id = AllocId::new(alloc_id).map_err(|e| ReconcileError::BadRecord {
        alloc_id: alloc_id.to_owned(),
        reason: e.to_string(),
    })?;
    if record.phase != Phase::Reclaiming {
        ctx.checkpoint.update(|c| {
            if let Some(r) = c.allocations.get_mut(alloc_id) {
                r.phase = Phase::Reclaiming;
            }
        })?;
        failpoint::hit(failpoint::RECLAIM_AFTER_MARK);
    }
    tracing::info!(alloc = alloc_id, pod = %format!("{}/{}", record.namespace, record.pod), "reclaiming");
    let driver = ctx.driver.as_ref();
    while let Some(instance) = ctx
        .checkpoint
        .get(alloc_id)
        .and_then(|r| r.instances.last().cloned())
    {
        {
            let _gpu = lock_gpu(&instance.gpu_uuid).await;
            blocking(|| destroy_instance(driver, alloc_id, &instance))?;
        }
        ctx.checkpoint.update(|c| {
            if let Some(r) = c.allocations.get_mut(alloc_id)
                && r.instances.last() == Some(&instance)
            {
                r.instances.pop();
            }
        })?;
    }
    remove_path(&spec_path(&ctx.config, id.as_str()), false)?;
    failpoint::hit(failpoint::RECLAIM_AFTER_SPEC);
    remove_path(&alloc_dir(&ctx.config, id.as_str()), true)?;
    ctx.checkpoint.update(|c| c.allocations.remove(alloc_id))?;
    tracing::info!(alloc = alloc_id, "reclaimed");
    Ok(())
}

/// Destroys one recorded instance ([`allocate::destroy_instance`]); an
/// intent without a GI id names nothing to destroy (the startup sweep adopts
/// such GIs before reclaiming). The crash points between the steps are
/// reclaim's.
fn destroy_instance(
    driver: &(dyn GpuDriver + Send + Sync),
    alloc_id: &str,
    instance: &InstanceRecord,
) -> Result<(), ReconcileError> {
    let after = |step: Destroyed| match step {
        Destroyed::ComputeInstances => failpoint::hit(failpoint::RECLAIM_AFTER_CI),
        Destroyed::GpuInstance => failpoint::hit(failpoint::RECLAIM_AFTER_GI),
    };
    allocate::destroy_instance(driver, instance, Unnamed::Skip, &after).map_err(|e| match e {
        UndoError::Driver { what, gpu, source } => ReconcileError::Driver {
            alloc_id: alloc_id.to_owned(),
            what: format!("destroying its instance ({what})"),
            gpu,
            source,
        },
        UndoError::Io { path, source } => ReconcileError::Io { path, source },
    })
}

fn remove_path(path: &Path, dir: bool) -> Result<(), ReconcileError> {
    let result = if dir {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ReconcileError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Settles the checkpoint against NVML and the API after a crash, before
/// the plugin serves kubelet: adopts the instances a killed Allocate
/// created but did not record; undoes every `Realizing` record (its
/// container never got an answer) and fails its pod if it still waits
/// (`bind-phase: failed`, bind lock released); keeps `Ready` records whose
/// pod holds them (checking their instances still exist) and reclaims the
/// rest; finishes `Reclaiming` ones; removes transient specs and allocation
/// directories no record names and no running pod owns; counts the GPU
/// instances no record names (foreign: never touched).
pub async fn startup_sweep(ctx: &Arc<NodeContext>) -> Result<SweepReport, ReconcileError> {
    let mut witnesses = gather(ctx).await;
    for _ in 0..4 {
        if witnesses.pods.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        witnesses.pods = list_pods(ctx).await.ok();
    }
    let Some(pods) = witnesses.pods.clone() else {
        return Err(ReconcileError::Api {
            what: "list pods".to_owned(),
            reason: "the API server did not answer; cannot tell which allocations are held"
                .to_owned(),
        });
    };
    let (mut report, to_fail) = sweep_records(ctx, &witnesses).await?;
    for uid in to_fail {
        let Some(pod) = pods.get(&uid) else {
            continue;
        };
        match fail_pod(ctx, pod, &uid).await {
            Ok(()) => report.pods_failed += 1,
            Err(e) => {
                tracing::error!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %e, "cannot mark the pod failed")
            }
        }
    }
    tracing::info!(
        adopted = report.adopted,
        reclaimed = report.reclaimed,
        kept = report.kept,
        foreign = report.foreign,
        files_removed = report.files_removed,
        pods_failed = report.pods_failed,
        "startup sweep done"
    );
    Ok(report)
}

/// The sweep but for the pod writes; returns the report and the uids of the
/// pods to fail.
async fn sweep_records(
    ctx: &NodeContext,
    witnesses: &Witnesses,
) -> Result<(SweepReport, Vec<String>), ReconcileError> {
    let mut report = SweepReport {
        adopted: blocking(|| adopt(ctx))?,
        ..SweepReport::default()
    };
    let mut to_fail = Vec::new();
    let snapshot = ctx.checkpoint.snapshot();
    // A pod still `allocating` got no answer for its last container (the
    // plugin writes `success` before it answers): unless a container of it
    // ran after all (bound, or listed by kubelet with its devices), its
    // Allocate died and none of its allocations will be used.
    let allocating = |uid: &str| {
        witnesses
            .pods
            .as_ref()
            .and_then(|p| p.get(uid))
            .is_some_and(|pod| {
                !pod.terminal
                    && pod.bind_phase.as_deref()
                        == Some(contract::annotations::bind_phase::ALLOCATING)
            })
    };
    let ran: BTreeSet<&str> = snapshot
        .allocations
        .values()
        .filter(|r| witnesses.ran(r))
        .map(|r| r.pod_uid.as_str())
        .collect();
    let died = |uid: &str| allocating(uid) && !ran.contains(uid);
    for record in snapshot.allocations.values() {
        let undo = match record.phase {
            Phase::Realizing => {
                tracing::warn!(alloc = %record.alloc_id, "Allocate died half-way; undoing it");
                true
            }
            Phase::Reclaiming => true,
            Phase::Ready if died(&record.pod_uid) => {
                tracing::warn!(alloc = %record.alloc_id, "Allocate died before its pod's answer; undoing it");
                true
            }
            Phase::Ready => witnesses.verdict(record) == Verdict::Gone,
        };
        if died(&record.pod_uid) && !to_fail.contains(&record.pod_uid) {
            to_fail.push(record.pod_uid.clone());
        }
        if undo {
            reclaim(ctx, &record.alloc_id).await?;
            report.reclaimed += 1;
        } else {
            blocking(|| check_instances(ctx.driver.as_ref(), record));
            report.kept += 1;
        }
    }
    report.files_removed = remove_orphans(ctx, witnesses)?;
    report.foreign = blocking(|| count_foreign(ctx))?;
    Ok((report, to_fail))
}

/// Records the GPU and compute instances a killed Allocate created before it
/// could write their ids: a GI of the intent's profile at its placement that
/// no record names, and the CIs inside a recorded GI without a CI id.
fn adopt(ctx: &NodeContext) -> Result<usize, ReconcileError> {
    let driver = ctx.driver.as_ref();
    let snapshot = ctx.checkpoint.snapshot();
    let mut named: BTreeSet<(String, u32)> = snapshot
        .allocations
        .values()
        .flat_map(|r| &r.instances)
        .filter_map(|i| i.gpu_instance_id.map(|id| (i.gpu_uuid.clone(), id)))
        .collect();
    let mut adopted = 0;
    for record in snapshot.allocations.values() {
        for (slot, instance) in record.instances.iter().enumerate() {
            if instance.gpu_instance_id.is_some() && instance.compute_instance_id.is_some() {
                continue;
            }
            let fail = |what: &str, source| ReconcileError::Driver {
                alloc_id: record.alloc_id.clone(),
                what: what.to_owned(),
                gpu: instance.gpu_uuid.clone(),
                source,
            };
            let Some(gpu) =
                gpu_index_of(driver, &instance.gpu_uuid).map_err(|e| fail("listing GPUs", e))?
            else {
                continue;
            };
            let mut found = instance.clone();
            if found.gpu_instance_id.is_none() {
                let gis = driver
                    .gpu_instances(gpu)
                    .map_err(|e| fail("listing GPU instances", e))?;
                let Some(gi) = gis.iter().find(|g| {
                    g.profile_id == instance.profile_id
                        && g.placement == instance.placement
                        && !named.contains(&(instance.gpu_uuid.clone(), g.id))
                }) else {
                    continue;
                };
                found.gpu_instance_id = Some(gi.id);
                named.insert((instance.gpu_uuid.clone(), gi.id));
            }
            let gi_id = found.gpu_instance_id.unwrap_or_default();
            let cis = match driver.compute_instances(gpu, gi_id) {
                Ok(cis) => cis,
                Err(DriverError::NotFound(_)) => Vec::new(),
                Err(e) => return Err(fail("listing compute instances", e)),
            };
            if found.compute_instance_id.is_none()
                && let [ci] = cis.as_slice()
            {
                found.compute_instance_id = Some(ci.id);
                found.mig_uuid = driver
                    .mig_devices(gpu)
                    .ok()
                    .and_then(|devs| {
                        devs.into_iter()
                            .find(|d| d.gpu_instance_id == gi_id && d.compute_instance_id == ci.id)
                    })
                    .map(|d| d.uuid);
            }
            if found != *instance {
                tracing::warn!(
                    alloc = %record.alloc_id, gpu = %instance.gpu_uuid,
                    gi = ?found.gpu_instance_id, ci = ?found.compute_instance_id,
                    "adopting an instance a killed Allocate created"
                );
                let id = record.alloc_id.clone();
                ctx.checkpoint.update(|c| {
                    if let Some(slot) = c
                        .allocations
                        .get_mut(&id)
                        .and_then(|r| r.instances.get_mut(slot))
                    {
                        *slot = found;
                    }
                })?;
                adopted += 1;
            }
        }
    }
    Ok(adopted)
}

/// Logs loudly when a kept record's instance no longer exists.
fn check_instances(driver: &(dyn GpuDriver + Send + Sync), record: &AllocRecord) {
    for instance in &record.instances {
        let exists = instance.gpu_instance_id.is_some_and(|gi_id| {
            gpu_index_of(driver, &instance.gpu_uuid)
                .ok()
                .flatten()
                .and_then(|gpu| driver.gpu_instances(gpu).ok())
                .is_some_and(|gis| {
                    gis.iter().any(|g| {
                        g.id == gi_id
                            && g.profile_id == instance.profile_id
                            && g.placement == instance.placement
                    })
                })
        });
        if !exists {
            tracing::error!(
                alloc = %record.alloc_id, pod = %format!("{}/{}", record.namespace, record.pod),
                gpu = %instance.gpu_uuid, gi = ?instance.gpu_instance_id, profile = %instance.profile,
                "a running pod's MIG instance is gone (destroyed by hand or by a GPU reset); the pod keeps its record until it ends"
            );
        }
    }
}

/// Removes `tessera.io-alloc_<id>.json` specs in the CDI directory and
/// `alloc/<id>` directories that no record names and no running pod owns
/// (those names are Tessera's by contract); nothing else is touched.
fn remove_orphans(ctx: &NodeContext, witnesses: &Witnesses) -> Result<usize, ReconcileError> {
    if witnesses.pods.is_none() {
        return Ok(0);
    }
    let snapshot = ctx.checkpoint.snapshot();
    let orphan = |id: &str| {
        AllocId::new(id).is_ok()
            && !snapshot.allocations.contains_key(id)
            && witnesses.running_owner(id).is_none()
            && !witnesses.bound.contains(id)
    };
    let mut removed = 0;
    let prefix = contract::cdi::transient_spec_file("");
    let (prefix, suffix) = prefix.split_at(prefix.len() - ".json".len());
    for name in dir_names(&ctx.config.cdi_dir)? {
        let Some(id) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
        else {
            continue;
        };
        if orphan(id) {
            tracing::info!(spec = %name, "removing a transient spec no allocation names");
            remove_path(&spec_path(&ctx.config, id), false)?;
            removed += 1;
        }
    }
    for id in dir_names(&ctx.config.state_dir.join(contract::node::ALLOC_DIR))? {
        if orphan(&id) {
            tracing::info!(alloc = %id, "removing an allocation directory no allocation names");
            remove_path(&alloc_dir(&ctx.config, &id), true)?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn dir_names(dir: &Path) -> Result<Vec<String>, ReconcileError> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(ReconcileError::Io {
            path: dir.to_owned(),
            source,
        }),
    }
}

/// Counts (and logs) the GPU instances no record names.
fn count_foreign(ctx: &NodeContext) -> Result<usize, ReconcileError> {
    let driver = ctx.driver.as_ref();
    let snapshot = ctx.checkpoint.snapshot();
    let named: BTreeSet<(String, u32)> = snapshot
        .allocations
        .values()
        .flat_map(|r| &r.instances)
        .filter_map(|i| i.gpu_instance_id.map(|id| (i.gpu_uuid.clone(), id)))
        .collect();
    let gpus = driver.gpus().map_err(|e| ReconcileError::Driver {
        alloc_id: String::new(),
        what: "listing GPUs".to_owned(),
        gpu: "every GPU".to_owned(),
        source: e,
    })?;
    let mut foreign = 0;
    for gpu in gpus.iter().filter(|g| g.mig.is_some_and(|m| m.current)) {
        let Ok(gis) = driver.gpu_instances(gpu.index) else {
            continue;
        };
        for gi in gis
            .iter()
            .filter(|g| !named.contains(&(gpu.uuid.clone(), g.id)))
        {
            tracing::info!(gpu = %gpu.uuid, gi = gi.id, profile_id = gi.profile_id, placement = ?gi.placement, "foreign GPU instance (not Tessera's; never touched)");
            foreign += 1;
        }
    }
    Ok(foreign)
}

/// Sets the pod's `bind-phase: failed` and releases the node's bind lock if
/// the pod holds it (through [`crate::cluster`]).
async fn fail_pod(ctx: &NodeContext, pod: &PodState, uid: &str) -> Result<(), ReconcileError> {
    let cluster = Cluster::new(
        ctx.client.clone(),
        &ctx.config.namespace,
        &ctx.config.node_name,
    );
    let pod = PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: uid.to_owned(),
    };
    let api_err = |what: &str, e: crate::cluster::ClusterError| ReconcileError::Api {
        what: format!("{what} of {}", pod.key()),
        reason: e.to_string(),
    };
    cluster
        .set_bind_phase(&pod, contract::annotations::bind_phase::FAILED)
        .await
        .map_err(|e| api_err("set bind-phase failed", e))?;
    tracing::warn!(pod = %pod.key(), "bind-phase: failed (the plugin died during its Allocate)");
    cluster
        .release_lease(&pod)
        .await
        .map_err(|e| api_err("release the bind lock", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tessera_driver::fake::{FakeDriver, FakeGpu};
    use tessera_model::mig::Placement;

    use super::*;
    use crate::checkpoint::Store;
    use crate::config::{CdiMode, DeviceSettings, PluginConfig};

    const UID: &str = "0b3c5b0e-7d1a-4c55-9f0e-1a2b3c4d5e6f";

    struct Env {
        _dir: tempfile::TempDir,
        ctx: NodeContext,
        driver: Arc<FakeDriver>,
    }

    fn env(driver: FakeDriver) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_owned();
        let config = PluginConfig {
            node_name: "node-1".to_owned(),
            kubeconfig: None,
            driver_root: root.join("node"),
            host_driver_root: root.join("node"),
            nvml_lib: None,
            kubelet_dir: root.join("kubelet"),
            cdi_dir: root.join("cdi"),
            state_dir: root.join("state"),
            cdi_mode: CdiMode::CdiField,
            namespace: "kube-system".to_owned(),
            hook_path: PathBuf::from(contract::hook::BINARY_PATH),
            hook_config: None,
            vgpu_library: PathBuf::from(contract::vgpu::HOST_LIBRARY),
            metrics_listen: None,
            fail_on_init_error: false,
            devices: DeviceSettings::default(),
            resource_name: contract::resources::GPU.to_owned(),
        };
        std::fs::create_dir_all(&config.cdi_dir).expect("cdi dir");
        let checkpoint = Arc::new(Store::open(&config.state_dir).expect("checkpoint"));
        // Never dialled by the blocking parts these tests drive.
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        let driver = Arc::new(driver);
        let ctx = NodeContext {
            config,
            driver: driver.clone(),
            client,
            checkpoint,
        };
        Env {
            _dir: dir,
            ctx,
            driver,
        }
    }

    fn a100() -> FakeDriver {
        FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0))
    }

    fn gpu_uuid(driver: &FakeDriver) -> String {
        driver.gpus().expect("gpus")[0].uuid.clone()
    }

    fn record(id: &str, phase: Phase, instances: Vec<InstanceRecord>) -> AllocRecord {
        AllocRecord {
            alloc_id: id.to_owned(),
            pod_uid: UID.to_owned(),
            namespace: "default".to_owned(),
            pod: "p".to_owned(),
            container: "c".to_owned(),
            container_index: 0,
            phase,
            instances,
            device_ids: vec!["MIG-unit-0".to_owned()],
            created_unix: unix_now(),
        }
    }

    /// Creates GI + CI of profile 19 (1g.5gb) at `start` and returns its record.
    fn realized(driver: &FakeDriver, start: u32) -> InstanceRecord {
        let placement = Placement::new(start, 1).expect("placement");
        let gi = driver
            .create_gpu_instance(0, 19, placement)
            .expect("create GI");
        let ci = driver.create_compute_instance(0, gi.id).expect("create CI");
        InstanceRecord {
            gpu_uuid: gpu_uuid(driver),
            gpu_index: 0,
            profile_id: 19,
            profile: "1g.5gb".to_owned(),
            placement,
            gpu_instance_id: Some(gi.id),
            compute_instance_id: Some(ci.id),
            mig_uuid: None,
        }
    }

    /// Destroys what [`realized`] made (the CI, then the GI) behind the
    /// plugin's back; returns the GI id, free again for reuse.
    fn unrealize(driver: &FakeDriver, instance: &InstanceRecord) -> u32 {
        let gi = instance.gpu_instance_id.expect("gi");
        let ci = instance.compute_instance_id.expect("ci");
        driver
            .destroy_compute_instance(0, gi, ci)
            .expect("destroy ci");
        driver.destroy_gpu_instance(0, gi).expect("destroy gi");
        gi
    }

    fn put(ctx: &NodeContext, record: AllocRecord) {
        ctx.checkpoint
            .update(|c| c.allocations.insert(record.alloc_id.clone(), record))
            .expect("update");
    }

    /// A killed Allocate's record `id`: `Realizing`, the intent of `of`
    /// recorded without NVML's ids.
    fn put_intent(ctx: &NodeContext, id: &str, of: &InstanceRecord) {
        let intent = InstanceRecord {
            gpu_instance_id: None,
            compute_instance_id: None,
            ..of.clone()
        };
        put(ctx, record(id, Phase::Realizing, vec![intent]));
    }

    fn write_files(ctx: &NodeContext, id: &str) -> (PathBuf, PathBuf) {
        let spec = spec_path(&ctx.config, id);
        std::fs::write(&spec, "{}").expect("spec");
        let dir = alloc_dir(&ctx.config, id);
        std::fs::create_dir_all(dir.join(contract::node::ACCOUNTING_SUBDIR)).expect("dir");
        (spec, dir)
    }

    fn placements(driver: &FakeDriver) -> Vec<(u32, u32)> {
        driver
            .gpu_instances(0)
            .expect("gis")
            .iter()
            .map(|g| (g.placement.start, g.id))
            .collect()
    }

    fn witnesses(pods: Option<Vec<(&str, bool)>>) -> Witnesses {
        Witnesses {
            pods: pods.map(|pods| {
                pods.into_iter()
                    .map(|(uid, terminal)| {
                        (
                            uid.to_owned(),
                            PodState {
                                namespace: "default".to_owned(),
                                name: "p".to_owned(),
                                terminal,
                                bind_phase: None,
                            },
                        )
                    })
                    .collect()
            }),
            kubelet: KubeletView::Absent,
            bound: BTreeSet::new(),
        }
    }

    #[test]
    fn any_witness_keeps_an_allocation_and_an_unreadable_one_defers() {
        let id = format!("{UID}-0");
        let r = record(&id, Phase::Ready, Vec::new());
        assert_eq!(witnesses(Some(vec![])).verdict(&r), Verdict::Gone);
        assert_eq!(
            witnesses(Some(vec![(UID, true)])).verdict(&r),
            Verdict::Gone,
            "a terminal pod holds nothing"
        );
        assert!(matches!(
            witnesses(Some(vec![(UID, false)])).verdict(&r),
            Verdict::Held(_)
        ));
        assert_eq!(witnesses(None).verdict(&r), Verdict::Unknown);

        let mut w = witnesses(Some(vec![]));
        w.bound.insert(id.clone());
        assert!(matches!(w.verdict(&r), Verdict::Held(_)), "bound");

        let listed = |ids: &[&str]| KubeletPod {
            namespace: "default".to_owned(),
            name: "p".to_owned(),
            containers: BTreeMap::from([(
                "c".to_owned(),
                ids.iter().map(|s| (*s).to_owned()).collect(),
            )]),
        };
        let mut w = witnesses(Some(vec![]));
        w.kubelet = KubeletView::Listed(vec![listed(&["MIG-unit-0"])]);
        assert!(
            matches!(w.verdict(&r), Verdict::Held(_)),
            "kubelet lists it"
        );
        // The same name holding other devices: a re-created pod, not ours.
        w.kubelet = KubeletView::Listed(vec![listed(&["MIG-unit-7"])]);
        assert_eq!(w.verdict(&r), Verdict::Gone);
        w.kubelet = KubeletView::Failed;
        assert_eq!(w.verdict(&r), Verdict::Unknown);
    }

    #[test]
    fn a_record_lingers_only_while_a_container_outlives_its_pod_in_the_api() {
        let id = format!("{UID}-0");
        let r = record(&id, Phase::Ready, Vec::new());
        let bound = |mut w: Witnesses| {
            w.bound.insert(id.clone());
            w
        };
        assert!(bound(witnesses(Some(vec![]))).lingering(&r), "pod deleted");
        assert!(
            bound(witnesses(Some(vec![(UID, true)]))).lingering(&r),
            "pod ended"
        );
        assert!(
            !bound(witnesses(Some(vec![(UID, false)]))).lingering(&r),
            "its pod runs: nothing is about to end"
        );
        assert!(
            !bound(witnesses(None)).lingering(&r),
            "the API unread: nothing known"
        );
        assert!(
            !witnesses(Some(vec![])).lingering(&r),
            "nothing holds it: reclaimed, not lingering"
        );
        let mut w = witnesses(Some(vec![]));
        w.kubelet = KubeletView::Listed(vec![KubeletPod {
            namespace: "default".to_owned(),
            name: "p".to_owned(),
            containers: BTreeMap::from([("c".to_owned(), vec!["MIG-unit-0".to_owned()])]),
        }]);
        assert!(w.lingering(&r), "kubelet still lists it");
    }

    #[test]
    fn lingering_records_bring_the_next_check_near_but_only_for_a_while() {
        let t0 = std::time::Instant::now();
        let mut l = Lingering::default();
        assert!(!l.recheck(t0), "nothing lingers");
        l.track(&["a-0".to_owned()], t0);
        assert!(l.recheck(t0 + Duration::from_secs(1)));
        // Still lingering later: first seen at t0 all the same.
        l.track(&["a-0".to_owned()], t0 + Duration::from_secs(5));
        assert!(!l.recheck(t0 + LINGER_LIMIT), "bounded");
        // Another record starts lingering: checks come soon again.
        let t1 = t0 + LINGER_LIMIT;
        l.track(&["a-0".to_owned(), "b-0".to_owned()], t1);
        assert!(l.recheck(t1 + Duration::from_secs(1)));
        // Both gone (reclaimed): back to pod events and the resync.
        l.track(&[], t1 + Duration::from_secs(2));
        assert!(!l.recheck(t1 + Duration::from_secs(2)));
        assert!(LINGER_RECHECK <= Duration::from_millis(500));
    }

    #[tokio::test]
    async fn reclaim_destroys_ci_then_gi_and_files_but_never_a_hand_made_gi() {
        let e = env(a100());
        let ours = realized(&e.driver, 0);
        let hand_made = realized(&e.driver, 6);
        let id = format!("{UID}-0");
        put(&e.ctx, record(&id, Phase::Ready, vec![ours.clone()]));
        let (spec, dir) = write_files(&e.ctx, &id);
        e.driver.clear_calls();

        reclaim(&e.ctx, &id).await.expect("reclaim");

        let gi = ours.gpu_instance_id.expect("gi");
        let ci = ours.compute_instance_id.expect("ci");
        let destroys: Vec<String> = e
            .driver
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("destroy"))
            .collect();
        assert_eq!(
            destroys,
            [
                format!("destroy_compute_instance(0, {gi}, {ci})"),
                format!("destroy_gpu_instance(0, {gi})")
            ]
        );
        assert_eq!(
            placements(&e.driver),
            [(6, hand_made.gpu_instance_id.expect("gi"))]
        );
        assert!(!spec.exists() && !dir.exists());
        assert!(e.ctx.checkpoint.get(&id).is_none());
        // Idempotent: a second run finds nothing to do.
        reclaim(&e.ctx, &id).await.expect("again");
    }

    #[tokio::test]
    async fn a_reclaim_resumed_after_a_crash_skips_what_is_gone_and_spares_a_reused_id() {
        let e = env(a100());
        let first = realized(&e.driver, 0);
        let second = realized(&e.driver, 1);
        let id = format!("{UID}-0");
        put(
            &e.ctx,
            record(&id, Phase::Reclaiming, vec![first.clone(), second.clone()]),
        );
        // The killed reclaim destroyed the second instance; someone then made
        // a GI by hand that got the first one's id... at another placement.
        unrealize(&e.driver, &second);
        let first_gi = unrealize(&e.driver, &first);
        let hand_made = realized(&e.driver, 4);
        assert_eq!(
            hand_made.gpu_instance_id,
            Some(first_gi),
            "the id is reused"
        );

        reclaim(&e.ctx, &id).await.expect("reclaim");

        assert_eq!(
            placements(&e.driver),
            [(4, first_gi)],
            "the reused id is spared"
        );
        assert!(e.ctx.checkpoint.get(&id).is_none());
    }

    #[tokio::test]
    async fn the_sweep_adopts_undoes_half_made_allocations_and_counts_foreign_gis() {
        let e = env(a100());
        // A killed Allocate: the intent recorded, the GI and CI made, no ids.
        let made = realized(&e.driver, 2);
        let half = format!("{UID}-0");
        put_intent(&e.ctx, &half, &made);
        write_files(&e.ctx, &half);
        // A running pod's allocation, and a GI made by hand.
        let running_uid = "11111111-2222-4333-8444-555555555555";
        let kept_instance = realized(&e.driver, 0);
        let kept = format!("{running_uid}-0");
        put(
            &e.ctx,
            AllocRecord {
                pod_uid: running_uid.to_owned(),
                ..record(&kept, Phase::Ready, vec![kept_instance.clone()])
            },
        );
        let foreign = realized(&e.driver, 6);
        let mut w = witnesses(Some(vec![(running_uid, false)]));
        w.pods
            .as_mut()
            .expect("pods")
            .get_mut(running_uid)
            .expect("pod")
            .bind_phase = Some("success".to_owned());

        let (report, to_fail) = sweep_records(&e.ctx, &w).await.expect("sweep");

        assert_eq!(
            report,
            SweepReport {
                adopted: 1,
                reclaimed: 1,
                kept: 1,
                foreign: 1,
                files_removed: 0,
                pods_failed: 0,
            }
        );
        assert!(to_fail.is_empty(), "the half-made pod is not in the API");
        let left: Vec<u32> = placements(&e.driver).iter().map(|p| p.0).collect();
        assert_eq!(left, [0, 6], "the adopted GI is gone, the others stay");
        assert!(!spec_path(&e.ctx.config, &half).exists());
        assert!(e.ctx.checkpoint.get(&half).is_none());
        assert!(e.ctx.checkpoint.get(&kept).is_some());
        let _ = (foreign, kept_instance);
    }

    #[tokio::test]
    async fn the_sweep_fails_a_pod_still_allocating_and_never_adopts_a_named_gi() {
        let e = env(a100());
        // Two records want the placement at 0; only the first names the GI.
        let other_uid = "99999999-2222-4333-8444-555555555555";
        let named = realized(&e.driver, 0);
        put(
            &e.ctx,
            AllocRecord {
                pod_uid: other_uid.to_owned(),
                ..record(&format!("{other_uid}-0"), Phase::Ready, vec![named.clone()])
            },
        );
        let id = format!("{UID}-0");
        put_intent(&e.ctx, &id, &named);
        let mut w = witnesses(Some(vec![(UID, false), (other_uid, false)]));
        w.pods
            .as_mut()
            .expect("pods")
            .get_mut(UID)
            .expect("pod")
            .bind_phase = Some(contract::annotations::bind_phase::ALLOCATING.to_owned());

        let (report, to_fail) = sweep_records(&e.ctx, &w).await.expect("sweep");

        assert_eq!((report.adopted, report.reclaimed, report.kept), (0, 1, 1));
        assert_eq!(to_fail, [UID.to_owned()]);
        assert_eq!(placements(&e.driver).len(), 1, "the named GI stays");
        assert!(e.ctx.checkpoint.get(&id).is_none());
    }

    #[tokio::test]
    async fn a_ready_record_of_a_pod_still_allocating_is_undone_unless_a_container_ran() {
        for bound in [false, true] {
            let e = env(a100());
            let id = format!("{UID}-0");
            put(
                &e.ctx,
                record(&id, Phase::Ready, vec![realized(&e.driver, 0)]),
            );
            let mut w = witnesses(Some(vec![(UID, false)]));
            w.pods
                .as_mut()
                .expect("pods")
                .get_mut(UID)
                .expect("pod")
                .bind_phase = Some(contract::annotations::bind_phase::ALLOCATING.to_owned());
            if bound {
                w.bound.insert(id.clone());
            }

            let (report, to_fail) = sweep_records(&e.ctx, &w).await.expect("sweep");

            if bound {
                assert_eq!((report.reclaimed, report.kept), (0, 1));
                assert!(to_fail.is_empty());
                assert!(e.ctx.checkpoint.get(&id).is_some());
            } else {
                assert_eq!((report.reclaimed, report.kept), (1, 0));
                assert_eq!(to_fail, [UID.to_owned()]);
                assert!(placements(&e.driver).is_empty());
            }
        }
    }

    #[tokio::test]
    async fn the_sweep_removes_only_orphans_with_our_names() {
        let e = env(a100());
        let running_uid = "11111111-2222-4333-8444-555555555555";
        let orphan = format!("{UID}-0");
        let owned = format!("{running_uid}-1");
        for id in [&orphan, &owned] {
            write_files(&e.ctx, id);
        }
        let cdi = &e.ctx.config.cdi_dir;
        for other in [
            contract::cdi::STATIC_SPEC_FILE,
            "vendor.com-x.json",
            "tessera.io-alloc_BAD.json",
        ] {
            std::fs::write(cdi.join(other), "{}").expect("write");
        }
        let alloc = e.ctx.config.state_dir.join(contract::node::ALLOC_DIR);
        std::fs::create_dir_all(alloc.join("not.an.id")).expect("dir");

        let (report, _) = sweep_records(&e.ctx, &witnesses(Some(vec![(running_uid, false)])))
            .await
            .expect("sweep");

        assert_eq!(report.files_removed, 2);
        assert!(!spec_path(&e.ctx.config, &orphan).exists());
        assert!(!alloc_dir(&e.ctx.config, &orphan).exists());
        assert!(spec_path(&e.ctx.config, &owned).exists());
        assert!(alloc_dir(&e.ctx.config, &owned).exists());
        for other in [
            contract::cdi::STATIC_SPEC_FILE,
            "vendor.com-x.json",
            "tessera.io-alloc_BAD.json",
        ] {
            assert!(cdi.join(other).exists(), "{other} touched");
        }
        assert!(alloc.join("not.an.id").exists());

        // With the API unreadable nothing is removed.
        write_files(&e.ctx, &orphan);
        let (report, _) = sweep_records(&e.ctx, &witnesses(None))
            .await
            .expect("sweep");
        assert_eq!(report.files_removed, 0);
    }

    #[test]
    fn a_binding_keeps_its_allocation_only_while_its_process_lives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |id: &str, pid: u32| {
            let path = dir.path().join(contract::node::ALLOC_DIR).join(id);
            std::fs::create_dir_all(&path).expect("dir");
            let binding = BindingRecord {
                alloc_id: id.to_owned(),
                container_id: "c1".to_owned(),
                pid,
                cgroup: "/x".to_owned(),
                cgroups: BTreeMap::new(),
                bundle: "/b".to_owned(),
                mode: "cdi".to_owned(),
                bound_at: 1,
            };
            std::fs::write(
                path.join(contract::node::BINDING_FILE),
                serde_json::to_vec(&binding).expect("json"),
            )
            .expect("write");
        };
        write("a-0", std::process::id());
        write("b-0", u32::MAX - 1);
        std::fs::create_dir_all(dir.path().join(contract::node::ALLOC_DIR).join("c-0"))
            .expect("dir");
        assert_eq!(
            bound_allocations(dir.path()),
            BTreeSet::from(["a-0".to_owned()])
        );
    }
}
