//! The scheduling loop: watch pods and nodes through kube-rs, take pending
//! pods one at a time from the queue, filter, score, bind, and report
//! failures as kube-scheduler does (a FailedScheduling Event and the pod's
//! `PodScheduled=False` condition).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::Instant;

use crate::algorithm::{self, NodeInfo, NodeStatus, PodUsage};
use crate::config::{DEFAULT_SCHEDULER_NAME, SchedulerConfig};
use crate::events::Recorder;
use crate::extender::Extender;
use crate::queue::SchedulingQueue;
use crate::resources;
use crate::wire::MAX_EXTENDER_PRIORITY;

/// How long a pod counts as bound on the node chosen before the watch shows
/// it bound; past that it is forgotten and scheduled again.
const ASSUME_TTL: Duration = Duration::from_secs(30);

/// What stops the loop.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// A watch stream ended (kube-rs watchers retry forever, so this is a bug).
    #[error("the {0} watch ended")]
    WatchEnded(&'static str),
}

/// The reason of the `PodScheduled=False` condition of a gated pod.
pub const REASON_SCHEDULING_GATED: &str = "SchedulingGated";
/// Its message (as the API server writes it when it creates such a pod).
pub const MESSAGE_SCHEDULING_GATED: &str =
    "Scheduling is blocked due to non-empty scheduling gates";

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// No node fits (reason `Unschedulable`); `by_filters` when the
    /// scheduler's own filters rejected a node (the pod is then parked until
    /// the cluster changes, else it backs off).
    Unschedulable { message: String, by_filters: bool },
    /// Something broke: an extender, the binding (reason `SchedulerError`).
    Error(String),
}

struct Assumed {
    node: String,
    pod: Pod,
    since: Instant,
}

/// The stand-in scheduler's state.
pub struct Scheduler {
    client: kube::Client,
    config: SchedulerConfig,
    extenders: Vec<Extender>,
    ignored: BTreeSet<String>,
    pods: HashMap<String, Pod>,
    /// What each pod in `pods` takes, parsed once.
    usage: HashMap<String, PodUsage>,
    nodes: BTreeMap<String, Node>,
    node_fingerprints: HashMap<String, String>,
    pod_buffer: Option<HashMap<String, Pod>>,
    node_buffer: Option<BTreeMap<String, Node>>,
    pods_synced: bool,
    nodes_synced: bool,
    assumed: HashMap<String, Assumed>,
    /// Gated pods whose PodScheduled condition does not say so yet.
    gated_unmarked: BTreeSet<String>,
    queue: SchedulingQueue,
    recorders: HashMap<String, Recorder>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_else(|| {
        // Only a broken API server leaves out the uid; key such a pod by name.
        format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        )
    })
}

fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

fn scheduler_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_SCHEDULER_NAME)
}

/// Whether the pod waits for its `spec.schedulingGates` to be removed.
fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// What about a pod, beyond its status, can make it fit where it did not
/// (kube-scheduler retries an unschedulable pod when it is updated).
fn pod_fingerprint(pod: &Pod) -> String {
    serde_json::json!({
        "labels": pod.metadata.labels,
        "annotations": pod.metadata.annotations,
        "spec": pod.spec,
    })
    .to_string()
}

/// The strategic merge patch of `pods/status` that sets `PodScheduled=False`
/// with the reason and message, touching no other condition (the list is
/// merged by type); `None` when the pod already says so.
pub fn pod_scheduled_false_patch(
    pod: &Pod,
    reason: &str,
    message: &str,
    now: Time,
) -> Option<serde_json::Value> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    if current.is_some_and(|c| {
        c.status == "False"
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(message)
    }) {
        return None;
    }
    let mut condition = serde_json::json!({
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
    });
    if current.is_none_or(|c| c.status != "False") {
        condition["lastTransitionTime"] = serde_json::json!(now);
    }
    Some(serde_json::json!({"status": {"conditions": [condition]}}))
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// What about a node can make a pod fit where it did not.
fn node_fingerprint(node: &Node) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    serde_json::json!({
        "labels": node.metadata.labels,
        "spec": node.spec,
        "allocatable": node.status.as_ref().and_then(|s| s.allocatable.as_ref()),
        "ready": ready,
    })
    .to_string()
}

