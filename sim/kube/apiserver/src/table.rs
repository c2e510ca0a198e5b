//! Server-side printing: `meta.k8s.io/v1` Table responses, as kubectl asks for
//! with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.
//!
//! The columns and cell values are the ones `kubectl get` shows against a
//! real server for the kinds served here (priority-1 columns appear with
//! `-o wide`). Ages are rendered as kubectl renders durations (`45s`,
//! `3m12s`, `5h`, `2d3h`); cells are computed once, when the Table is
//! built, as the real server does.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::resources::Resource;

/// The content type of a Table response.
pub const TABLE_CONTENT_TYPE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// Whether an `Accept` header asks for a Table (and this server gives one).
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.first().is_some_and(|t| *t == "application/json")
            && params.contains(&"as=Table")
            && params.contains(&"g=meta.k8s.io")
            && params.contains(&"v=v1")
    })
}

/// A Table of `items` (objects of `resource`, as stored), with each row's
/// `object` as PartialObjectMetadata unless `include_object` is `Object`;
/// `list_metadata` is the list's `metadata` (resourceVersion, continue).
pub fn to_table(
    resource: &Resource,
    items: &[serde_json::Value],
    include_object: &str,
    list_metadata: serde_json::Value,
) -> serde_json::Value {
    to_table_at(resource, items, include_object, list_metadata, now())
}

/// The wall clock as a [`Timestamp`] (whole seconds: ages need no more).
fn now() -> Timestamp {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Timestamp::from_second(i64::try_from(seconds).unwrap_or(0)).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// [`to_table`] with ages computed against `now`.
pub fn to_table_at(
    resource: &Resource,
    items: &[Value],
    include_object: &str,
    list_metadata: Value,
    now: Timestamp,
) -> Value {
    let columns = columns(resource.kind);
    let column_definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.kind,
                "format": if c.name == "Name" { "name" } else { "" },
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let cells = cells(resource.kind, item, now);
            let mut row = json!({"cells": cells});
            match include_object {
                "None" => {}
                "Object" => row["object"] = item.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": item.get("metadata").cloned().unwrap_or_else(|| json!({})),
                    })
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_metadata,
        "columnDefinitions": column_definitions,
        "rows": rows,
    })
}

/// One column of a kind's Table.
struct Column {
    name: &'static str,
    /// OpenAPI type of the cells: `string` or `integer`.
    kind: &'static str,
    /// 0: always shown; 1: shown with `-o wide`.
    priority: u8,
    description: &'static str,
}

const fn col(
    name: &'static str,
    kind: &'static str,
    priority: u8,
    description: &'static str,
) -> Column {
    Column {
        name,
        kind,
        priority,
        description,
    }
}

const NAME: Column = col(
    "Name",
    "string",
    0,
    "Name must be unique within a namespace.",
);
const AGE: Column = col(
    "Age",
    "string",
    0,
    "Time since the object was created (metadata.creationTimestamp).",
);

