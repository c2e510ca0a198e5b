//! The shipped Kubernetes manifests (`packaging/kubernetes/`):
//!
//! - every YAML document of every file decodes into its type (k8s-openapi's
//!   for the built-in kinds, strict local structs for the
//!   `KubeSchedulerConfiguration` and the Prometheus Operator's
//!   `ServiceMonitor`) and serializes back to the same JSON: a field the type
//!   does not know (unknown or misspelt) fails with its file, document index
//!   and path;
//! - the files agree with the contract and with each other: ports
//!   31992/31993 in args, probes and Services, ServiceAccounts and bindings,
//!   selectors, the ConfigMap's copy of the cluster config, the extender's
//!   Service address in the scheduler configuration, the device plugin's
//!   rights (exactly what its code uses), and both binaries' args through
//!   their own command-line parsers;
//! - `kubectl apply -f packaging/kubernetes/` against the stand-in API server
//!   creates every object, `kubectl get` returns each, and a second apply
//!   changes nothing. The stand-in runs no controllers: the DaemonSet and
//!   the Deployment make no pods there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use clap::Parser as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_model::contract::cluster;
use tessera_model::sched::config::ClusterConfig;
use tessera_test_support::kube::{StandInApiServer, kubectl_needs, kubectl_stdout};
use tessera_test_support::{Need, require};

/// The folder `kubectl apply -f` takes.
fn manifest_dir() -> PathBuf {
    tessera_test_support::workspace_root().join("packaging/kubernetes")
}

/// `kube-scheduler --config` (kubescheduler.config.k8s.io/v1), the fields
/// Tessera's file uses; anything else is refused.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SchedulerConfiguration {
    api_version: String,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_connection: Option<ClientConnection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    leader_election: Option<LeaderElection>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    profiles: Vec<Profile>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    extenders: Vec<Extender>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClientConnection {
    kubeconfig: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaderElection {
    leader_elect: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Profile {
    scheduler_name: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Extender {
    url_prefix: String,
    filter_verb: String,
    prioritize_verb: String,
    bind_verb: String,
    weight: i64,
    node_cache_capable: bool,
    #[serde(rename = "enableHTTPS")]
    enable_https: bool,
    http_timeout: String,
    ignorable: bool,
    managed_resources: Vec<ManagedResource>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ManagedResource {
    name: String,
    ignored_by_scheduler: bool,
}

/// The Prometheus Operator's `ServiceMonitor` (monitoring.coreos.com/v1),
/// the fields Tessera's file uses; anything else is refused.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace_selector: Option<NamespaceSelector>,
    endpoints: Vec<Endpoint>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NamespaceSelector {
    match_names: Vec<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Endpoint {
    port: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scheme: Option<String>,
}

/// One YAML document of a file.
#[derive(Debug, Clone)]
struct Doc {
    file: String,
    index: usize,
    value: Value,
}

impl Doc {
    fn at(&self) -> String {
        format!("{} document {}", self.file, self.index)
    }

    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }

    fn typed<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(self.value.clone()).with_context(|| self.at())
    }
}

/// The YAML documents of `text` (empty ones skipped), as JSON.
fn parse_documents(file: &str, text: &str) -> Result<Vec<Doc>> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let yaml = serde_yaml::Value::deserialize(de)
            .with_context(|| format!("{file} document {index}: not YAML"))?;
        if yaml.is_null() {
            continue;
        }
        let value = serde_json::to_value(&yaml)
            .with_context(|| format!("{file} document {index}: not JSON-shaped"))?;
        docs.push(Doc {
            file: file.to_owned(),
            index,
            value,
        });
    }
    Ok(docs)
}

/// Every document of the `*.yaml` files of `dir` (not recursive: what
/// `kubectl apply -f dir` reads).
fn documents_in(dir: &Path) -> Result<Vec<Doc>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| {
        p.is_file()
            && p.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
    });
    files.sort();
    let mut docs = Vec::new();
    for path in files {
        let name = path
            .strip_prefix(tessera_test_support::workspace_root())
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {name}"))?;
        docs.extend(parse_documents(&name, &text)?);
    }
    Ok(docs)
}

