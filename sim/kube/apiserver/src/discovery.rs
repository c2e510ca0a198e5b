//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/<group>`,
//! `/api/v1`, `/apis/<group>/<version>`, built from [`crate::resources::RESOURCES`].
//!
//! Two shapes of the same facts: the legacy documents ([`document`]:
//! `APIVersions`, `APIGroupList`, `APIResourceList`), which every client
//! understands, and aggregated discovery ([`aggregated`]: one
//! `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList` for `/api` and one for
//! `/apis`), which kubectl ≥ 1.30 and client-go ask for first and which
//! saves them one request per group version. A client that asks for the
//! aggregated shape and gets a legacy document with `Content-Type:
//! application/json` falls back to the legacy requests.

use serde_json::{Value, json};

use crate::resources::{self, RESOURCES, Resource, VERBS};

/// Verbs of the `status` subresources (as the real server lists them).
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

/// Verbs of `pods/binding`: a Binding is only ever created.
const BINDING_VERBS: &[&str] = &["create"];

/// The content type of an aggregated discovery answer ([`aggregated`]).
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The JSON document served at `path` (no query), or `None` when `path` is
/// not a discovery path. `server_address` is `host:port` as the client
/// reached the server (for `serverAddressByClientCIDRs`).
pub fn document(path: &str, server_address: &str) -> Option<Value> {
    let path = path.trim_end_matches('/');
    match path {
        "/version" => return Some(version()),
        "/api" => {
            return Some(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
                ],
            }));
        }
        "/apis" => {
            let groups: Vec<Value> = group_names().into_iter().map(api_group).collect();
            return Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}));
        }
        "/api/v1" => return Some(resource_list("", "v1")),
        _ => {}
    }
    let rest = path.strip_prefix("/apis/")?;
    match rest.split_once('/') {
        None => {
            let group = group_names().into_iter().find(|g| *g == rest)?;
            let mut doc = api_group(group);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            Some(doc)
        }
        Some((group, version)) => {
            if group.is_empty()
                || !RESOURCES
                    .iter()
                    .any(|r| r.group == group && r.version == version)
            {
                return None;
            }
            Some(resource_list(group, version))
        }
    }
}

/// Whether an `Accept` header asks for aggregated discovery (an
/// `APIGroupDiscoveryList` of `apidiscovery.k8s.io/v2`).
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.contains(&"g=apidiscovery.k8s.io")
            && params.contains(&"v=v2")
            && params.contains(&"as=APIGroupDiscoveryList")
    })
}

/// The aggregated discovery document (`apidiscovery.k8s.io/v2`
/// `APIGroupDiscoveryList`) for `/api` (the core group) or `/apis` (every
/// other group), or `None` for any other path. Serve it with
/// [`AGGREGATED_CONTENT_TYPE`] when [`wants_aggregated`] says so.
pub fn aggregated(path: &str) -> Option<Value> {
    let items: Vec<Value> = match path.trim_end_matches('/') {
        "/api" => vec![aggregated_group("")],
        "/apis" => group_names().into_iter().map(aggregated_group).collect(),
        _ => return None,
    };
    Some(json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }))
}

/// `version.Info`, as `kubectl version` prints it.
fn version() -> Value {
    let (major, minor, git_version) = resources::SERVER_VERSION;
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": git_version,
        "gitCommit": concat!("tessera-sim-", env!("CARGO_PKG_VERSION")),
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        // Not a Go program; kubectl prints the field as it is.
        "goVersion": "none (Rust stand-in)",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// The groups other than core, each once, in [`RESOURCES`] order.
fn group_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for (group, _) in resources::groups() {
        if !names.contains(&group) {
            names.push(group);
        }
    }
    names
}

/// The versions served of `group`, preferred (first served) first.
fn versions_of(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group) {
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    versions
}

/// One `APIGroup` entry of an `APIGroupList`.
fn api_group(group: &str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .into_iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": versions, "preferredVersion": preferred})
}

/// `APIResourceList` of one group version: each resource, then its subresources.
fn resource_list(group: &str, version: &str) -> Value {
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let mut entries = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        entries.push(entry);
        for sub in r.subresources {
            let (kind, verbs) = subresource_kind_and_verbs(r, sub);
            entries.push(json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    })
}

