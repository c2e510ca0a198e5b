//! Debian's kubectl (1.32) against the stand-in API server (or the cluster
//! `TESSERA_E2E_KUBECONFIG` names): the commands people and the docs use —
//! `get` (server-side tables, `-o json|yaml|wide`, selectors), `describe`
//! (with the events of the object), `apply -f` (create, then a three-way
//! patch of the same object), `patch` of each type, `label`, `delete`,
//! `api-resources`, `api-versions`, and an unknown resource.
//!
//! Objects are set up with kube-rs, a second, independent client, and
//! kubectl's output is parsed and compared with what was set up; no expected
//! output is copied from the stand-in. Each test works in its own namespace
//! and with its own node names, so tests can share a real cluster.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_test_support::kube::{
    self as tkube, Cluster, KUBECONFIG_ENV, StandInApiServer, kubectl_stdout,
};
use tessera_test_support::{Need, require};

fn needs() -> Vec<Need> {
    let mut needs = tkube::needs();
    needs.extend(tkube::kubectl_needs());
    needs
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs kubectl; the output, whatever the exit status.
fn kubectl_output(kubeconfig: &Path, args: &[&str]) -> Result<Output> {
    tkube::kubectl(kubeconfig)
        .args(args)
        .output()
        .with_context(|| format!("running kubectl {}", args.join(" ")))
}

/// A kubectl table (`get`, `api-resources`): the header's column names and
/// each row's cells, split where the header's columns start (cells such as
/// `<none>` or `60s (x2 over 3m)` hold no column gap, but may hold a space).
struct Table {
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn parse(text: &str) -> Result<Table> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header = lines.next().context("no header line")?;
        // Column starts: a non-space after two spaces (or at 0). Column names
        // hold single spaces ("NOMINATED NODE").
        let bytes = header.as_bytes();
        let mut starts = vec![0];
        for i in 2..bytes.len() {
            if bytes[i] != b' ' && bytes[i - 1] == b' ' && bytes[i - 2] == b' ' {
                starts.push(i);
            }
        }
        let cut = |line: &str| -> Vec<String> {
            starts
                .iter()
                .enumerate()
                .map(|(n, &s)| {
                    let end = starts
                        .get(n + 1)
                        .copied()
                        .unwrap_or(line.len())
                        .min(line.len());
                    line.get(s.min(line.len())..end)
                        .unwrap_or("")
                        .trim()
                        .to_owned()
                })
                .collect()
        };
        let columns = cut(header);
        let rows = lines.map(cut).collect();
        Ok(Table { columns, rows })
    }

    /// The row whose first cell is `name`, as column → cell.
    fn row(&self, name: &str) -> Result<BTreeMap<String, String>> {
        let row = self
            .rows
            .iter()
            .find(|r| r.first().map(String::as_str) == Some(name))
            .with_context(|| format!("no row {name} in {:?}", self.rows))?;
        Ok(self
            .columns
            .iter()
            .cloned()
            .zip(row.iter().cloned())
            .collect())
    }

    fn first_cells(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter_map(|r| r.first().cloned())
            .collect()
    }
}

/// A unique prefix for this test's names (a real cluster is shared).
fn unique(tag: &str) -> String {
    format!("kctl-{tag}-{}", std::process::id())
}

/// What a test starts with: the cluster, a namespace of its own (made), a
/// runtime for the kube-rs calls and a client.
struct Setup {
    cluster: Cluster,
    ns: String,
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

/// The set-up of the test `tag`, or `None` (skipped loudly) when a
/// prerequisite is missing.
fn set_up(tag: &str) -> Result<Option<Setup>> {
    let Ok(()) = require(&needs()) else {
        return Ok(None);
    };
    let cluster = Cluster::get()?;
    let ns = unique(tag);
    let rt = runtime();
    let client = rt.block_on(async {
        let client = tkube::client(cluster.kubeconfig()).await?;
        make_namespace(&client, &ns).await?;
        anyhow::Ok(client)
    })?;
    Ok(Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }))
}

async fn make_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating namespace")?;
    Ok(())
}

/// A ready node with a kubelet version, an internal IP and a role label.
async fn make_node(client: &kube::Client, name: &str, ip: &str) -> Result<Node> {
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/gpu": "", "kubernetes.io/hostname": name}},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .context("creating node")?;
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "nodeInfo": {"kubeletVersion": "v1.33.9-test", "osImage": "Test OS 1", "kernelVersion": "6.1.0-test",
            "containerRuntimeVersion": "containerd://1.7.24", "architecture": "amd64", "operatingSystem": "linux",
            "machineID": "m", "systemUUID": "s", "bootID": "b", "kubeProxyVersion": ""}
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("node status")
}