fn typed_roundtrip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// `value` through the type its apiVersion and kind name, and back.
fn roundtrip(value: &Value) -> Result<Value, String> {
    let api_version = value["apiVersion"].as_str().unwrap_or("");
    let kind = value["kind"].as_str().unwrap_or("");
    match (api_version, kind) {
        ("v1", "ServiceAccount") => typed_roundtrip::<ServiceAccount>(value),
        ("v1", "Service") => typed_roundtrip::<Service>(value),
        ("v1", "ConfigMap") => typed_roundtrip::<ConfigMap>(value),
        ("apps/v1", "DaemonSet") => typed_roundtrip::<DaemonSet>(value),
        ("apps/v1", "Deployment") => typed_roundtrip::<Deployment>(value),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => typed_roundtrip::<ClusterRole>(value),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            typed_roundtrip::<ClusterRoleBinding>(value)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => typed_roundtrip::<Role>(value),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => typed_roundtrip::<RoleBinding>(value),
        ("policy/v1", "PodDisruptionBudget") => typed_roundtrip::<PodDisruptionBudget>(value),
        ("monitoring.coreos.com/v1", "ServiceMonitor") => typed_roundtrip::<ServiceMonitor>(value),
        ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration") => {
            typed_roundtrip::<SchedulerConfiguration>(value)
        }
        _ => Err(format!(
            "apiVersion {api_version:?} kind {kind:?}: no type known to this test"
        )),
    }
}

/// The first difference between `given` and `back`, as `path: what`.
fn first_difference(given: &Value, back: &Value, path: &str) -> Option<String> {
    let here = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (given, back) {
        (Value::Object(g), Value::Object(b)) => {
            for (key, value) in g {
                match b.get(key) {
                    None => {
                        return Some(format!(
                            "{}: not kept by the type (unknown or misspelt field)",
                            here(key)
                        ));
                    }
                    Some(inner) => {
                        if let Some(d) = first_difference(value, inner, &here(key)) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys()
                .find(|k| !g.contains_key(*k))
                .map(|k| format!("{}: added by the type", here(k)))
        }
        (Value::Array(g), Value::Array(b)) if g.len() == b.len() => g
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (g, b))| first_difference(g, b, &format!("{path}[{i}]"))),
        _ if given == back => None,
        _ => Some(format!("{path}: {given} came back as {back}")),
    }
}

/// Every problem of `docs`' round trips, one line each.
fn roundtrip_problems(docs: &[Doc]) -> Vec<String> {
    docs.iter()
        .filter_map(|doc| match roundtrip(&doc.value) {
            Err(e) => Some(format!("{}: {e}", doc.at())),
            Ok(back) => {
                first_difference(&doc.value, &back, "").map(|d| format!("{}: {d}", doc.at()))
            }
        })
        .collect()
}

/// The objects of the folder `kubectl apply` takes, and the scheduler
/// configuration.
fn all_documents() -> Result<(Vec<Doc>, Vec<Doc>)> {
    let dir = manifest_dir();
    let objects = documents_in(&dir)?;
    let config = documents_in(&dir.join("config"))?
        .into_iter()
        .filter(|d| d.value.get("kind").is_some())
        .collect();
    Ok((objects, config))
}

#[test]
fn every_document_round_trips_through_its_type() -> Result<()> {
    let (objects, config) = all_documents()?;
    let kinds: BTreeSet<&str> = objects.iter().map(Doc::kind).collect();
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceMonitor",
    ] {
        ensure!(
            kinds.contains(kind),
            "no {kind} in the manifests: {kinds:?}"
        );
    }
    ensure!(
        config
            .iter()
            .any(|d| d.kind() == "KubeSchedulerConfiguration"),
        "no KubeSchedulerConfiguration under config/"
    );
    let mut problems = roundtrip_problems(&objects);
    problems.extend(roundtrip_problems(&config));
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// A misspelt field anywhere is caught, named by file, document and path.
#[test]
fn a_misspelt_field_is_caught_with_its_path() -> Result<()> {
    let dir = manifest_dir();
    let cases = [
        (
            "device-plugin.yaml",
            "      hostPID: true",
            "      hostPid: true",
            "spec.template.spec.hostPid",
        ),
        (
            "scheduler-extender.yaml",
            "          readinessProbe:",
            "          readynessProbe:",
            "spec.template.spec.containers[0].readynessProbe",
        ),
        (
            "node-monitor.yaml",
            "  namespaceSelector:",
            "  namespaceSelecter:",
            "unknown field `namespaceSelecter`",
        ),
        (
            "config/scheduler-config.yaml",
            "    nodeCacheCapable: true",
            "    nodeCacheCapabel: true",
            "unknown field `nodeCacheCapabel`",
        ),
    ];
    for (file, good, bad, want) in cases {
        let text = std::fs::read_to_string(dir.join(file)).with_context(|| file.to_owned())?;
        ensure!(
            text.matches(good).count() == 1,
            "{file}: {good:?} is not there exactly once"
        );
        let docs = parse_documents(file, &text.replace(good, bad))?;
        let problems = roundtrip_problems(&docs);
        ensure!(problems.len() == 1, "{file}: {problems:?}");
        let line = &problems[0];
        ensure!(
            line.starts_with(&format!("{file} document ")) && line.contains(want),
            "{file}: {line:?} does not name {want:?}"
        );
    }
    Ok(())
}

/// Finds the one document of `kind` named `name`.
fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> Result<&'a Doc> {
    let found: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == kind && d.name() == name)
        .collect();
    match found[..] {
        [one] => Ok(one),
        _ => bail!("{} {kind} named {name}", found.len()),
    }
}

