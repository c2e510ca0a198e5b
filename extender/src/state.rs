//! The cluster as the extender sees it: kube-rs reflectors on Nodes and Pods
//! (all namespaces) plus the reservations this replica made and the
//! reflector has not shown yet.
//!
//! Nothing is kept locally: a restarted extender rebuilds the same picture
//! from the API alone, since every reservation that counts is written on its
//! pod (`tessera.io/allocation`) before the pod is bound.
//!
//! What a node holds: the allocations of the live pods (not Succeeded or
//! Failed) bound to it (`spec.nodeName`), of the unbound pods whose
//! allocation names it (a bind in flight, or one left behind), plus this
//! replica's in-flight reservations. An unbound pod whose `bind-phase` is
//! `success` or `failed` carries annotations left from elsewhere (a pod
//! re-created from saved YAML: no bind in flight ever writes those on an
//! unbound pod) and holds nothing. A pod on the node whose allocation cannot
//! be read (corrupt, hand-edited, another version), or names another node,
//! makes the node unusable, with that as its reason: its devices are
//! unknown, and guessing could over-commit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tessera_model::contract::annotations;
use tessera_model::sched::allocation::Allocation;
use tessera_model::sched::config::{ClusterConfig, NodeSettings};
use tessera_model::sched::fit::NodeUsage;
use tessera_model::sched::inventory::NodeGpus;

/// How long an in-flight reservation counts at most without the reflector
/// showing its pod's allocation.
pub const RESERVATION_TTL: Duration = Duration::from_secs(300);

/// How long a reservation whose pod the reflector does not show is kept
/// (the pod may be newer than the reflector's view).
pub const RESERVATION_UNSEEN_GRACE: Duration = Duration::from_secs(30);

/// A reservation this replica made at bind, before the reflector shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid.
    pub uid: String,
    /// What was reserved (names its node).
    pub allocation: Allocation,
    /// When it was made.
    pub made: Instant,
}

/// What one node holds: the allocations counted on it, and the problems
/// that make it unusable (unreadable allocations of pods on it).
#[derive(Debug, Clone, Default)]
pub struct Holdings {
    /// Allocations held on the node. Add with [`Holdings::push`]: the usage
    /// is computed once per value, and a direct push after [`Holdings::usage`]
    /// would not be seen.
    pub allocations: Vec<Arc<Allocation>>,
    /// Why the node's holdings are unknown, one line each.
    pub problems: Vec<String>,
    /// The usage, computed at the first [`Holdings::usage`] and shared by the
    /// clones of this value (filter and prioritize ask for every node's
    /// usage on every call; the pods rarely change between calls).
    usage: Arc<OnceLock<Result<Arc<NodeUsage>, String>>>,
}

impl Holdings {
    /// The node's usage, or the first reason it is unknown.
    pub fn usage(&self) -> Result<Arc<NodeUsage>, String> {
        self.usage
            .get_or_init(|| match self.problems.first() {
                Some(problem) => Err(problem.clone()),
                None => Ok(Arc::new(NodeUsage::from_allocations(
                    self.allocations.iter().map(Arc::as_ref),
                ))),
            })
            .clone()
    }

    /// Adds an allocation held on the node.
    pub fn push(&mut self, allocation: Arc<Allocation>) {
        self.allocations.push(allocation);
        self.usage = Arc::default();
    }

    /// Adds a reason the node's holdings are unknown.
    pub fn push_problem(&mut self, problem: String) {
        self.problems.push(problem);
        self.usage = Arc::default();
    }
}

/// What every node holds, as [`ClusterState::holdings`] answers it: the
/// holdings computed from the reflector's pods (shared, recomputed only
/// when a pod changed) with this call's reservations laid over them.
#[derive(Debug, Clone, Default)]
pub struct HoldingsView {
    base: Arc<HashMap<String, Holdings>>,
    overlay: HashMap<String, Holdings>,
}

impl HoldingsView {
    /// What `node` holds, if anything was ever charged to it.
    pub fn get(&self, node: &str) -> Option<&Holdings> {
        self.overlay.get(node).or_else(|| self.base.get(node))
    }

    /// Whether anything is charged to `node`.
    pub fn contains_key(&self, node: &str) -> bool {
        self.get(node).is_some()
    }
}