/// A pod bound to `node` with labels, and a status as a kubelet reports it:
/// `ready_running` containers running and ready, then one waiting with
/// `waiting_reason` if given.
async fn make_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    labels: Value,
    waiting_reason: Option<&str>,
) -> Result<Pod> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let mut containers = vec![json!({"name": "main", "image": "busybox"})];
    let mut statuses = vec![
        json!({"name": "main", "ready": true, "restartCount": 2, "image": "busybox", "imageID": "",
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}),
    ];
    if let Some(reason) = waiting_reason {
        containers.push(json!({"name": "side", "image": "busybox"}));
        statuses.push(json!({"name": "side", "ready": false, "restartCount": 1, "image": "busybox", "imageID": "",
            "state": {"waiting": {"reason": reason}}}));
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": containers},
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .context("creating pod")?;
    let status = json!({"status": {"phase": "Running", "podIP": "10.9.8.7", "hostIP": "192.0.2.1",
        "conditions": [{"type": "Ready", "status": if waiting_reason.is_some() { "False" } else { "True" }}],
        "containerStatuses": statuses}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("pod status")
}

#[test]
fn get_prints_server_side_tables_with_kubectls_columns() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("get")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    let node_name = format!("{ns}-n1");
    let (pod, crash) = rt.block_on(async {
        make_node(&client, &node_name, "192.0.2.11").await?;
        let pod = make_pod(&client, &ns, "web", &node_name, json!({"app": "x"}), None).await?;
        let crash = make_pod(
            &client,
            &ns,
            "crashy",
            &node_name,
            json!({"app": "y"}),
            Some("CrashLoopBackOff"),
        )
        .await?;
        anyhow::Ok((pod, crash))
    })?;

    let nodes = Table::parse(&kubectl_stdout(kc, &["get", "nodes"])?)?;
    assert_eq!(nodes.columns, ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    let row = nodes.row(&node_name)?;
    assert_eq!(row["STATUS"], "Ready");
    assert_eq!(row["ROLES"], "gpu");
    assert_eq!(row["VERSION"], "v1.33.9-test");
    let age = &row["AGE"];
    assert!(
        age.ends_with('s') || age.ends_with('m'),
        "a fresh node's age: {age}"
    );

    let wide = Table::parse(&kubectl_stdout(
        kc,
        &["get", "node", &node_name, "-o", "wide"],
    )?)?;
    assert_eq!(
        wide.columns,
        [
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE",
            "KERNEL-VERSION",
            "CONTAINER-RUNTIME"
        ]
    );
    let row = wide.row(&node_name)?;
    assert_eq!(row["INTERNAL-IP"], "192.0.2.11");
    assert_eq!(row["EXTERNAL-IP"], "<none>");
    assert_eq!(row["OS-IMAGE"], "Test OS 1");
    assert_eq!(row["KERNEL-VERSION"], "6.1.0-test");
    assert_eq!(row["CONTAINER-RUNTIME"], "containerd://1.7.24");

    let pods = Table::parse(&kubectl_stdout(kc, &["get", "pods", "-n", &ns])?)?;
    assert_eq!(pods.columns, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    let mut names = pods.first_cells();
    names.sort();
    assert_eq!(names, ["crashy", "web"]);
    let web = pods.row("web")?;
    assert_eq!(
        (
            web["READY"].as_str(),
            web["STATUS"].as_str(),
            web["RESTARTS"].as_str()
        ),
        ("1/1", "Running", "2")
    );
    let crashy = pods.row("crashy")?;
    assert_eq!(
        (
            crashy["READY"].as_str(),
            crashy["STATUS"].as_str(),
            crashy["RESTARTS"].as_str()
        ),
        ("1/2", "CrashLoopBackOff", "3")
    );

    let wide = Table::parse(&kubectl_stdout(
        kc,
        &["get", "pods", "-n", &ns, "-o", "wide"],
    )?)?;
    assert_eq!(
        wide.columns,
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED NODE",
            "READINESS GATES"
        ]
    );
    let web = wide.row("web")?;
    assert_eq!(web["IP"], "10.9.8.7");
    assert_eq!(web["NODE"], node_name);
    assert_eq!(web["NOMINATED NODE"], "<none>");

    let namespaces = Table::parse(&kubectl_stdout(kc, &["get", "ns"])?)?;
    assert_eq!(namespaces.columns, ["NAME", "STATUS", "AGE"]);
    assert_eq!(namespaces.row(&ns)?["STATUS"], "Active");

    // -o json: the objects as stored, the same uid kube-rs saw.
    let list: Value = serde_json::from_str(&kubectl_stdout(
        kc,
        &["get", "pods", "-n", &ns, "-o", "json"],
    )?)?;
    assert_eq!(list["kind"], "List");
    let uids: Vec<&str> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["metadata"]["uid"].as_str())
        .collect();
    let want_uid = pod.metadata.uid.as_deref().context("pod uid")?;
    assert!(uids.contains(&want_uid), "{uids:?} lacks {want_uid}");
    assert!(uids.contains(&crash.metadata.uid.as_deref().context("uid")?));
    let one: Value = serde_json::from_str(&kubectl_stdout(
        kc,
        &["get", "pod", "web", "-n", &ns, "-o", "json"],
    )?)?;
    assert_eq!(one["kind"], "Pod");
    assert_eq!(one["spec"]["nodeName"], node_name.as_str());
    assert_eq!(one["status"]["podIP"], "10.9.8.7");

    // -o yaml: the same object; top-level keys and the uid line.
    let yaml = kubectl_stdout(kc, &["get", "pod", "web", "-n", &ns, "-o", "yaml"])?;
    let top: Vec<&str> = yaml
        .lines()
        .filter(|l| !l.starts_with(' ') && l.contains(':'))
        .map(|l| l.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(top, ["apiVersion", "kind", "metadata", "spec", "status"]);
    assert!(
        yaml.lines().any(|l| l.trim() == format!("uid: {want_uid}")),
        "{yaml}"
    );
    Ok(())
}

#[test]
fn describe_shows_the_objects_events() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("describe")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    let node_name = format!("{ns}-n1");
    rt.block_on(async {
        let node = make_node(&client, &node_name, "192.0.2.12").await?;
        let pod = make_pod(&client, &ns, "web", &node_name, json!({"app": "x"}), None).await?;
        let events = Api::<Event>::namespaced(client.clone(), &ns);
        let pod_event: Event = serde_json::from_value(json!({
            "metadata": {"name": "web.pulled"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "web", "uid": pod.metadata.uid},
            "type": "Normal", "reason": "TestPulled", "message": "image busybox pulled for the test",
            "source": {"component": "kubelet", "host": node_name},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
        }))?;
        events.create(&PostParams::default(), &pod_event).await.context("pod event")?;
        let node_event: Event = serde_json::from_value(json!({
            "metadata": {"name": format!("{node_name}.ready"), "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": node_name, "uid": node.metadata.uid},
            "type": "Warning", "reason": "TestNodeNotice", "message": "node notice for the test",
            "source": {"component": "kubelet", "host": node_name},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
        }))?;
        Api::<Event>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &node_event)
            .await
            .context("node event")?;
        anyhow::Ok(())
    })?;

    let text = kubectl_stdout(kc, &["describe", "pod", "web", "-n", &ns])?;
    let field = |text: &str, key: &str| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .map(|l| l[key.len() + 1..].trim().to_owned())
    };
    assert_eq!(field(&text, "Name").as_deref(), Some("web"), "{text}");
    assert_eq!(field(&text, "Namespace").as_deref(), Some(ns.as_str()));
    assert_eq!(field(&text, "Status").as_deref(), Some("Running"));
    assert_eq!(field(&text, "IP").as_deref(), Some("10.9.8.7"));
    assert!(
        field(&text, "Node").is_some_and(|n| n.starts_with(&node_name)),
        "{text}"
    );
    let events = text
        .split("\nEvents:")
        .nth(1)
        .with_context(|| format!("no Events section:\n{text}"))?;
    let line = events
        .lines()
        .find(|l| l.contains("TestPulled"))
        .with_context(|| format!("the pod's event is missing:\n{text}"))?;
    assert!(
        line.contains("Normal") && line.contains("image busybox pulled for the test"),
        "{line}"
    );

    let text = kubectl_stdout(kc, &["describe", "node", &node_name])?;
    assert_eq!(
        field(&text, "Name").as_deref(),
        Some(node_name.as_str()),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("InternalIP:")
                && l.trim_end().ends_with(" 192.0.2.12")),
        "{text}"
    );
    // The pods section lists the pod bound to the node (found with a field selector).
    let pods = text
        .split("Non-terminated Pods:")
        .nth(1)
        .with_context(|| format!("no pods section:\n{text}"))?;
    assert!(
        pods.lines()
            .any(|l| l.split_whitespace().take(2).eq([ns.as_str(), "web"])),
        "{text}"
    );
    let events = text
        .split("\nEvents:")
        .nth(1)
        .with_context(|| format!("no Events section:\n{text}"))?;
    assert!(
        events
            .lines()
            .any(|l| l.contains("TestNodeNotice") && l.contains("Warning")),
        "{text}"
    );
    Ok(())
}