fn pod_spec_of(doc: &Doc) -> Result<PodSpec> {
    let spec = match doc.kind() {
        "DaemonSet" => doc.typed::<DaemonSet>()?.spec.map(|s| s.template),
        "Deployment" => doc.typed::<Deployment>()?.spec.map(|s| s.template),
        other => bail!("{other} has no pod template"),
    };
    spec.and_then(|t| t.spec)
        .with_context(|| format!("{}: no pod spec", doc.at()))
}

fn template_labels(doc: &Doc) -> BTreeMap<String, String> {
    doc.value["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `selector`'s matchLabels all hold in `labels` (and it has some).
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn port_of(port: &Option<IntOrString>) -> Option<i32> {
    match port {
        Some(IntOrString::Int(p)) => Some(*p),
        _ => None,
    }
}

/// Rights as (group, resource) → verbs.
fn rights(rules: &[PolicyRule]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut map: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in rules {
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                map.entry((g.clone(), r.clone()))
                    .or_default()
                    .extend(rule.verbs.iter().cloned());
            }
        }
    }
    map
}

fn verbs(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Every ServiceAccount a binding or a workload names exists, in its
/// namespace; every roleRef names a role of the manifests.
#[test]
fn service_accounts_and_bindings_agree() -> Result<()> {
    let (docs, _) = all_documents()?;
    let accounts: BTreeSet<(String, String)> = docs
        .iter()
        .filter(|d| d.kind() == "ServiceAccount")
        .map(|d| {
            (
                d.value["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                d.name().to_owned(),
            )
        })
        .collect();
    ensure!(accounts.len() == 2, "{accounts:?}");
    for doc in docs
        .iter()
        .filter(|d| d.kind() == "ClusterRoleBinding" || d.kind() == "RoleBinding")
    {
        let (role_ref, subjects) = if doc.kind() == "RoleBinding" {
            let b: RoleBinding = doc.typed()?;
            (b.role_ref, b.subjects.unwrap_or_default())
        } else {
            let b: ClusterRoleBinding = doc.typed()?;
            (b.role_ref, b.subjects.unwrap_or_default())
        };
        find(&docs, &role_ref.kind, &role_ref.name)
            .with_context(|| format!("{}: roleRef", doc.at()))?;
        ensure!(!subjects.is_empty(), "{}: no subjects", doc.at());
        for s in subjects {
            ensure!(s.kind == "ServiceAccount", "{}: {s:?}", doc.at());
            let key = (s.namespace.clone().unwrap_or_default(), s.name.clone());
            ensure!(
                accounts.contains(&key),
                "{}: no ServiceAccount {key:?}",
                doc.at()
            );
        }
    }
    for (kind, name) in [
        ("DaemonSet", "tessera-device-plugin"),
        ("Deployment", "tessera-scheduler-extender"),
    ] {
        let doc = find(&docs, kind, name)?;
        let account = pod_spec_of(doc)?.service_account_name.unwrap_or_default();
        ensure!(
            accounts.contains(&(cluster::DEFAULT_NAMESPACE.to_owned(), account.clone())),
            "{}: serviceAccountName {account:?}",
            doc.at()
        );
    }
    for doc in &docs {
        if !matches!(doc.kind(), "ClusterRole" | "ClusterRoleBinding") {
            ensure!(
                doc.value["metadata"]["namespace"] == cluster::DEFAULT_NAMESPACE,
                "{}: not in {}",
                doc.at(),
                cluster::DEFAULT_NAMESPACE
            );
        }
    }
    Ok(())
}

/// The device plugin: its rights are exactly what its code uses, its args
/// parse with its own parser and name mounted paths, its probes and the
/// node monitor's Service and ServiceMonitor use port 31992.
#[test]
fn device_plugin_manifest_agrees_with_the_plugin() -> Result<()> {
    let (docs, _) = all_documents()?;
    let name = "tessera-device-plugin";
    let cluster_rights = rights(
        &find(&docs, "ClusterRole", name)?
            .typed::<ClusterRole>()?
            .rules
            .unwrap_or_default(),
    );
    ensure!(
        cluster_rights
            == BTreeMap::from([
                (
                    (String::new(), "pods".to_owned()),
                    verbs(&["get", "list", "watch", "patch"])
                ),
                ((String::new(), "nodes".to_owned()), verbs(&["patch"])),
            ]),
        "ClusterRole {name}: {cluster_rights:?}"
    );
    let role_rights = rights(
        &find(&docs, "Role", name)?
            .typed::<Role>()?
            .rules
            .unwrap_or_default(),
    );
    ensure!(
        role_rights
            == BTreeMap::from([(
                ("coordination.k8s.io".to_owned(), "leases".to_owned()),
                verbs(&["get", "update"])
            )]),
        "Role {name}: {role_rights:?}"
    );

    let ds = find(&docs, "DaemonSet", name)?;
    let pod = pod_spec_of(ds)?;
    ensure!(
        pod.host_pid == Some(true),
        "hostPID: the monitor reads host pids"
    );
    ensure!(pod.host_network != Some(true), "no host network needed");
    let container = pod.containers.first().context("a container")?;
    ensure!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            == Some(true),
        "privileged: NVML and MIG management open host device nodes"
    );
    let args = container.args.clone().unwrap_or_default();
    let parsed = tessera_plugin::cli::Args::try_parse_from(
        std::iter::once("tessera-device-plugin".to_owned()).chain(args.iter().cloned()),
    )
    .map_err(|e| anyhow::anyhow!("the DaemonSet's args: {e}"))?;
    let env_node = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == tessera_model::contract::kubelet::NODE_NAME_ENV)
        .context("NODE_NAME env")?;
    ensure!(
        env_node
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str())
            == Some("spec.nodeName"),
        "NODE_NAME from spec.nodeName"
    );
    let cluster_config = ClusterConfig::parse(&std::fs::read_to_string(
        manifest_dir().join("config/cluster.yaml"),
    )?)
    .map_err(|e| anyhow::anyhow!("config/cluster.yaml: {e}"))?;
    let config = tessera_plugin::cli::resolve(&parsed, Some("gpu-node-1".into()), &cluster_config)
        .map_err(|e| anyhow::anyhow!("the DaemonSet's args: {e}"))?;
    ensure!(
        config.metrics_listen.map(|a| a.port()) == Some(cluster::PLUGIN_METRICS_PORT),
        "--metrics-listen: {:?}",
        config.metrics_listen
    );
    ensure!(config.namespace == cluster::DEFAULT_NAMESPACE);
    ensure!(parsed.config.as_deref() == Some(Path::new(cluster::CONFIG_PATH)));

    // Every other path the plugin works under is mounted from the same host path.
    let mounts: BTreeMap<String, String> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.clone(), m.name.clone()))
        .collect();
    let host_paths: BTreeMap<String, String> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (v.name.clone(), h.path.clone()))
        })
        .collect();
    let same_path = |path: &Path| -> Result<()> {
        let path = path.display().to_string();
        let volume = mounts
            .get(&path)
            .with_context(|| format!("{path} is not mounted: {mounts:?}"))?;
        ensure!(
            host_paths.get(volume) == Some(&path),
            "{path}: volume {volume} is not the host's {path}"
        );
        Ok(())
    };
    for path in [
        config.kubelet_dir.join("device-plugins"),
        config.kubelet_dir.join("pod-resources"),
        config.cdi_dir.clone(),
        config.state_dir.clone(),
        config
            .devices
            .dev_root
            .clone()
            .unwrap_or(config.driver_root.clone())
            .join("dev"),
    ] {
        same_path(&path)?;
    }
    // The driver root is the one path seen elsewhere in the container: the
    // volume behind --driver-root must be the host's --host-driver-root, which
    // is what the specs name.
    let driver_root = config.driver_root.display().to_string();
    let volume = mounts
        .get(&driver_root)
        .with_context(|| format!("--driver-root {driver_root} is not mounted: {mounts:?}"))?;
    ensure!(
        host_paths.get(volume).map(Path::new) == Some(config.host_driver_root.as_path()),
        "--driver-root {driver_root}: volume {volume} is {:?} on the host, not --host-driver-root {}",
        host_paths.get(volume),
        config.host_driver_root.display()
    );
    let config_dir = Path::new(cluster::CONFIG_PATH)
        .parent()
        .context("config dir")?;
    let config_volume = mounts
        .get(config_dir.to_str().context("path")?)
        .context("the cluster config mount")?;
    let config_map = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| &v.name == config_volume)
        .and_then(|v| v.config_map.as_ref())
        .map(|c| c.name.clone());
    ensure!(config_map.as_deref() == Some("tessera-cluster-config"));

    let port = i32::from(cluster::PLUGIN_METRICS_PORT);
    ensure!(
        container
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port == port && p.name.as_deref() == Some("metrics")),
        "containerPort {port} named metrics"
    );
    for (what, probe) in [
        ("liveness", &container.liveness_probe),
        ("readiness", &container.readiness_probe),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .with_context(|| format!("{what} probe"))?;
        ensure!(get.path.as_deref() == Some("/healthz"), "{what}: {get:?}");
        ensure!(get.port == IntOrString::Int(port), "{what}: {get:?}");
    }

    // The node monitor's Service selects the plugin's pods on 31992, and the
    // ServiceMonitor selects that Service by its port's name.
    let svc_doc = find(&docs, "Service", "tessera-node-monitor")?;
    let svc = svc_doc.typed::<Service>()?.spec.context("Service spec")?;
    ensure!(
        selects(
            &svc.selector.clone().unwrap_or_default(),
            &template_labels(ds)
        ),
        "the node monitor's Service does not select the plugin's pods"
    );
    let svc_port = svc.ports.iter().flatten().next().context("a port")?;
    ensure!(svc_port.port == port && port_of(&svc_port.target_port) == Some(port));
    let monitor: ServiceMonitor = find(&docs, "ServiceMonitor", "tessera-node-monitor")?.typed()?;
    let svc_labels: BTreeMap<String, String> = svc_doc
        .typed::<Service>()?
        .metadata
        .labels
        .unwrap_or_default();
    ensure!(
        selects(
            &monitor
                .spec
                .selector
                .match_labels
                .clone()
                .unwrap_or_default(),
            &svc_labels
        ),
        "the ServiceMonitor does not select the Service"
    );
    ensure!(
        monitor
            .spec
            .namespace_selector
            .as_ref()
            .is_some_and(|n| n.match_names == [cluster::DEFAULT_NAMESPACE])
    );
    ensure!(
        monitor
            .spec
            .endpoints
            .iter()
            .any(|e| Some(&e.port) == svc_port.name.as_ref()
                && e.path.as_deref() == Some("/metrics")),
        "{:?}",
        monitor.spec.endpoints
    );
    Ok(())
}

