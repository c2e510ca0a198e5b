//! The three extender verbs.
//!
//! - filter: per candidate node, the fit or its reason. Reasons preemption
//!   cannot cure (a node the extender does not know, [`UNKNOWN_NODE`]; a
//!   missing or unreadable inventory; an ask the node could not take even
//!   empty, such as no allowed MIG profile on its model) go in
//!   `FailedAndUnresolvableNodes`; capacity shortfalls in `FailedNodes`. A
//!   pod asking for no GPU passes every node untouched; a pod whose ask
//!   cannot be read fails every node, unresolvably. Until the reflectors
//!   have synced, a GPU pod's filter answers `Error`, so kube-scheduler
//!   retries rather than reading every node as unknown. The reply names
//!   nodes in the form the request used (names or objects).
//! - prioritize: the fit's score 0..=10 per node, 0 where it does not fit.
//! - bind: refuse while another bind of the same pod runs (in this replica,
//!   or anywhere: the pod carries an allocation whose node's lock is held
//!   under this pod's holder string); take the node's bind lock
//!   ([`crate::lock`]); re-read the pod and the node's pods fresh from the
//!   API; re-check the fit; renew the lock by compare-and-swap (fencing any
//!   takeover); write `tessera.io/allocation`, `bind-phase: allocating` and
//!   `bind-time` on the pod, conditional on the pod's resourceVersion;
//!   confirm the lock is still as renewed; create the Binding. A failure
//!   known to have left the pod unbound removes those annotations (only
//!   from the unbound pod at the version read) and releases the lock; a
//!   failure that leaves it unknown whether the Binding was made keeps the
//!   reservation and the lock and re-checks later. On success the lock stays
//!   held until the device plugin moves the pod out of `allocating`.
//!   Binds to different nodes run in parallel.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Binding, Container, Node, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_model::contract::annotations;
use tessera_model::sched::allocation::Allocation;
use tessera_model::sched::config::ClusterConfig;
use tessera_model::sched::fit::{self, NodeFit, NodeView};
use tessera_model::sched::request::{ContainerResources, PodRequest};

use crate::lock::{
    API_TIMEOUT, BIND_GRACE, BindLocks, HeldLock, LeaseState, TimedError, api_code, holder_of,
    timed,
};
use crate::metrics::Metrics;
use crate::state::{
    ClusterState, Holdings, HoldingsView, NodeData, Reservation, UNKNOWN_NODE, parse_inventory,
};
use crate::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    NodeForm, NodeList,
};

/// The filter's `Error` while the reflectors have not listed yet.
pub const NOT_SYNCED: &str = "the extender has not synced nodes and pods yet; retry";

/// The longest a bind may take from renewing its lock to its annotation
/// write returning: well inside [`BIND_GRACE`], so no other replica can
/// have judged the lock stale before the annotations landed.
pub const FENCE: Duration = Duration::from_secs(BIND_GRACE.as_secs() / 3 * 2);

/// How long after a bind whose outcome is unknown (the Binding's reply and
/// the confirming read both failed) the extender looks again.
pub const UNKNOWN_RECHECK: Duration = API_TIMEOUT;

/// The extender: state, locks, an API client and metrics.
#[derive(Clone)]
pub struct Extender {
    /// The cluster state.
    pub state: Arc<ClusterState>,
    /// The bind locks.
    pub locks: BindLocks,
    /// For fresh reads and writes at bind.
    pub client: kube::Client,
    /// Verb metrics.
    pub metrics: Metrics,
    /// Uids of the pods this replica is binding now.
    binding: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for Extender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extender")
            .field("state", &self.state)
            .finish()
    }
}

/// A pod's containers as the request reader takes them.
fn container_resources(containers: &[Container]) -> Vec<ContainerResources> {
    let quantities = |map: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        map.map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
            .unwrap_or_default()
    };
    containers
        .iter()
        .map(|c| ContainerResources {
            name: c.name.clone(),
            limits: quantities(c.resources.as_ref().and_then(|r| r.limits.as_ref())),
            requests: quantities(c.resources.as_ref().and_then(|r| r.requests.as_ref())),
        })
        .collect()
}

