//! `/openapi/v3` for the resources served (what kubectl's validation,
//! `apply` and `explain` read); `/openapi/v2` is not served.
//!
//! What kubectl 1.32 does with these documents (found with `kubectl -v=8`
//! against a scripted server):
//! - `apply`, `create`, `replace` and `edit` validate by default
//!   (`--validate=strict`). kubectl first reads `/openapi/v3`, then the group
//!   version's document, and looks for a `patch` operation carrying the
//!   kind's `x-kubernetes-group-version-kind` with a `fieldValidation` query
//!   parameter. Found: it leaves validation to the server (it sends
//!   `?fieldValidation=Strict`). Not found, or `/openapi/v3` 404: it falls
//!   back to client-side validation against `/openapi/v2`, which it fetches
//!   as **protobuf** (gnostic `openapi_v2.Document`); 404 there fails the
//!   command with "failed to download openapi … turn validation off with
//!   --validate=false". Every served kind therefore has such a `patch`
//!   operation here, and no kubectl command needs `--validate=false`.
//! - `apply` of an object that exists computes a three-way patch. With a
//!   `patch` operation accepting `application/strategic-merge-patch+json` it
//!   builds a strategic merge patch from the v3 schema's
//!   `x-kubernetes-patch-merge-key`s; without one it tries `/openapi/v2`
//!   (404 here, ignored), then uses the patch strategy compiled into kubectl
//!   for the built-in kinds — the authoritative one for every kind served
//!   here. The `patch` operations below therefore list JSON patch and JSON
//!   merge patch bodies only, so that kubectl never builds a strategic merge
//!   patch from the compact schemas of this file (the server still accepts
//!   strategic merge patches: `kubectl patch --type=strategic` works).
//! - `explain` reads the component schemas (`x-kubernetes-group-version-kind`
//!   names the kind): the schemas below carry the fields of each kind that
//!   Tessera, the stand-ins and everyday manifests use, with merge keys on
//!   the lists kubectl merges by key; other fields are accepted (objects
//!   preserve unknown fields) but not described.
//!
//! The schemas are written here from the API's field names, not copied from
//! the Kubernetes OpenAPI files.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{Map, Value, json};

use crate::resources::{RESOURCES, Resource, SERVER_VERSION};

const JSON: &str = "application/json";

/// The body and content type served at `path` with this `Accept` header, or
/// `None` when `path` is not an OpenAPI path or is not served.
pub fn document(path: &str, accept: &str) -> Option<(&'static str, bytes::Bytes)> {
    if !accepts_json(accept) {
        return None;
    }
    documents()
        .get(path.trim_end_matches('/'))
        .map(|body| (JSON, body.clone()))
}

/// Whether a client with this `Accept` header takes JSON (kubectl asks
/// `/openapi/v2` for protobuf only; that is not served).
fn accepts_json(accept: &str) -> bool {
    let accept = accept.trim();
    accept.is_empty()
        || accept.split(',').any(|media| {
            let media = media.split(';').next().unwrap_or("").trim();
            media == JSON || media == "*/*" || media == "application/*"
        })
}

/// Every document served, by path, built once.
fn documents() -> &'static HashMap<String, bytes::Bytes> {
    static DOCUMENTS: OnceLock<HashMap<String, bytes::Bytes>> = OnceLock::new();
    DOCUMENTS.get_or_init(|| {
        let mut docs = HashMap::new();
        let mut index = Map::new();
        for (group, version) in group_versions() {
            let relative = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            let body =
                serde_json::to_vec(&group_version_document(group, version)).unwrap_or_default();
            let url = format!("/openapi/v3/{relative}?hash={:016X}", fnv1a(&body));
            index.insert(relative.clone(), json!({ "serverRelativeURL": url }));
            docs.insert(format!("/openapi/v3/{relative}"), bytes::Bytes::from(body));
        }
        let root = serde_json::to_vec(&json!({ "paths": index })).unwrap_or_default();
        docs.insert("/openapi/v3".to_owned(), bytes::Bytes::from(root));
        docs
    })
}

/// A content hash for the index's URLs (clients cache documents by it).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut gvs: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !gvs.contains(&(r.group, r.version)) {
            gvs.push((r.group, r.version));
        }
    }
    gvs
}