#[test]
fn apply_creates_then_patches_the_same_object() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("apply")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    let dir = tempfile::tempdir()?;
    let manifest = |tier: &str, image: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: applied\n  namespace: {ns}\n  labels:\n    app: x\n    tier: {tier}\nspec:\n  containers:\n  - name: main\n    image: {image}\n    env:\n    - name: A\n      value: \"1\"\n  - name: side\n    image: busybox\n"
        )
    };
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, manifest("one", "busybox:1"))?;
    let path = file.to_str().context("path")?;
    let out = kubectl_stdout(kc, &["apply", "-f", path])?;
    assert_eq!(out.trim(), "pod/applied created");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let first = rt.block_on(pods.get("applied"))?;
    let last_applied = first
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubectl.kubernetes.io/last-applied-configuration"))
        .context("apply records its last-applied configuration")?;
    let last_applied: Value = serde_json::from_str(last_applied)?;
    assert_eq!(last_applied["metadata"]["labels"]["tier"], "one");

    // The same again: nothing to do.
    let out = kubectl_stdout(kc, &["apply", "-f", path])?;
    assert_eq!(out.trim(), "pod/applied unchanged");

    // Edited: a label changed and an image changed → patched in place.
    std::fs::write(&file, manifest("two", "busybox:2"))?;
    let out = kubectl_stdout(kc, &["apply", "-f", path])?;
    assert_eq!(out.trim(), "pod/applied configured");
    let second = rt.block_on(pods.get("applied"))?;
    assert_eq!(
        second.metadata.uid, first.metadata.uid,
        "apply recreated the pod"
    );
    assert_eq!(
        second
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("tier"))
            .map(String::as_str),
        Some("two")
    );
    assert_eq!(
        second
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("x")
    );
    let spec = second.spec.context("spec")?;
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["main", "side"], "containers merged by name");
    assert_eq!(spec.containers[0].image.as_deref(), Some("busybox:2"));
    assert_eq!(spec.containers[0].env.as_ref().map(Vec::len), Some(1));
    let rv1: u64 = first.metadata.resource_version.context("rv")?.parse()?;
    let rv2: u64 = second.metadata.resource_version.context("rv")?.parse()?;
    assert!(rv2 > rv1, "resourceVersion {rv1} → {rv2}");

    // A ConfigMap too (validation and create of another kind), then edited.
    let cm = dir.path().join("cm.yaml");
    std::fs::write(
        &cm,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: conf\n  namespace: {ns}\ndata:\n  a: \"1\"\n  b: \"2\"\n"
        ),
    )?;
    assert_eq!(
        kubectl_stdout(kc, &["apply", "-f", cm.to_str().context("path")?])?.trim(),
        "configmap/conf created"
    );
    std::fs::write(
        &cm,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: conf\n  namespace: {ns}\ndata:\n  a: \"1\"\n  c: \"3\"\n"
        ),
    )?;
    assert_eq!(
        kubectl_stdout(kc, &["apply", "-f", cm.to_str().context("path")?])?.trim(),
        "configmap/conf configured"
    );
    let data = rt
        .block_on(Api::<ConfigMap>::namespaced(client.clone(), &ns).get("conf"))?
        .data
        .context("data")?;
    // Three-way: b was in the last applied configuration and is gone from the file → removed.
    assert_eq!(
        data.into_iter().collect::<Vec<_>>(),
        [("a".into(), "1".into()), ("c".into(), "3".into())]
    );

    // kubectl edit: the editor (a script here) changes a value; kubectl sends
    // the difference as a patch.
    let editor = dir.path().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/^  c: \"3\"$/  c: \"edited\"/' \"$1\"\n",
    )?;
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let out = tkube::kubectl(kc)
        .args(["edit", "configmap", "conf", "-n", &ns])
        .env("KUBE_EDITOR", &editor)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl edit: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "configmap/conf edited");
    let data = rt
        .block_on(Api::<ConfigMap>::namespaced(client, &ns).get("conf"))?
        .data
        .context("data")?;
    assert_eq!(data.get("c").map(String::as_str), Some("edited"));
    Ok(())
}

