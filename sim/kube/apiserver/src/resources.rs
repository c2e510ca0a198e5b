//! The resources the stand-in serves: one table, read by the REST handlers,
//! discovery, OpenAPI and the table printer, so each fact about a resource is
//! written once.

/// One REST resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// API group; `""` is the core group (served under `/api/v1`).
    pub group: &'static str,
    /// API version, e.g. `v1`.
    pub version: &'static str,
    /// Kind of one object, e.g. `Pod`.
    pub kind: &'static str,
    /// Plural name in URLs, e.g. `pods`.
    pub plural: &'static str,
    /// Singular name, e.g. `pod`.
    pub singular: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names, e.g. `po`.
    pub short_names: &'static [&'static str],
    /// Subresources served, e.g. `status`, `binding`.
    pub subresources: &'static [&'static str],
    /// Discovery categories (`all` for pods).
    pub categories: &'static [&'static str],
}

impl Resource {
    /// `apiVersion` of its objects: `v1` or `<group>/<version>`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Kind of its lists, e.g. `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

/// The verbs every resource here supports (as discovery names them).
pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Every resource served, core group first.
pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        singular: "namespace",
        namespaced: false,
        short_names: &["ns"],
        subresources: &["status"],
        categories: &[],
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        singular: "node",
        namespaced: false,
        short_names: &["no"],
        subresources: &["status"],
        categories: &[],
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        singular: "pod",
        namespaced: true,
        short_names: &["po"],
        subresources: &["status", "binding"],
        categories: &["all"],
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        namespaced: true,
        short_names: &["ev"],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        singular: "configmap",
        namespaced: true,
        short_names: &["cm"],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        singular: "lease",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        categories: &[],
    },
    // Stored as given (after the typed round trip): no controller acts on
    // them, so a DaemonSet makes no pods, a Service gets no endpoints, RBAC
    // is not enforced. They are here so that Tessera's manifests
    // (packaging/kubernetes/) apply and read back as on a real cluster.
    Resource {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        namespaced: true,
        short_names: &["sa"],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        singular: "service",
        namespaced: true,
        short_names: &["svc"],
        subresources: &[],
        categories: &["all"],
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        singular: "daemonset",
        namespaced: true,
        short_names: &["ds"],
        subresources: &[],
        categories: &["all"],
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        singular: "deployment",
        namespaced: true,
        short_names: &["deploy"],
        subresources: &[],
        categories: &["all"],
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRole",
        plural: "clusterroles",
        singular: "clusterrole",
        namespaced: false,
        short_names: &[],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        namespaced: false,
        short_names: &[],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "Role",
        plural: "roles",
        singular: "role",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "RoleBinding",
        plural: "rolebindings",
        singular: "rolebinding",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        categories: &[],
    },
    Resource {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        namespaced: true,
        short_names: &["pdb"],
        subresources: &[],
        categories: &[],
    },
    // The Prometheus Operator's custom resource, served as if its CRD were
    // installed (a real cluster without that CRD refuses the kind).
    Resource {
        group: "monitoring.coreos.com",
        version: "v1",
        kind: "ServiceMonitor",
        plural: "servicemonitors",
        singular: "servicemonitor",
        namespaced: true,
        short_names: &["smon"],
        subresources: &[],
        categories: &[],
    },
];

/// The resource with this group, version and plural, if served.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The groups served besides core, with their versions, in discovery order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&(r.group, r.version)) {
            groups.push((r.group, r.version));
        }
    }
    groups
}

/// The version the stand-in reports at `/version` (the API types it decodes
/// are Kubernetes 1.33's, from k8s-openapi).
pub const SERVER_VERSION: (&str, &str, &str) = ("1", "33", "v1.33.0-tessera-sim");