/// The OpenAPI v3 document of one group version: paths and schemas.
fn group_version_document(group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        add_paths(r, &mut paths);
    }
    let mut schemas = Map::new();
    for schema in SCHEMAS {
        schemas.insert(schema_name(schema.name), schema_json(schema));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (tessera-sim stand-in)", "version": SERVER_VERSION.2},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// The paths of one resource: the collection (and for namespaced resources
/// the all-namespaces list), one object, and its subresources.
fn add_paths(r: &Resource, paths: &mut Map<String, Value>) {
    let prefix = if r.group.is_empty() {
        format!("/api/{}", r.version)
    } else {
        format!("/apis/{}/{}", r.group, r.version)
    };
    let scoped = if r.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{prefix}/{}", r.plural)
    };
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let kind_ref = json!({"$ref": format!("#/components/schemas/{}", schema_name(r.kind))});
    let ns_param = if r.namespaced {
        vec![
            json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}}),
        ]
    } else {
        Vec::new()
    };
    let name_param =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let op = |action: &str, id: String, body: Option<Vec<&str>>, extra: &[&str]| -> Value {
        let mut params: Vec<Value> = extra.iter().map(|p| query_param(p)).collect();
        if body.is_some() {
            params.push(query_param("dryRun"));
            params.push(query_param("fieldManager"));
            params.push(query_param("fieldValidation"));
        }
        let mut op = json!({
            "operationId": id,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": params,
            "responses": {"200": {"description": "OK", "content": {JSON: {"schema": kind_ref}}}},
        });
        if let Some(types) = body {
            let content: Map<String, Value> = types
                .into_iter()
                .map(|t| (t.to_owned(), json!({"schema": kind_ref})))
                .collect();
            op["requestBody"] = json!({"required": true, "content": content});
        }
        op
    };
    let id = |verb: &str, suffix: &str| {
        let scope = if r.namespaced { "Namespaced" } else { "" };
        format!(
            "{verb}{}{}{scope}{}{suffix}",
            title(r.group),
            title(r.version),
            r.kind
        )
    };
    let list_params = [
        "labelSelector",
        "fieldSelector",
        "limit",
        "continue",
        "resourceVersion",
        "watch",
    ];
    let patch_types = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
    ];
    paths.insert(
        scoped.clone(),
        json!({
            "parameters": ns_param,
            "get": op("list", id("list", ""), None, &list_params),
            "post": op("post", id("create", ""), Some(vec![JSON]), &[]),
            "delete": op("deletecollection", id("deleteCollection", ""), None, &["labelSelector", "fieldSelector"]),
        }),
    );
    if r.namespaced {
        paths.insert(
            format!("{prefix}/{}", r.plural),
            json!({"get": op("list", format!("list{}{}{}ForAllNamespaces", title(r.group), title(r.version), r.kind), None, &list_params)}),
        );
    }
    let mut item_params = ns_param.clone();
    item_params.push(name_param.clone());
    paths.insert(
        format!("{scoped}/{{name}}"),
        json!({
            "parameters": item_params,
            "get": op("get", id("read", ""), None, &[]),
            "put": op("put", id("replace", ""), Some(vec![JSON]), &[]),
            "patch": op("patch", id("patch", ""), Some(patch_types.clone()), &[]),
            "delete": op("delete", id("delete", ""), None, &["gracePeriodSeconds", "propagationPolicy"]),
        }),
    );
    for sub in r.subresources {
        let path = format!("{scoped}/{{name}}/{sub}");
        let entry = if *sub == "binding" {
            json!({"parameters": item_params, "post": op("post", id("create", "Binding"), Some(vec![JSON]), &[])})
        } else {
            let suffix = title(sub);
            json!({
                "parameters": item_params,
                "get": op("get", id("read", &suffix), None, &[]),
                "put": op("put", id("replace", &suffix), Some(vec![JSON]), &[]),
                "patch": op("patch", id("patch", &suffix), Some(patch_types.clone()), &[]),
            })
        };
        paths.insert(path, entry);
    }
}

fn query_param(name: &str) -> Value {
    let ty = match name {
        "limit" | "gracePeriodSeconds" => "integer",
        "watch" => "boolean",
        _ => "string",
    };
    json!({"name": name, "in": "query", "schema": {"type": ty}, "uniqueItems": true})
}

