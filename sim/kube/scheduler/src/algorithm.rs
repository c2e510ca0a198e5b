//! The scheduling algorithm without I/O: per-node filters, scores, the
//! choice of a node and the failure message, shaped as kube-scheduler's.
//!
//! Filters run in kube-scheduler's default order and stop at the first
//! that fails a node: NodeUnschedulable, TaintToleration, NodeAffinity
//! (nodeSelector and required node affinity), NodeResourcesFit. kube-scheduler
//! itself does not read node conditions (the node lifecycle controller taints
//! a not-ready node); the stand-in has no such controller, so a node whose
//! Ready condition is False (or missing) is treated as carrying the
//! `node.kubernetes.io/not-ready:NoSchedule` taint, and Unknown as
//! `node.kubernetes.io/unreachable:NoSchedule`, with the same messages.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

use crate::resources::{self, CPU, EPHEMERAL_STORAGE, MEMORY, PODS, Resources};

/// Highest score of one scoring function (kube-scheduler's MaxNodeScore).
pub const MAX_NODE_SCORE: i64 = 100;

/// kube-scheduler's reason for a cordoned node.
pub const REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
/// kube-scheduler's reason for a node failing nodeSelector or node affinity.
pub const REASON_NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
/// kube-scheduler's reason for a full node.
pub const REASON_TOO_MANY_PODS: &str = "Too many pods";
/// The preemption note for a node where evicting pods cannot help.
pub const PREEMPTION_NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
/// The preemption note for a node where it could, but the stand-in never
/// preempts (as when no lower-priority pod runs there).
pub const PREEMPTION_NO_VICTIMS: &str = "No preemption victims found for incoming pod";
/// The taint the node lifecycle controller puts on a not-ready node.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The taint the node lifecycle controller puts on an unreachable node.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// The taint a cordoned node is treated as having.
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// kube-scheduler's message when the cluster has no node at all.
pub const NO_NODES_AVAILABLE: &str = "no nodes available to schedule pods";

/// Why a node cannot take a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// The reasons, each counted once in the failure message.
    pub reasons: Vec<String>,
    /// Whether preemption cannot help (kube-scheduler's
    /// UnschedulableAndUnresolvable).
    pub unresolvable: bool,
}

impl NodeStatus {
    fn unresolvable(reason: impl Into<String>) -> NodeStatus {
        NodeStatus {
            reasons: vec![reason.into()],
            unresolvable: true,
        }
    }
}

/// What a pod takes on its node, computed once per pod version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// [`resources::pod_requests`].
    pub requests: Resources,
    /// [`resources::nonzero_cpu_memory`].
    pub nonzero_cpu_memory: (i128, i128),
}

impl PodUsage {
    /// The usage of a pod.
    pub fn of(pod: &Pod) -> PodUsage {
        PodUsage {
            requests: resources::pod_requests(pod),
            nonzero_cpu_memory: resources::nonzero_cpu_memory(pod),
        }
    }
}

/// A node and what the pods on it (bound or assumed) already take.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The node.
    pub node: Node,
    /// Sum of the requests of its non-terminal pods.
    pub requested: Resources,
    /// cpu and memory requested, with kube-scheduler's non-zero defaults
    /// (for scoring).
    pub nonzero_requested: (i128, i128),
    /// How many pods it runs.
    pub pod_count: usize,
}