/// What `pod` asks for; `Ok(None)` when it wants no GPU.
pub fn pod_request(pod: &Pod, config: &ClusterConfig) -> Result<Option<PodRequest>, String> {
    let (init, regular) = match &pod.spec {
        Some(spec) => (
            container_resources(spec.init_containers.as_deref().unwrap_or_default()),
            container_resources(&spec.containers),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    PodRequest::from_pod(&init, &regular, &annotations, &config.nvidia)
        .map_err(|e| format!("the pod's GPU request: {e}"))
}

/// One node's answer for a pod.
enum Judgement {
    Fits(NodeFit),
    /// Short of capacity now: freeing pods could help.
    Fails(String),
    /// No pod leaving the node would help (unknown node, no or bad
    /// inventory, an ask the empty node cannot take).
    Unresolvable(String),
}

/// Marks a pod uid as being bound by this replica until dropped.
struct InFlight {
    set: Arc<Mutex<HashSet<String>>>,
    uid: String,
}

impl InFlight {
    fn enter(set: &Arc<Mutex<HashSet<String>>>, uid: &str) -> Option<InFlight> {
        let mut uids = set.lock().unwrap_or_else(|e| e.into_inner());
        uids.insert(uid.to_string()).then(|| InFlight {
            set: set.clone(),
            uid: uid.to_string(),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.uid);
    }
}

/// What a roll-back found.
enum RolledBack {
    /// This bind's annotations are gone from the unbound pod (or were
    /// never there, or the pod is gone).
    Cleared,
    /// The pod is bound, to this node: the Binding was made after all.
    BoundHere,
    /// The pod is bound to another node: not this bind's doing.
    BoundElsewhere(String),
}

/// How a bind under the lock failed.
enum BindFailure {
    /// The pod is known not to be bound by this bind: undo (roll back what
    /// may have been written, release the lock).
    Undo {
        error: String,
        /// The allocation annotation written (or maybe written).
        written: Option<String>,
    },
    /// Whether the Binding was made is unknown: keep everything.
    Unknown { error: String, written: String },
}

impl Extender {
    /// An extender over `state`, taking `locks`, reading and writing through
    /// `client`.
    pub fn new(
        state: Arc<ClusterState>,
        locks: BindLocks,
        client: kube::Client,
        metrics: Metrics,
    ) -> Extender {
        Extender {
            state,
            locks,
            client,
            metrics,
            binding: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn judge(
        &self,
        request: &PodRequest,
        name: &str,
        object: Option<&Node>,
        holdings: &HoldingsView,
    ) -> Judgement {
        let config = self.state.config();
        let inventory = match self.state.node(name) {
            Some(node) => self.state.inventory(&node),
            // Given the whole Node, its inventory can be read from it.
            None => match object {
                Some(node) => parse_inventory(node),
                None => Err(UNKNOWN_NODE.to_string()),
            },
        };
        let inventory = match inventory {
            Ok(inventory) => inventory,
            Err(reason) => return Judgement::Unresolvable(reason),
        };
        let usage = match holdings.get(name).map(Holdings::usage) {
            Some(Err(reason)) => return Judgement::Fails(reason),
            Some(Ok(usage)) => usage,
            None => Arc::default(),
        };
        let data = NodeData {
            inventory,
            settings: config.node_settings(name),
            usage,
        };
        match judge_data(request, name, &data, config) {
            Err(reason) => {
                let empty = NodeData {
                    usage: Arc::default(),
                    ..data
                };
                if judge_data(request, name, &empty, config).is_err() {
                    Judgement::Unresolvable(reason)
                } else {
                    Judgement::Fails(reason)
                }
            }
            Ok(fit) => Judgement::Fits(fit),
        }
    }

    /// The filter verb.
    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let started = Instant::now();
        let (names, form) = args.candidates();
        let mut result = ExtenderFilterResult::default();
        let passed: Vec<String> = match pod_request(&args.pod, self.state.config()) {
            Ok(None) => names.clone(),
            Err(reason) => {
                for name in &names {
                    result
                        .failed_and_unresolvable_nodes
                        .insert(name.clone(), reason.clone());
                }
                Vec::new()
            }
            Ok(Some(_)) if !self.state.is_ready() => {
                result.error = NOT_SYNCED.to_string();
                Vec::new()
            }
            Ok(Some(request)) => {
                let holdings = self.state.holdings(args.pod.metadata.uid.as_deref());
                let objects = node_objects(args);
                let mut passed = Vec::new();
                for name in &names {
                    match self.judge(
                        &request,
                        name,
                        objects.get(name.as_str()).copied(),
                        &holdings,
                    ) {
                        Judgement::Fits(_) => passed.push(name.clone()),
                        Judgement::Fails(reason) => {
                            result.failed_nodes.insert(name.clone(), reason);
                        }
                        Judgement::Unresolvable(reason) => {
                            result
                                .failed_and_unresolvable_nodes
                                .insert(name.clone(), reason);
                        }
                    }
                }
                passed
            }
        };
        match form {
            NodeForm::Names => result.node_names = Some(passed),
            NodeForm::Objects => {
                let objects = node_objects(args);
                result.nodes = Some(NodeList {
                    items: passed
                        .iter()
                        .filter_map(|n| objects.get(n.as_str()).map(|node| (*node).clone()))
                        .collect(),
                });
            }
        }
        self.metrics
            .observe_verb("filter", started.elapsed().as_secs_f64());
        result
    }

    /// The prioritize verb.
    pub fn prioritize(&self, args: &ExtenderArgs) -> Vec<HostPriority> {
        let started = Instant::now();
        let (names, _) = args.candidates();
        let scores = match pod_request(&args.pod, self.state.config()) {
            Ok(Some(request)) => {
                let holdings = self.state.holdings(args.pod.metadata.uid.as_deref());
                let objects = node_objects(args);
                names
                    .iter()
                    .map(|name| {
                        let score = match self.judge(
                            &request,
                            name,
                            objects.get(name.as_str()).copied(),
                            &holdings,
                        ) {
                            Judgement::Fits(fit) => i64::from(fit.score.min(10)),
                            Judgement::Fails(_) | Judgement::Unresolvable(_) => 0,
                        };
                        HostPriority {
                            host: name.clone(),
                            score,
                        }
                    })
                    .collect()
            }
            // No GPU asked (or an unreadable ask): no preference.
            _ => names
                .iter()
                .map(|name| HostPriority {
                    host: name.clone(),
                    score: 0,
                })
                .collect(),
        };
        self.metrics
            .observe_verb("prioritize", started.elapsed().as_secs_f64());
        scores
    }

    /// The bind verb.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        let started = Instant::now();
        let outcome = self.bind_inner(args).await;
        self.metrics
            .observe_verb("bind", started.elapsed().as_secs_f64());
        match outcome {
            Ok(()) => {
                self.metrics.count_bind("success");
                tracing::info!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, "bound");
                ExtenderBindingResult::default()
            }
            Err(error) => {
                self.metrics.count_bind("failure");
                tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, %error, "bind failed");
                ExtenderBindingResult { error }
            }
        }
    }

    async fn bind_inner(&self, args: &ExtenderBindingArgs) -> Result<(), String> {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        // kube-scheduler may bind again after giving up on a bind that is
        // still running here: one bind per pod at a time.
        let Some(_in_flight) = InFlight::enter(&self.binding, &args.pod_uid) else {
            return Err(format!(
                "pod {key}: another bind of this pod is still in progress in this extender"
            ));
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let pod = self.fresh_pod(&pods, args).await?;
        let request = pod_request(&pod, self.state.config())?;
        let Some(request) = request else {
            // No GPU: nothing to reserve or lock.
            return self.create_binding(&pods, args).await.map_err(|(e, _)| e);
        };
        let holder = holder_of(&args.pod_namespace, &args.pod_name, &args.pod_uid);
        // Not taking a lock for a pod another bind is placing spares the
        // wait; the check that counts is repeated under the lock.
        self.refuse_other_bind(&pod, args, &holder).await?;
        let mut held = self
            .locks
            .acquire(&args.node, &holder)
            .await
            .map_err(|e| e.to_string())?;
        match self.bind_locked(&pods, args, &request, &mut held).await {
            Ok(()) => Ok(()),
            Err(BindFailure::Undo { error, written }) => {
                self.undo(&pods, args, &held, written.as_deref(), error)
                    .await
            }
            Err(BindFailure::Unknown { error, written }) => {
                self.resolve_later(args.clone(), held, written);
                Err(format!(
                    "{error}; whether the pod was bound is unknown: its reservation and the node's bind lock are kept until it is known"
                ))
            }
        }
    }

    /// After a failure that left the pod unbound: removes what this bind
    /// wrote and releases the lock. Finds the pod bound here after all, it
    /// reports success; cannot tell, it keeps everything for later.
    async fn undo(
        &self,
        pods: &Api<Pod>,
        args: &ExtenderBindingArgs,
        held: &HeldLock,
        written: Option<&str>,
        mut error: String,
    ) -> Result<(), String> {
        if let Some(written) = written {
            match self.roll_back(pods, args, written).await {
                Ok(RolledBack::Cleared) => {}
                Ok(RolledBack::BoundHere) => return Ok(()),
                Ok(RolledBack::BoundElsewhere(node)) => {
                    error = format!("{error}; the pod is bound to {node} by someone else");
                }
                Err(e) => {
                    self.resolve_later(args.clone(), held.clone(), written.to_string());
                    return Err(format!(
                        "{error}; rolling back the annotations failed too ({e}): the reservation and the node's bind lock are kept until it is known"
                    ));
                }
            }
        }
        self.state.unreserve(&args.pod_uid);
        if let Err(e) = self.locks.release(held).await {
            error = format!("{error}; releasing the bind lock failed too: {e}");
        }
        Err(error)
    }

    /// Looks at a bind of unknown outcome again until its outcome is known:
    /// bound here (the lock stays for the device plugin), or unbound (roll
    /// back, release). Gives up when the lock has expired anyway.
    fn resolve_later(&self, args: ExtenderBindingArgs, held: HeldLock, written: String) {
        let extender = self.clone();
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(extender.client.clone(), &args.pod_namespace);
            let started = Instant::now();
            let give_up = Duration::from_secs(u64::from(
                tessera_model::contract::cluster::BIND_LEASE_SECONDS,
            ));
            while started.elapsed() < give_up {
                tokio::time::sleep(UNKNOWN_RECHECK).await;
                match extender.roll_back(&pods, &args, &written).await {
                    Ok(RolledBack::BoundHere) => {
                        tracing::info!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, "a bind of unknown outcome was made after all");
                        return;
                    }
                    Ok(_) => {
                        extender.state.unreserve(&args.pod_uid);
                        if let Err(e) = extender.locks.release(&held).await {
                            tracing::warn!(node = %args.node, error = %e, "releasing a bind lock");
                        }
                        tracing::info!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, "a bind of unknown outcome was not made: rolled back");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "a bind of unknown outcome: still cannot tell")
                    }
                }
            }
        });
    }

    /// Refuses when the pod carries an allocation for another node whose
    /// lock is held under this pod's holder string: another bind of this
    /// pod (another replica, or one its caller gave up on) is placing it.
    async fn refuse_other_bind(
        &self,
        pod: &Pod,
        args: &ExtenderBindingArgs,
        holder: &str,
    ) -> Result<(), String> {
        let Some(text) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::ALLOCATION))
        else {
            return Ok(());
        };
        let node = match Allocation::parse(text) {
            Ok(allocation) => allocation.node,
            Err(_) => match serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| v.get("node")?.as_str().map(str::to_owned))
            {
                Some(node) => node,
                None => return Ok(()),
            },
        };
        if node == args.node {
            // Taking this node's lock excludes any other bind under it.
            return Ok(());
        }
        match self.locks.state_of(&node).await {
            Ok(LeaseState::Held(other)) if other == holder => Err(format!(
                "pod {}/{}: another bind of this pod, to node {node}, is in progress",
                args.pod_namespace, args.pod_name
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(format!(
                "pod {}/{} carries an allocation for {node} and its bind lock cannot be read: {e}",
                args.pod_namespace, args.pod_name
            )),
        }
    }

    async fn bind_locked(
        &self,
        pods: &Api<Pod>,
        args: &ExtenderBindingArgs,
        request: &PodRequest,
        held: &mut HeldLock,
    ) -> Result<(), BindFailure> {
        let early = |error: String| BindFailure::Undo {
            error,
            written: None,
        };
        // Fresh reads: the pod (still there, same uid, unbound), the node, its pods.
        let pod = self.fresh_pod(pods, args).await.map_err(early)?;
        self.refuse_other_bind(&pod, args, &held.holder)
            .await
            .map_err(early)?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = timed(nodes.get_opt(&args.node))
            .await
            .map_err(|e| early(format!("reading node {}: {e}", args.node)))?
            .ok_or_else(|| early(format!("node {} is gone", args.node)))?;
        let inventory = parse_inventory(&node).map_err(early)?;
        let usage = self
            .fresh_holdings(&args.node, &args.pod_uid)
            .await
            .map_err(early)?
            .usage()
            .map_err(early)?;
        let data = NodeData {
            inventory,
            settings: self.state.config().node_settings(&args.node),
            usage,
        };
        let fit = judge_data(request, &args.node, &data, self.state.config())
            .map_err(|reason| early(format!("node {} no longer fits: {reason}", args.node)))?;
        let allocation = fit::allocation_for(&args.node, &fit);
        self.state.reserve(Reservation {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
            uid: args.pod_uid.clone(),
            allocation: allocation.clone(),
            made: Instant::now(),
        });
        let written = allocation.to_annotation();
        // Fence: renew the lease by compare-and-swap now; a takeover since
        // the lock was taken fails it. No other replica judges the lease
        // stale before BIND_GRACE after this, and the write below returns
        // within FENCE or is undone.
        let renewed = Instant::now();
        self.locks
            .renew(held)
            .await
            .map_err(|e| early(e.to_string()))?;
        let patch = json!({"metadata": {
            "uid": args.pod_uid,
            "resourceVersion": pod.metadata.resource_version,
            "annotations": {
                annotations::ALLOCATION: written,
                annotations::BIND_PHASE: "allocating",
                annotations::BIND_TIME: Timestamp::now().to_string(),
            }
        }});
        timed(pods.patch(
            &args.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ))
        .await
        .map_err(|e| BindFailure::Undo {
            // A refusal (4xx) wrote nothing; a timeout or a server error may
            // have: roll back to be sure (only this write, only if unbound).
            written: (!refused(&e)).then(|| written.clone()),
            error: format!("writing the allocation on the pod: {e}"),
        })?;
        let undo = |error: String| BindFailure::Undo {
            error,
            written: Some(written.clone()),
        };
        if renewed.elapsed() >= FENCE {
            return Err(undo(format!(
                "writing the allocation took {:?} after renewing the bind lock (limit {FENCE:?})",
                renewed.elapsed()
            )));
        }
        self.locks
            .confirm(held)
            .await
            .map_err(|e| undo(e.to_string()))?;
        let Err((error, refused)) = self.create_binding(pods, args).await else {
            return Ok(());
        };
        // Did the Binding happen after all (a lost reply)? Only a fresh read
        // can tell; never roll back the allocation of a pod on the node.
        match timed(pods.get_opt(&args.pod_name)).await {
            Ok(Some(now))
                if now.metadata.uid.as_deref() == Some(args.pod_uid.as_str())
                    && now.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(args.node.as_str()) =>
            {
                Ok(())
            }
            Ok(_) => Err(undo(error)),
            Err(_) if refused => Err(undo(error)),
            Err(read) => Err(BindFailure::Unknown {
                error: format!("{error}; reading the pod back: {read}"),
                written,
            }),
        }
    }

    async fn fresh_pod(&self, pods: &Api<Pod>, args: &ExtenderBindingArgs) -> Result<Pod, String> {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let pod = timed(pods.get_opt(&args.pod_name))
            .await
            .map_err(|e| format!("reading pod {key}: {e}"))?
            .ok_or_else(|| format!("pod {key} is gone"))?;
        if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            return Err(format!("pod {key} is gone (now another pod of that name)"));
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(format!("pod {key} is being deleted"));
        }
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            return Err(format!("pod {key} is already bound to {node}"));
        }
        Ok(pod)
    }

    /// What `node` holds, read fresh from the API: the pods bound to it; plus
    /// the unbound pods whose allocation names it (a bind crashed or fenced
    /// between its annotation patch and its Binding) as the reflector shows
    /// them, and this replica's reservations on it not yet shown on their
    /// pods; never the pod being bound.
    ///
    /// Unbound pods are taken from the reflector, not listed fresh: such a
    /// pod only becomes bound through a bind that holds this node's lock,
    /// and this bind holds it now (any earlier holder was fenced off by the
    /// lock's compare-and-swap), so a stale view of them cannot let two
    /// binds share a GPU — while a fresh list of every pending pod of the
    /// cluster on every bind cost seconds per bind with thousands pending.
    async fn fresh_holdings(&self, node: &str, binding_uid: &str) -> Result<Holdings, String> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let mut pods: Vec<Pod> = timed(all.list(&on_node))
            .await
            .map_err(|e| format!("listing the pods of node {node}: {e}"))?
            .items;
        let listed: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        pods.extend(
            self.state
                .pods()
                .into_iter()
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_none()
                        && p.metadata
                            .uid
                            .as_ref()
                            .is_some_and(|uid| !listed.contains(uid))
                        && p.metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key(annotations::ALLOCATION))
                })
                .map(|p| (*p).clone()),
        );
        pods.retain(|p| p.metadata.uid.as_deref() != Some(binding_uid));
        let mut holdings = self
            .state
            .holdings_of(pods.iter())
            .remove(node)
            .unwrap_or_default();
        for reservation in self.state.reservations() {
            let shown = pods.iter().any(|p| {
                p.metadata.uid.as_deref() == Some(reservation.uid.as_str())
                    && matches!(self.state.allocation(p), Some(Ok(a)) if *a == reservation.allocation)
            });
            if reservation.allocation.node == node && reservation.uid != binding_uid && !shown {
                holdings.push(Arc::new(reservation.allocation));
            }
        }
        Ok(holdings)
    }

    /// Creates the Binding; on failure, the error and whether the API
    /// refused it outright (a 4xx: certainly not made).
    async fn create_binding(
        &self,
        pods: &Api<Pod>,
        args: &ExtenderBindingArgs,
    ) -> Result<(), (String, bool)> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(args.pod_name.clone()),
                namespace: Some(args.pod_namespace.clone()),
                uid: Some(args.pod_uid.clone()),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(args.node.clone()),
                ..Default::default()
            },
        };
        timed(pods.create_subresource::<Binding, serde_json::Value>(
            "binding",
            &args.pod_name,
            &PostParams::default(),
            &binding,
        ))
        .await
        .map(|_| ())
        .map_err(|e| {
            (
                format!("binding the pod to {}: {e}", args.node),
                refused(&e),
            )
        })
    }

    /// Removes the annotations this bind wrote: only from the pod while it
    /// is unbound and still carries `written`, read fresh, with the patch
    /// conditional on the version read (JSON patch `test`s), so neither a
    /// Binding nor another bind's write in between is undone.
    async fn roll_back(
        &self,
        pods: &Api<Pod>,
        args: &ExtenderBindingArgs,
        written: &str,
    ) -> Result<RolledBack, String> {
        let key = |name: &str| {
            format!(
                "/metadata/annotations/{}",
                name.replace('~', "~0").replace('/', "~1")
            )
        };
        let mut last = String::new();
        for _ in 0..5 {
            let pod = match timed(pods.get_opt(&args.pod_name)).await {
                Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(args.pod_uid.as_str()) => pod,
                Ok(_) => return Ok(RolledBack::Cleared),
                Err(e) => return Err(format!("reading the pod: {e}")),
            };
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                return Ok(if node == args.node {
                    RolledBack::BoundHere
                } else {
                    RolledBack::BoundElsewhere(node)
                });
            }
            let present = pod.metadata.annotations.clone().unwrap_or_default();
            if present.get(annotations::ALLOCATION).map(String::as_str) != Some(written) {
                return Ok(RolledBack::Cleared);
            }
            let mut operations = vec![
                json!({"op": "test", "path": "/metadata/uid", "value": args.pod_uid}),
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": pod.metadata.resource_version}),
                json!({"op": "test", "path": key(annotations::ALLOCATION), "value": written}),
            ];
            for name in [
                annotations::ALLOCATION,
                annotations::BIND_PHASE,
                annotations::BIND_TIME,
            ] {
                if present.contains_key(name) {
                    operations.push(json!({"op": "remove", "path": key(name)}));
                }
            }
            let patch: json_patch::Patch =
                serde_json::from_value(serde_json::Value::Array(operations))
                    .map_err(|e| e.to_string())?;
            match timed(pods.patch(
                &args.pod_name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            ))
            .await
            {
                Ok(_) => return Ok(RolledBack::Cleared),
                Err(TimedError::Api(e)) if api_code(&e) == Some(404) => {
                    return Ok(RolledBack::Cleared);
                }
                // Changed since the read: read again.
                Err(TimedError::Api(e)) if matches!(api_code(&e), Some(409 | 422)) => {
                    last = e.to_string();
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("the pod kept changing: {last}"))
    }
}

/// The API refused the request outright (a 4xx): it certainly made no change.
fn refused(error: &TimedError) -> bool {
    matches!(error, TimedError::Api(e) if api_code(e).is_some_and(|c| (400..500).contains(&c)))
}

fn judge_data(
    request: &PodRequest,
    name: &str,
    data: &NodeData,
    config: &ClusterConfig,
) -> Result<NodeFit, String> {
    let view = NodeView {
        name,
        inventory: &data.inventory,
        usage: &data.usage,
        settings: &data.settings,
    };
    fit::fit(request, view, config).map_err(|unfit| unfit.reason)
}

fn node_objects(args: &ExtenderArgs) -> HashMap<&str, &Node> {
    args.nodes
        .iter()
        .flatten()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, n)))
        .collect()
}

/// The allocation this pod holds, as the reflector shows it (for tests and
/// inspection).
pub fn allocation_of(pod: &Pod) -> Option<Allocation> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(annotations::ALLOCATION)
        .and_then(|t| Allocation::parse(t).ok())
}