/// The extender: two replicas on different nodes behind a PDB, probes,
/// args through its own parser, the Service at the scheduler
/// configuration's address, the rights bind and the Lease sweep need.
#[test]
fn extender_manifest_agrees_with_the_extender_and_the_scheduler_config() -> Result<()> {
    let (docs, config) = all_documents()?;
    let name = "tessera-scheduler-extender";
    let deploy_doc = find(&docs, "Deployment", name)?;
    let deploy = deploy_doc.typed::<Deployment>()?.spec.context("spec")?;
    ensure!(
        deploy.replicas == Some(2),
        "replicas: {:?}",
        deploy.replicas
    );
    let labels = template_labels(deploy_doc);
    ensure!(selects(
        &deploy.selector.match_labels.clone().unwrap_or_default(),
        &labels
    ));
    let pod = pod_spec_of(deploy_doc)?;
    ensure!(
        pod.host_network != Some(true),
        "reached through its Service"
    );
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .context("required pod anti-affinity")?;
    ensure!(
        anti.iter()
            .any(|t| t.topology_key == "kubernetes.io/hostname"
                && t.label_selector
                    .as_ref()
                    .and_then(|s| s.match_labels.as_ref())
                    .is_some_and(|m| selects(m, &labels))),
        "anti-affinity across nodes against its own pods: {anti:?}"
    );
    let pdb = find(&docs, "PodDisruptionBudget", name)?
        .typed::<PodDisruptionBudget>()?
        .spec
        .context("PDB spec")?;
    ensure!(pdb.min_available == Some(IntOrString::Int(1)));
    ensure!(selects(
        &pdb.selector
            .and_then(|s| s.match_labels)
            .unwrap_or_default(),
        &labels
    ));

    let container = pod.containers.first().context("a container")?;
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|a| a.replace("$(POD_NAME)", "tessera-scheduler-extender-0"))
        .collect();
    let parsed = tessera_extender::cli::Args::try_parse_from(
        std::iter::once("tessera-scheduler-extender".to_owned()).chain(args),
    )
    .map_err(|e| anyhow::anyhow!("the Deployment's args: {e}"))?;
    let port = cluster::EXTENDER_METRICS_PORT;
    ensure!(parsed.listen.port() == port, "--listen {}", parsed.listen);
    ensure!(parsed.namespace == cluster::DEFAULT_NAMESPACE);
    ensure!(parsed.config.as_deref() == Some(Path::new(cluster::CONFIG_PATH)));
    ensure!(parsed.identity.as_deref() == Some("tessera-scheduler-extender-0"));
    let port = i32::from(port);
    for (what, probe, path) in [
        ("readiness", &container.readiness_probe, "/readyz"),
        ("liveness", &container.liveness_probe, "/healthz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .with_context(|| format!("{what} probe"))?;
        ensure!(get.path.as_deref() == Some(path), "{what}: {get:?}");
        ensure!(get.port == IntOrString::Int(port), "{what}: {get:?}");
    }

    // kube-scheduler calls the Service's fixed ClusterIP.
    let svc = find(&docs, "Service", name)?
        .typed::<Service>()?
        .spec
        .context("Service spec")?;
    ensure!(selects(&svc.selector.clone().unwrap_or_default(), &labels));
    let svc_port = svc.ports.iter().flatten().next().context("a port")?;
    ensure!(svc_port.port == port && port_of(&svc_port.target_port) == Some(port));
    let cluster_ip = svc.cluster_ip.clone().context("a fixed clusterIP")?;
    ensure!(
        cluster_ip.parse::<std::net::Ipv4Addr>().is_ok(),
        "{cluster_ip}"
    );
    let sched = config
        .iter()
        .find(|d| d.kind() == "KubeSchedulerConfiguration")
        .context("scheduler configuration")?
        .typed::<SchedulerConfiguration>()?;
    ensure!(sched.extenders.len() == 1);
    let e = &sched.extenders[0];
    ensure!(
        e.url_prefix == format!("http://{cluster_ip}:{port}"),
        "urlPrefix {} is not the Service's {cluster_ip}:{port}",
        e.url_prefix
    );
    ensure!(
        (
            e.filter_verb.as_str(),
            e.prioritize_verb.as_str(),
            e.bind_verb.as_str()
        ) == ("filter", "prioritize", "bind")
    );
    ensure!(e.node_cache_capable && !e.ignorable && !e.enable_https && e.weight > 0);
    ensure!(e.http_timeout == "30s");
    let managed: BTreeMap<&str, bool> = e
        .managed_resources
        .iter()
        .map(|m| (m.name.as_str(), m.ignored_by_scheduler))
        .collect();
    ensure!(
        managed
            == BTreeMap::from([
                ("nvidia.com/gpu", false),
                ("nvidia.com/gpumem", true),
                ("nvidia.com/gpumem-percentage", true),
                ("nvidia.com/gpucores", true),
            ]),
        "{managed:?}"
    );
    ensure!(
        sched
            .client_connection
            .as_ref()
            .map(|c| c.kubeconfig.as_str())
            == Some("/etc/kubernetes/scheduler.conf")
    );
    ensure!(
        sched
            .leader_election
            .as_ref()
            .is_some_and(|l| l.leader_elect)
    );

    let cluster_rights = rights(
        &find(&docs, "ClusterRole", name)?
            .typed::<ClusterRole>()?
            .rules
            .unwrap_or_default(),
    );
    let has = |map: &BTreeMap<(String, String), BTreeSet<String>>,
               group: &str,
               resource: &str,
               want: &[&str]| {
        let got = map
            .get(&(group.to_owned(), resource.to_owned()))
            .cloned()
            .unwrap_or_default();
        ensure!(
            want.iter().all(|v| got.contains(*v)),
            "{group}/{resource}: {got:?} lacks some of {want:?}"
        );
        Ok(())
    };
    has(&cluster_rights, "", "nodes", &["get", "list", "watch"])?;
    has(
        &cluster_rights,
        "",
        "pods",
        &["get", "list", "watch", "patch"],
    )?;
    has(&cluster_rights, "", "pods/binding", &["create"])?;
    ensure!(
        !cluster_rights
            .keys()
            .any(|(g, _)| g == "coordination.k8s.io"),
        "leases are granted in the Tessera namespace only"
    );
    let role_rights = rights(
        &find(&docs, "Role", name)?
            .typed::<Role>()?
            .rules
            .unwrap_or_default(),
    );
    // list: the sweep of Leases left behind.
    has(
        &role_rights,
        "coordination.k8s.io",
        "leases",
        &["get", "list", "create", "update"],
    )?;
    Ok(())
}