/// The columns of `kind`'s Table, in order.
fn columns(kind: &str) -> Vec<Column> {
    match kind {
        "Pod" => vec![
            NAME,
            col(
                "Ready",
                "string",
                0,
                "Ready containers / containers in the pod.",
            ),
            col(
                "Status",
                "string",
                0,
                "The pod's phase, or why it is not running.",
            ),
            col("Restarts", "string", 0, "Restarts of the pod's containers."),
            AGE,
            col("IP", "string", 1, "IP address of the pod (status.podIP)."),
            col(
                "Node",
                "string",
                1,
                "The node the pod is bound to (spec.nodeName).",
            ),
            col("Nominated Node", "string", 1, "status.nominatedNodeName."),
            col(
                "Readiness Gates",
                "string",
                1,
                "True readiness gates / readiness gates.",
            ),
        ],
        "Node" => vec![
            NAME,
            col(
                "Status",
                "string",
                0,
                "Ready condition, and SchedulingDisabled when cordoned.",
            ),
            col(
                "Roles",
                "string",
                0,
                "The node's roles (node-role.kubernetes.io/<role> labels).",
            ),
            AGE,
            col(
                "Version",
                "string",
                0,
                "Kubelet version (status.nodeInfo.kubeletVersion).",
            ),
            col("Internal-IP", "string", 1, "The node's InternalIP address."),
            col("External-IP", "string", 1, "The node's ExternalIP address."),
            col("OS-Image", "string", 1, "status.nodeInfo.osImage."),
            col(
                "Kernel-Version",
                "string",
                1,
                "status.nodeInfo.kernelVersion.",
            ),
            col(
                "Container-Runtime",
                "string",
                1,
                "status.nodeInfo.containerRuntimeVersion.",
            ),
        ],
        "Namespace" => vec![
            NAME,
            col("Status", "string", 0, "The namespace's phase."),
            AGE,
        ],
        "Event" => vec![
            col(
                "Last Seen",
                "string",
                0,
                "Time since the event was last seen.",
            ),
            col("Type", "string", 0, "Normal or Warning."),
            col("Reason", "string", 0, "Short, machine-readable reason."),
            col(
                "Object",
                "string",
                0,
                "The object the event is about (kind/name).",
            ),
            col(
                "Subobject",
                "string",
                1,
                "The field of the object (involvedObject.fieldPath).",
            ),
            col("Source", "string", 1, "The component that reported it."),
            col("Message", "string", 0, "What happened."),
            col(
                "First Seen",
                "string",
                1,
                "Time since the event was first seen.",
            ),
            col("Count", "string", 1, "How many times it happened."),
            col("Name", "string", 1, "The event's name."),
        ],
        "ConfigMap" => vec![
            NAME,
            col(
                "Data",
                "integer",
                0,
                "Number of entries in data and binaryData.",
            ),
            AGE,
        ],
        "Lease" => vec![
            NAME,
            col("Holder", "string", 0, "spec.holderIdentity."),
            AGE,
        ],
        _ => vec![NAME, AGE],
    }
}

/// The cells of one row, in [`columns`] order.
fn cells(kind: &str, item: &Value, now: Timestamp) -> Vec<Value> {
    let name = json!(str_at(item, &["metadata", "name"]));
    let age = json!(age_of(item.pointer("/metadata/creationTimestamp"), now));
    match kind {
        "Pod" => {
            let row = pod_row(item);
            vec![
                name,
                json!(format!("{}/{}", row.ready, row.total)),
                json!(row.status),
                json!(row.restarts.to_string()),
                age,
                json!(or_none(str_at(item, &["status", "podIP"]))),
                json!(or_none(str_at(item, &["spec", "nodeName"]))),
                json!(or_none(str_at(item, &["status", "nominatedNodeName"]))),
                json!(readiness_gates(item)),
            ]
        }
        "Node" => {
            let info = |field: &str| {
                let v = str_at(item, &["status", "nodeInfo", field]);
                if v.is_empty() {
                    "<unknown>".to_owned()
                } else {
                    v.to_owned()
                }
            };
            vec![
                name,
                json!(node_status(item)),
                json!(node_roles(item)),
                age,
                json!(str_at(item, &["status", "nodeInfo", "kubeletVersion"])),
                json!(node_address(item, "InternalIP")),
                json!(node_address(item, "ExternalIP")),
                json!(info("osImage")),
                json!(info("kernelVersion")),
                json!(info("containerRuntimeVersion")),
            ]
        }
        "Namespace" => vec![name, json!(str_at(item, &["status", "phase"])), age],
        "Event" => event_cells(item, now),
        "ConfigMap" => {
            let count = |field: &str| {
                item.get(field)
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len())
            };
            vec![name, json!(count("data") + count("binaryData")), age]
        }
        "Lease" => vec![name, json!(str_at(item, &["spec", "holderIdentity"])), age],
        _ => vec![name, age],
    }
}

/// The string at `path` in `v`, or `""`.
fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for key in path {
        match cur.get(key) {
            Some(next) => cur = next,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_owned()
    } else {
        s.to_owned()
    }
}