/// `coordination.k8s.io` → `Coordination`, `v1` → `V1`, `` → `Core`.
fn title(word: &str) -> String {
    let first = word.split('.').next().unwrap_or("");
    if first.is_empty() {
        return "Core".to_owned();
    }
    let mut chars = first.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// One component schema, written compactly: each field is
/// `(name, type, description)` with `type` in a small notation:
/// `string`, `integer`, `boolean`, `object` (free-form), `Time`,
/// `map[T]`, `[]T`, `[]T@key` (a list merged by `key`, as strategic merge
/// patches do), `[]T@` (a list of scalars merged as a set), or the short
/// name of another schema here.
struct Schema {
    name: &'static str,
    description: &'static str,
    /// `(group, version)` for the kinds served (the kind is `name`).
    kind_of: Option<(&'static str, &'static str)>,
    fields: &'static [(&'static str, &'static str, &'static str)],
}

/// The full schema name (`io.k8s.api.core.v1.Pod`) of a short one.
fn schema_name(short: &str) -> String {
    match short {
        "ObjectMeta" | "OwnerReference" | "ManagedFieldsEntry" | "Time" => {
            format!("io.k8s.apimachinery.pkg.apis.meta.v1.{short}")
        }
        "Lease" | "LeaseSpec" => format!("io.k8s.api.coordination.v1.{short}"),
        "DaemonSet" | "Deployment" => format!("io.k8s.api.apps.v1.{short}"),
        "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding" => {
            format!("io.k8s.api.rbac.v1.{short}")
        }
        "PodDisruptionBudget" => format!("io.k8s.api.policy.v1.{short}"),
        "ServiceMonitor" => format!("com.coreos.monitoring.v1.{short}"),
        _ => format!("io.k8s.api.core.v1.{short}"),
    }
}

fn schema_json(schema: &Schema) -> Value {
    let mut properties = Map::new();
    for (name, ty, description) in schema.fields {
        let mut field = type_json(ty);
        field["description"] = json!(description);
        properties.insert((*name).to_owned(), field);
    }
    let mut out = json!({
        "type": "object",
        "description": schema.description,
        "properties": properties,
        // The fields listed are those described, not all there are.
        "x-kubernetes-preserve-unknown-fields": true,
    });
    if let Some((group, version)) = schema.kind_of {
        out["x-kubernetes-group-version-kind"] =
            json!([{"group": group, "version": version, "kind": schema.name}]);
    }
    out
}

fn type_json(ty: &str) -> Value {
    if let Some(inner) = ty.strip_prefix("map[").and_then(|t| t.strip_suffix(']')) {
        return json!({"type": "object", "additionalProperties": type_json(inner)});
    }
    if let Some(item) = ty.strip_prefix("[]") {
        let (item, merge) = match item.split_once('@') {
            Some((item, key)) => (item, Some(key)),
            None => (item, None),
        };
        let mut out = json!({"type": "array", "items": type_json(item)});
        match merge {
            Some("") => out["x-kubernetes-patch-strategy"] = json!("merge"),
            Some(key) => {
                out["x-kubernetes-patch-strategy"] = json!("merge");
                out["x-kubernetes-patch-merge-key"] = json!(key);
                out["x-kubernetes-list-type"] = json!("map");
                out["x-kubernetes-list-map-keys"] = json!([key]);
            }
            None => out["x-kubernetes-list-type"] = json!("atomic"),
        }
        return out;
    }
    match ty {
        "string" | "integer" | "boolean" | "number" => json!({"type": ty}),
        "Time" => json!({"type": "string", "format": "date-time"}),
        "Quantity" => json!({"type": "string", "x-kubernetes-int-or-string": true}),
        "object" => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        other => json!({"$ref": format!("#/components/schemas/{}", schema_name(other))}),
    }
}

const API_VERSION: (&str, &str, &str) = (
    "apiVersion",
    "string",
    "The schema version of this object, e.g. v1.",
);
const KIND: (&str, &str, &str) = ("kind", "string", "The type of this object, e.g. Pod.");
const METADATA: (&str, &str, &str) = (
    "metadata",
    "ObjectMeta",
    "Name, namespace, labels and other metadata.",
);