impl std::ops::Index<&str> for HoldingsView {
    type Output = Holdings;

    /// Panics when nothing is charged to `node` (as a map's index does).
    fn index(&self, node: &str) -> &Holdings {
        match self.get(node) {
            Some(holdings) => holdings,
            None => panic!("nothing is charged to node {node}"),
        }
    }
}

/// The holdings of the reflector's pods as of one pod-event count.
struct BaseHoldings {
    /// [`ClusterState::pod_events`] when they were computed.
    events: u64,
    per_node: Arc<HashMap<String, Holdings>>,
    /// Pods carrying an allocation annotation (a superset of those charged).
    annotated: HashSet<String>,
}

/// A node ready for the fit: inventory, settings and usage.
#[derive(Debug, Clone)]
pub struct NodeData {
    /// The node's GPUs (`tessera.io/node-gpus`).
    pub inventory: Arc<NodeGpus>,
    /// Settings in force on it.
    pub settings: NodeSettings,
    /// What is held on it.
    pub usage: Arc<NodeUsage>,
}

/// The reason given for a node the extender does not know.
pub const UNKNOWN_NODE: &str = "node unknown to the extender";

/// Parsed annotations by object (node name or pod uid): the resourceVersion
/// they were read at, and the outcome.
type ParseCache<T> = HashMap<String, (String, Result<Arc<T>, String>)>;

/// The cluster state: reflector stores, the config, in-flight reservations.
pub struct ClusterState {
    nodes: Store<Node>,
    pods: Store<Pod>,
    config: Arc<ClusterConfig>,
    reservations: Mutex<HashMap<String, Reservation>>,
    inventories: Mutex<ParseCache<NodeGpus>>,
    allocations: Mutex<ParseCache<Allocation>>,
    nodes_synced: AtomicBool,
    pods_synced: AtomicBool,
    /// Pod watch events applied so far; the base holdings are recomputed
    /// when it moved (the count is taken after the store applied the event).
    pod_events: Arc<AtomicU64>,
    base_holdings: Mutex<Option<BaseHoldings>>,
}