impl Scheduler {
    /// A scheduler over a client and a configuration.
    pub fn new(client: kube::Client, config: SchedulerConfig) -> Scheduler {
        let extenders = config
            .extenders
            .iter()
            .cloned()
            .map(Extender::new)
            .collect();
        let ignored = config.ignored_resources();
        let queue = SchedulingQueue::new(config.pod_initial_backoff, config.pod_max_backoff);
        Scheduler {
            client,
            config,
            extenders,
            ignored,
            pods: HashMap::new(),
            usage: HashMap::new(),
            nodes: BTreeMap::new(),
            node_fingerprints: HashMap::new(),
            pod_buffer: None,
            node_buffer: None,
            pods_synced: false,
            nodes_synced: false,
            assumed: HashMap::new(),
            gated_unmarked: BTreeSet::new(),
            queue,
            recorders: HashMap::new(),
        }
    }

    fn is_ours_and_pending(&self, pod: &Pod) -> bool {
        self.config
            .scheduler_names
            .iter()
            .any(|n| n == scheduler_name(pod))
            && bound_node(pod).is_none()
            && pod.metadata.deletion_timestamp.is_none()
            && !algorithm::is_terminal(pod)
    }

    /// Queues or unqueues a pod after a change.
    fn consider(&mut self, pod: &Pod) {
        let uid = uid_of(pod);
        if bound_node(pod).is_some() {
            // The watch confirms a binding: the cache counts it from now on.
            self.assumed.remove(&uid);
        }
        let gated = self.is_ours_and_pending(pod) && is_gated(pod);
        if gated
            && pod_scheduled_false_patch(
                pod,
                REASON_SCHEDULING_GATED,
                MESSAGE_SCHEDULING_GATED,
                Time(Timestamp::now()),
            )
            .is_some()
        {
            self.gated_unmarked.insert(uid.clone());
        } else {
            self.gated_unmarked.remove(&uid);
        }
        if self.is_ours_and_pending(pod) && !gated && !self.assumed.contains_key(&uid) {
            let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
            let created = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(0);
            self.queue.add(&uid, priority, created);
        } else {
            self.queue.remove(&uid);
        }
    }