/// One copy of the cluster config: the ConfigMap carries
/// config/cluster.yaml verbatim, and it parses with what the tests rely on.
#[test]
fn the_config_map_carries_config_cluster_yaml_verbatim() -> Result<()> {
    let (docs, _) = all_documents()?;
    let text = std::fs::read_to_string(manifest_dir().join("config/cluster.yaml"))?;
    let cm: ConfigMap = find(&docs, "ConfigMap", "tessera-cluster-config")?.typed()?;
    let data = cm.data.unwrap_or_default();
    let file = Path::new(cluster::CONFIG_PATH)
        .file_name()
        .and_then(|f| f.to_str())
        .context("file name")?;
    ensure!(
        data.get(file) == Some(&text),
        "cluster-config.yaml's data.{file} differs from config/cluster.yaml: copy the file into the ConfigMap"
    );
    let parsed = ClusterConfig::parse(&text).map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(parsed.nvidia.device_split_count == 10);
    ensure!(parsed.nvidia.default_cores == 0);
    ensure!(
        parsed.allowed_profiles("NVIDIA A100-SXM4-40GB")
            == Some(&["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"].map(String::from)[..])
    );
    Ok(())
}

/// kubectl's `<resource>.<group>/<name>` for a document.
fn kubectl_name(doc: &Doc) -> String {
    let api_version = doc.value["apiVersion"].as_str().unwrap_or("");
    let resource = doc.kind().to_ascii_lowercase();
    match api_version.split_once('/') {
        Some((group, _)) => format!("{resource}.{group}/{}", doc.name()),
        None => format!("{resource}/{}", doc.name()),
    }
}