fn array(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// What the Pod row shows besides name and age.
struct PodRow {
    ready: usize,
    total: usize,
    restarts: i64,
    status: String,
}

/// READY, STATUS and RESTARTS of a pod, worked out as kubectl's printer does:
/// the phase (or `status.reason`), overridden by an init container still at
/// work, then by the reason a container is waiting or terminated with;
/// `Terminating` once a deletion is under way.
fn pod_row(pod: &Value) -> PodRow {
    let status = pod.get("status").cloned().unwrap_or(Value::Null);
    let total = array(pod.pointer("/spec/containers")).len();
    let mut reason = str_at(&status, &["phase"]).to_owned();
    if !str_at(&status, &["reason"]).is_empty() {
        reason = str_at(&status, &["reason"]).to_owned();
    }
    let mut restarts = 0i64;
    let mut ready = 0usize;

    let init_total = array(pod.pointer("/spec/initContainers")).len();
    let mut initializing = false;
    for (i, cs) in array(status.get("initContainerStatuses"))
        .iter()
        .enumerate()
    {
        restarts += cs.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
        if let Some(term) = cs.pointer("/state/terminated") {
            if term.get("exitCode").and_then(Value::as_i64) == Some(0) {
                continue;
            }
            reason = terminated_reason(term, "Init:");
        } else if let Some(waiting) = cs.pointer("/state/waiting")
            && !str_at(waiting, &["reason"]).is_empty()
            && str_at(waiting, &["reason"]) != "PodInitializing"
        {
            reason = format!("Init:{}", str_at(waiting, &["reason"]));
        } else {
            reason = format!("Init:{i}/{init_total}");
        }
        initializing = true;
        break;
    }

    if !initializing {
        restarts = 0;
        let mut has_running = false;
        for cs in array(status.get("containerStatuses")).iter().rev() {
            restarts += cs.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
            let waiting_reason = cs
                .pointer("/state/waiting/reason")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_owned();
            } else if let Some(term) = cs.pointer("/state/terminated") {
                reason = terminated_reason(term, "");
            } else if cs.get("ready").and_then(Value::as_bool) == Some(true)
                && cs.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = array(status.get("conditions"))
                .iter()
                .any(|c| str_at(c, &["type"]) == "Ready" && str_at(c, &["status"]) == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.to_owned();
        }
    }

    if pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        reason = if str_at(&status, &["reason"]) == "NodeLost" {
            "Unknown".to_owned()
        } else {
            "Terminating".to_owned()
        };
    }
    if reason.is_empty() {
        reason = "Pending".to_owned();
    }
    PodRow {
        ready,
        total,
        restarts,
        status: reason,
    }
}

/// `reason`, or `Signal:N` / `ExitCode:N` when a terminated state gives none.
fn terminated_reason(term: &Value, prefix: &str) -> String {
    let reason = str_at(term, &["reason"]);
    if !reason.is_empty() {
        return format!("{prefix}{reason}");
    }
    match term.get("signal").and_then(Value::as_i64) {
        Some(signal) if signal != 0 => format!("{prefix}Signal:{signal}"),
        _ => format!(
            "{prefix}ExitCode:{}",
            term.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
        ),
    }
}

/// `<true gates>/<gates>`, or `<none>` when the pod has no readiness gates.
fn readiness_gates(pod: &Value) -> String {
    let gates = array(pod.pointer("/spec/readinessGates"));
    if gates.is_empty() {
        return "<none>".to_owned();
    }
    let conditions = array(pod.pointer("/status/conditions"));
    let true_count = gates
        .iter()
        .filter(|g| {
            conditions.iter().any(|c| {
                str_at(c, &["type"]) == str_at(g, &["conditionType"])
                    && str_at(c, &["status"]) == "True"
            })
        })
        .count();
    format!("{true_count}/{}", gates.len())
}