#[test]
fn patch_of_each_type_label_and_delete() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("patch")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    rt.block_on(async {
        let pods = Api::<Pod>::namespaced(client.clone(), &ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"app": "x"}},
            // Bound to a node (with no kubelet), so deletion is graceful.
            "spec": {"nodeName": format!("{ns}-gone"),
                "containers": [{"name": "a", "image": "busybox:1"}, {"name": "b", "image": "busybox:1"}]},
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}}))?;
        Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&PostParams::default(), &cm).await?;
        anyhow::Ok(())
    })?;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let uid = rt.block_on(pods.get("p"))?.metadata.uid;
    // The arguments of `kubectl patch pod p -n <ns> --type=<kind> -p <patch>`.
    let patch_p = |kind: &'static str, patch: &'static str| {
        ["patch", "pod", "p", "-n", ns.as_str(), kind, "-p", patch]
    };

    // Strategic merge: the containers list is merged by name (b is kept).
    let out = kubectl_stdout(
        kc,
        &patch_p(
            "--type=strategic",
            r#"{"spec":{"containers":[{"name":"a","image":"busybox:2"}]}}"#,
        ),
    )?;
    assert_eq!(out.trim(), "pod/p patched");
    let pod = rt.block_on(pods.get("p"))?;
    let images: Vec<(String, Option<String>)> = pod
        .spec
        .context("spec")?
        .containers
        .into_iter()
        .map(|c| (c.name, c.image))
        .collect();
    assert_eq!(
        images,
        [
            ("a".into(), Some("busybox:2".into())),
            ("b".into(), Some("busybox:1".into()))
        ]
    );

    // JSON merge patch: maps merge, null deletes.
    kubectl_stdout(
        kc,
        &patch_p(
            "--type=merge",
            r#"{"metadata":{"labels":{"m":"1","app":null}}}"#,
        ),
    )?;
    // JSON patch.
    kubectl_stdout(
        kc,
        &patch_p(
            "--type=json",
            r#"[{"op":"add","path":"/metadata/labels/j","value":"2"}]"#,
        ),
    )?;
    // label, and --overwrite to change one.
    assert_eq!(
        kubectl_stdout(kc, &["label", "pod", "p", "-n", &ns, "tier=gpu"])?.trim(),
        "pod/p labeled"
    );
    let refused = kubectl_output(kc, &["label", "pod", "p", "-n", &ns, "tier=cpu"])?;
    assert!(
        !refused.status.success(),
        "relabelling without --overwrite must fail"
    );
    kubectl_stdout(
        kc,
        &["label", "pod", "p", "-n", &ns, "tier=cpu", "--overwrite"],
    )?;
    let pod = rt.block_on(pods.get("p"))?;
    assert_eq!(pod.metadata.uid, uid);
    let labels = pod.metadata.labels.unwrap_or_default();
    let want: BTreeMap<String, String> = [("m", "1"), ("j", "2"), ("tier", "cpu")]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    assert_eq!(labels, want);

    // A JSON patch whose test fails is refused, and changes nothing.
    let refused = kubectl_output(
        kc,
        &patch_p(
            "--type=json",
            r#"[{"op":"test","path":"/metadata/labels/j","value":"9"},{"op":"add","path":"/metadata/labels/k","value":"3"}]"#,
        ),
    )?;
    assert!(!refused.status.success());
    assert!(
        !rt.block_on(pods.get("p"))?
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("k")
    );

    // delete pod --wait=false: the pod is bound and no kubelet confirms, so
    // it stays, marked for deletion, and kubectl shows it Terminating.
    let out = kubectl_stdout(kc, &["delete", "pod", "p", "-n", &ns, "--wait=false"])?;
    assert_eq!(out.trim(), r#"pod "p" deleted"#);
    let pod = rt
        .block_on(pods.get_opt("p"))?
        .context("a bound pod is deleted gracefully")?;
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "no deletionTimestamp"
    );
    let table = Table::parse(&kubectl_stdout(kc, &["get", "pod", "p", "-n", &ns])?)?;
    assert_eq!(table.row("p")?["STATUS"], "Terminating");
    // Deleting it for good (what a kubelet does once the containers are gone).
    kubectl_stdout(
        kc,
        &[
            "delete",
            "pod",
            "p",
            "-n",
            &ns,
            "--grace-period=0",
            "--force",
        ],
    )?;
    assert!(
        rt.block_on(pods.get_opt("p"))?.is_none(),
        "a forced delete removes the pod"
    );
    let out = kubectl_stdout(kc, &["delete", "configmap", "c", "-n", &ns])?;
    assert_eq!(out.trim(), r#"configmap "c" deleted"#);
    let missing = kubectl_output(kc, &["get", "configmap", "c", "-n", &ns])?;
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains(r#"configmaps "c" not found"#), "{stderr}");
    Ok(())
}

#[test]
fn field_and_label_selectors_pick_the_pods() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("select")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    let (n1, n2) = (format!("{ns}-n1"), format!("{ns}-n2"));
    rt.block_on(async {
        for (pod, node, app) in [
            ("a1", &n1, "x"),
            ("a2", &n1, "x"),
            ("b1", &n1, "y"),
            ("c1", &n2, "x"),
        ] {
            make_pod(&client, &ns, pod, node, json!({"app": app}), None).await?;
        }
        anyhow::Ok(())
    })?;
    let selector = format!("spec.nodeName={n1}");
    let names = |args: &[&str]| -> Result<Vec<String>> {
        let mut all = vec!["get", "pods", "-n", ns.as_str(), "-o", "name"];
        all.extend_from_slice(args);
        let mut names: Vec<String> = kubectl_stdout(kc, &all)?
            .lines()
            .map(str::to_owned)
            .collect();
        names.sort();
        Ok(names)
    };
    assert_eq!(
        names(&["--field-selector", &selector, "-l", "app=x"])?,
        ["pod/a1", "pod/a2"]
    );
    assert_eq!(
        names(&["--field-selector", &selector])?,
        ["pod/a1", "pod/a2", "pod/b1"]
    );
    assert_eq!(names(&["-l", "app!=x"])?, ["pod/b1"]);
    assert_eq!(names(&["-l", "app in (y)"])?, ["pod/b1"]);
    assert_eq!(
        names(&["--field-selector", &format!("spec.nodeName!={n1}")])?,
        ["pod/c1"]
    );
    // As a table too: the server filters before printing.
    let table = Table::parse(&kubectl_stdout(
        kc,
        &[
            "get",
            "pods",
            "-n",
            &ns,
            "--field-selector",
            &selector,
            "-l",
            "app=x",
        ],
    )?)?;
    let mut rows = table.first_cells();
    rows.sort();
    assert_eq!(rows, ["a1", "a2"]);
    Ok(())
}