impl std::fmt::Debug for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterState")
            .field("nodes", &self.nodes.len())
            .field("pods", &self.pods.len())
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl ClusterState {
    /// Starts the reflectors on `client` and returns the state; they run
    /// (re-listing after errors with back-off) until the runtime ends.
    pub fn start(client: kube::Client, config: Arc<ClusterConfig>) -> Arc<ClusterState> {
        let (nodes, node_writer) = reflector::store::<Node>();
        let (pods, pod_writer) = reflector::store::<Pod>();
        let pod_events = Arc::new(AtomicU64::new(0));
        let state = Arc::new(ClusterState {
            nodes,
            pods,
            config,
            reservations: Mutex::new(HashMap::new()),
            inventories: Mutex::new(HashMap::new()),
            allocations: Mutex::new(HashMap::new()),
            nodes_synced: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
            pod_events: pod_events.clone(),
            base_holdings: Mutex::new(None),
        });
        let node_stream = reflector::reflector(
            node_writer,
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff();
        tokio::spawn(drive(node_stream, "nodes"));
        let pod_stream = reflector::reflector(
            pod_writer,
            watcher(Api::<Pod>::all(client), watcher::Config::default()),
        )
        .default_backoff()
        .inspect(move |_| {
            pod_events.fetch_add(1, Ordering::SeqCst);
        });
        tokio::spawn(drive(pod_stream, "pods"));
        for (store_is_nodes, weak) in [
            (true, Arc::downgrade(&state)),
            (false, Arc::downgrade(&state)),
        ] {
            tokio::spawn(async move {
                let Some(state) = weak.upgrade() else { return };
                let ready = if store_is_nodes {
                    state.nodes.wait_until_ready().await
                } else {
                    state.pods.wait_until_ready().await
                };
                if ready.is_ok() {
                    let flag = if store_is_nodes {
                        &state.nodes_synced
                    } else {
                        &state.pods_synced
                    };
                    flag.store(true, Ordering::SeqCst);
                    tracing::info!(
                        what = if store_is_nodes { "nodes" } else { "pods" },
                        "reflector synced"
                    );
                }
            });
        }
        state
    }

    /// A state over fixed objects, with no API behind it (benchmarks, and
    /// tests of the verbs without a server): ready at once, never updated.
    pub fn from_objects(
        nodes: Vec<Node>,
        pods: Vec<Pod>,
        config: Arc<ClusterConfig>,
    ) -> Arc<ClusterState> {
        fn fill<K>(objects: Vec<K>) -> Store<K>
        where
            K: kube::Resource<DynamicType = ()> + Clone + 'static,
        {
            let mut writer = reflector::store::Writer::<K>::default();
            writer.apply_watcher_event(&watcher::Event::Init);
            for object in objects {
                writer.apply_watcher_event(&watcher::Event::InitApply(object));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            writer.as_reader()
        }
        Arc::new(ClusterState {
            nodes: fill(nodes),
            pods: fill(pods),
            config,
            reservations: Mutex::new(HashMap::new()),
            inventories: Mutex::new(HashMap::new()),
            allocations: Mutex::new(HashMap::new()),
            nodes_synced: AtomicBool::new(true),
            pods_synced: AtomicBool::new(true),
            pod_events: Arc::new(AtomicU64::new(0)),
            base_holdings: Mutex::new(None),
        })
    }

    /// Both reflectors have listed once.
    pub fn is_ready(&self) -> bool {
        self.nodes_synced.load(Ordering::SeqCst) && self.pods_synced.load(Ordering::SeqCst)
    }

    /// The cluster config in force.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Every node the reflector shows.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    /// Every pod the reflector shows.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// One node, by name.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// One pod, by namespace and name.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// A node's inventory, parsed (cached per resourceVersion), or why not.
    pub fn inventory(&self, node: &Node) -> Result<Arc<NodeGpus>, String> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let version = node.metadata.resource_version.clone().unwrap_or_default();
        let mut cache = lock(&self.inventories);
        if let Some((seen, parsed)) = cache.get(&name)
            && *seen == version
            && !version.is_empty()
        {
            return parsed.clone();
        }
        let parsed = parse_inventory(node);
        cache.insert(name, (version, parsed.clone()));
        parsed
    }

    /// A pod's allocation, parsed (cached per uid and resourceVersion):
    /// `None` when it has none.
    pub fn allocation(&self, pod: &Pod) -> Option<Result<Arc<Allocation>, String>> {
        let text = pod
            .metadata
            .annotations
            .as_ref()?
            .get(annotations::ALLOCATION)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        let mut cache = lock(&self.allocations);
        if let Some((seen, parsed)) = cache.get(&uid)
            && *seen == version
            && !version.is_empty()
        {
            return Some(parsed.clone());
        }
        let parsed = Allocation::parse(text)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        if cache.len() > 4 * self.pods.len() + 1024 {
            cache.clear();
        }
        cache.insert(uid, (version, parsed.clone()));
        Some(parsed)
    }

    /// Records a reservation made at bind (before its annotation is written).
    pub fn reserve(&self, reservation: Reservation) {
        lock(&self.reservations).insert(reservation.uid.clone(), reservation);
    }

    /// Drops the reservation of a pod (bind failed and rolled back).
    pub fn unreserve(&self, uid: &str) {
        lock(&self.reservations).remove(uid);
    }

    /// The in-flight reservations still counted (expired ones are dropped).
    pub fn reservations(&self) -> Vec<Reservation> {
        let mut reservations = lock(&self.reservations);
        reservations.retain(|_, r| self.reservation_counts(r));
        reservations.values().cloned().collect()
    }

    fn reservation_counts(&self, reservation: &Reservation) -> bool {
        let age = reservation.made.elapsed();
        if age > RESERVATION_TTL {
            return false;
        }
        match self.pod(&reservation.namespace, &reservation.name) {
            // Counts until the pod shows this very allocation (then the pod
            // counts); a stale or different annotation does not replace it.
            Some(pod) if pod.metadata.uid.as_deref() == Some(reservation.uid.as_str()) => {
                !is_terminal(&pod)
                    && !matches!(self.allocation(&pod), Some(Ok(shown)) if *shown == reservation.allocation)
            }
            // Gone, or replaced by a pod of the same name.
            _ => age < RESERVATION_UNSEEN_GRACE,
        }
    }

    /// What the nodes hold, from the reflector's pods and the reservations;
    /// never counting the pod `except_uid` (the pod being placed: an
    /// allocation left on it by an earlier attempt is replaced by this one).
    pub fn holdings(&self, except_uid: Option<&str>) -> HoldingsView {
        let (base, annotated_except) = {
            let mut cached = lock(&self.base_holdings);
            let events = self.pod_events.load(Ordering::SeqCst);
            let base = match cached.as_ref() {
                Some(base) if base.events == events => base,
                _ => {
                    let pods = self.pods.state();
                    let annotated = pods
                        .iter()
                        .filter(|p| {
                            p.metadata
                                .annotations
                                .as_ref()
                                .is_some_and(|a| a.contains_key(annotations::ALLOCATION))
                        })
                        .filter_map(|p| p.metadata.uid.clone())
                        .collect();
                    let per_node = self.holdings_of(pods.iter().map(Arc::as_ref));
                    cached.insert(BaseHoldings {
                        events,
                        per_node: Arc::new(per_node),
                        annotated,
                    })
                }
            };
            let annotated_except = except_uid.is_some_and(|uid| base.annotated.contains(uid));
            (base.per_node.clone(), annotated_except)
        };
        let mut view = HoldingsView {
            base,
            overlay: HashMap::new(),
        };
        if annotated_except {
            // Rare: the pod being placed carries an allocation (an earlier
            // attempt's); count the others without it.
            let pods = self.pods.state();
            view.base = Arc::new(
                self.holdings_of(
                    pods.iter()
                        .map(Arc::as_ref)
                        .filter(|p| p.metadata.uid.as_deref() != except_uid),
                ),
            );
        }
        for reservation in self.reservations() {
            if Some(reservation.uid.as_str()) == except_uid {
                continue;
            }
            let node = reservation.allocation.node.clone();
            let entry = match view.overlay.entry(node) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let from_pods = view.base.get(e.key()).cloned().unwrap_or_default();
                    e.insert(from_pods)
                }
            };
            entry.push(Arc::new(reservation.allocation));
        }
        view
    }

    /// What the given pods hold, per node (no reservations).
    pub fn holdings_of<'a>(
        &self,
        pods: impl Iterator<Item = &'a Pod>,
    ) -> HashMap<String, Holdings> {
        let mut holdings: HashMap<String, Holdings> = HashMap::new();
        for pod in pods {
            if is_terminal(pod) {
                continue;
            }
            let bound_to = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if bound_to.is_none() && left_from_elsewhere(pod) {
                continue;
            }
            let Some(parsed) = self.allocation(pod) else {
                continue;
            };
            match parsed {
                Ok(allocation) => match bound_to {
                    Some(node) if node != allocation.node => {
                        holdings.entry(node.clone()).or_default().push_problem(format!(
                            "pod {} is bound to {node} but its allocation names node {}: its GPUs here are unknown",
                            pod_key(pod),
                            allocation.node
                        ));
                    }
                    _ => holdings
                        .entry(allocation.node.clone())
                        .or_default()
                        .push(allocation),
                },
                Err(problem) => {
                    let key = pod_key(pod);
                    match unreadable_allocation_node(pod) {
                        Some(node) => holdings.entry(node).or_default().push_problem(format!(
                            "pod {key} holds GPUs this extender cannot account for ({problem})"
                        )),
                        None => tracing::warn!(
                            pod = %key,
                            %problem,
                            "unreadable allocation on a pod bound to no node"
                        ),
                    }
                }
            }
        }
        holdings
    }

    /// Everything the fit needs of `name`, or why the node cannot take GPUs.
    pub fn node_data(&self, name: &str, holdings: &HoldingsView) -> Result<NodeData, String> {
        let node = self.node(name).ok_or_else(|| UNKNOWN_NODE.to_string())?;
        let inventory = self.inventory(&node)?;
        let usage = match holdings.get(name) {
            Some(held) => held.usage()?,
            None => Arc::default(),
        };
        Ok(NodeData {
            inventory,
            settings: self.config.node_settings(name),
            usage,
        })
    }
}