impl NodeInfo {
    /// A node with no pods yet.
    pub fn new(node: Node) -> NodeInfo {
        NodeInfo {
            node,
            requested: Resources::new(),
            nonzero_requested: (0, 0),
            pod_count: 0,
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }

    /// Counts a pod as running here.
    pub fn add_pod(&mut self, pod: &Pod) {
        self.add_usage(&PodUsage::of(pod));
    }

    /// Counts a pod as running here, from its precomputed usage.
    pub fn add_usage(&mut self, usage: &PodUsage) {
        for (k, v) in &usage.requests {
            let e = self.requested.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
        let (cpu, memory) = usage.nonzero_cpu_memory;
        self.nonzero_requested.0 = self.nonzero_requested.0.saturating_add(cpu);
        self.nonzero_requested.1 = self.nonzero_requested.1.saturating_add(memory);
        self.pod_count = self.pod_count.saturating_add(1);
    }

    fn allocatable(&self) -> Resources {
        resources::resource_list(
            self.node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref()),
        )
    }
}

/// Whether a pod is done (its resources are free again).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty())
        && key != taint.key
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

/// Whether any of the tolerations tolerates the taint (key, operator
/// `Exists`/`Equal`, value, effect; an empty key with `Exists` tolerates
/// every taint).
pub fn tolerations_tolerate(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

fn taint(key: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Default::default()
    }
}

/// The taints that keep pods off the node: its NoSchedule and NoExecute
/// taints, plus the one its Ready condition implies (see the module doc).
pub fn scheduling_taints(node: &Node) -> Vec<Taint> {
    let mut out: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .collect();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    let implied = match ready {
        Some("True") => None,
        Some("Unknown") => Some(TAINT_UNREACHABLE),
        _ => Some(TAINT_NOT_READY),
    };
    if let Some(key) = implied
        && !out.iter().any(|t| t.key == key)
    {
        out.push(taint(key));
    }
    out
}

fn requirement_matches(
    r: &NodeSelectorRequirement,
    value_of: impl Fn(&str) -> Option<String>,
) -> bool {
    let value = value_of(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(want)) = (
                value.as_deref().and_then(int),
                values.first().and_then(|v| int(v)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        // An empty term selects nothing.
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, |k| labels.get(k).cloned()))
        && fields.iter().all(|r| {
            requirement_matches(r, |k| {
                (k == "metadata.name").then(|| node.metadata.name.clone().unwrap_or_default())
            })
        })
}

/// Whether the node satisfies the pod's `nodeSelector` and required node
/// affinity (any term; all requirements of a term).
pub fn matches_node_affinity(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = &pod.spec else { return true };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some(selector) = &spec.node_selector
        && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node)),
    }
}

/// The NodeResourcesFit reasons: "Too many pods", then "Insufficient <r>"
/// for cpu, memory, ephemeral-storage and every other requested resource
/// (by name) that does not fit; resources in `ignored` are left to an
/// extender.
pub fn insufficient_resources(
    pod_requests: &Resources,
    info: &NodeInfo,
    ignored: &BTreeSet<String>,
) -> Vec<String> {
    let alloc = info.allocatable();
    let mut reasons = Vec::new();
    let allowed_pods = alloc.get(PODS).copied().unwrap_or(0) / 1000;
    if i128::try_from(info.pod_count)
        .unwrap_or(i128::MAX)
        .saturating_add(1)
        > allowed_pods
    {
        reasons.push(REASON_TOO_MANY_PODS.to_owned());
    }
    let mut check = |name: &str, want: i128| {
        if want <= 0 || ignored.contains(name) {
            return;
        }
        let free = alloc
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(info.requested.get(name).copied().unwrap_or(0));
        if want > free {
            reasons.push(format!("Insufficient {name}"));
        }
    };
    for name in [CPU, MEMORY, EPHEMERAL_STORAGE] {
        check(name, pod_requests.get(name).copied().unwrap_or(0));
    }
    for (name, want) in pod_requests {
        if ![CPU, MEMORY, EPHEMERAL_STORAGE, PODS].contains(&name.as_str()) {
            check(name, *want);
        }
    }
    reasons
}

/// Runs the scheduler's own filters on one node; `None` when the pod fits.
pub fn filter_node(
    pod: &Pod,
    pod_requests: &Resources,
    info: &NodeInfo,
    ignored: &BTreeSet<String>,
) -> Option<NodeStatus> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let cordoned = info
        .node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if cordoned && !tolerations_tolerate(&tolerations, &taint(TAINT_UNSCHEDULABLE)) {
        return Some(NodeStatus::unresolvable(REASON_UNSCHEDULABLE));
    }
    if let Some(t) = scheduling_taints(&info.node)
        .into_iter()
        .find(|t| !tolerations_tolerate(&tolerations, t))
    {
        return Some(NodeStatus::unresolvable(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            t.key,
            t.value.as_deref().unwrap_or("")
        )));
    }
    if !matches_node_affinity(pod, &info.node) {
        return Some(NodeStatus::unresolvable(REASON_NODE_AFFINITY));
    }
    let reasons = insufficient_resources(pod_requests, info, ignored);
    if !reasons.is_empty() {
        return Some(NodeStatus {
            reasons,
            unresolvable: false,
        });
    }
    None
}