/// `Ready`, `NotReady` or `Unknown`, with `,SchedulingDisabled` when cordoned.
fn node_status(node: &Value) -> String {
    let ready = array(node.pointer("/status/conditions"))
        .iter()
        .find(|c| str_at(c, &["type"]) == "Ready")
        .map(|c| str_at(c, &["status"]));
    let mut status = match ready {
        Some("True") => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }
    .to_owned();
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    status
}

/// The roles named by `node-role.kubernetes.io/<role>` and
/// `kubernetes.io/role` labels, sorted, comma-separated; `<none>` if none.
fn node_roles(node: &Value) -> String {
    let mut roles: Vec<String> = Vec::new();
    if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
        for (key, value) in labels {
            if let Some(role) = key.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.push(role.to_owned());
                }
            } else if key == "kubernetes.io/role"
                && let Some(role) = value.as_str()
                && !role.is_empty()
            {
                roles.push(role.to_owned());
            }
        }
    }
    roles.sort();
    roles.dedup();
    if roles.is_empty() {
        "<none>".to_owned()
    } else {
        roles.join(",")
    }
}

/// The first address of type `kind`, or `<none>`.
fn node_address(node: &Value, kind: &str) -> String {
    array(node.pointer("/status/addresses"))
        .iter()
        .find(|a| str_at(a, &["type"]) == kind)
        .map(|a| str_at(a, &["address"]).to_owned())
        .unwrap_or_else(|| "<none>".to_owned())
}

fn event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let first = ev.pointer("/firstTimestamp").filter(|v| !v.is_null());
    let last = ev
        .pointer("/lastTimestamp")
        .filter(|v| !v.is_null())
        .or_else(|| ev.pointer("/eventTime").filter(|v| !v.is_null()))
        .or(first)
        .or_else(|| ev.pointer("/metadata/creationTimestamp"));
    let first = first.or(last);
    let count = ev.get("count").and_then(Value::as_i64).unwrap_or(1);
    let mut last_seen = age_of(last, now);
    let first_seen = age_of(first, now);
    if count > 1 {
        last_seen = format!("{last_seen} (x{count} over {first_seen})");
    }
    let object = format!(
        "{}/{}",
        str_at(ev, &["involvedObject", "kind"]).to_lowercase(),
        str_at(ev, &["involvedObject", "name"])
    );
    let mut source = str_at(ev, &["source", "component"]).to_owned();
    if source.is_empty() {
        source = str_at(ev, &["reportingComponent"]).to_owned();
    }
    let host = str_at(ev, &["source", "host"]);
    if !host.is_empty() {
        source = format!("{source}, {host}");
    }
    vec![
        json!(last_seen),
        json!(str_at(ev, &["type"])),
        json!(str_at(ev, &["reason"])),
        json!(object),
        json!(str_at(ev, &["involvedObject", "fieldPath"])),
        json!(source),
        json!(str_at(ev, &["message"]).trim()),
        json!(first_seen),
        json!(count.to_string()),
        json!(str_at(ev, &["metadata", "name"])),
    ]
}

/// The age of an RFC 3339 timestamp as kubectl prints it; `<unknown>` when
/// there is none or it does not parse.
fn age_of(timestamp: Option<&Value>, now: Timestamp) -> String {
    let Some(then) = timestamp
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<Timestamp>().ok())
    else {
        return "<unknown>".to_owned();
    };
    human_duration(now.as_second() - then.as_second())
}