/// A Mutex lock that survives a poisoned mutex (the data are caches and
/// maps that stay consistent between statements).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

async fn drive<S, T>(stream: S, what: &'static str)
where
    S: futures::Stream<Item = Result<T, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            tracing::warn!(what, error = %e, "watch failed; relisting");
        }
    }
    tracing::warn!(what, "watch stream ended");
}

/// Parses a node's `tessera.io/node-gpus`, or says why it cannot be used.
pub fn parse_inventory(node: &Node) -> Result<Arc<NodeGpus>, String> {
    let text = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::NODE_GPUS))
        .ok_or_else(|| {
            format!(
                "node has no {} annotation (no Tessera device plugin reported its GPUs)",
                annotations::NODE_GPUS
            )
        })?;
    NodeGpus::parse(text)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Succeeded or Failed: the pod holds nothing any more.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// An unbound pod whose `bind-phase` says its allocation was already
/// realized or failed: its annotations came from elsewhere.
fn left_from_elsewhere(pod: &Pod) -> bool {
    matches!(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::BIND_PHASE))
            .map(String::as_str),
        Some("success" | "failed")
    )
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The node an unreadable allocation should be charged to: the pod's node,
/// else a `node` string the JSON names (a foreign version still says where).
fn unreadable_allocation_node(pod: &Pod) -> Option<String> {
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Some(node);
    }
    let text = pod
        .metadata
        .annotations
        .as_ref()?
        .get(annotations::ALLOCATION)?;
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value.get("node")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn pod(name: &str, node: Option<&str>, allocation: Option<&str>, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("1".into()),
                annotations: allocation.map(|a| {
                    BTreeMap::from([(annotations::ALLOCATION.to_string(), a.to_string())])
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_owned),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    /// A running pod bound to `node` holding `mib` of its `GPU-1`.
    fn running(name: &str, node: &str, mib: u64) -> Pod {
        pod(
            name,
            Some(node),
            Some(&share(node, "GPU-1", mib)),
            "Running",
        )
    }

    /// The state of a cluster of these pods (no nodes, default config).
    fn state_of(pods: Vec<Pod>) -> Arc<ClusterState> {
        ClusterState::from_objects(Vec::new(), pods, Arc::new(ClusterConfig::default()))
    }

    /// The extender's own reservation for pod `name` in `ns`, made now.
    fn reservation(name: &str, allocation: Allocation) -> Reservation {
        Reservation {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            allocation,
            made: Instant::now(),
        }
    }

    fn share(node: &str, uuid: &str, mib: u64) -> String {
        format!(
            r#"{{"version":1,"node":"{node}","containers":[{{"index":0,"name":"main","devices":[{{"mode":"share","uuid":"{uuid}","memoryMiB":{mib},"cores":10}}]}}]}}"#
        )
    }

    #[test]
    fn live_pods_hold_their_allocations_and_finished_ones_do_not() {
        let state = state_of(vec![
            running("a", "n1", 1000),
            // Annotated, not bound yet: charged to the node it names.
            pod("b", None, Some(&share("n1", "GPU-1", 2000)), "Pending"),
            pod(
                "done",
                Some("n1"),
                Some(&share("n1", "GPU-1", 4000)),
                "Succeeded",
            ),
            pod(
                "failed",
                Some("n1"),
                Some(&share("n1", "GPU-1", 8000)),
                "Failed",
            ),
            pod("plain", Some("n1"), None, "Running"),
        ]);
        let holdings = state.holdings(None);
        let held = &holdings["n1"];
        assert!(held.problems.is_empty());
        let mut mib: Vec<u64> = held
            .allocations
            .iter()
            .flat_map(|a| a.devices().map(|(_, d)| d.clone()).collect::<Vec<_>>())
            .map(|d| match d {
                tessera_model::sched::allocation::DeviceAllocation::Share {
                    memory_mib, ..
                } => memory_mib,
                other => panic!("{other:?}"),
            })
            .collect();
        mib.sort();
        assert_eq!(mib, [1000, 2000]);
        // The pod being placed never counts against itself.
        assert_eq!(state.holdings(Some("uid-b"))["n1"].allocations.len(), 1);
    }

    #[test]
    fn an_unreadable_allocation_makes_its_node_unusable_naming_the_pod() {
        let state = state_of(vec![
            pod("bad", Some("n1"), Some("{not json"), "Running"),
            // Not bound: charged to the node its JSON names, though another version.
            pod(
                "future",
                None,
                Some(r#"{"version":7,"node":"n2"}"#),
                "Pending",
            ),
            running("ok", "n3", 1000),
        ]);
        let holdings = state.holdings(None);
        let n1 = holdings["n1"].usage().expect_err("n1 unusable");
        assert!(n1.contains("ns/bad"), "{n1}");
        let n2 = holdings["n2"].usage().expect_err("n2 unusable");
        assert!(n2.contains("ns/future") && n2.contains("version 7"), "{n2}");
        assert!(holdings["n3"].usage().is_ok());
    }

    #[test]
    fn a_reservation_counts_until_its_pod_shows_the_allocation() {
        let allocation = Allocation::parse(&share("n1", "GPU-1", 3000)).expect("valid");
        let reservation = |name: &str| reservation(name, allocation.clone());
        let state = state_of(vec![
            pod("pending", None, None, "Pending"),
            pod("shown", None, Some(&share("n1", "GPU-1", 3000)), "Pending"),
            pod("finished", None, None, "Failed"),
        ]);
        for name in ["pending", "shown", "finished", "unseen"] {
            state.reserve(reservation(name));
        }
        let mut kept: Vec<String> = state.reservations().into_iter().map(|r| r.name).collect();
        kept.sort();
        // "shown" counts through its annotation now; "finished" holds nothing;
        // "unseen" may be newer than the reflector's view, within the grace.
        assert_eq!(kept, ["pending", "unseen"]);
        // Pod annotation (shown) + the two reservations.
        assert_eq!(state.holdings(None)["n1"].allocations.len(), 3);
        state.unreserve("uid-pending");
        assert_eq!(state.holdings(None)["n1"].allocations.len(), 2);
        let mut old = reservation("old");
        old.made = Instant::now()
            .checked_sub(RESERVATION_TTL + Duration::from_secs(1))
            .expect("clock far enough from boot");
        state.reserve(old);
        assert_eq!(state.holdings(None)["n1"].allocations.len(), 2, "expired");
    }

    #[test]
    fn a_bound_pod_is_charged_to_its_node_and_a_mismatch_makes_that_node_unusable() {
        let state = state_of(vec![
            // Bound to n1, its allocation names n2: n1's GPUs are unknown.
            pod(
                "moved",
                Some("n1"),
                Some(&share("n2", "GPU-1", 1000)),
                "Running",
            ),
            running("fine", "n3", 1000),
        ]);
        let holdings = state.holdings(None);
        let n1 = holdings["n1"].usage().expect_err("n1 unusable");
        assert!(n1.contains("ns/moved") && n1.contains("n2"), "{n1}");
        assert!(!holdings.contains_key("n2"), "nothing charged to n2");
        assert_eq!(holdings["n3"].allocations.len(), 1);
    }

    #[test]
    fn an_unbound_pod_with_a_finished_phase_holds_nothing() {
        let with_phase = |name: &str, phase: &str| {
            let mut pod = pod(name, None, Some(&share("n1", "GPU-1", 1000)), "Pending");
            if let Some(annotations) = pod.metadata.annotations.as_mut() {
                annotations.insert(annotations::BIND_PHASE.to_string(), phase.to_string());
            }
            pod
        };
        let state = state_of(vec![
            with_phase("copied", "success"),
            with_phase("copied-failed", "failed"),
            with_phase("in-flight", "allocating"),
        ]);
        assert_eq!(state.holdings(None)["n1"].allocations.len(), 1);
    }

    #[test]
    fn a_reservation_outlives_a_stale_annotation_of_its_pod() {
        let reserved = Allocation::parse(&share("n1", "GPU-1", 3000)).expect("valid");
        let state = ClusterState::from_objects(
            Vec::new(),
            // The pod still shows an older, different allocation.
            vec![pod("p", None, Some(&share("n1", "GPU-2", 500)), "Pending")],
            Arc::new(ClusterConfig::default()),
        );
        state.reserve(reservation("p", reserved));
        assert_eq!(state.reservations().len(), 1);
        // The stale annotation and the reservation both count (never less).
        assert_eq!(state.holdings(None)["n1"].allocations.len(), 2);
    }
}