/// The kind a subresource takes and returns, and its verbs.
fn subresource_kind_and_verbs(r: &Resource, sub: &str) -> (&'static str, &'static [&'static str]) {
    match sub {
        "binding" => ("Binding", BINDING_VERBS),
        _ => (r.kind, STATUS_VERBS),
    }
}

/// One `APIGroupDiscovery` item: the group with all its versions and resources.
fn aggregated_group(group: &'static str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .into_iter()
        .map(|version| {
            let resources: Vec<Value> = RESOURCES
                .iter()
                .filter(|r| r.group == group && r.version == version)
                .map(aggregated_resource)
                .collect();
            json!({"version": version, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
}

/// One `APIResourceDiscovery` entry, subresources nested.
fn aggregated_resource(r: &Resource) -> Value {
    let subresources: Vec<Value> = r
        .subresources
        .iter()
        .map(|sub| {
            let (kind, verbs) = subresource_kind_and_verbs(r, sub);
            let kind_group = if kind == "Binding" { "" } else { r.group };
            json!({
                "subresource": sub,
                "responseKind": {"group": kind_group, "version": r.version, "kind": kind},
                "verbs": verbs,
            })
        })
        .collect();
    let mut entry = json!({
        "resource": r.plural,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        entry["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        entry["categories"] = json!(r.categories);
    }
    if !subresources.is_empty() {
        entry["subresources"] = json!(subresources);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &Value) -> Vec<String> {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn core_resource_list_names_every_core_resource_and_its_subresources() {
        let list = document("/api/v1", "127.0.0.1:1").unwrap();
        assert_eq!(list["kind"], "APIResourceList");
        assert_eq!(list["groupVersion"], "v1");
        let mut got = names(&list);
        got.sort();
        let mut want: Vec<String> = [
            "namespaces",
            "namespaces/status",
            "nodes",
            "nodes/status",
            "pods",
            "pods/status",
            "pods/binding",
            "events",
            "configmaps",
            "serviceaccounts",
            "services",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        want.sort();
        assert_eq!(got, want);
        let pods = &list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["namespaced"], true);
        assert_eq!(pods["kind"], "Pod");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        let verbs = pods["verbs"].as_array().unwrap();
        for v in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            assert!(verbs.contains(&json!(v)), "pods lack verb {v}");
        }
        let binding = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/binding")
            .unwrap();
        assert_eq!(binding["verbs"], json!(["create"]));
        assert_eq!(binding["kind"], "Binding");
        let node_status = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "nodes/status")
            .unwrap();
        assert_eq!(node_status["verbs"], json!(["get", "patch", "update"]));
        assert_eq!(node_status["namespaced"], false);
    }

    #[test]
    fn coordination_group_is_listed_with_its_preferred_version() {
        let apis = document("/apis", "127.0.0.1:1").unwrap();
        assert_eq!(apis["kind"], "APIGroupList");
        let groups = apis["groups"].as_array().unwrap();
        let coordination = groups
            .iter()
            .find(|g| g["name"] == "coordination.k8s.io")
            .unwrap();
        assert_eq!(
            coordination["preferredVersion"],
            json!({"groupVersion": "coordination.k8s.io/v1", "version": "v1"})
        );
        let group = document("/apis/coordination.k8s.io", "x").unwrap();
        assert_eq!(group["kind"], "APIGroup");
        let leases = document("/apis/coordination.k8s.io/v1", "x").unwrap();
        assert_eq!(names(&leases), vec!["leases"]);
        assert_eq!(leases["groupVersion"], "coordination.k8s.io/v1");
    }

    #[test]
    fn api_versions_and_version_info() {
        let api = document("/api", "10.1.2.3:6443").unwrap();
        assert_eq!(api["versions"], json!(["v1"]));
        assert_eq!(
            api["serverAddressByClientCIDRs"][0]["serverAddress"],
            "10.1.2.3:6443"
        );
        let v = document("/version", "x").unwrap();
        assert_eq!(v["major"], "1");
        assert_eq!(v["minor"], "33");
        assert!(v["gitVersion"].as_str().unwrap().starts_with("v1.33."));
        assert_eq!(v["platform"], "linux/amd64");
    }

    #[test]
    fn other_paths_are_not_discovery() {
        for path in [
            "/api/v2",
            "/apis/batch/v1",
            "/apis/batch",
            "/apis/coordination.k8s.io/v9",
            "/api/v1/pods",
            "/healthz",
            "/apis//v1",
        ] {
            assert!(document(path, "x").is_none(), "{path} answered");
        }
    }

    #[test]
    fn aggregated_discovery_carries_the_same_resources() {
        let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(wants_aggregated(accept));
        assert!(!wants_aggregated("application/json, */*"));
        let core = aggregated("/api").unwrap();
        assert_eq!(core["kind"], "APIGroupDiscoveryList");
        let resources = core["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap();
        let pods = resources.iter().find(|r| r["resource"] == "pods").unwrap();
        assert_eq!(pods["scope"], "Namespaced");
        let subs: Vec<&str> = pods["subresources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["subresource"].as_str().unwrap())
            .collect();
        assert_eq!(subs, vec!["status", "binding"]);
        let nodes = resources.iter().find(|r| r["resource"] == "nodes").unwrap();
        assert_eq!(nodes["scope"], "Cluster");
        let apis = aggregated("/apis").unwrap();
        assert_eq!(apis["items"][0]["metadata"]["name"], "coordination.k8s.io");
        assert!(aggregated("/api/v1").is_none());
    }
}
