//! Drives one [`PodState`] per pod of the node from the API server: the pod
//! watch feeds each pod's worker (a task), which syncs about every second,
//! writes `pods/status` when it changed, posts Events, and on deletion tears
//! the pod down and confirms it with the final delete.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{NodeContext, PodEvent, PodState, listed_containers};
use crate::devices::ActivePod;
use crate::runtime::{ContainerInfo, RuntimeError, SandboxInfo};

/// How often a pod is synced without news from the watch.
const SYNC_PERIOD: Duration = Duration::from_secs(1);

/// What the worker of a pod learns from the watch.
#[derive(Debug, Clone)]
pub enum PodUpdate {
    /// The pod as the API server has it now.
    Present(Arc<Pod>),
    /// The API server no longer has it.
    Gone,
}

/// What the runtime had for a pod when the kubelet started.
#[derive(Debug, Clone, Default)]
pub struct Adoptable {
    /// Its sandboxes.
    pub sandboxes: Vec<SandboxInfo>,
    /// Their containers.
    pub containers: Vec<ContainerInfo>,
}

/// The workers of the node's pods.
pub struct PodWorkers {
    ctx: Arc<NodeContext>,
    client: kube::Client,
    workers: Mutex<HashMap<String, watch::Sender<PodUpdate>>>,
    /// Pods that hold (or may hold) devices, by uid: not finished, not
    /// torn down (PodResources lists them).
    active: Mutex<BTreeMap<String, ActivePod>>,
    /// Whether the first full pod list arrived (before it, devices are not
    /// released: a pod not seen yet may hold some).
    synced: AtomicBool,
    adoptable: Mutex<HashMap<String, Adoptable>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodWorkers {
    /// Workers over `ctx`, with what the runtime already runs (`adoptable`,
    /// by pod uid).
    pub fn new(
        ctx: Arc<NodeContext>,
        client: kube::Client,
        adoptable: HashMap<String, Adoptable>,
    ) -> Arc<PodWorkers> {
        Arc::new(PodWorkers {
            ctx,
            client,
            workers: Mutex::default(),
            active: Mutex::default(),
            synced: AtomicBool::new(false),
            adoptable: Mutex::new(adoptable),
        })
    }

    /// A pod was added or changed: to its worker, started if new.
    pub fn update(self: &Arc<Self>, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let pod = Arc::new(pod);
        let mut workers = lock(&self.workers);
        if let Some(tx) = workers.get(&uid) {
            let _ = tx.send(PodUpdate::Present(pod));
            return;
        }
        let mut state = PodState::new(&pod);
        if let Some(found) = lock(&self.adoptable).remove(&uid) {
            tracing::info!(pod = %pod_name(&pod), containers = found.containers.len(), "adopting what the runtime runs for the pod");
            state.adopt(&found.sandboxes, &found.containers);
        }
        let active = ActivePod {
            pod: state.pod_ref(),
            containers: listed_containers(&pod),
        };
        let (tx, rx) = watch::channel(PodUpdate::Present(pod));
        workers.insert(uid.clone(), tx);
        lock(&self.active).insert(uid, active);
        // PodResources lists it from now on, devices or not.
        self.retain_devices();
        let this = Arc::clone(self);
        tokio::spawn(async move { this.run(state, rx).await });
    }

    /// The pod is gone from the API server.
    pub fn gone(&self, uid: &str) {
        if let Some(tx) = lock(&self.workers).get(uid) {
            let _ = tx.send(PodUpdate::Gone);
        }
    }

    /// The uids of the pods with a worker.
    pub fn uids(&self) -> BTreeSet<String> {
        lock(&self.workers).keys().cloned().collect()
    }

    /// The first full list of the node's pods arrived: every pod that
    /// holds devices is known now, so the others' devices can go, and
    /// sandboxes of pods that no longer exist are cleaned up.
    pub async fn synced(&self) {
        if !self.synced.swap(true, Ordering::SeqCst) {
            self.retain_devices();
            let orphans: Vec<(String, Adoptable)> = lock(&self.adoptable).drain().collect();
            for (uid, found) in orphans {
                self.remove_orphan(&uid, &found).await;
            }
        }
    }

    /// Stops and removes what the runtime runs for a pod the API server no
    /// longer has.
    pub async fn remove_orphan(&self, uid: &str, found: &Adoptable) {
        tracing::info!(%uid, sandboxes = found.sandboxes.len(), "removing the sandboxes of a pod that no longer exists");
        let rt = &self.ctx.runtime;
        for c in &found.containers {
            log_err("StopContainer", rt.stop_container(&c.id, 0).await);
            log_err("RemoveContainer", rt.remove_container(&c.id).await);
        }
        for s in &found.sandboxes {
            log_err("StopPodSandbox", rt.stop_sandbox(&s.id).await);
            log_err("RemovePodSandbox", rt.remove_sandbox(&s.id).await);
        }
    }

    /// Periodic resync: pods that had a worker `before` the API server
    /// listed the node's pods (`listed`) and are not in the list are gone
    /// (a pod that arrived after the list is left alone); sandboxes in the
    /// runtime of pods without a worker are removed.
    pub async fn resync(&self, before: &BTreeSet<String>, listed: &BTreeSet<String>) {
        if !self.synced.load(Ordering::SeqCst) {
            return;
        }
        for uid in before.difference(listed) {
            self.gone(uid);
        }
        let (sandboxes, containers) = match (
            self.ctx.runtime.list_sandboxes().await,
            self.ctx.runtime.list_containers().await,
        ) {
            (Ok(s), Ok(c)) => (s, c),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "resync: listing the runtime's pods");
                return;
            }
        };
        let workers = self.uids();
        let mut orphans: HashMap<String, Adoptable> = HashMap::new();
        // Only this node's: another stand-in kubelet may share the runtime.
        let node = &self.ctx.node_name;
        for s in sandboxes
            .into_iter()
            .filter(|s| &s.node == node && !workers.contains(&s.pod_uid))
        {
            orphans
                .entry(s.pod_uid.clone())
                .or_default()
                .sandboxes
                .push(s);
        }
        for c in containers.into_iter().filter(|c| &c.node == node) {
            if let Some(o) = orphans.get_mut(&c.pod_uid) {
                o.containers.push(c);
            }
        }
        for (uid, found) in orphans {
            // A worker may have started for it since the listing.
            if !self.uids().contains(&uid) {
                self.remove_orphan(&uid, &found).await;
            }
        }
    }

    fn retain_devices(&self) {
        if self.synced.load(Ordering::SeqCst) {
            let active: Vec<ActivePod> = lock(&self.active).values().cloned().collect();
            self.ctx.devices.set_active_pods(&active);
        }
    }

    /// The pod no longer holds devices or resources (finished or torn down).
    fn release(&self, uid: &str) {
        self.ctx.node_resources.release(uid);
        if lock(&self.active).remove(uid).is_some() {
            self.retain_devices();
        }
    }

    async fn run(self: Arc<Self>, mut state: PodState, mut rx: watch::Receiver<PodUpdate>) {
        let uid = state.uid().to_owned();
        let mut written: Option<Value> = None;
        let mut torn_down = false;
        loop {
            let update = rx.borrow_and_update().clone();
            let done = match update {
                PodUpdate::Present(pod) if pod.metadata.deletion_timestamp.is_some() => {
                    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
                    if !torn_down {
                        torn_down = self.tear_down(&mut state, grace).await;
                    }
                    torn_down && self.confirm_deletion(&pod).await
                }
                PodUpdate::Present(pod) => {
                    let status = state.sync(&self.ctx, &pod).await;
                    self.post_events(&pod, state.take_events()).await;
                    if state.is_terminal() {
                        self.release(&uid);
                    }
                    let value = serde_json::to_value(&status).unwrap_or(Value::Null);
                    if written.as_ref() != Some(&value) && self.write_status(&pod, &value).await {
                        written = Some(value);
                    }
                    false
                }
                PodUpdate::Gone => {
                    if !torn_down {
                        torn_down = self.tear_down(&mut state, 0).await;
                    }
                    torn_down
                }
            };
            if done {
                break;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep(SYNC_PERIOD) => {}
            }
        }
        lock(&self.workers).remove(&uid);
        self.release(&uid);
    }

    async fn tear_down(&self, state: &mut PodState, grace: i64) -> bool {
        let (ns, name) = state.name();
        let (ns, name) = (ns.to_owned(), name.to_owned());
        match state.tear_down(&self.ctx, grace).await {
            Ok(()) => {
                tracing::info!(pod = %format!("{ns}/{name}"), "pod's containers and sandbox removed");
                self.release(state.uid());
                true
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "tearing the pod down; retrying");
                false
            }
        }
    }

    /// The final delete (grace 0, this pod's uid) that removes the pod from
    /// the API server; true when it is gone.
    async fn confirm_deletion(&self, pod: &Pod) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace(pod));
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &params).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
            Err(e) => {
                tracing::warn!(pod = %pod_name(pod), error = %e, "final delete of the pod; retrying");
                false
            }
        }
    }

    async fn write_status(&self, pod: &Pod, status: &Value) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace(pod));
        let name = pod.metadata.name.clone().unwrap_or_default();
        let patch = json!({"status": status});
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                tracing::warn!(pod = %pod_name(pod), error = %e, "writing the pod status; retrying");
                false
            }
        }
    }

    async fn post_events(&self, pod: &Pod, events: Vec<PodEvent>) {
        for e in events {
            if e.kind == "Warning" {
                tracing::warn!(pod = %pod_name(pod), reason = %e.reason, "{}", e.message);
            } else {
                tracing::info!(pod = %pod_name(pod), reason = %e.reason, "{}", e.message);
            }
            let event = pod_event(pod, &self.ctx.node_name, &e);
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace(pod));
            if let Err(err) = api.create(&PostParams::default(), &event).await {
                tracing::warn!(pod = %pod_name(pod), error = %err, "posting an Event");
            }
        }
    }
}

fn log_err(call: &str, result: Result<(), RuntimeError>) {
    match result {
        Ok(()) | Err(RuntimeError::NotFound { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "{call}"),
    }
}

fn namespace(pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned())
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        namespace(pod),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A core/v1 Event about `pod` from this node's kubelet.
pub fn pod_event(pod: &Pod, node: &str, e: &PodEvent) -> Event {
    let now = Timestamp::now();
    let name = pod.metadata.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace(pod)),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(name),
            namespace: Some(namespace(pod)),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(e.reason.clone()),
        message: Some(e.message.clone()),
        type_: Some(e.kind.to_owned()),
        source: Some(EventSource {
            component: Some("kubelet".to_owned()),
            host: Some(node.to_owned()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some("kubelet".to_owned()),
        reporting_instance: Some(node.to_owned()),
        ..Event::default()
    }
}