#[test]
fn discovery_lists_what_is_served_and_unknown_resources_are_refused() -> Result<()> {
    let Ok(()) = require(&needs()) else {
        return Ok(());
    };
    let cluster = Cluster::get()?;
    let kc = cluster.kubeconfig();

    let table = Table::parse(&kubectl_stdout(kc, &["api-resources"])?)?;
    assert_eq!(
        table.columns,
        ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    );
    for (name, short, version, namespaced, kind) in [
        ("pods", "po", "v1", "true", "Pod"),
        ("nodes", "no", "v1", "false", "Node"),
        ("namespaces", "ns", "v1", "false", "Namespace"),
        ("configmaps", "cm", "v1", "true", "ConfigMap"),
        ("events", "ev", "v1", "true", "Event"),
        ("leases", "", "coordination.k8s.io/v1", "true", "Lease"),
        ("daemonsets", "ds", "apps/v1", "true", "DaemonSet"),
        ("deployments", "deploy", "apps/v1", "true", "Deployment"),
        (
            "clusterroles",
            "",
            "rbac.authorization.k8s.io/v1",
            "false",
            "ClusterRole",
        ),
    ] {
        let row = table.row(name)?;
        assert_eq!(
            (
                row["SHORTNAMES"].as_str(),
                row["APIVERSION"].as_str(),
                row["NAMESPACED"].as_str(),
                row["KIND"].as_str()
            ),
            (short, version, namespaced, kind),
            "{name}"
        );
    }
    // Subresources are not resources of their own.
    assert!(!table.first_cells().iter().any(|n| n.contains('/')));

    let versions: Vec<String> = kubectl_stdout(kc, &["api-versions"])?
        .lines()
        .map(str::to_owned)
        .collect();
    for v in ["v1", "coordination.k8s.io/v1"] {
        assert!(
            versions.iter().any(|l| l == v),
            "{v} missing from {versions:?}"
        );
    }

    let version: Value = serde_json::from_str(&kubectl_stdout(kc, &["version", "-o", "json"])?)?;
    let server = &version["serverVersion"];
    let git = server["gitVersion"].as_str().context("gitVersion")?;
    assert_eq!(
        git.split('.').next(),
        Some(format!("v{}", server["major"].as_str().unwrap_or("?")).as_str())
    );

    for resource in ["widgets", "jobs"] {
        let out = kubectl_output(kc, &["get", resource])?;
        assert!(!out.status.success(), "kubectl get {resource} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                r#"the server doesn't have a resource type "{resource}""#
            )),
            "{stderr}"
        );
    }
    // Explain reads the served OpenAPI schemas.
    let explain = kubectl_stdout(kc, &["explain", "pod.spec.containers.resources"])?;
    ensure!(
        explain
            .lines()
            .any(|l| l.trim_start().starts_with("limits")),
        "{explain}"
    );
    Ok(())
}