/// `kubectl apply -f packaging/kubernetes/` on the stand-in: every object
/// created, each read back, a second apply changes nothing.
#[test]
fn kubectl_apply_of_the_folder_creates_every_object_once() -> Result<()> {
    let mut needs = vec![Need::Built("tessera-sim")];
    needs.extend(kubectl_needs());
    let Ok(()) = require(&needs) else {
        return Ok(());
    };
    let server = StandInApiServer::start(&[])?;
    let kc = server.kubeconfig();
    let (docs, _) = all_documents()?;
    let dir = manifest_dir();
    let dir = dir.to_str().context("path")?;

    let out = kubectl_stdout(kc, &["apply", "-f", dir])?;
    let mut got: Vec<String> = out.lines().map(str::to_owned).collect();
    got.sort();
    let mut want: Vec<String> = docs
        .iter()
        .map(|d| format!("{} created", kubectl_name(d)))
        .collect();
    want.sort();
    ensure!(
        got == want,
        "first apply:\n{out}\nexpected:\n{}",
        want.join("\n")
    );

    for doc in &docs {
        let mut args = vec!["get", "-o", "json"];
        let name = kubectl_name(doc);
        args.push(&name);
        let ns = doc.value["metadata"]["namespace"].as_str().unwrap_or("");
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        let read: Value = serde_json::from_str(&kubectl_stdout(kc, &args)?)?;
        ensure!(read["kind"] == doc.value["kind"], "{name}: {read}");
        ensure!(read["metadata"]["name"] == doc.value["metadata"]["name"]);
        ensure!(
            read["metadata"]["uid"]
                .as_str()
                .is_some_and(|u| !u.is_empty()),
            "{name}: no uid"
        );
        for field in ["spec", "data", "rules", "roleRef", "subjects"] {
            if let Some(given) = doc.value.get(field) {
                let stored = &read[field];
                ensure!(
                    first_difference(given, stored, field)
                        .is_none_or(|d| d.ends_with("added by the type")),
                    "{name}: {:?}",
                    first_difference(given, stored, field)
                );
            }
        }
    }

    let out = kubectl_stdout(kc, &["apply", "-f", dir])?;
    for line in out.lines() {
        ensure!(
            line.ends_with(" unchanged") || line.ends_with(" configured"),
            "second apply: {line}"
        );
    }
    ensure!(out.lines().count() == docs.len(), "second apply:\n{out}");
    Ok(())
}