/// kube-scheduler's histogram of reasons: "<count> <reason>" strings,
/// sorted as strings (so "10 x" sorts before "2 y", as in Go's sort.Strings).
pub fn reason_histogram<'a>(statuses: impl IntoIterator<Item = &'a NodeStatus>) -> Vec<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for s in statuses {
        for r in &s.reasons {
            *counts.entry(r.as_str()).or_insert(0) += 1;
        }
    }
    let mut out: Vec<String> = counts
        .into_iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect();
    out.sort();
    out
}

/// "0/N nodes are available: <histogram>." (the histogram left out when
/// empty).
pub fn nodes_available_message<'a>(
    num_all_nodes: usize,
    statuses: impl IntoIterator<Item = &'a NodeStatus>,
) -> String {
    let mut msg = format!("0/{num_all_nodes} nodes are available:");
    let hist = reason_histogram(statuses);
    if !hist.is_empty() {
        msg.push_str(&format!(" {}.", hist.join(", ")));
    }
    msg
}

/// What DefaultPreemption adds after the filters failed: the stand-in never
/// preempts, so each failed node gets "Preemption is not helpful" when its
/// failure is unresolvable, else "No preemption victims found".
pub fn preemption_message(pod: &Pod, num_all_nodes: usize, statuses: &[&NodeStatus]) -> String {
    let never = pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never");
    if never {
        return "preemption: not eligible due to preemptionPolicy=Never.".to_owned();
    }
    let notes: Vec<NodeStatus> = statuses
        .iter()
        .map(|s| NodeStatus {
            reasons: vec![
                if s.unresolvable {
                    PREEMPTION_NOT_HELPFUL
                } else {
                    PREEMPTION_NO_VICTIMS
                }
                .to_owned(),
            ],
            unresolvable: true,
        })
        .collect();
    format!(
        "preemption: {}",
        nodes_available_message(num_all_nodes, &notes)
    )
}

/// The whole FailedScheduling message for a pod no node fits.
pub fn fit_error_message(
    pod: &Pod,
    num_all_nodes: usize,
    statuses: &BTreeMap<String, NodeStatus>,
) -> String {
    let all: Vec<&NodeStatus> = statuses.values().collect();
    format!(
        "{} {}",
        nodes_available_message(num_all_nodes, all.iter().copied()),
        preemption_message(pod, num_all_nodes, &all)
    )
}

/// NodeResourcesFit's LeastAllocated score (cpu and memory, equal
/// weights), 0–[`MAX_NODE_SCORE`]: emptier nodes score higher.
pub fn least_allocated_score(pod: &Pod, info: &NodeInfo) -> i64 {
    let alloc = info.allocatable();
    let (pod_cpu, pod_mem) = resources::nonzero_cpu_memory(pod);
    let one = |name: &str, requested: i128| -> i128 {
        let capacity = alloc.get(name).copied().unwrap_or(0);
        if capacity <= 0 || requested > capacity {
            return 0;
        }
        // Share of the capacity left, in parts per MAX_NODE_SCORE; the
        // division comes first where the product would not fit.
        let left = capacity.saturating_sub(requested.max(0));
        match left.checked_mul(i128::from(MAX_NODE_SCORE)) {
            Some(product) => product / capacity,
            None => left / (capacity / i128::from(MAX_NODE_SCORE)).max(1),
        }
        .min(i128::from(MAX_NODE_SCORE))
    };
    let total = one(CPU, info.nonzero_requested.0.saturating_add(pod_cpu)).saturating_add(one(
        MEMORY,
        info.nonzero_requested.1.saturating_add(pod_mem),
    ));
    i64::try_from(total / 2).unwrap_or(0)
}