#[test]
fn concurrent_kubectl_clients_lose_no_write() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("concurrent")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    rt.block_on(async {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "shared"}, "data": {"seed": "0"}}))?;
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &cm)
            .await?;
        anyhow::Ok(())
    })?;
    const CLIENTS: usize = 8;
    let dir = tempfile::tempdir()?;
    // Each client applies its own ConfigMap, merge-patches its own key into
    // the shared one and labels it; all at once.
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let ns = ns.as_str();
                let file = dir.path().join(format!("cm{i}.yaml"));
                scope.spawn(move || -> Result<()> {
                    std::fs::write(
                        &file,
                        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: own-{i}\n  namespace: {ns}\ndata:\n  i: \"{i}\"\n"),
                    )?;
                    kubectl_stdout(kc, &["apply", "-f", file.to_str().context("path")?])?;
                    let patch = format!(r#"{{"data":{{"k{i}":"{i}"}}}}"#);
                    kubectl_stdout(kc, &["patch", "configmap", "shared", "-n", ns, "--type=merge", "-p", &patch])?;
                    kubectl_stdout(kc, &["label", "configmap", "shared", "-n", ns, &format!("l{i}=x")])?;
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    })?;
    let names: Vec<String> = kubectl_stdout(kc, &["get", "configmaps", "-n", &ns, "-o", "name"])?
        .lines()
        .map(str::to_owned)
        .collect();
    for i in 0..CLIENTS {
        assert!(
            names.contains(&format!("configmap/own-{i}")),
            "own-{i} missing from {names:?}"
        );
    }
    let shared = rt.block_on(Api::<ConfigMap>::namespaced(client, &ns).get("shared"))?;
    let data = shared.data.unwrap_or_default();
    let labels = shared.metadata.labels.unwrap_or_default();
    for i in 0..CLIENTS {
        assert_eq!(
            data.get(&format!("k{i}")).map(String::as_str),
            Some(i.to_string().as_str()),
            "patch {i} lost: {data:?}"
        );
        assert!(
            labels.contains_key(&format!("l{i}")),
            "label {i} lost: {labels:?}"
        );
    }
    assert_eq!(data.get("seed").map(String::as_str), Some("0"));
    Ok(())
}