/// The schemas, each kind's first.
const SCHEMAS: &[Schema] = &[
    Schema {
        name: "Pod",
        description: "A group of containers scheduled together onto one node.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "PodSpec", "What the pod should run."),
            (
                "status",
                "PodStatus",
                "What the pod is doing (written by the kubelet).",
            ),
        ],
    },
    Schema {
        name: "PodSpec",
        description: "The desired state of a pod.",
        kind_of: None,
        fields: &[
            (
                "containers",
                "[]Container@name",
                "The containers of the pod.",
            ),
            (
                "initContainers",
                "[]Container@name",
                "Containers run to completion, in order, before the others.",
            ),
            ("nodeName", "string", "The node the pod is bound to."),
            (
                "nodeSelector",
                "map[string]",
                "Labels a node must carry to run the pod.",
            ),
            (
                "schedulerName",
                "string",
                "The scheduler that places the pod.",
            ),
            ("priorityClassName", "string", "The pod's priority class."),
            ("restartPolicy", "string", "Always, OnFailure or Never."),
            (
                "serviceAccountName",
                "string",
                "The service account the pod runs as.",
            ),
            (
                "terminationGracePeriodSeconds",
                "integer",
                "Seconds between SIGTERM and SIGKILL on deletion.",
            ),
            ("tolerations", "[]Toleration", "Taints the pod tolerates."),
            (
                "volumes",
                "[]Volume@name",
                "Volumes the containers can mount.",
            ),
            (
                "readinessGates",
                "[]object",
                "Extra conditions the pod's readiness waits for.",
            ),
            (
                "hostNetwork",
                "boolean",
                "Whether the pod uses the node's network namespace.",
            ),
            (
                "hostPID",
                "boolean",
                "Whether the pod uses the node's pid namespace.",
            ),
            (
                "shareProcessNamespace",
                "boolean",
                "Whether the containers share one pid namespace.",
            ),
            (
                "runtimeClassName",
                "string",
                "The runtime handler to run the pod with.",
            ),
            ("affinity", "object", "Node and pod affinity rules."),
        ],
    },
    Schema {
        name: "Container",
        description: "One container of a pod.",
        kind_of: None,
        fields: &[
            ("name", "string", "The container's name, unique in the pod."),
            ("image", "string", "The container image."),
            (
                "imagePullPolicy",
                "string",
                "Always, IfNotPresent or Never.",
            ),
            (
                "command",
                "[]string",
                "The entrypoint (replaces the image's).",
            ),
            ("args", "[]string", "Arguments to the entrypoint."),
            ("workingDir", "string", "The working directory."),
            ("env", "[]EnvVar@name", "Environment variables."),
            (
                "ports",
                "[]ContainerPort@containerPort",
                "Ports the container exposes.",
            ),
            (
                "resources",
                "ResourceRequirements",
                "Requests and limits of compute and extended resources.",
            ),
            (
                "volumeMounts",
                "[]VolumeMount@mountPath",
                "Volumes mounted into the container.",
            ),
            (
                "securityContext",
                "object",
                "Security options of the container.",
            ),
        ],
    },
    Schema {
        name: "EnvVar",
        description: "An environment variable.",
        kind_of: None,
        fields: &[
            ("name", "string", "The variable's name."),
            ("value", "string", "The variable's value."),
            (
                "valueFrom",
                "object",
                "Where to read the value from instead.",
            ),
        ],
    },
    Schema {
        name: "ContainerPort",
        description: "A network port of a container.",
        kind_of: None,
        fields: &[
            ("containerPort", "integer", "The port number."),
            ("name", "string", "A name for the port."),
            ("protocol", "string", "TCP, UDP or SCTP."),
        ],
    },
    Schema {
        name: "ResourceRequirements",
        description: "Resources a container asks for and may not exceed.",
        kind_of: None,
        fields: &[
            (
                "limits",
                "map[Quantity]",
                "The most a container may use, e.g. nvidia.com/gpu: 1.",
            ),
            (
                "requests",
                "map[Quantity]",
                "What the scheduler reserves for the container.",
            ),
        ],
    },
    Schema {
        name: "VolumeMount",
        description: "Where a volume appears in a container.",
        kind_of: None,
        fields: &[
            ("name", "string", "The volume's name."),
            ("mountPath", "string", "The path in the container."),
            ("readOnly", "boolean", "Whether the mount is read-only."),
            (
                "subPath",
                "string",
                "A path inside the volume to mount instead of its root.",
            ),
        ],
    },
    Schema {
        name: "Volume",
        description: "A named volume of a pod.",
        kind_of: None,
        fields: &[
            ("name", "string", "The volume's name."),
            ("hostPath", "object", "A file or directory of the node."),
            (
                "emptyDir",
                "object",
                "A scratch directory that lives as long as the pod.",
            ),
            (
                "configMap",
                "object",
                "The entries of a ConfigMap as files.",
            ),
        ],
    },
    Schema {
        name: "Toleration",
        description: "A taint the pod tolerates.",
        kind_of: None,
        fields: &[
            ("key", "string", "The taint key."),
            ("operator", "string", "Exists or Equal."),
            ("value", "string", "The taint value (with Equal)."),
            (
                "effect",
                "string",
                "NoSchedule, PreferNoSchedule or NoExecute.",
            ),
            (
                "tolerationSeconds",
                "integer",
                "How long a NoExecute taint is tolerated.",
            ),
        ],
    },
    Schema {
        name: "PodStatus",
        description: "The observed state of a pod.",
        kind_of: None,
        fields: &[
            (
                "phase",
                "string",
                "Pending, Running, Succeeded, Failed or Unknown.",
            ),
            (
                "conditions",
                "[]PodCondition@type",
                "PodScheduled, Initialized, ContainersReady, Ready.",
            ),
            ("message", "string", "Why the pod is in this state."),
            ("reason", "string", "A one-word reason, e.g. Evicted."),
            ("hostIP", "string", "The IP of the pod's node."),
            ("podIP", "string", "The pod's IP."),
            (
                "nominatedNodeName",
                "string",
                "The node preemption made room on.",
            ),
            ("startTime", "Time", "When the kubelet accepted the pod."),
            (
                "containerStatuses",
                "[]ContainerStatus",
                "One per container.",
            ),
            (
                "initContainerStatuses",
                "[]ContainerStatus",
                "One per init container.",
            ),
            ("qosClass", "string", "Guaranteed, Burstable or BestEffort."),
        ],
    },
    Schema {
        name: "PodCondition",
        description: "One condition of a pod.",
        kind_of: None,
        fields: &[
            ("type", "string", "The condition, e.g. PodScheduled."),
            ("status", "string", "True, False or Unknown."),
            ("reason", "string", "A one-word reason, e.g. Unschedulable."),
            ("message", "string", "What happened, for people."),
            (
                "lastTransitionTime",
                "Time",
                "When the status last changed.",
            ),
            (
                "lastProbeTime",
                "Time",
                "When the condition was last checked.",
            ),
        ],
    },
    Schema {
        name: "ContainerStatus",
        description: "The observed state of one container.",
        kind_of: None,
        fields: &[
            ("name", "string", "The container's name."),
            ("ready", "boolean", "Whether the container is ready."),
            ("started", "boolean", "Whether the container has started."),
            ("restartCount", "integer", "How often it was restarted."),
            ("image", "string", "The image it runs."),
            ("imageID", "string", "The image's id."),
            ("containerID", "string", "<runtime>://<id>."),
            (
                "state",
                "object",
                "waiting, running or terminated, with details.",
            ),
            (
                "lastState",
                "object",
                "The state it was in before the last restart.",
            ),
        ],
    },
    Schema {
        name: "Node",
        description: "A machine pods run on.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "NodeSpec", "How the node is configured."),
            (
                "status",
                "NodeStatus",
                "What the node reports (written by its kubelet).",
            ),
        ],
    },
    Schema {
        name: "NodeSpec",
        description: "The desired state of a node.",
        kind_of: None,
        fields: &[
            ("podCIDR", "string", "The pod IP range of the node."),
            (
                "providerID",
                "string",
                "The node's id at its cloud provider.",
            ),
            (
                "taints",
                "[]Taint",
                "Taints that repel pods which do not tolerate them.",
            ),
            (
                "unschedulable",
                "boolean",
                "Whether new pods may not be placed here (cordoned).",
            ),
        ],
    },
    Schema {
        name: "Taint",
        description: "A mark that repels pods without a matching toleration.",
        kind_of: None,
        fields: &[
            ("key", "string", "The taint key."),
            ("value", "string", "The taint value."),
            (
                "effect",
                "string",
                "NoSchedule, PreferNoSchedule or NoExecute.",
            ),
            ("timeAdded", "Time", "When a NoExecute taint was added."),
        ],
    },
    Schema {
        name: "NodeStatus",
        description: "The observed state of a node.",
        kind_of: None,
        fields: &[
            (
                "capacity",
                "map[Quantity]",
                "Total resources of the node, e.g. tessera.io/gpu.",
            ),
            (
                "allocatable",
                "map[Quantity]",
                "Resources available to pods.",
            ),
            (
                "conditions",
                "[]NodeCondition@type",
                "Ready, MemoryPressure, DiskPressure, PIDPressure.",
            ),
            (
                "addresses",
                "[]NodeAddress@type",
                "Hostname, InternalIP, ExternalIP.",
            ),
            (
                "nodeInfo",
                "NodeSystemInfo",
                "Versions and ids of the node's software.",
            ),
            ("phase", "string", "Deprecated; not set."),
        ],
    },
    Schema {
        name: "NodeCondition",
        description: "One condition of a node.",
        kind_of: None,
        fields: &[
            ("type", "string", "The condition, e.g. Ready."),
            ("status", "string", "True, False or Unknown."),
            ("reason", "string", "A one-word reason."),
            ("message", "string", "What happened, for people."),
            (
                "lastHeartbeatTime",
                "Time",
                "When the kubelet last reported it.",
            ),
            (
                "lastTransitionTime",
                "Time",
                "When the status last changed.",
            ),
        ],
    },
    Schema {
        name: "NodeAddress",
        description: "An address of a node.",
        kind_of: None,
        fields: &[
            ("type", "string", "Hostname, InternalIP or ExternalIP."),
            ("address", "string", "The address."),
        ],
    },
    Schema {
        name: "NodeSystemInfo",
        description: "Versions and ids of a node's software.",
        kind_of: None,
        fields: &[
            ("architecture", "string", "e.g. amd64."),
            ("operatingSystem", "string", "e.g. linux."),
            (
                "osImage",
                "string",
                "The OS release, e.g. Debian GNU/Linux 12.",
            ),
            ("kernelVersion", "string", "uname -r."),
            (
                "containerRuntimeVersion",
                "string",
                "<runtime>://<version>.",
            ),
            ("kubeletVersion", "string", "The kubelet's version."),
            ("kubeProxyVersion", "string", "Deprecated."),
            ("machineID", "string", "/etc/machine-id."),
            ("systemUUID", "string", "The machine's SMBIOS UUID."),
            ("bootID", "string", "Changes on every boot."),
        ],
    },
    Schema {
        name: "Namespace",
        description: "A scope for the names of namespaced objects.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "object", "finalizers."),
            ("status", "object", "phase: Active or Terminating."),
        ],
    },
    Schema {
        name: "Event",
        description: "A report of something that happened to an object.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            (
                "involvedObject",
                "ObjectReference",
                "The object it is about.",
            ),
            ("type", "string", "Normal or Warning."),
            (
                "reason",
                "string",
                "A one-word reason, e.g. FailedScheduling.",
            ),
            ("message", "string", "What happened, for people."),
            ("source", "object", "component and host that reported it."),
            (
                "reportingComponent",
                "string",
                "The component that reported it.",
            ),
            (
                "reportingInstance",
                "string",
                "Which instance of that component.",
            ),
            ("firstTimestamp", "Time", "When it was first seen."),
            ("lastTimestamp", "Time", "When it was last seen."),
            (
                "eventTime",
                "string",
                "When it was first seen, in microseconds.",
            ),
            ("count", "integer", "How many times it happened."),
            ("action", "string", "What was done, or failed."),
        ],
    },
    Schema {
        name: "ObjectReference",
        description: "A reference to another object.",
        kind_of: None,
        fields: &[
            ("apiVersion", "string", "Its apiVersion."),
            ("kind", "string", "Its kind."),
            ("namespace", "string", "Its namespace."),
            ("name", "string", "Its name."),
            ("uid", "string", "Its uid."),
            (
                "resourceVersion",
                "string",
                "Its resourceVersion when referenced.",
            ),
            (
                "fieldPath",
                "string",
                "A field inside it, e.g. spec.containers{main}.",
            ),
        ],
    },
    Schema {
        name: "ConfigMap",
        description: "Configuration data, as string and binary entries.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("data", "map[string]", "UTF-8 entries."),
            ("binaryData", "map[string]", "Binary entries, base64."),
            ("immutable", "boolean", "Whether data may no longer change."),
        ],
    },
    Schema {
        name: "ServiceAccount",
        description: "An identity for the processes of pods.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            (
                "automountServiceAccountToken",
                "boolean",
                "Whether pods get its token mounted.",
            ),
            ("secrets", "[]object", "Secrets of the account."),
            ("imagePullSecrets", "[]object", "Pull secrets of its pods."),
        ],
    },
    Schema {
        name: "Service",
        description: "A stable address for a set of pods.",
        kind_of: Some(("", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "object", "What is wanted."),
            ("status", "object", "What was observed."),
        ],
    },
    Schema {
        name: "DaemonSet",
        description: "One pod on each matching node (no controller runs here).",
        kind_of: Some(("apps", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "object", "What is wanted."),
            ("status", "object", "What was observed."),
        ],
    },
    Schema {
        name: "Deployment",
        description: "Replicated pods (no controller runs here).",
        kind_of: Some(("apps", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "object", "What is wanted."),
            ("status", "object", "What was observed."),
        ],
    },
    Schema {
        name: "ClusterRole",
        description: "Rights across the cluster (not enforced here).",
        kind_of: Some(("rbac.authorization.k8s.io", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("rules", "[]object", "The rights."),
            ("aggregationRule", "object", "Roles whose rules it gathers."),
        ],
    },
    Schema {
        name: "ClusterRoleBinding",
        description: "Grants a cluster role to subjects.",
        kind_of: Some(("rbac.authorization.k8s.io", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("roleRef", "object", "The role granted."),
            ("subjects", "[]object", "Who gets it."),
        ],
    },
    Schema {
        name: "Role",
        description: "Rights in one namespace (not enforced here).",
        kind_of: Some(("rbac.authorization.k8s.io", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("rules", "[]object", "The rights."),
        ],
    },
    Schema {
        name: "RoleBinding",
        description: "Grants a role to subjects in one namespace.",
        kind_of: Some(("rbac.authorization.k8s.io", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("roleRef", "object", "The role granted."),
            ("subjects", "[]object", "Who gets it."),
        ],
    },
    Schema {
        name: "PodDisruptionBudget",
        description: "How many pods of a set may be evicted at once.",
        kind_of: Some(("policy", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "object", "What is wanted."),
            ("status", "object", "What was observed."),
        ],
    },
    Schema {
        name: "ServiceMonitor",
        description: "The Prometheus Operator's scrape target (served as if its CRD were installed).",
        kind_of: Some(("monitoring.coreos.com", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "object", "What is wanted."),
        ],
    },
    Schema {
        name: "Lease",
        description: "A lock held by one holder for a time.",
        kind_of: Some(("coordination.k8s.io", "v1")),
        fields: &[
            API_VERSION,
            KIND,
            METADATA,
            ("spec", "LeaseSpec", "Who holds it and until when."),
        ],
    },
    Schema {
        name: "LeaseSpec",
        description: "The holder and duration of a lease.",
        kind_of: None,
        fields: &[
            ("holderIdentity", "string", "Who holds it."),
            (
                "leaseDurationSeconds",
                "integer",
                "How long a renewal lasts.",
            ),
            (
                "acquireTime",
                "string",
                "When it was acquired (RFC 3339, microseconds).",
            ),
            (
                "renewTime",
                "string",
                "When it was last renewed (RFC 3339, microseconds).",
            ),
            (
                "leaseTransitions",
                "integer",
                "How often the holder changed.",
            ),
        ],
    },
    Schema {
        name: "ObjectMeta",
        description: "Metadata every persisted object carries.",
        kind_of: None,
        fields: &[
            (
                "name",
                "string",
                "Unique within a namespace (or the cluster, for cluster-scoped kinds).",
            ),
            (
                "generateName",
                "string",
                "A prefix the server completes into a unique name.",
            ),
            (
                "namespace",
                "string",
                "The namespace; empty for cluster-scoped kinds.",
            ),
            ("uid", "string", "Unique for all time; set by the server."),
            (
                "resourceVersion",
                "string",
                "Changes on every write; for optimistic concurrency and watches.",
            ),
            ("generation", "integer", "Changes when the spec changes."),
            ("creationTimestamp", "Time", "When the object was created."),
            (
                "deletionTimestamp",
                "Time",
                "When a graceful deletion was requested.",
            ),
            (
                "deletionGracePeriodSeconds",
                "integer",
                "The grace period of that deletion.",
            ),
            (
                "labels",
                "map[string]",
                "Keys and values to select objects by.",
            ),
            ("annotations", "map[string]", "Keys and values for tools."),
            (
                "finalizers",
                "[]string@",
                "What must happen before the object is removed.",
            ),
            (
                "ownerReferences",
                "[]OwnerReference@uid",
                "Objects this one depends on.",
            ),
            (
                "managedFields",
                "[]ManagedFieldsEntry",
                "Which manager set which fields.",
            ),
        ],
    },
    Schema {
        name: "OwnerReference",
        description: "An owner of an object.",
        kind_of: None,
        fields: &[
            ("apiVersion", "string", "The owner's apiVersion."),
            ("kind", "string", "The owner's kind."),
            ("name", "string", "The owner's name."),
            ("uid", "string", "The owner's uid."),
            (
                "controller",
                "boolean",
                "Whether the owner is the managing controller.",
            ),
            (
                "blockOwnerDeletion",
                "boolean",
                "Whether the owner waits for this object on foreground deletion.",
            ),
        ],
    },
    Schema {
        name: "ManagedFieldsEntry",
        description: "The fields one manager set, and when.",
        kind_of: None,
        fields: &[
            ("manager", "string", "The manager's name."),
            ("operation", "string", "Apply or Update."),
            ("apiVersion", "string", "The version the fields are in."),
            ("time", "Time", "When they were last set."),
            ("fieldsType", "string", "FieldsV1."),
            ("fieldsV1", "object", "The fields."),
            ("subresource", "string", "The subresource written, if any."),
        ],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Value {
        let (content_type, body) =
            document(path, "application/json").unwrap_or_else(|| panic!("{path} not served"));
        assert_eq!(content_type, "application/json");
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn index_points_at_every_group_version() {
        let index = get("/openapi/v3");
        let paths = index["paths"].as_object().unwrap();
        let mut keys: Vec<&str> = paths.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            vec![
                "api/v1",
                "apis/apps/v1",
                "apis/coordination.k8s.io/v1",
                "apis/monitoring.coreos.com/v1",
                "apis/policy/v1",
                "apis/rbac.authorization.k8s.io/v1"
            ]
        );
        for (key, entry) in paths {
            let url = entry["serverRelativeURL"].as_str().unwrap();
            let (path, hash) = url.split_once("?hash=").unwrap();
            assert_eq!(path, format!("/openapi/v3/{key}"));
            assert_eq!(hash.len(), 16);
            get(path);
        }
    }

    /// The rule kubectl applies before it leaves validation to the server.
    #[test]
    fn every_kind_has_a_patch_operation_with_field_validation() {
        for r in RESOURCES {
            let doc = if r.group.is_empty() {
                get("/openapi/v3/api/v1")
            } else {
                get(&format!("/openapi/v3/apis/{}/{}", r.group, r.version))
            };
            let found = doc["paths"].as_object().unwrap().values().any(|item| {
                let Some(patch) = item.get("patch") else {
                    return false;
                };
                patch["x-kubernetes-group-version-kind"]
                    == json!({"group": r.group, "version": r.version, "kind": r.kind})
                    && patch["parameters"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
            });
            assert!(
                found,
                "{} has no patch operation with fieldValidation",
                r.kind
            );
        }
    }

    /// kubectl must fall back to its compiled-in patch strategies, not our
    /// compact schemas, when it builds an apply patch.
    #[test]
    fn patch_operations_do_not_offer_strategic_merge() {
        let doc = get("/openapi/v3/api/v1");
        for item in doc["paths"].as_object().unwrap().values() {
            if let Some(patch) = item.get("patch") {
                let content = patch["requestBody"]["content"].as_object().unwrap();
                assert!(!content.contains_key("application/strategic-merge-patch+json"));
                assert!(content.contains_key("application/merge-patch+json"));
            }
        }
    }

    #[test]
    fn schemas_name_their_kinds_and_merge_keys_and_every_ref_resolves() {
        let doc = get("/openapi/v3/api/v1");
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let pod = &schemas["io.k8s.api.core.v1.Pod"];
        assert_eq!(
            pod["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Pod"}])
        );
        let containers = &schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        let env = &schemas["io.k8s.api.core.v1.Container"]["properties"]["env"];
        assert_eq!(env["x-kubernetes-patch-merge-key"], "name");
        let conditions = &schemas["io.k8s.api.core.v1.NodeStatus"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-patch-merge-key"], "type");
        let text = doc.to_string();
        for piece in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(schemas.contains_key(name), "dangling $ref to {name}");
        }
        let lease = get("/openapi/v3/apis/coordination.k8s.io/v1");
        assert_eq!(
            lease["components"]["schemas"]["io.k8s.api.coordination.v1.Lease"]["x-kubernetes-group-version-kind"]
                [0]["group"],
            "coordination.k8s.io"
        );
    }

    #[test]
    fn v2_and_protobuf_only_requests_are_not_served() {
        assert!(document("/openapi/v2", "application/json").is_none());
        assert!(
            document(
                "/openapi/v2",
                "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
            )
            .is_none()
        );
        assert!(
            document(
                "/openapi/v3/api/v1",
                "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"
            )
            .is_none()
        );
        assert!(document("/openapi/v3/api/v1", "application/json, */*").is_some());
        assert!(document("/openapi/v3/apis/batch/v1", "application/json").is_none());
    }
}