/// The node with the highest total score. kube-scheduler picks at random
/// among equal scores; the stand-in takes the first name in sort order, so
/// runs are reproducible.
pub fn select_host(scores: &BTreeMap<String, i64>) -> Option<String> {
    let mut best: Option<(&String, i64)> = None;
    for (name, score) in scores {
        if best.is_none_or(|(_, s)| *score > s) {
            best = Some((name, *score));
        }
    }
    best.map(|(n, _)| n.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, Container, NodeAffinity, NodeCondition, NodeSelector, NodeSpec,
        NodeStatus as K8sNodeStatus, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, alloc: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(K8sNodeStatus {
                allocatable: Some(
                    alloc
                        .iter()
                        .map(|(k, v)| ((*k).into(), Quantity((*v).into())))
                        .collect(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn pod(requests: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            requests
                                .iter()
                                .map(|(k, v)| ((*k).into(), Quantity((*v).into())))
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const STD: &[(&str, &str)] = &[
        ("cpu", "4"),
        ("memory", "8Gi"),
        ("pods", "110"),
        ("example.com/dev", "2"),
    ];

    fn check(p: &Pod, info: &NodeInfo) -> Option<NodeStatus> {
        filter_node(p, &resources::pod_requests(p), info, &BTreeSet::new())
    }

    #[test]
    fn a_fitting_pod_passes() {
        let info = NodeInfo::new(node("n1", STD));
        assert_eq!(
            check(&pod(&[("cpu", "1"), ("example.com/dev", "2")]), &info),
            None
        );
    }

    #[test]
    fn resources_already_taken_count() {
        let mut info = NodeInfo::new(node("n1", STD));
        info.add_pod(&pod(&[("cpu", "3500m"), ("example.com/dev", "1")]));
        let s = check(
            &pod(&[("cpu", "1"), ("memory", "1Gi"), ("example.com/dev", "2")]),
            &info,
        )
        .expect("must not fit");
        assert_eq!(
            s.reasons,
            vec!["Insufficient cpu", "Insufficient example.com/dev"]
        );
        assert!(!s.unresolvable);
        // An extended resource the node does not have at all.
        let s = check(
            &pod(&[("other.io/x", "1")]),
            &NodeInfo::new(node("n1", STD)),
        )
        .expect("no fit");
        assert_eq!(s.reasons, vec!["Insufficient other.io/x"]);
        // Ignored by the scheduler (an extender manages it).
        let ignored: BTreeSet<String> = ["other.io/x".to_owned()].into();
        let p = pod(&[("other.io/x", "1")]);
        assert_eq!(
            filter_node(
                &p,
                &resources::pod_requests(&p),
                &NodeInfo::new(node("n1", STD)),
                &ignored
            ),
            None
        );
    }

    #[test]
    fn pod_count_is_checked() {
        let mut info = NodeInfo::new(node("n1", &[("cpu", "4"), ("pods", "1")]));
        assert_eq!(check(&pod(&[]), &info), None);
        info.add_pod(&pod(&[]));
        assert_eq!(
            check(&pod(&[]), &info).expect("full").reasons,
            vec!["Too many pods"]
        );
        let no_pods = NodeInfo::new(node("n2", &[("cpu", "4")]));
        assert_eq!(
            check(&pod(&[]), &no_pods).expect("none allowed").reasons,
            vec!["Too many pods"]
        );
    }

    #[test]
    fn taints_and_tolerations() {
        let mut n = node("n1", STD);
        n.spec = Some(NodeSpec {
            taints: Some(vec![
                Taint {
                    key: "soft".into(),
                    effect: "PreferNoSchedule".into(),
                    ..Default::default()
                },
                Taint {
                    key: "gpu".into(),
                    value: Some("yes".into()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        });
        let info = NodeInfo::new(n);
        let mut p = pod(&[]);
        assert_eq!(
            check(&p, &info).expect("tainted").reasons,
            vec!["node(s) had untolerated taint {gpu: yes}"]
        );
        let tol =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                value: value.map(Into::into),
                effect: effect.map(Into::into),
                ..Default::default()
            };
        let cases = [
            (
                tol(Some("gpu"), "Equal", Some("yes"), Some("NoSchedule")),
                true,
            ),
            (tol(Some("gpu"), "Equal", Some("no"), None), false),
            (tol(Some("gpu"), "Exists", None, None), true),
            (tol(Some("gpu"), "Exists", None, Some("NoExecute")), false),
            (tol(None, "Exists", None, None), true),
            (tol(Some("other"), "Exists", None, None), false),
        ];
        for (t, fits) in cases {
            p.spec.as_mut().expect("spec").tolerations = Some(vec![t.clone()]);
            assert_eq!(check(&p, &info).is_none(), fits, "{t:?}");
        }
    }

    #[test]
    fn cordoned_and_not_ready_nodes() {
        let mut n = node("n1", STD);
        n.spec.as_mut().expect("spec").unschedulable = Some(true);
        let s = check(&pod(&[]), &NodeInfo::new(n)).expect("cordoned");
        assert_eq!(s, NodeStatus::unresolvable("node(s) were unschedulable"));
        let mut n = node("n1", STD);
        n.status
            .as_mut()
            .expect("status")
            .conditions
            .as_mut()
            .expect("c")[0]
            .status = "False".into();
        let s = check(&pod(&[]), &NodeInfo::new(n.clone())).expect("not ready");
        assert_eq!(
            s.reasons,
            vec!["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"]
        );
        n.status.as_mut().expect("status").conditions = None;
        assert!(
            check(&pod(&[]), &NodeInfo::new(n.clone())).is_some(),
            "no Ready condition"
        );
        n.status.as_mut().expect("status").conditions = Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "Unknown".into(),
            ..Default::default()
        }]);
        let s = check(&pod(&[]), &NodeInfo::new(n)).expect("unreachable");
        assert_eq!(
            s.reasons,
            vec!["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]
        );
    }

    #[test]
    fn node_selector_and_affinity() {
        let mut n = node("n1", STD);
        n.metadata.labels = Some(
            [
                ("zone".to_owned(), "a".to_owned()),
                ("gen".to_owned(), "5".to_owned()),
            ]
            .into(),
        );
        let info = NodeInfo::new(n);
        let mut p = pod(&[]);
        p.spec.as_mut().expect("spec").node_selector =
            Some([("zone".to_owned(), "b".to_owned())].into());
        assert_eq!(
            check(&p, &info).expect("selector").reasons,
            vec![REASON_NODE_AFFINITY]
        );
        p.spec.as_mut().expect("spec").node_selector =
            Some([("zone".to_owned(), "a".to_owned())].into());
        assert_eq!(check(&p, &info), None);
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).into()).collect()),
        };
        let cases = [
            (vec![req("zone", "In", &["a", "c"])], true),
            (vec![req("zone", "NotIn", &["a"])], false),
            (vec![req("missing", "NotIn", &["a"])], true),
            (vec![req("zone", "Exists", &[])], true),
            (vec![req("zone", "DoesNotExist", &[])], false),
            (vec![req("gen", "Gt", &["4"])], true),
            (vec![req("gen", "Lt", &["4"])], false),
            (
                vec![req("zone", "In", &["a"]), req("gen", "In", &["6"])],
                false,
            ),
            (vec![], false),
        ];
        for (exprs, fits) in cases {
            p.spec.as_mut().expect("spec").affinity = Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(exprs.clone()),
                            match_fields: None,
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
            assert_eq!(check(&p, &info).is_none(), fits, "{exprs:?}");
        }
    }

    #[test]
    fn message_has_kube_scheduler_shape() {
        // The example of the issue, written out by hand.
        let statuses: BTreeMap<String, NodeStatus> = [
            (
                "n1".to_owned(),
                NodeStatus {
                    reasons: vec!["Insufficient example.com/dev".into()],
                    unresolvable: false,
                },
            ),
            (
                "n2".to_owned(),
                NodeStatus::unresolvable(REASON_NODE_AFFINITY),
            ),
            (
                "n3".to_owned(),
                NodeStatus::unresolvable(REASON_NODE_AFFINITY),
            ),
        ]
        .into();
        assert_eq!(
            fit_error_message(&pod(&[]), 3, &statuses),
            "0/3 nodes are available: 1 Insufficient example.com/dev, 2 node(s) didn't match Pod's node affinity/selector. \
             preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling."
        );
        let mut never = pod(&[]);
        never.spec.as_mut().expect("spec").preemption_policy = Some("Never".into());
        assert_eq!(
            fit_error_message(&never, 3, &statuses),
            "0/3 nodes are available: 1 Insufficient example.com/dev, 2 node(s) didn't match Pod's node affinity/selector. \
             preemption: not eligible due to preemptionPolicy=Never."
        );
    }

    #[test]
    fn histogram_sorts_as_strings() {
        let mut statuses = Vec::new();
        for _ in 0..10 {
            statuses.push(NodeStatus::unresolvable("z reason"));
        }
        statuses.push(NodeStatus::unresolvable("a reason"));
        statuses.push(NodeStatus::unresolvable("a reason"));
        statuses.push(NodeStatus {
            reasons: vec!["Insufficient cpu".into(), "Insufficient memory".into()],
            unresolvable: false,
        });
        assert_eq!(
            reason_histogram(&statuses),
            vec![
                "1 Insufficient cpu",
                "1 Insufficient memory",
                "10 z reason",
                "2 a reason"
            ]
        );
    }

    #[test]
    fn extreme_quantities_neither_panic_nor_fit() {
        let huge = "170141183460469231731687303715884105";
        let mut p = pod(&[]);
        let spec = p.spec.as_mut().expect("spec");
        spec.containers.push(spec.containers[0].clone());
        for c in &mut spec.containers {
            c.resources = pod(&[("cpu", huge)]).spec.expect("spec").containers[0]
                .resources
                .clone();
        }
        let info = NodeInfo::new(node("n1", STD));
        assert_eq!(
            check(&p, &info).expect("no fit").reasons,
            vec!["Insufficient cpu"]
        );
        // Counting such pods on a node, and scoring there, saturates.
        let mut full = NodeInfo::new(node(
            "n1",
            &[("cpu", huge), ("memory", huge), ("pods", "9")],
        ));
        full.add_pod(&p);
        full.add_pod(&p);
        // cpu over capacity scores 0, memory (only the 200 MiB defaults) 99.
        assert_eq!(least_allocated_score(&pod(&[("cpu", "1")]), &full), 49);
        // Huge allocatable (clamped to int64 milli-units): 99 as integer
        // division gives it, never above 100.
        let roomy = NodeInfo::new(node(
            "n2",
            &[("cpu", "9e40"), ("memory", "9e40"), ("pods", "9e40")],
        ));
        assert_eq!(least_allocated_score(&pod(&[("cpu", "1")]), &roomy), 99);
        assert_eq!(check(&pod(&[("cpu", "1")]), &roomy), None);
        // Very negative allocatable: free is below zero, nothing fits.
        let negative = NodeInfo::new(node("n3", &[("cpu", "-9e40"), ("pods", "-9e40")]));
        let mut busy = negative.clone();
        busy.add_pod(&pod(&[("cpu", "1")]));
        assert_eq!(
            check(&pod(&[("cpu", "1")]), &busy).expect("no fit").reasons,
            vec!["Too many pods", "Insufficient cpu"]
        );
        assert_eq!(least_allocated_score(&pod(&[("cpu", "1")]), &negative), 0);
    }

    #[test]
    fn scores_and_choice() {
        let empty = NodeInfo::new(node("a", STD));
        let mut busy = NodeInfo::new(node("b", STD));
        busy.add_pod(&pod(&[("cpu", "2"), ("memory", "4Gi")]));
        let p = pod(&[("cpu", "1"), ("memory", "2Gi")]);
        // (4-1)/4 = 75, (8-2)/8 = 75 → 75; busy: (4-3)/4 = 25, (8-6)/8 = 25 → 25.
        assert_eq!(least_allocated_score(&p, &empty), 75);
        assert_eq!(least_allocated_score(&p, &busy), 25);
        let scores: BTreeMap<String, i64> = [
            ("b".to_owned(), 7),
            ("a".to_owned(), 7),
            ("c".to_owned(), 3),
        ]
        .into();
        assert_eq!(select_host(&scores).as_deref(), Some("a"));
        let scores: BTreeMap<String, i64> = [("b".to_owned(), 9), ("a".to_owned(), 7)].into();
        assert_eq!(select_host(&scores).as_deref(), Some("b"));
        assert_eq!(select_host(&BTreeMap::new()), None);
    }
}