/// The stand-in's own restart (a real cluster keeps its objects by itself).
#[test]
fn kubectl_finds_applied_objects_after_a_stand_in_restart() -> Result<()> {
    let mut needs = needs();
    needs.push(Need::condition(
        std::env::var_os(KUBECONFIG_ENV).is_none(),
        "the stand-in API server (this test restarts it)",
        format!("unset {KUBECONFIG_ENV}"),
    ));
    let Ok(()) = require(&needs) else {
        return Ok(());
    };
    let state_dir = tempfile::tempdir()?;
    let state = state_dir.path().join("state.json");
    let mut server = StandInApiServer::start(&["--state", state.to_str().context("path")?])?;
    let ns = unique("restart");
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("all.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: conf\n  namespace: {ns}\ndata:\n  a: \"1\"\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: {ns}\n  labels:\n    app: x\nspec:\n  containers:\n  - name: main\n    image: busybox\n"
        ),
    )?;
    let path = file.to_str().context("path")?;
    let out = kubectl_stdout(server.kubeconfig(), &["apply", "-f", path])?;
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "configmap/conf created",
            &format!("namespace/{ns} created"),
            "pod/web created"
        ]
    );
    let before: Value = serde_json::from_str(&kubectl_stdout(
        server.kubeconfig(),
        &["get", "pod", "web", "-n", &ns, "-o", "json"],
    )?)?;

    server.restart()?;
    let after: Value = serde_json::from_str(&kubectl_stdout(
        server.kubeconfig(),
        &["get", "pod", "web", "-n", &ns, "-o", "json"],
    )?)?;
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    // The last-applied configuration survived: applying the same file changes nothing.
    let out = kubectl_stdout(server.kubeconfig(), &["apply", "-f", path])?;
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "configmap/conf unchanged",
            &format!("namespace/{ns} unchanged"),
            "pod/web unchanged"
        ]
    );
    // And writes after the restart get newer resourceVersions.
    kubectl_stdout(
        server.kubeconfig(),
        &["label", "pod", "web", "-n", &ns, "after=restart"],
    )?;
    let relabelled: Value = serde_json::from_str(&kubectl_stdout(
        server.kubeconfig(),
        &["get", "pod", "web", "-n", &ns, "-o", "json"],
    )?)?;
    let rv = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("0")
            .parse::<u64>()
            .unwrap_or(0)
    };
    assert!(
        rv(&relabelled) > rv(&after),
        "{} after {}",
        rv(&relabelled),
        rv(&after)
    );
    Ok(())
}

/// The lines a running `kubectl get -w` prints, read on a thread; the child
/// is killed when this is dropped.
struct WatchOutput {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl WatchOutput {
    fn start(kubeconfig: &Path, args: &[&str]) -> Result<WatchOutput> {
        let mut child = tkube::kubectl(kubeconfig)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting kubectl get -w")?;
        let stdout = child.stdout.take().context("kubectl stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(WatchOutput {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// The next line's whitespace-separated words for which `want` holds
    /// (earlier lines are skipped), within 30 s.
    fn next(&mut self, what: &str, want: impl Fn(&[&str]) -> bool) -> Result<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => bail!(
                    "no line with {what} from kubectl get -w ({e}); it printed {:#?}",
                    self.seen
                ),
            };
            self.seen.push(line.clone());
            let words: Vec<&str> = line.split_whitespace().collect();
            if want(&words) {
                return Ok(words.into_iter().map(str::to_owned).collect());
            }
        }
    }
}