/// A duration in seconds the way kubectl shows ages: two units while they
/// carry information, one unit for longer spans.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = seconds / 3600;
    let days = hours / 24;
    let years = days / 365;
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else if days < 365 * 8 {
        match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        }
    } else {
        format!("{years}y")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    fn now() -> Timestamp {
        "2026-06-01T12:00:00Z".parse().unwrap()
    }

    fn res(plural: &str) -> &'static Resource {
        resources::RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap()
    }

    /// The cells of the one row of a Table of `item`, by column name.
    fn row(plural: &str, item: Value) -> Vec<(String, Value)> {
        let table = to_table_at(res(plural), &[item], "Metadata", json!({}), now());
        let names: Vec<String> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        let cells = table["rows"][0]["cells"].as_array().unwrap().clone();
        assert_eq!(names.len(), cells.len(), "one cell per column");
        names.into_iter().zip(cells).collect()
    }

    fn cell(row: &[(String, Value)], name: &str) -> Value {
        row.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no column {name}"))
            .1
            .clone()
    }

    fn running_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1",
                          "creationTimestamp": "2026-06-01T11:55:00Z", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7",
                "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}}},
                    {"name": "b", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
                ]}
        })
    }

    #[test]
    fn table_request_is_recognised_from_kubectls_accept_header() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
        assert!(!wants_table(
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
        ));
        assert!(!wants_table("application/yaml;as=Table;v=v1;g=meta.k8s.io"));
    }

    #[test]
    fn pod_row_shows_ready_count_waiting_reason_and_restarts() {
        let r = row("pods", running_pod());
        assert_eq!(cell(&r, "Name"), "web");
        assert_eq!(cell(&r, "Ready"), "1/2");
        assert_eq!(cell(&r, "Status"), "CrashLoopBackOff");
        assert_eq!(cell(&r, "Restarts"), "3");
        assert_eq!(cell(&r, "Age"), "5m");
        assert_eq!(cell(&r, "IP"), "10.0.0.7");
        assert_eq!(cell(&r, "Node"), "n1");
        assert_eq!(cell(&r, "Nominated Node"), "<none>");
        assert_eq!(cell(&r, "Readiness Gates"), "<none>");
    }

    #[test]
    fn pod_status_follows_kubectls_rules() {
        let mut pending = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Pending"}});
        assert_eq!(cell(&row("pods", pending.clone()), "Status"), "Pending");
        assert_eq!(cell(&row("pods", pending.clone()), "Ready"), "0/1");
        assert_eq!(cell(&row("pods", pending.clone()), "IP"), "<none>");
        pending["metadata"]["deletionTimestamp"] = json!("2026-06-01T11:59:00Z");
        assert_eq!(cell(&row("pods", pending), "Status"), "Terminating");

        let failed = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "a", "restartCount": 0, "state": {"terminated": {"exitCode": 3}}}]}});
        assert_eq!(cell(&row("pods", failed), "Status"), "ExitCode:3");
        let killed = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}});
        assert_eq!(cell(&row("pods", killed), "Status"), "Signal:9");
        let unschedulable =
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(cell(&row("pods", unschedulable), "Status"), "Pending");
        let evicted = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Failed", "reason": "Evicted"}});
        assert_eq!(cell(&row("pods", evicted), "Status"), "Evicted");
        let init = json!({"metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "i0"}, {"name": "i1"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i0", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                {"name": "i1", "state": {"running": {}}}]}});
        assert_eq!(cell(&row("pods", init), "Status"), "Init:1/2");
        let completed_but_running = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}], "containerStatuses": [
                {"name": "a", "ready": true, "state": {"running": {}}},
                {"name": "b", "ready": false, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        assert_eq!(
            cell(&row("pods", completed_but_running), "Status"),
            "NotReady"
        );
    }

    #[test]
    fn readiness_gates_count_true_conditions() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [],
                "readinessGates": [{"conditionType": "x/a"}, {"conditionType": "x/b"}]},
            "status": {"conditions": [{"type": "x/a", "status": "True"}, {"type": "x/b", "status": "False"}]}});
        assert_eq!(cell(&row("pods", pod), "Readiness Gates"), "1/2");
    }

    #[test]
    fn node_row_shows_status_roles_version_and_wide_columns() {
        let node = json!({"metadata": {"name": "n1", "creationTimestamp": "2026-05-30T12:00:00Z",
                "labels": {"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/gpu": "", "kubernetes.io/hostname": "n1"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "192.168.0.4"}],
                "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian", "kernelVersion": "6.1",
                    "containerRuntimeVersion": "containerd://1.7.24"}}});
        let r = row("nodes", node);
        assert_eq!(cell(&r, "Status"), "Ready,SchedulingDisabled");
        assert_eq!(cell(&r, "Roles"), "gpu,worker");
        assert_eq!(cell(&r, "Age"), "2d");
        assert_eq!(cell(&r, "Version"), "v1.33.0");
        assert_eq!(cell(&r, "Internal-IP"), "192.168.0.4");
        assert_eq!(cell(&r, "External-IP"), "<none>");
        assert_eq!(cell(&r, "Container-Runtime"), "containerd://1.7.24");
        let bare = row("nodes", json!({"metadata": {"name": "n2"}}));
        assert_eq!(cell(&bare, "Status"), "Unknown");
        assert_eq!(cell(&bare, "Roles"), "<none>");
        assert_eq!(cell(&bare, "OS-Image"), "<unknown>");
        assert_eq!(cell(&bare, "Age"), "<unknown>");
    }

    #[test]
    fn namespace_configmap_lease_and_event_rows() {
        let ns = row(
            "namespaces",
            json!({"metadata": {"name": "default", "creationTimestamp": "2026-06-01T11:59:30Z"}, "status": {"phase": "Active"}}),
        );
        assert_eq!(cell(&ns, "Status"), "Active");
        assert_eq!(cell(&ns, "Age"), "30s");
        let cm = row(
            "configmaps",
            json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
        );
        assert_eq!(cell(&cm, "Data"), 3);
        let lease = row(
            "leases",
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "ns/pod/uid"}}),
        );
        assert_eq!(cell(&lease, "Holder"), "ns/pod/uid");
        let ev = row(
            "events",
            json!({"metadata": {"name": "web.1"}, "type": "Warning", "reason": "FailedScheduling",
            "involvedObject": {"kind": "Pod", "name": "web"}, "message": "0/3 nodes are available\n",
            "firstTimestamp": "2026-06-01T11:50:00Z", "lastTimestamp": "2026-06-01T11:59:00Z", "count": 4,
            "source": {"component": "default-scheduler"}}),
        );
        assert_eq!(cell(&ev, "Last Seen"), "60s (x4 over 10m)");
        assert_eq!(cell(&ev, "Type"), "Warning");
        assert_eq!(cell(&ev, "Object"), "pod/web");
        assert_eq!(cell(&ev, "Message"), "0/3 nodes are available");
        assert_eq!(cell(&ev, "Source"), "default-scheduler");
    }

    #[test]
    fn include_object_chooses_what_each_row_carries() {
        let pod = running_pod();
        let meta = to_table_at(
            res("pods"),
            std::slice::from_ref(&pod),
            "Metadata",
            json!({"resourceVersion": "9"}),
            now(),
        );
        assert_eq!(meta["kind"], "Table");
        assert_eq!(meta["metadata"]["resourceVersion"], "9");
        assert_eq!(meta["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(meta["rows"][0]["object"]["metadata"]["uid"], "u-1");
        assert!(meta["rows"][0]["object"].get("spec").is_none());
        let full = to_table_at(
            res("pods"),
            std::slice::from_ref(&pod),
            "Object",
            json!({}),
            now(),
        );
        assert_eq!(full["rows"][0]["object"], pod);
        let none = to_table_at(
            res("pods"),
            std::slice::from_ref(&pod),
            "None",
            json!({}),
            now(),
        );
        assert!(none["rows"][0].get("object").is_none());
        let wide: Vec<u64> = meta["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["priority"].as_u64().unwrap())
            .collect();
        assert_eq!(wide, vec![0, 0, 0, 0, 0, 1, 1, 1, 1]);
        let empty = to_table_at(res("pods"), &[], "Metadata", json!({}), now());
        assert_eq!(empty["rows"], json!([]));
    }

    #[test]
    fn durations_read_as_kubectl_prints_them() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (50 * 3600, "2d2h"),
            (20 * 86400, "20d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs} s");
        }
    }
}