    fn on_pod_event(&mut self, event: Result<watcher::Event<Pod>, watcher::Error>) {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("pod watch: {e}");
                return;
            }
        };
        match event {
            watcher::Event::Init => self.pod_buffer = Some(HashMap::new()),
            watcher::Event::InitApply(pod) => {
                self.pod_buffer
                    .get_or_insert_with(HashMap::new)
                    .insert(uid_of(&pod), pod);
            }
            watcher::Event::InitDone => {
                self.pods = self.pod_buffer.take().unwrap_or_default();
                self.usage = self
                    .pods
                    .iter()
                    .map(|(uid, pod)| (uid.clone(), PodUsage::of(pod)))
                    .collect();
                self.pods_synced = true;
                let pods: Vec<Pod> = self.pods.values().cloned().collect();
                for pod in &pods {
                    self.consider(pod);
                }
                let known: Vec<String> = self.queue.uids();
                for uid in known {
                    if !self.pods.contains_key(&uid) {
                        self.queue.remove(&uid);
                    }
                }
                let pods = &self.pods;
                self.assumed.retain(|uid, _| pods.contains_key(uid));
                self.queue.move_all_to_active();
                tracing::debug!(pods = self.pods.len(), "pods listed");
            }
            watcher::Event::Apply(pod) => {
                let uid = uid_of(&pod);
                let was_running = self
                    .pods
                    .get(&uid)
                    .is_some_and(|old| !algorithm::is_terminal(old));
                let finished = was_running && algorithm::is_terminal(&pod);
                let updated = self
                    .pods
                    .get(&uid)
                    .is_some_and(|old| pod_fingerprint(old) != pod_fingerprint(&pod));
                self.consider(&pod);
                if updated {
                    self.queue.move_to_active(&uid);
                }
                self.usage.insert(uid.clone(), PodUsage::of(&pod));
                self.pods.insert(uid, pod);
                if finished {
                    self.queue.move_all_to_active();
                }
            }
            watcher::Event::Delete(pod) => {
                let uid = uid_of(&pod);
                self.pods.remove(&uid);
                self.usage.remove(&uid);
                self.queue.remove(&uid);
                self.assumed.remove(&uid);
                self.gated_unmarked.remove(&uid);
                for r in self.recorders.values_mut() {
                    r.forget(&uid);
                }
                self.queue.move_all_to_active();
            }
        }
    }

    fn on_node_event(&mut self, event: Result<watcher::Event<Node>, watcher::Error>) {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("node watch: {e}");
                return;
            }
        };
        match event {
            watcher::Event::Init => self.node_buffer = Some(BTreeMap::new()),
            watcher::Event::InitApply(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                self.node_buffer
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, node);
            }
            watcher::Event::InitDone => {
                self.nodes = self.node_buffer.take().unwrap_or_default();
                self.node_fingerprints = self
                    .nodes
                    .iter()
                    .map(|(n, node)| (n.clone(), node_fingerprint(node)))
                    .collect();
                self.nodes_synced = true;
                self.queue.move_all_to_active();
                tracing::debug!(nodes = self.nodes.len(), "nodes listed");
            }
            watcher::Event::Apply(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                let print = node_fingerprint(&node);
                if self.node_fingerprints.get(&name) != Some(&print) {
                    self.node_fingerprints.insert(name.clone(), print);
                    self.queue.move_all_to_active();
                }
                self.nodes.insert(name, node);
            }
            watcher::Event::Delete(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                self.nodes.remove(&name);
                self.node_fingerprints.remove(&name);
            }
        }
    }

    /// Runs until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), LoopError> {
        let pods = watcher(
            Api::<Pod>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff();
        let nodes = watcher(
            Api::<Node>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff();
        tracing::info!(
            profiles = ?self.config.scheduler_names,
            extenders = self.extenders.len(),
            "scheduler started"
        );
        tokio::select! {
            r = self.schedule_loop(pods, nodes) => r,
            () = shutdown => {
                tracing::info!("scheduler stopping");
                Ok(())
            }
        }
    }

    async fn schedule_loop(
        &mut self,
        pods: impl Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
        nodes: impl Stream<Item = Result<watcher::Event<Node>, watcher::Error>>,
    ) -> Result<(), LoopError> {
        let mut pods = std::pin::pin!(pods);
        let mut nodes = std::pin::pin!(nodes);
        loop {
            // Take in every change already there before choosing a pod.
            loop {
                let mut progressed = false;
                if let Some(next) = pods.next().now_or_never() {
                    self.on_pod_event(next.ok_or(LoopError::WatchEnded("pod"))?);
                    progressed = true;
                }
                if let Some(next) = nodes.next().now_or_never() {
                    self.on_node_event(next.ok_or(LoopError::WatchEnded("node"))?);
                    progressed = true;
                }
                if !progressed {
                    break;
                }
            }
            let now = Instant::now();
            if self.pods_synced && self.nodes_synced {
                self.mark_gated().await;
                self.expire_assumed(now);
                self.queue.flush_backoff(now);
                if let Some(uid) = self.queue.pop() {
                    self.schedule_one(&uid).await;
                    continue;
                }
            }
            let assumed_end = self.assumed.values().map(|a| a.since + ASSUME_TTL).min();
            let wake = [self.queue.next_backoff_end(), assumed_end]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now + Duration::from_secs(3600));
            tokio::select! {
                next = pods.next() => self.on_pod_event(next.ok_or(LoopError::WatchEnded("pod"))?),
                next = nodes.next() => self.on_node_event(next.ok_or(LoopError::WatchEnded("node"))?),
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Gives gated pods the `PodScheduled=False` condition the API server
    /// gives them on creation (reason SchedulingGated), where it is missing
    /// (a stand-in API server does not set it).
    async fn mark_gated(&mut self) {
        for uid in std::mem::take(&mut self.gated_unmarked) {
            if let Some(pod) = self.pods.get(&uid).cloned()
                && self.is_ours_and_pending(&pod)
                && is_gated(&pod)
            {
                tracing::info!(pod = %pod_ref(&pod), "not scheduled: scheduling gates");
                self.set_pod_scheduled_false(
                    &pod,
                    REASON_SCHEDULING_GATED,
                    MESSAGE_SCHEDULING_GATED,
                )
                .await;
            }
        }
    }

    fn expire_assumed(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .assumed
            .iter()
            .filter(|(_, a)| a.since + ASSUME_TTL <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in expired {
            if let Some(a) = self.assumed.remove(&uid) {
                tracing::warn!(
                    pod = %pod_ref(&a.pod),
                    node = %a.node,
                    "binding not seen within {ASSUME_TTL:?}; scheduling the pod again"
                );
            }
            if let Some(pod) = self.pods.get(&uid).cloned() {
                self.consider(&pod);
            }
        }
    }

    /// The nodes with what their pods (bound, or assumed bound) take.
    fn node_infos(&self) -> BTreeMap<String, NodeInfo> {
        let mut infos: BTreeMap<String, NodeInfo> = self
            .nodes
            .iter()
            .map(|(n, node)| (n.clone(), NodeInfo::new(node.clone())))
            .collect();
        for (uid, pod) in &self.pods {
            if let Some(node) = bound_node(pod)
                && !algorithm::is_terminal(pod)
                && let Some(info) = infos.get_mut(node)
            {
                match self.usage.get(uid) {
                    Some(usage) => info.add_usage(usage),
                    None => info.add_pod(pod),
                }
            }
        }
        for (uid, a) in &self.assumed {
            let seen_bound = self.pods.get(uid).is_some_and(|p| bound_node(p).is_some());
            if !seen_bound && let Some(info) = infos.get_mut(&a.node) {
                info.add_pod(&a.pod);
            }
        }
        infos
    }

    async fn schedule_one(&mut self, uid: &str) {
        let Some(pod) = self.pods.get(uid).cloned() else {
            self.queue.remove(uid);
            return;
        };
        if !self.is_ours_and_pending(&pod) {
            self.queue.remove(uid);
            return;
        }
        let profile = scheduler_name(&pod).to_owned();
        match self.attempt(&pod).await {
            Ok(node) => {
                self.queue.done(uid);
                let mut bound = pod.clone();
                if let Some(spec) = bound.spec.as_mut() {
                    spec.node_name = Some(node.clone());
                }
                self.assumed.insert(
                    uid.to_owned(),
                    Assumed {
                        node: node.clone(),
                        pod: bound,
                        since: Instant::now(),
                    },
                );
                tracing::info!(pod = %pod_ref(&pod), %node, "scheduled");
                let message = format!("Successfully assigned {} to {node}", pod_ref(&pod));
                self.recorder(&profile)
                    .record(&pod, "Normal", "Scheduled", "Binding", &message)
                    .await;
            }
            Err(failure) => {
                let (reason, message) = match failure {
                    Failure::Unschedulable {
                        message,
                        by_filters: true,
                    } => {
                        self.queue.unschedulable(uid, Instant::now());
                        ("Unschedulable", message)
                    }
                    Failure::Unschedulable { message, .. } => {
                        self.queue.failed(uid, Instant::now());
                        ("Unschedulable", message)
                    }
                    Failure::Error(m) => {
                        self.queue.failed(uid, Instant::now());
                        ("SchedulerError", m)
                    }
                };
                tracing::info!(pod = %pod_ref(&pod), reason, "not scheduled: {message}");
                self.recorder(&profile)
                    .record(&pod, "Warning", "FailedScheduling", "Scheduling", &message)
                    .await;
                self.set_pod_scheduled_false(&pod, reason, &message).await;
            }
        }
    }

    fn recorder(&mut self, profile: &str) -> &mut Recorder {
        let client = self.client.clone();
        self.recorders
            .entry(profile.to_owned())
            .or_insert_with(|| Recorder::new(client, profile))
    }

    /// Sets `PodScheduled=False` with the reason and message, as
    /// kube-scheduler does after each failed attempt (left alone when it
    /// already says so), patching that condition only.
    async fn set_pod_scheduled_false(&self, pod: &Pod, reason: &str, message: &str) {
        let Some(patch) = pod_scheduled_false_patch(pod, reason, message, Time(Timestamp::now()))
        else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = pod.metadata.name.as_deref().unwrap_or("");
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            tracing::warn!(pod = %pod_ref(pod), "setting PodScheduled: {e}");
        }
    }

    /// One scheduling attempt: the chosen node, bound.
    async fn attempt(&self, pod: &Pod) -> Result<String, Failure> {
        let infos = self.node_infos();
        if infos.is_empty() {
            return Err(Failure::Unschedulable {
                message: algorithm::NO_NODES_AVAILABLE.to_owned(),
                by_filters: false,
            });
        }
        let requests = resources::pod_requests(pod);
        let mut statuses: BTreeMap<String, NodeStatus> = BTreeMap::new();
        let mut feasible: Vec<&NodeInfo> = Vec::new();
        for (name, info) in &infos {
            match algorithm::filter_node(pod, &requests, info, &self.ignored) {
                None => feasible.push(info),
                Some(status) => {
                    statuses.insert(name.clone(), status);
                }
            }
        }
        let by_filters = !statuses.is_empty();
        let interested: Vec<&Extender> = self
            .config
            .interested_extenders(pod)
            .map(|(i, _)| &self.extenders[i])
            .collect();
        for ext in &interested {
            if feasible.is_empty() {
                break;
            }
            let nodes: Vec<Node> = feasible.iter().map(|i| i.node.clone()).collect();
            let outcome = match ext.filter(pod, &nodes).await {
                Ok(o) => o,
                Err(e) if ext.config.ignorable => {
                    tracing::warn!(extender = %ext.config.url_prefix, pod = %pod_ref(pod), "skipping ignorable extender: {e}");
                    continue;
                }
                Err(e) => return Err(Failure::Error(e.to_string())),
            };
            for (node, reason) in &outcome.failed_and_unresolvable {
                let status = statuses.entry(node.clone()).or_default();
                status.reasons.push(reason.clone());
                status.unresolvable = true;
            }
            for (node, reason) in &outcome.failed {
                if outcome.failed_and_unresolvable.contains_key(node) {
                    continue;
                }
                statuses
                    .entry(node.clone())
                    .or_default()
                    .reasons
                    .push(reason.clone());
            }
            let mut seen = BTreeSet::new();
            feasible = outcome
                .passed
                .iter()
                .filter(|n| seen.insert((*n).clone()))
                .filter_map(|n| infos.get(n))
                .collect();
        }
        if feasible.is_empty() {
            return Err(Failure::Unschedulable {
                message: algorithm::fit_error_message(pod, infos.len(), &statuses),
                by_filters,
            });
        }
        let host = if feasible.len() == 1 {
            feasible[0].name().to_owned()
        } else {
            self.choose(pod, &feasible, &interested).await
        };
        self.bind(pod, &host, &interested).await?;
        Ok(host)
    }

    /// Scores the feasible nodes: the stand-in's own least-allocated score
    /// plus each interested extender's score × weight × 10.
    async fn choose(&self, pod: &Pod, feasible: &[&NodeInfo], interested: &[&Extender]) -> String {
        let mut totals: BTreeMap<String, i64> = feasible
            .iter()
            .map(|i| {
                (
                    i.name().to_owned(),
                    algorithm::least_allocated_score(pod, i),
                )
            })
            .collect();
        let nodes: Vec<Node> = feasible.iter().map(|i| i.node.clone()).collect();
        let mut extender_scores: BTreeMap<String, i64> = BTreeMap::new();
        for ext in interested {
            match ext.prioritize(pod, &nodes).await {
                Ok(None) => {}
                Ok(Some(list)) => {
                    for hp in list {
                        if !totals.contains_key(&hp.host) {
                            tracing::warn!(extender = %ext.config.url_prefix, host = %hp.host, "prioritize scored a node it was not sent; ignored");
                            continue;
                        }
                        if !(0..=MAX_EXTENDER_PRIORITY).contains(&hp.score) {
                            tracing::warn!(extender = %ext.config.url_prefix, host = %hp.host, score = hp.score, "prioritize score outside 0-10");
                        }
                        *extender_scores.entry(hp.host).or_insert(0) +=
                            hp.score.saturating_mul(ext.config.weight);
                    }
                }
                // kube-scheduler ignores prioritize errors, ignorable or not.
                Err(e) => {
                    tracing::warn!(extender = %ext.config.url_prefix, pod = %pod_ref(pod), "prioritize failed, no score from it: {e}");
                }
            }
        }
        for (host, score) in extender_scores {
            if let Some(t) = totals.get_mut(&host) {
                *t = t.saturating_add(
                    score.saturating_mul(algorithm::MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY),
                );
            }
        }
        tracing::debug!(pod = %pod_ref(pod), scores = ?totals, "scores");
        algorithm::select_host(&totals).unwrap_or_else(|| feasible[0].name().to_owned())
    }

    /// Binds through the first interested extender with a bindVerb, else
    /// with a Binding through the API.
    async fn bind(&self, pod: &Pod, node: &str, interested: &[&Extender]) -> Result<(), Failure> {
        for ext in interested.iter().filter(|e| e.config.is_binder()) {
            match ext.bind(pod, node).await {
                Ok(()) => return Ok(()),
                Err(e) if ext.config.ignorable => {
                    tracing::warn!(extender = %ext.config.url_prefix, pod = %pod_ref(pod), "ignorable extender failed to bind: {e}");
                }
                Err(e) => return Err(Failure::Error(format!("binding rejected: {e}"))),
            }
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_owned()),
                ..Default::default()
            },
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.create_subresource::<Binding, serde_json::Value>(
            "binding",
            name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
        .map_err(|e| Failure::Error(format!("binding rejected: {}", kube_error(&e))))
    }
}

/// A kube error as the API server's message when there is one.
fn kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn condition(type_: &str, status: &str, reason: &str) -> PodCondition {
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(format!("{reason} message")),
            ..Default::default()
        }
    }

    #[test]
    fn the_pod_scheduled_patch_touches_that_condition_only() {
        let now = Time(Timestamp::from_second(1_700_000_000).expect("time"));
        let mut pod = Pod {
            status: Some(PodStatus {
                conditions: Some(vec![condition("example.com/Gate", "True", "Ready")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let patch = pod_scheduled_false_patch(&pod, "Unschedulable", "0/1 nodes", now.clone())
            .expect("a patch");
        assert_eq!(
            patch,
            serde_json::json!({"status": {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/1 nodes", "lastTransitionTime": "2023-11-14T22:13:20Z",
            }]}}),
            "other conditions are left to the server's merge by type"
        );
        // Already False: a new message keeps the transition time.
        pod.status.as_mut().expect("status").conditions =
            Some(vec![condition("PodScheduled", "False", "Unschedulable")]);
        let patch = pod_scheduled_false_patch(&pod, "Unschedulable", "other", now.clone())
            .expect("a patch");
        assert!(
            patch["status"]["conditions"][0]
                .get("lastTransitionTime")
                .is_none()
        );
        // Already saying so: no patch.
        assert_eq!(
            pod_scheduled_false_patch(&pod, "Unschedulable", "Unschedulable message", now),
            None
        );
    }

    #[test]
    fn gated_pods_and_updates() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "resourceVersion": "1"},
            "spec": {"containers": [], "schedulingGates": [{"name": "example.com/wait"}]},
        }))
        .expect("pod");
        assert!(is_gated(&pod));
        let before = pod_fingerprint(&pod);
        pod.metadata.resource_version = Some("2".into());
        pod.status = Some(PodStatus {
            conditions: Some(vec![condition("PodScheduled", "False", "SchedulingGated")]),
            ..Default::default()
        });
        assert_eq!(
            pod_fingerprint(&pod),
            before,
            "status changes are no update"
        );
        pod.spec.as_mut().expect("spec").scheduling_gates = Some(Vec::new());
        assert!(!is_gated(&pod));
        assert_ne!(pod_fingerprint(&pod), before);
    }
}