impl Drop for WatchOutput {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn get_watch_prints_full_columns_for_each_event() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("watch")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    let node = format!("{ns}-node");
    rt.block_on(make_pod(
        &client,
        &ns,
        "early",
        &node,
        json!({"app": "w"}),
        None,
    ))?;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let mut watch = WatchOutput::start(
        kc,
        &["get", "pods", "-n", &ns, "-w", "--output-watch-events"],
    )?;

    // The header has the pod columns (not just NAME and AGE), and the
    // existing pod comes first, running with its one container ready.
    let header = watch.next("the header", |w| w.first() == Some(&"EVENT"))?;
    assert_eq!(
        header,
        ["EVENT", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    let early = watch.next("the existing pod", |w| w.get(1) == Some(&"early"))?;
    assert_eq!(early[..5], ["ADDED", "early", "1/1", "Running", "2"]);

    // A new pod, then its container crash-looping, then its deletion.
    rt.block_on(make_pod(
        &client,
        &ns,
        "late",
        &node,
        json!({"app": "w"}),
        None,
    ))?;
    let late = watch.next("the new pod running", |w| {
        w.get(1) == Some(&"late") && w.get(3) == Some(&"Running")
    })?;
    assert_eq!(late[2], "1/1");
    let crash = json!({"status": {"containerStatuses": [{"name": "main", "ready": false, "restartCount": 3,
        "image": "busybox", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        "conditions": [{"type": "Ready", "status": "False"}]}});
    rt.block_on(pods.patch_status("late", &PatchParams::default(), &Patch::Merge(&crash)))?;
    let crashed = watch.next("the crash loop", |w| {
        w.get(1) == Some(&"late") && w.get(3) == Some(&"CrashLoopBackOff")
    })?;
    assert_eq!(
        crashed[..5],
        ["MODIFIED", "late", "0/1", "CrashLoopBackOff", "3"]
    );

    // A bound pod's deletion is graceful: Terminating first, then gone.
    rt.block_on(pods.delete("late", &DeleteParams::default()))?;
    let terminating = watch.next("the pod terminating", |w| {
        w.get(1) == Some(&"late") && w.get(3) == Some(&"Terminating")
    })?;
    assert_eq!(terminating[0], "MODIFIED");
    rt.block_on(pods.delete("late", &DeleteParams::default().grace_period(0)))?;
    let deleted = watch.next("the deletion", |w| {
        w.first() == Some(&"DELETED") && w.get(1) == Some(&"late")
    })?;
    assert_eq!(
        deleted[2], "0/1",
        "a deleted pod's row still has its columns"
    );
    Ok(())
}

#[test]
fn apply_of_a_manifest_with_a_typo_is_refused_or_warned() -> Result<()> {
    let Some(Setup {
        cluster,
        ns,
        rt,
        client,
    }) = set_up("typo")?
    else {
        return Ok(());
    };
    let kc = cluster.kubeconfig();
    let pods = Api::<Pod>::namespaced(client, &ns);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("pod.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: typo\n  namespace: {ns}\nspec:\n  containers:\n  - name: main\n    image: busybox:1.36\n    imagePullPolicyy: Always\n"
        ),
    )?;
    let path = file.to_str().context("path")?;

    // kubectl validates strictly by default: the server refuses the create.
    let out = kubectl_output(kc, &["apply", "-f", path])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "apply of a typo succeeded: {stderr}");
    assert!(
        stderr.contains("Error from server (BadRequest)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            r#"strict decoding error: unknown field "spec.containers[0].imagePullPolicyy""#
        ),
        "{stderr}"
    );
    let status = rt.block_on(pods.get_opt("typo"))?;
    assert!(status.is_none(), "a refused create stored the pod");

    // --validate=warn: created, and kubectl prints the server's warning.
    let out = kubectl_output(kc, &["apply", "--validate=warn", "-f", path])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "apply --validate=warn failed: {stderr}"
    );
    assert!(
        stderr.contains(r#"Warning: unknown field "spec.containers[0].imagePullPolicyy""#),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pod/typo created"
    );
    let stored = rt.block_on(pods.get("typo"))?;
    assert_eq!(
        stored.spec.context("spec")?.containers[0]
            .image_pull_policy
            .as_deref(),
        Some("IfNotPresent"),
        "the misspelt field was dropped, the default applies"
    );
    Ok(())
}
